// The kernel IR's GPU lowering run on the host by the device emulator (jit/kir_emulator.hpp)
// against the CPU lowering of the same programs: thread-0 stores in serial code, threads loops
// spread over a block, the grid-stride loop over instances, shared arrays, the tensor-core
// fragments of mma (GEMM tile program, f16 and bf16), the segment programs and the
// relative-position tile programs. What this cannot show (the device's memory model, real
// warps, libdevice) is left to tests/gpu/run.sh on a GPU.
#include "jit/gemm_programs.hpp"
#include "jit/kir_emulator.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/reduce_programs.hpp"
#include "jit/relpos.hpp"
#include "jit/relpos_step.hpp"
#include "tests/gpu/relpos_cases.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <cstring>

namespace rag {
namespace {

using namespace rag::testing;
using kir::Expr;

// Every instance adds 1 to out[pid] `n` times in serial code, then fills row pid of `rows`
// from a threads loop: a store repeated by every thread would add up 128 times, a threads loop
// that skipped or repeated iterations would leave holes or double counts.
kir::Kernel serial_and_threads() {
    kir::Builder b("serial_and_threads");
    Expr n = b.param("n");
    const int out = b.buffer("out", kir::Elem::f32), rows = b.buffer("rows", kir::Elem::f32);
    const int tmp = b.scratch("tmp", Expr(300));
    b.loop(0, n, [&](Expr) { b.add_to(out, b.pid(), 1.0); });
    b.loop(
        0, 300, [&](Expr j) { b.store(tmp, j, to_f32(j + b.pid())); }, kir::Loop::threads);
    b.loop(
        0, 300, [&](Expr j) { b.add_to(rows, b.pid() * 300 + j, b.load(tmp, 299 - j)); },
        kir::Loop::threads);
    return b.finish();
}

TEST(GpuEmulator, SerialStoresThreadsLoopsAndGridStrideMatchTheCpu) {
    const std::int64_t grid = 5, n = 7;
    for (int blocks : {1, 2, 3}) {
        auto emu = jit::compile_kernel_emulated(serial_and_threads(), blocks);
        std::vector<float> out(grid, 0.0f), rows(std::size_t(grid * 300), 1.0f);
        void* bufs[] = {out.data(), rows.data()};
        const std::int64_t params[] = {n};
        emu->launch(grid, bufs, params);
        for (std::int64_t p = 0; p < grid; ++p) {
            EXPECT_EQ(out[std::size_t(p)], float(n)) << "instance " << p << ", " << blocks;
            for (std::int64_t j = 0; j < 300; ++j)
                ASSERT_EQ(rows[std::size_t(p * 300 + j)], float(1 + 299 - j + p)) << p << " " << j;
        }
    }
}

// A threads loop in which iteration j stores element j of `space` and reads element j + 1 with
// no barrier between (racy), or, with `barrier`, in two threads loops (a barrier after the
// first); `past` iterations beyond the array's 256 elements.
kir::Kernel neighbours(kir::Space space, bool barrier, std::int64_t past = 0) {
    kir::Builder b("neighbours");
    const int out = b.buffer("out", kir::Elem::f32);
    const int a = space == kir::Space::shared ? b.shared("a", 256) : b.scratch("a", Expr(256));
    const Expr n = Expr(255 + past);
    b.loop(
        0, n, [&](Expr j) { b.store(a, j, to_f32(j)); }, kir::Loop::threads);
    auto read = [&](Expr j) { b.store(out, b.pid() * 256 + j, b.load(a, min(j + 1, n - 1))); };
    if (barrier) {
        b.loop(0, n, read, kir::Loop::threads);
    } else {
        b.loop(
            0, n,
            [&](Expr j) {
                b.store(a, j, to_f32(j));
                read(j);
            },
            kir::Loop::threads);
    }
    return b.finish();
}

std::string run_neighbours(const kir::Kernel& k) {
    std::vector<float> out(2 * 256 + 64, 0.0f);
    void* bufs[] = {out.data()};
    return error_of([&] { jit::compile_kernel_emulated(k)->launch(2, bufs, {}); });
}

// The race detector: a planted race in shared memory and in scratch is reported with the
// kernel, the array, the word and both threads; the same accesses with a barrier between pass.
TEST(GpuEmulator, DetectsSharedAndScratchRacesBetweenBarriers) {
    for (kir::Space space : {kir::Space::shared, kir::Space::scratch}) {
        const std::string kind = space == kir::Space::shared ? "shared" : "scratch";
        SCOPED_TRACE(kind);
        EXPECT_EQ(run_neighbours(neighbours(space, true)), "");
        const std::string e = run_neighbours(neighbours(space, false));
        EXPECT_NE(
            e.find("kernel neighbours (emulated GPU): " + kind + "-memory race on `a` (byte "),
            std::string::npos)
            << e;
        // Iteration j (thread j) reads word j + 1, which thread j + 1 writes: some pair of
        // neighbouring threads is named.
        EXPECT_NE(e.find("it with no bar.sync between"), std::string::npos) << e;
        EXPECT_NE(e.find(" in block 0: thread "), std::string::npos) << e;
    }
}

// Out-of-bounds accesses of a shared array or a scratch array fail the launch (and are
// redirected, so the emulation itself writes nothing out of bounds).
TEST(GpuEmulator, DetectsOutOfBoundsSharedAndScratchAccesses) {
    for (kir::Space space : {kir::Space::shared, kir::Space::scratch}) {
        const std::string kind = space == kir::Space::shared ? "shared" : "scratch";
        SCOPED_TRACE(kind);
        const std::string e = run_neighbours(neighbours(space, true, 2));
        EXPECT_NE(e.find("kernel neighbours (emulated GPU): out-of-bounds " + kind +
                         " write by "
                         "thread "),
                  std::string::npos)
            << e;
        EXPECT_NE(e.find("byte 1024 of `a` (1024 bytes)"), std::string::npos) << e;
    }
}

// The GEMM program on the emulated device (tensor-core fragments for the half types, FMAs
// for f32) against its CPU lowering: the same sums, so equal up to the accumulation order.
TEST(GpuEmulator, GemmTensorCoreFragmentsMatchTheCpu) {
    for (DType t : {DType::f32, DType::f16, DType::bf16})
        for (bool transposed : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + (transposed ? " A transposed" : ""));
            jit::GemmJob job;
            job.M = 80;
            job.N = 72;
            job.K = 40;
            job.a_transposed = transposed;
            const RaggedTensor a = random_dense(t, {80, 40}), b = random_dense(t, {40, 72});
            // Distinct buffers (a copy of a tensor would share its values).
            RaggedTensor want = random_dense(t, {80, 72}), got = random_dense(t, {80, 72});
            std::vector<void*> bufs = {const_cast<void*>(a.data()), const_cast<void*>(b.data()),
                                       want.mutable_data()};
            jit::compile_kernel_cpu(jit::gemm_program(t))->launch(job.grid(), bufs, job.params());
            bufs[2] = got.mutable_data();
            jit::compile_kernel_emulated(jit::gemm_program(t))
                ->launch(job.grid(), bufs, job.params());
            const auto g = got.to_f64(), w = want.to_f64();
            const double ulp = t == DType::f32 ? 1e-6 : t == DType::f16 ? 1e-3 : 8e-3;
            for (std::size_t i = 0; i < g.size(); ++i)
                ASSERT_NEAR(g[i], w[i], 1e-5 * 40 + ulp * std::abs(w[i])) << "element " << i;
        }
}

// An mma over shared tiles of element type e, A (32 x 32) stored row-major or transposed and
// B (32 x 16) likewise, in tiles of pitch 40 (rows 16-byte aligned for the half types), or of
// pitch 32 in arrays padded every 32 elements.
kir::Kernel shared_operands(kir::Elem e, bool a_trans, bool b_trans, bool padded) {
    constexpr std::int64_t M = 32, N = 16, K = 32;
    const std::int64_t P = padded ? 32 : 40, row = padded ? 32 : 0;
    kir::Builder b("shared_operands");
    const int a = b.buffer("a", kir::Elem::f32), bg = b.buffer("b", kir::Elem::f32),
              out = b.buffer("out", kir::Elem::f32);
    const int As = b.shared("As", P * P, e, row), Bs = b.shared("Bs", P * P, e, row);
    const int C = b.scratch("C", Expr(M * N));
    b.loop(
        0, M * K,
        [&](Expr x) {
            Expr i = x / K, l = x % K;
            b.store(As, a_trans ? l * P + i : i * P + l, b.load(a, x));
        },
        kir::Loop::threads);
    b.loop(
        0, K * N,
        [&](Expr x) {
            Expr l = x / N, j = x % N;
            b.store(Bs, b_trans ? l * P + j : j * P + l, b.load(bg, x));
        },
        kir::Loop::threads);
    b.loop(
        0, M * N, [&](Expr x) { b.store(C, x, 0.0); }, kir::Loop::threads);
    const kir::Precision p = e == kir::Elem::bf16 ? kir::Precision::bf16 : kir::Precision::f16;
    b.mma({C, 0, N, 1}, {As, 0, a_trans ? 1 : P, a_trans ? P : 1},
          {Bs, 0, b_trans ? P : 1, b_trans ? 1 : P}, M, N, K, p);
    b.loop(
        0, M * N, [&](Expr x) { b.store(out, b.pid() * (M * N) + x, b.load(C, x)); },
        kir::Loop::threads);
    return b.finish();
}

// ldmatrix (and .trans) fragments on the emulated device: every layout of A and B in f16 and
// bf16 shared tiles, padded or not, gives the CPU lowering's C bit for bit (operands k/8 make
// every sum exact), and takes the fragment load it should; f32 tiles take scalar loads and
// agree too.
TEST(GpuEmulator, LdmatrixFragmentsMatchTheCpu) {
    std::vector<float> a(32 * 32), bv(32 * 16);
    for (std::size_t x = 0; x < a.size(); ++x) a[x] = float(int(x * 7 % 17) - 8) / 8;
    for (std::size_t x = 0; x < bv.size(); ++x) bv[x] = float(int(x * 5 % 17) - 8) / 8;
    using FL = kir::FragmentLoad;
    for (kir::Elem e : {kir::Elem::f16, kir::Elem::bf16, kir::Elem::f32})
        for (bool at : {false, true})
            for (int layout = 0; layout < 4; ++layout) {
                const bool bt = layout & 1, padded = layout & 2;
                SCOPED_TRACE(std::string(e == kir::Elem::f32 ? "f32" : "half") +
                             (at ? " A transposed" : "") + (bt ? " B transposed" : "") +
                             (padded ? " padded" : ""));
                const kir::Kernel k = shared_operands(e, at, bt, padded);
                const kir::Mma& x = *k.body[3].mma;
                const bool half = e != kir::Elem::f32;
                EXPECT_EQ(kir::fragment_load(k, x, false), !half ? FL::elements
                                                           : at  ? FL::ldmatrix_trans
                                                                 : FL::ldmatrix);
                EXPECT_EQ(kir::fragment_load(k, x, true), !half ? FL::elements
                                                          : bt  ? FL::ldmatrix_trans
                                                                : FL::ldmatrix);
                std::vector<float> want(3 * 512, -1.0f), got(3 * 512, -1.0f);
                std::vector<void*> bufs = {a.data(), bv.data(), want.data()};
                jit::compile_kernel_cpu(k)->launch(3, bufs, {});
                bufs[2] = got.data();
                jit::compile_kernel_emulated(k)->launch(3, bufs, {});
                ASSERT_EQ(got, want);
            }
}

// Fragments (registers on the GPU, scratch on the CPU): C = A B into a fragment from shared
// f16 tiles, an element-wise update that reads the row and column, row max and row sum by
// quad shuffles, and D = C' B2 with the fragment C' as A (its registers reused as the A
// fragment), then every element out. Integer operands keep every sum exact, so the emulated
// GPU and the CPU agree bit for bit.
kir::Kernel fragment_program() {
    constexpr std::int64_t R = kir::kFragmentRows, K = 32, N = 16, N2 = 8;
    kir::Builder b("fragments");
    const int a = b.buffer("a", kir::Elem::f32), bg = b.buffer("b", kir::Elem::f32),
              out = b.buffer("out", kir::Elem::f32), stats = b.buffer("stats", kir::Elem::f32);
    const int As = b.shared("As", R * K, kir::Elem::f16, K),
              Bs = b.shared("Bs", K * N + N * N2, kir::Elem::f16, 8);
    const int C = b.fragment("C", N), D = b.fragment("D", N2);
    const int mx = b.fragment("mx", 1), sm = b.fragment("sm", 1);
    b.loop(
        0, R * K, [&](Expr x) { b.store(As, x, b.load(a, x)); }, kir::Loop::threads);
    b.loop(
        0, K * N + N * N2, [&](Expr x) { b.store(Bs, x, b.load(bg, x)); }, kir::Loop::threads);
    b.each(C, [&](Expr, Expr) { b.put(C, 0.0); });
    b.each(D, [&](Expr, Expr) { b.put(D, 0.0); });
    // B stored [j][l] (contiguous along l: ldmatrix), B2 [l][j] (.trans).
    b.mma({C, 0, N, 1}, {As, 0, K, 1}, {Bs, 0, 1, K}, R, N, K, kir::Precision::f16);
    b.each(C, [&](Expr r, Expr c) { b.put(C, b.here(C) * 2.0 + to_f32(r - c * 3)); });
    b.row_reduce(mx, C, kir::Reduce::max);
    b.row_reduce(sm, C, kir::Reduce::sum);
    b.each(mx, [&](Expr, Expr) { b.put(mx, b.here(mx) - 1.0); });
    b.mma({D, 0, N2, 1}, {C, 0, N, 1}, {Bs, K * N, N2, 1}, R, N2, N, kir::Precision::f16);
    b.each(D, [&](Expr r, Expr c) {
        b.store(out, (b.pid() * R + r) * N2 + c, b.here(D) + b.here(mx));
        b.when(c == 0, [&] {
            b.store(stats, (b.pid() * R + r) * 2, b.here(mx));
            b.store(stats, (b.pid() * R + r) * 2 + 1, b.here(sm));
        });
    });
    return b.finish();
}

TEST(GpuEmulator, FragmentsMatchTheCpu) {
    std::vector<float> a(64 * 32), bv(32 * 16 + 16 * 8);
    for (std::size_t x = 0; x < a.size(); ++x) a[x] = float(int(x * 7 % 3) - 1);
    for (std::size_t x = 0; x < bv.size(); ++x) bv[x] = float(int(x * 5 % 3) - 1);
    const kir::Kernel k = fragment_program();
    std::vector<float> want(2 * 64 * 8, -7.0f), got = want, wstats(2 * 64 * 2, -7.0f),
                                                gstats = wstats;
    std::vector<void*> bufs = {a.data(), bv.data(), want.data(), wstats.data()};
    jit::compile_kernel_cpu(k)->launch(2, bufs, {});
    bufs[2] = got.data();
    bufs[3] = gstats.data();
    jit::compile_kernel_emulated(k)->launch(2, bufs, {});
    EXPECT_EQ(got, want);
    EXPECT_EQ(gstats, wstats);
    // Not trivially equal: rows differ, and every value was written.
    EXPECT_NE(want[0], want[8]);
    for (float v : want) ASSERT_NE(v, -7.0f);
    const std::string ptx = jit::kir_ptx(k, "sm_90");
    EXPECT_NE(ptx.find("shfl.sync.bfly.b32"), std::string::npos);
    EXPECT_EQ(ptx.find(".local"), std::string::npos) << "fragments spilled to local memory";
}

// The GPU lowering computes the kernel IR's integers in 32 bits (64-bit indices took two
// registers each, and were what the tile programs spilled): the PTX has no 64-bit index
// arithmetic, the emulator runs the same 32-bit code (a sum that wraps in 32 bits shows it),
// and launches refuse parameters and buffers past 2^31 - 1.
TEST(GpuEmulator, KernelIntegersAre32BitOnTheGpu) {
    kir::Builder b("indices");
    const int in = b.buffer("in", kir::Elem::f32), out = b.buffer("out", kir::Elem::i64);
    const Expr n = b.param("n"), big = b.param("big");
    b.loop(
        0, n,
        [&](Expr x) {
            b.store(out, b.pid() * n + x, kir::to_i64(b.load(in, b.pid() * n + x)) + big + big);
        },
        kir::Loop::threads);
    const kir::Kernel k = b.finish();
    for (const std::string arch : {"sm_80", "sm_90"}) {
        const std::string ptx = jit::kir_ptx(k, arch);
        EXPECT_EQ(ptx.find("mul.lo.s64"), std::string::npos) << ptx;
        EXPECT_NE(ptx.find("mul.lo.s32"), std::string::npos) << ptx;
    }
    std::vector<float> values = {1, 2, 3, 4, 5, 6};
    std::vector<std::int64_t> cpu(6), emulated(6);
    const std::int64_t params[] = {3, std::int64_t(1) << 30};
    std::vector<void*> bufs = {values.data(), cpu.data()};
    jit::compile_kernel_cpu(k)->launch(2, bufs, params);
    bufs[1] = emulated.data();
    jit::compile_kernel_emulated(k)->launch(2, bufs, params);
    EXPECT_EQ(cpu[0], 1 + (std::int64_t(1) << 31));      // 64 bits on the CPU
    EXPECT_EQ(emulated[0], 1 - (std::int64_t(1) << 31)); // wrapped: the GPU's 32 bits
    const std::int64_t too_big[] = {3, std::int64_t(1) << 31};
    EXPECT_EQ(error_of([&] { jit::compile_kernel_emulated(k)->launch(2, bufs, too_big); }),
              "GPU kernel indices (emulated GPU): big = 2147483648 does not fit the kernels' "
              "32-bit indices (at most 2^31 - 1)");
    const std::uint64_t aligned[] = {256, 512};
    const std::size_t bytes[] = {(std::size_t(1) << 31) * 4, 48};
    EXPECT_EQ(error_of([&] { jit::check_kir_launch(k, aligned, params, "", bytes); }),
              "GPU kernel indices: buffer in holds 2147483648 elements; the kernels index at "
              "most 2^31 - 1 (split the batch)");
    const std::size_t fits[] = {((std::size_t(1) << 31) - 1) * 4, 48};
    jit::check_kir_launch(k, aligned, params, "", fits);
}

// copy16: 16-byte vector copies from a global f16 buffer into a padded shared tile (one
// load and store each, with no scalar fallback in the PTX), then out: the CPU's values. The
// vector accesses rely on every global buffer being 16-byte aligned at launch, so a launch
// with one that is not is refused (a GPU would fault on the misaligned ld.global.v4).
TEST(GpuEmulator, VectorCopiesMatchTheCpuAndNeedAlignedBuffers) {
    for (const kir::Elem e : {kir::Elem::f16, kir::Elem::bf16}) {
        SCOPED_TRACE(e == kir::Elem::f16 ? "f16" : "bf16");
        kir::Builder b("copies");
        const int src = b.buffer("src", e), out = b.buffer("out", kir::Elem::f32);
        const int tile = b.shared("tile", 16 * 32, e, 32);
        b.loop(
            0, 16 * 32 / 8, [&](Expr v) { b.copy16(tile, v * 8, src, (b.pid() * 64 + v) * 8); },
            kir::Loop::threads);
        b.loop(
            0, 16 * 32, [&](Expr x) { b.store(out, b.pid() * 512 + x, b.load(tile, x)); },
            kir::Loop::threads);
        const kir::Kernel k = b.finish();
        std::vector<std::uint16_t> halves(2 * 512 + 8);
        for (std::size_t x = 0; x < halves.size(); ++x) {
            const float f = float(x % 977);
            halves[x] = e == kir::Elem::f16 ? float_to_half(f) : float_to_bf16(f);
        }
        std::vector<float> want(1024, -1.0f), got(1024, -1.0f);
        std::vector<void*> bufs = {halves.data() + 8, want.data()};
        jit::compile_kernel_cpu(k)->launch(2, bufs, {});
        bufs[1] = got.data();
        jit::compile_kernel_emulated(k)->launch(2, bufs, {});
        EXPECT_EQ(got, want);
        EXPECT_EQ(want[1], 9.0f);
        bufs[0] = halves.data() + 7;
        EXPECT_EQ(error_of([&] { jit::compile_kernel_emulated(k)->launch(2, bufs, {}); }),
                  "internal: kernel copies (emulated GPU) launched with global buffer 0 not "
                  "16-byte aligned");
        // One 16-byte load and store per copy16 (for bf16 too, whose i16 vectors LLVM would
        // split), and no scalar fallback.
        const std::string ptx = jit::kir_ptx(k, "sm_90");
        EXPECT_NE(ptx.find("ld.global.v4.u32"), std::string::npos) << ptx;
        EXPECT_NE(ptx.find("st.shared.v4.u32"), std::string::npos) << ptx;
        for (std::size_t at = ptx.find("ld.global"); at != std::string::npos;
             at = ptx.find("ld.global", at + 1))
            EXPECT_EQ(ptx.compare(at, 17, "ld.global.v4.u32 "), 0)
                << "not one 16-byte load: " << ptx;
    }
}

// cp.async (copy16_async + await_copies): double-buffered staging, tile t + 1 in flight while
// tile t is read, gives the CPU's values, and the PTX holds cp.async with its group
// commit/wait. The emulator holds every copy in flight until a wait lands it: a program that
// reads a tile before its wait, or ends with copies in flight, is refused.
TEST(GpuEmulator, AsyncCopiesLandAtTheirWait) {
    constexpr std::int64_t tiles = 5, tile = 16 * 32; // 5 tiles of 16 x 32 f16 per instance
    // wait: the groups await_copies leaves in flight in the loop (1 is right: tile t lands);
    // last: whether the program waits for everything at its end.
    auto program = [&](std::int64_t wait, bool first_wait) {
        kir::Builder b("async_copies");
        const int src = b.buffer("src", kir::Elem::f16), out = b.buffer("out", kir::Elem::f32);
        const int two = b.shared("two", 2 * tile, kir::Elem::f16, 32);
        auto prefetch = [&](Expr t) {
            b.loop(
                0, tile / 8,
                [&](Expr v) {
                    b.copy16_async(two, t % 2 * Expr(tile) + v * 8, src,
                                   (b.pid() * tiles + t) * tile + v * 8);
                },
                kir::Loop::threads);
        };
        prefetch(Expr(std::int64_t(0)));
        if (first_wait) b.await_copies(1);
        b.loop(0, tiles, [&](Expr t) {
            b.when(t + 1 < tiles, [&] { prefetch(t + 1); });
            b.await_copies(wait);
            b.loop(
                0, tile,
                [&](Expr x) {
                    b.store(out, (b.pid() * tiles + t) * tile + x,
                            b.load(two, t % 2 * Expr(tile) + x) * 2.0);
                },
                kir::Loop::threads);
        });
        return b.finish();
    };
    std::vector<std::uint16_t> halves(std::size_t(2 * tiles * tile));
    for (std::size_t x = 0; x < halves.size(); ++x) halves[x] = float_to_half(float(x % 1013));
    std::vector<float> want(halves.size(), -1.0f), got(halves.size(), -1.0f);
    std::vector<void*> bufs = {halves.data(), want.data()};
    const kir::Kernel k = program(1, true);
    jit::compile_kernel_cpu(k)->launch(2, bufs, {});
    bufs[1] = got.data();
    jit::compile_kernel_emulated(k)->launch(2, bufs, {});
    EXPECT_EQ(got, want);
    EXPECT_EQ(want[std::size_t(tiles * tile + 3)], 2.0f * float((tiles * tile + 3) % 1013));
    const std::string ptx = jit::kir_ptx(k, "sm_80");
    for (const char* op :
         {"cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group 1"})
        EXPECT_NE(ptx.find(op), std::string::npos) << op << " in\n" << ptx;
    // Planted: waiting for all but two groups reads tile t before it lands; without the first
    // wait, tiles 0 and 1 form one group, which a wait leaving one in flight does not land.
    for (const auto& [wait, first] : {std::pair<std::int64_t, bool>{2, true}, {1, false}}) {
        const std::string e = error_of(
            [&] { jit::compile_kernel_emulated(program(wait, first))->launch(2, bufs, {}); });
        EXPECT_NE(e.find("while thread"), std::string::npos) << e;
        EXPECT_NE(e.find("cp.async to it is in flight"), std::string::npos) << e;
    }
    // Copies never waited for: refused at the end of the block.
    kir::Builder b("unawaited");
    const int src = b.buffer("src", kir::Elem::f16);
    const int sh = b.shared("sh", tile, kir::Elem::f16, 32);
    b.loop(
        0, tile / 8, [&](Expr v) { b.copy16_async(sh, v * 8, src, v * 8); }, kir::Loop::threads);
    EXPECT_NE(error_of([&] {
                  jit::compile_kernel_emulated(b.finish())
                      ->launch(1, std::vector<void*>{halves.data()}, {});
              }).find("ended with copies in flight"),
              std::string::npos);
    // 4-byte copies (small f32 rows at any element offset): the same semantics, cp.async.ca.
    for (const bool wait : {true, false}) {
        kir::Builder rows("async_rows");
        const int from = rows.buffer("from", kir::Elem::f32),
                  to = rows.buffer("to", kir::Elem::f32);
        const int row = rows.shared("row", 37);
        rows.loop(
            0, 37, [&](Expr x) { rows.copy4_async(row, x, from, rows.pid() * 37 + x + 3); },
            kir::Loop::threads);
        if (wait) rows.await_copies(0);
        rows.loop(
            0, 37, [&](Expr x) { rows.store(to, rows.pid() * 37 + x, rows.load(row, x) + 1.0); },
            kir::Loop::threads);
        const kir::Kernel k4 = rows.finish();
        std::vector<float> in(2 * 37 + 3), cpu(2 * 37, -1.0f), gpu(2 * 37, -1.0f);
        for (std::size_t x = 0; x < in.size(); ++x) in[x] = float(x) * 0.5f;
        std::vector<void*> b4 = {in.data(), cpu.data()};
        if (!wait) {
            b4[1] = gpu.data();
            EXPECT_NE(error_of([&] {
                          jit::compile_kernel_emulated(k4)->launch(2, b4, {});
                      }).find("cp.async to it is in flight"),
                      std::string::npos);
            continue;
        }
        jit::compile_kernel_cpu(k4)->launch(2, b4, {});
        b4[1] = gpu.data();
        jit::compile_kernel_emulated(k4)->launch(2, b4, {});
        EXPECT_EQ(gpu, cpu);
        EXPECT_EQ(cpu[40], in[43] + 1.0f);
        EXPECT_NE(jit::kir_ptx(k4, "sm_80").find("cp.async.ca.shared.global"), std::string::npos);
    }
    // Only global to shared.
    kir::Builder bad("bad");
    const int g = bad.buffer("g", kir::Elem::f16), g2 = bad.buffer("g2", kir::Elem::f16);
    bad.loop(
        0, 8,
        [&](Expr v) {
            EXPECT_NE(
                error_of([&] { bad.copy16_async(g2, v * 8, g, v * 8); }).find("global to shared"),
                std::string::npos);
        },
        kir::Loop::threads);
}

// The segment programs on the emulated device against their CPU lowering: bit for bit (each
// line is reduced in index order by one thread on both).
TEST(GpuEmulator, SegmentProgramsMatchTheCpuBitForBit) {
    const RaggedTensor x =
        random_batch(DType::f32, "~N, 5", shapes_for("~N, 5", {{3}, {0}, {300}, {1}}));
    const Attrs over_n{{"axis", std::int64_t(1)}};
    for (const char* op : {"sum", "mean", "softmax"}) {
        SCOPED_TRACE(op);
        const RaggedTensor want = evaluate(op, {x}, over_n);
        const ir::Node n{op, {0}, over_n, want.schema(), ""};
        const auto job = jit::segment_job(n, std::vector<RaggedTensor>{x});
        ASSERT_TRUE(job.has_value());
        std::vector<std::vector<float>> results;
        for (bool emulated : {false, true}) {
            const kir::Kernel k = jit::segment_program(job->op);
            auto kernel = emulated ? jit::compile_kernel_emulated(k) : jit::compile_kernel_cpu(k);
            std::vector<float> out(std::size_t(job->out->numel()), NAN);
            std::vector<void*> bufs = {const_cast<std::int64_t*>(job->seg.data())};
            for (const RaggedTensor& in : job->inputs) bufs.push_back(const_cast<void*>(in.data()));
            bufs.push_back(out.data());
            kernel->launch(job->grid(), bufs, {});
            results.push_back(out);
        }
        EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4));
    }
}

// Every relative-position pass (forward, query and key gradients, table reduction; recomputed
// and saved projections) lowered for the GPU and emulated, against the CPU lowering: the four
// mechanisms in f32, Transformer-XL (every table) also causal, saved and in f16, DeBERTa in
// bf16, on lengths around the 64-token strip. The half types run as the GPU runs them, on
// tensor cores (D = 16: the score products; Dv = 24: P V, while dP falls back to FMAs).
// (Each case compiles its programs twice: the cases are few.)
TEST(GpuEmulator, RelposTileProgramsMatchTheCpu) {
    const std::vector<std::int64_t> lengths = {65, 1, 0, 40};
    struct Case {
        int mechanism;
        DType t;
        bool causal, saved;
        std::int64_t Dv = 32; // half types: FlashAttention's structure (relpos_flash)
    };
    // Every map in f32 and in both half types (tensor cores, ldmatrix fragments), masks and
    // saved projections.
    std::vector<Case> cases = {{1, DType::f32, true, false},      {1, DType::f32, false, true},
                               {2, DType::bf16, true, false},     {1, DType::f16, true, true},
                               {1, DType::f16, true, false, 24}, // tiles in scratch
                               {3, DType::bf16, false, false, 24}};
    for (int mechanism = 0; mechanism < 4; ++mechanism)
        for (DType t : {DType::f32, DType::f16, DType::bf16})
            cases.push_back({mechanism, t, false, false});
    for (const Case& k : cases) {
        const Mechanism m = mechanisms(65)[std::size_t(k.mechanism)];
        SCOPED_TRACE(m.name + (k.causal ? " causal " : " bidirectional ") +
                     std::string(dtype_name(k.t)) + (k.saved ? " saved" : "") + " Dv " +
                     std::to_string(k.Dv));
        const RelposCase c = relpos_case(m, k.t, k.causal, lengths, k.Dv);
        const double tol = k.t == DType::f32 ? 1e-5 : k.t == DType::f16 ? 2e-3 : 1e-2;
        jit::RelposOptions cpu, emulated;
        cpu.save_projections = emulated.save_projections = k.saved;
        emulated.emulate_gpu = true;
        const jit::RelposForward want = jit::relpos_forward(c.in, c.at, cpu);
        const jit::RelposForward got = jit::relpos_forward(c.in, c.at, emulated);
        EXPECT_LE(rel_l2(got.out, want.out), tol) << "output";
        const auto gw = jit::relpos_backward(c.in, c.dO, c.at, &want, cpu);
        const auto gg = jit::relpos_backward(c.in, c.dO, c.at, &got, emulated);
        ASSERT_EQ(gg.size(), gw.size());
        for (std::size_t g = 0; g < gw.size(); ++g)
            EXPECT_LE(rel_l2(gg[g], gw[g]), tol) << "gradient " << g;
    }
}

// One relpos application whose tile programs run on the emulated GPU (tensor cores for the
// half types), as RelposNodes drives it on the GPU tier.
struct EmulatedRelpos : jit::RelposOnCpu {
    EmulatedRelpos(std::span<const RaggedTensor> in, const Attrs& at)
        : jit::RelposOnCpu(in, at, options()) {}
    static jit::RelposOptions options() {
        jit::RelposOptions o;
        o.emulate_gpu = true;
        return o;
    }
};

// Self-attention (attention with keys as long as the queries) through the relpos programs, as
// the GPU tier runs it: the output and the three gradients (one pass for the siblings) equal
// the reference kernels; cross-attention is not taken.
TEST(GpuEmulator, SelfAttentionRunsAsRelposWithoutTables) {
    for (DType t : {DType::f32, DType::f16})
        for (bool causal : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + (causal ? " causal" : ""));
            const std::vector<Shape_> n = {{70, 2, 16}, {0, 2, 16}, {9, 2, 16}};
            const RaggedTensor q = random_batch(t, "~N, 2, 16", n);
            const RaggedTensor k = random_batch(t, "~M, 2, 16", n);
            const RaggedTensor v = random_batch(t, "~M, 2, 16", n);
            const RaggedTensor dO = random_batch(t, "~N, 2, 16", n);
            const Attrs at{{"causal", causal}, {"scale", 0.3}};
            ir::Function f;
            ir::Builder b(f);
            const int qi = b.input(q.schema(), "q"), ki = b.input(k.schema(), "k"),
                      vi = b.input(v.schema(), "v"), gi = b.input(dO.schema(), "dO");
            f.outputs = {b.op("attention", {qi, ki, vi}, at)};
            for (std::int64_t w = 0; w < 3; ++w)
                f.outputs.push_back(
                    b.op("attention_grad", {qi, ki, vi, gi}, Attrs(at).set("wrt", w)));
            std::vector<RaggedTensor> vals = {q, k, v, dO};
            vals.resize(f.nodes.size());
            jit::RelposNodes<EmulatedRelpos> nodes(true);
            const double tol = t == DType::f32 ? 1e-5 : 3e-3;
            for (int o : f.outputs) {
                ASSERT_TRUE(nodes.run(f, std::size_t(o), vals));
                const ir::Node& node = f.nodes[std::size_t(o)];
                std::vector<RaggedTensor> args;
                for (int a : node.args) args.push_back(vals[std::size_t(a)]);
                const RaggedTensor want = evaluate(node.op, args, node.attrs);
                EXPECT_EQ(vals[std::size_t(o)].schema(), want.schema()) << node.op;
                EXPECT_LE(rel_l2(vals[std::size_t(o)], want), tol)
                    << node.op << " " << node.attrs.str();
            }
        }
    // Cross-attention (other key lengths) stays with the caller.
    const RaggedTensor q = random_batch(DType::f32, "~N, 1, 4", {{3, 1, 4}});
    const RaggedTensor kv = random_batch(DType::f32, "~M, 1, 4", {{5, 1, 4}});
    ir::Function f;
    ir::Builder b(f);
    const int qi = b.input(q.schema(), "q"), ki = b.input(kv.schema(), "k");
    f.outputs = {b.op("attention", {qi, ki, ki}, {})};
    std::vector<RaggedTensor> vals = {q, kv};
    vals.resize(f.nodes.size());
    EXPECT_FALSE(jit::RelposNodes<EmulatedRelpos>(true).run(f, std::size_t(f.outputs[0]), vals));
}

} // namespace
} // namespace rag
