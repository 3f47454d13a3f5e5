// The kernel IR (jit/kir.hpp) and its CPU lowering: builder checks, printing, and compiled
// kernels against plain C++ on the same inputs, including narrow storage types, vectorised
// inner loops and bitwise-identical results across thread counts; the bank-conflict analysis
// of its GPU lowering (jit/kir_banks.hpp) against counts made by hand.
#include "jit/kir.hpp"
#include "jit/kir_banks.hpp"

#include "jit/kir_cpu.hpp"
#include "runtime/dtype.hpp"
#include "runtime/error.hpp"
#include "runtime/memory.hpp"
#include "runtime/parallel.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

namespace rag {
namespace {

using kir::Builder;
using kir::Expr;

// Row softmax of an [rows, cols] f32 matrix, one program instance per row, with a scratch row.
kir::Kernel softmax_rows() {
    Builder b("softmax_rows");
    Expr cols = b.param("cols");
    const int in = b.buffer("in", kir::Elem::f32), out = b.buffer("out", kir::Elem::f32);
    const int tmp = b.scratch("tmp", cols);
    Expr base = b.let(b.pid() * cols, "base");
    int top = b.var(kir::Type::f32, -INFINITY);
    b.loop(0, cols, [&](Expr j) { b.set(top, max(b.get(top), b.load(in, base + j))); });
    int sum = b.var(kir::Type::f32, 0.0);
    b.loop(0, cols, [&](Expr j) {
        Expr e = b.let(exp(b.load(in, base + j) - b.get(top)));
        b.store(tmp, j, e);
        b.set(sum, b.get(sum) + e);
    });
    b.loop(0, cols, [&](Expr j) { b.store(out, base + j, b.load(tmp, j) / b.get(sum)); });
    return b.finish();
}

TEST(KernelIr, BuilderRejectsMixedTypes) {
    Builder b("bad");
    Expr n = b.param("n");
    const int buf = b.buffer("x", kir::Elem::f32);
    EXPECT_THROW(b.load(buf, Expr(1.5)), Error);           // float index
    EXPECT_THROW((void)(n + b.load(buf, Expr(0))), Error); // i64 + f32
    EXPECT_THROW(b.store(buf, Expr(0), n), Error);         // i64 into f32
    EXPECT_THROW(b.when(n, [] {}), Error);                 // non-boolean condition
    EXPECT_THROW((void)b.scratch("s", Expr(2.0)), Error);  // float size
}

TEST(KernelIr, PrintsLoopsAndBuffers) {
    const std::string text = kir::print(softmax_rows());
    EXPECT_NE(text.find("kernel softmax_rows(cols)"), std::string::npos) << text;
    EXPECT_NE(text.find("scratch tmp: f32[cols]"), std::string::npos) << text;
    EXPECT_NE(text.find("exp("), std::string::npos) << text;
}

TEST(KernelIr, EvaluatesScratchSizes) {
    Builder b("sizes");
    Expr n = b.param("n"), m = b.param("m");
    const std::int64_t params[] = {5, 7};
    EXPECT_EQ(kir::evaluate(min(n * m, Expr(30)) + 1, params), 31);
    EXPECT_THROW(kir::evaluate(b.pid() + n, params), Error);
}

TEST(KernelIr, CompiledSoftmaxMatchesCpp) {
    const std::int64_t rows = 37, cols = 53;
    std::vector<float> x(std::size_t(rows * cols)), y(x.size());
    std::mt19937 gen(3);
    std::uniform_real_distribution<float> dist(-4, 4);
    for (auto& v : x) v = dist(gen);
    auto k = jit::compile_kernel_cpu(softmax_rows());
    void* bufs[] = {x.data(), y.data()};
    const std::int64_t params[] = {cols};
    k->launch(rows, bufs, params);
    for (std::int64_t r = 0; r < rows; ++r) {
        double top = -INFINITY, sum = 0;
        for (std::int64_t c = 0; c < cols; ++c)
            top = std::max(top, double(x[std::size_t(r * cols + c)]));
        for (std::int64_t c = 0; c < cols; ++c)
            sum += std::exp(double(x[std::size_t(r * cols + c)]) - top);
        for (std::int64_t c = 0; c < cols; ++c) {
            const double want = std::exp(double(x[std::size_t(r * cols + c)]) - top) / sum;
            EXPECT_NEAR(y[std::size_t(r * cols + c)], want, 1e-6 * std::max(want, 1e-3));
        }
    }
    // The exp loop is vectorised (libmvec), and the launch's scratch was counted and freed.
    EXPECT_NE(k->llvm_ir().find("x float>"), std::string::npos);
    EXPECT_EQ(memory::stats().current, 0u);
}

TEST(KernelIr, Bf16AndF16StorageRoundLikeTheRuntime) {
    Builder b("convert");
    const int in = b.buffer("in", kir::Elem::f32), h = b.buffer("h", kir::Elem::f16),
              bf = b.buffer("bf", kir::Elem::bf16), back = b.buffer("back", kir::Elem::f32);
    b.store(h, b.pid(), b.load(in, b.pid()));
    b.store(bf, b.pid(), b.load(in, b.pid()));
    b.store(back, b.pid(), b.load(bf, b.pid()) + b.load(h, b.pid()));
    auto k = jit::compile_kernel_cpu(b.finish());
    std::vector<float> x = {1.0f, -2.5f, 3.14159265f, 1e-3f, 65504.0f, 0.333333f, -1e4f, 7.0f};
    std::vector<std::uint16_t> hb(x.size()), bb(x.size());
    std::vector<float> back_v(x.size());
    void* bufs[] = {x.data(), hb.data(), bb.data(), back_v.data()};
    k->launch(std::int64_t(x.size()), bufs, {});
    for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t want_h, want_b;
        store_from_f64(&want_h, DType::f16, 0, x[i]);
        store_from_f64(&want_b, DType::bf16, 0, x[i]);
        EXPECT_EQ(hb[i], want_h) << x[i];
        EXPECT_EQ(bb[i], want_b) << x[i];
        EXPECT_EQ(back_v[i], float(load_as_f64(&want_b, DType::bf16, 0) +
                                   load_as_f64(&want_h, DType::f16, 0)));
    }
}

TEST(KernelIr, SameBitsOnAnyThreadCount) {
    const std::int64_t rows = 301, cols = 129;
    std::vector<float> x(std::size_t(rows * cols));
    std::mt19937 gen(5);
    std::normal_distribution<float> dist;
    for (auto& v : x) v = dist(gen);
    auto k = jit::compile_kernel_cpu(softmax_rows());
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        std::vector<float> y(x.size());
        void* bufs[] = {x.data(), y.data()};
        const std::int64_t params[] = {cols};
        k->launch(rows, bufs, params);
        results.push_back(y);
    }
    set_num_threads(0);
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), x.size() * 4));
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[2].data(), x.size() * 4));
}

// C(i, j) += sum_l round(A(i, l)) round(B(l, j)) through strided, offset views of a scratch
// array (A column-major), a shared one (B with padded rows) and C, for every precision.
kir::Kernel mma_views(std::int64_t m, std::int64_t n, std::int64_t k, kir::Precision p,
                      bool accumulate = true) {
    Builder b("mma_views");
    const int a_in = b.buffer("a_in", kir::Elem::f32), b_in = b.buffer("b_in", kir::Elem::f32),
              c_io = b.buffer("c_io", kir::Elem::f32);
    const int A = b.scratch("A", Expr(3 + m * k)), B = b.shared("B", k * (n + 1)),
              C = b.scratch("C", Expr(2 + m * n));
    b.loop(0, m * k, [&](Expr x) { b.store(A, 3 + x / k + x % k * m, b.load(a_in, x)); });
    b.loop(0, k * n, [&](Expr x) { b.store(B, x / n * (n + 1) + x % n, b.load(b_in, x)); });
    b.loop(0, m * n, [&](Expr x) { b.store(C, 2 + x, b.load(c_io, x)); });
    b.mma({C, 2, n, 1}, {A, 3, 1, m}, {B, 0, n + 1, 1}, m, n, k, p, accumulate);
    b.loop(0, m * n, [&](Expr x) { b.store(c_io, x, b.load(C, 2 + x)); });
    return b.finish();
}

TEST(KernelIr, MmaRoundsItsOperandsAndReadsThroughViews) {
    const std::int64_t m = 5, n = 7, k = 9;
    std::mt19937 gen(11);
    std::uniform_real_distribution<float> dist(-2, 2);
    std::vector<float> a(std::size_t(m * k)), bm(std::size_t(k * n)), c0(std::size_t(m * n));
    for (auto* v : {&a, &bm, &c0})
        for (float& x : *v) x = dist(gen);
    // Without accumulating, C's old values (here NaN) are never read.
    for (const bool accumulate : {true, false})
        for (kir::Precision p : {kir::Precision::f32, kir::Precision::f16, kir::Precision::bf16}) {
            auto round = [&](float x) {
                return p == kir::Precision::f16    ? half_to_float(float_to_half(x))
                       : p == kir::Precision::bf16 ? bf16_to_float(float_to_bf16(x))
                                                   : x;
            };
            auto kernel = jit::compile_kernel_cpu(mma_views(m, n, k, p, accumulate));
            std::vector<float> c = c0;
            if (!accumulate) std::fill(c.begin(), c.end(), NAN);
            void* bufs[] = {a.data(), bm.data(), c.data()};
            kernel->launch(1, bufs, {});
            for (std::int64_t i = 0; i < m; ++i)
                for (std::int64_t j = 0; j < n; ++j) {
                    double want = accumulate ? c0[std::size_t(i * n + j)] : 0.0;
                    for (std::int64_t l = 0; l < k; ++l)
                        want += double(round(a[std::size_t(i * k + l)])) *
                                double(round(bm[std::size_t(l * n + j)]));
                    EXPECT_NEAR(c[std::size_t(i * n + j)], want, 1e-5) << int(p) << " " << i << j;
                }
        }
    const std::string text = kir::print(mma_views(16, 8, 16, kir::Precision::f16));
    EXPECT_NE(text.find("shared B: f32[144]"), std::string::npos) << text;
    EXPECT_NE(text.find("mma.f16 16x8x16 C[2 + r 8 + c 1] += A["), std::string::npos) << text;
    EXPECT_NE(kir::print(mma_views(16, 8, 16, kir::Precision::f16, false))
                  .find("mma.f16 16x8x16 C[2 + r 8 + c 1] = A["),
              std::string::npos);
    EXPECT_TRUE(kir::on_tensor_cores({{}, {}, {}, 16, 8, 16, kir::Precision::bf16}));
    EXPECT_FALSE(kir::on_tensor_cores({{}, {}, {}, 16, 8, 16, kir::Precision::f32}));
    EXPECT_FALSE(kir::on_tensor_cores({{}, {}, {}, 16, 4, 16, kir::Precision::f16}));
}

TEST(KernelIr, BuilderRejectsMisusedMmaAndSharedArrays) {
    Builder b("bad_mma");
    const int g = b.buffer("g", kir::Elem::f32);
    const int s = b.scratch("s", Expr(64)), t = b.shared("t", 64), u = b.shared("u", 64);
    auto mma = [&](int c, int a) { b.mma({c, 0, 8, 1}, {a, 0, 8, 1}, {u, 0, 8, 1}, 8, 8, 8, {}); };
    EXPECT_THROW(mma(g, s), Error); // a global operand
    EXPECT_THROW(mma(s, s), Error); // C is A
    EXPECT_THROW(b.loop(
                     0, 4, [&](Expr) { mma(s, t); }, kir::Loop::threads),
                 Error);
    EXPECT_NO_THROW(mma(s, t));
    EXPECT_THROW(b.shared("huge", 113 * 256), Error); // past 113 KiB with t and u
    EXPECT_THROW(b.loop(
                     0, 4, [&](Expr) { b.await_copies(0); }, kir::Loop::threads),
                 Error); // a wait is the whole block's
    EXPECT_THROW(b.await_copies(8), Error);
    Builder halves("halves");
    const int gh = halves.buffer("gh", kir::Elem::f16);
    const int h = halves.shared("h", 64, kir::Elem::f16);
    EXPECT_THROW(halves.loop(
                     0, 4, [&](Expr x) { halves.copy4_async(h, x, gh, x); }, kir::Loop::threads),
                 Error); // 4-byte elements only
    EXPECT_THROW(b.loop(
                     0, 4, [&](Expr x) { b.copy4_async(t, x, s, x); }, kir::Loop::threads),
                 Error); // from a global buffer only
    EXPECT_NO_THROW(b.loop(
        0, 4, [&](Expr x) { b.copy4_async(t, x, g, x); }, kir::Loop::threads));
    EXPECT_THROW(b.buffer("late", kir::Elem::f32), Error); // globals come first
}

TEST(KernelIr, LaunchChecksItsArguments) {
    auto k = jit::compile_kernel_cpu(softmax_rows());
    float x = 0;
    void* bufs[] = {&x};
    EXPECT_THROW(k->launch(1, bufs, {}), Error);
}

// Bank conflicts by hand: 32 lanes at word stride s hit gcd(s, 32)... distinct words per bank:
// stride 1 or 33: 1-way, 2: 2-way, 32: 32-way, 0 (one word): a broadcast, 1-way.
TEST(KernelIr, BankDegreeCountsDistinctWordsPerBank) {
    auto strided = [](std::int64_t stride, std::int64_t base = 0) {
        std::vector<std::int64_t> w;
        for (std::int64_t l = 0; l < 32; ++l) w.push_back(base + l * stride);
        return jit::bank_degree(w);
    };
    EXPECT_EQ(strided(1), 1);
    EXPECT_EQ(strided(33), 1);
    EXPECT_EQ(strided(2), 2);
    EXPECT_EQ(strided(64, 5), 32);
    EXPECT_EQ(strided(0, 7), 1);
}

// Stores and loads of a shared tile in a threads loop (lane L runs iteration lo + L) and
// tensor-core fragments of a row-major 64-wide tile: the PTX ISA's A fragment puts lanes
// 4 g + t at words 64 g + 2t (+1, +8): the 8 lanes of one t share a bank, 8-way; a 72-wide
// (padded) tile spreads them, 72 g + 2t covers 32 banks once per two g... counted: 2-way.
TEST(KernelIr, BankConflictsFollowTheLoweringsAddressing) {
    auto kernel = [](std::int64_t width, std::int64_t stride) {
        Builder b("banks");
        Expr n = b.param("n");
        const int in = b.buffer("in", kir::Elem::i64), out = b.buffer("out", kir::Elem::f32);
        const int tile = b.shared("tile", 16 * width), rhs = b.shared("rhs", 16 * 8);
        const int acc = b.shared("acc", 16 * 8);
        Expr first = b.let(b.load(in, 1), "first"); // a global load the analysis is told
        b.loop(
            first, n,
            [&](Expr i) {
                b.store(tile, i * stride, b.load(out, i));
                b.store(out, i, b.load(tile, i % 3)); // 3 words: broadcasts, 1-way
            },
            kir::Loop::threads);
        b.mma({acc, 0, 8, 1}, {tile, 0, width, 1}, {rhs, 0, 8, 1}, 16, 8, 16, kir::Precision::f16);
        return b.finish();
    };
    auto degrees = [](const kir::Kernel& k, const std::string& kind) {
        const std::int64_t params[] = {1000};
        std::vector<int> d;
        for (const auto& a :
             jit::kir_bank_conflicts(k, params, [](int, std::int64_t at) { return at * 10; }))
            if (a.kind == kind) d.push_back(a.degree);
        return d;
    };
    const kir::Kernel k = kernel(64, 2);
    EXPECT_EQ(degrees(k, "store"), std::vector<int>{2});
    EXPECT_EQ(degrees(k, "load"), std::vector<int>{1});
    EXPECT_EQ(degrees(k, "mma A"), std::vector<int>(8, 8)); // 4 registers x 2 halves
    // B: rows 2t (+1, +8) of column g in an 8-wide tile: words 16t + g (+8): 4 lanes of one g
    // in banks g, g + 16: 2-way.
    EXPECT_EQ(degrees(k, "mma B"), std::vector<int>(4, 2));
    EXPECT_EQ(degrees(k, "mma C"), std::vector<int>(4, 2)); // 8 g + 2t: banks repeat twice
    EXPECT_EQ(degrees(kernel(72, 1), "mma A"), std::vector<int>(8, 2));
    EXPECT_EQ(degrees(kernel(72, 1), "store"), std::vector<int>{1});
}

// Shared loads inside an each: lane 4g + t holds the fragment's element (g, 2t), so a read
// of x[(r - c + 63) stride + r] (the tensor-core forward's query projections by offset) asks
// lane (g, t) for word (stride + 1) g - 2t stride + const: with stride 64, banks g - 0 only
// (4-way); with stride 68, 5g - 8t, 32 distinct banks (1-way). Row-major x[64 r + c] puts the
// 8 rows in one bank (8-way) and column-major x[64 c + r] the 4 columns (4-way): each lane's
// row and column both count.
TEST(KernelIr, BankConflictsOfFragmentElementReads) {
    auto degree = [](const std::function<Expr(Expr, Expr)>& at) {
        Builder b("each_reads");
        const int x = b.shared("x", 128 * 68), f = b.fragment("f", 64);
        b.each(f, [&](Expr r, Expr c) { b.put(f, b.load(x, at(r, c))); });
        std::vector<int> d;
        for (const auto& a : jit::kir_bank_conflicts(b.finish(), {}, {}))
            if (a.kind == "load") d.push_back(a.degree);
        return d;
    };
    auto by_offset = [](std::int64_t stride) {
        return [stride](Expr r, Expr c) { return (r - c + 63) * stride + r; };
    };
    EXPECT_EQ(degree(by_offset(64)), std::vector<int>{4});
    EXPECT_EQ(degree(by_offset(68)), std::vector<int>{1});
    EXPECT_EQ(degree([](Expr r, Expr c) { return r * 64 + c; }), std::vector<int>{8});
    EXPECT_EQ(degree([](Expr r, Expr c) { return c * 64 + r; }), std::vector<int>{4});
}

// ldmatrix fragments (kir::fragment_load): each 8 x 8 matrix is one pass of 8 lanes' 16-byte
// rows. A 64-wide f16 tile puts its rows 128 bytes apart, all 8 in the same 4 banks: 8-way;
// padded by 16 bytes a row (BufferDecl::row), the rows start 36 words apart, 4 banks each,
// covering all 32 once: 1-way. B stored [l][j] (contiguous along j) takes .trans and the same
// counts; an f32 tile keeps element loads.
TEST(KernelIr, LdmatrixBankConflictsFollowThePadding) {
    auto kernel = [](kir::Elem e, std::int64_t row) {
        Builder b("ldsm_banks");
        const int a = b.shared("a", 16 * 64, e, row), bt = b.shared("bt", 64 * 64, e, row);
        const int acc = b.scratch("acc", Expr(16 * 64));
        b.mma({acc, 0, 64, 1}, {a, 0, 64, 1}, {bt, 0, 64, 1}, 16, 64, 64, kir::Precision::f16);
        return b.finish();
    };
    auto degrees = [](const kir::Kernel& k) {
        std::map<std::string, int> d;
        for (const auto& x : jit::kir_bank_conflicts(k, {}, [](int, std::int64_t) { return 0; }))
            d[x.kind] = std::max(d[x.kind], x.degree);
        return d;
    };
    const kir::Kernel plain = kernel(kir::Elem::f16, 0), padded = kernel(kir::Elem::f16, 64);
    const kir::Mma& x = *plain.body[0].mma;
    EXPECT_EQ(kir::fragment_load(plain, x, false), kir::FragmentLoad::ldmatrix);
    EXPECT_EQ(kir::fragment_load(plain, x, true), kir::FragmentLoad::ldmatrix_trans);
    EXPECT_EQ(degrees(plain), (std::map<std::string, int>{{"ldmatrix A", 8}, {"ldmatrix B", 8}}));
    EXPECT_EQ(degrees(padded), (std::map<std::string, int>{{"ldmatrix A", 1}, {"ldmatrix B", 1}}));
    const kir::Kernel f32 = kernel(kir::Elem::f32, 0);
    EXPECT_EQ(kir::fragment_load(f32, *f32.body[0].mma, false), kir::FragmentLoad::elements);
    EXPECT_EQ(degrees(f32).count("ldmatrix A"), 0u);
    // Misaligned: an operand offset that is not a multiple of 8 elements.
    Builder b("misaligned");
    const int a = b.shared("a", 16 * 72, kir::Elem::f16),
              bt = b.shared("bt", 16 * 8, kir::Elem::f16);
    const int acc = b.scratch("acc", Expr(16 * 8));
    b.mma({acc, 0, 8, 1}, {a, 4, 72, 1}, {bt, 0, 8, 1}, 16, 8, 16, kir::Precision::f16);
    const kir::Kernel m = b.finish();
    EXPECT_EQ(kir::fragment_load(m, *m.body[0].mma, false), kir::FragmentLoad::elements);
}

// Fragments are addressed only through each (here, put) and whole-fragment statements; the
// builder rejects the rest with the kernel's name.
TEST(KernelIr, FragmentMisuseIsAnError) {
    Builder b("frags");
    const int out = b.buffer("out", kir::Elem::f32);
    const int f = b.fragment("f", 16), g = b.fragment("g", 8), v = b.fragment("v", 1);
    const int sh = b.shared("sh", 64 * 16, kir::Elem::f16, 16);
    EXPECT_THROW(b.fragment("odd", 12), Error);
    EXPECT_THROW(b.here(f), Error);          // outside an each
    EXPECT_THROW(b.load(f, Expr(0)), Error); // fragments are not memory
    EXPECT_THROW(b.store(f, Expr(0), 1.0), Error);
    EXPECT_THROW(b.each(f, [&](Expr, Expr) { b.put(g, 1.0); }), Error); // other columns
    EXPECT_THROW(b.each(f, [&](Expr, Expr) { b.put(v, 1.0); }), Error); // a row vector
    EXPECT_THROW(b.each(v, [&](Expr, Expr) { b.store(out, Expr(0), 1.0); }), Error);
    EXPECT_THROW(b.each(f, [&](Expr, Expr) { b.row_reduce(v, f, kir::Reduce::max); }), Error);
    EXPECT_THROW(
        b.mma({f, 0, 16, 1}, {sh, 0, 16, 1}, {sh, 0, 16, 1}, 32, 16, 16, kir::Precision::f16),
        Error); // not the whole fragment
    EXPECT_THROW(b.mma({f, 0, 16, 1}, {sh, 0, 16, 1}, {g, 0, 8, 1}, 64, 16, 8, kir::Precision::f16),
                 Error); // a fragment B
    EXPECT_THROW(
        b.mma({f, 0, 16, 1}, {sh, 0, 16, 1}, {sh, 0, 16, 1}, 64, 16, 16, kir::Precision::f32),
        Error); // not on tensor cores
    EXPECT_THROW(b.mma({f, 0, 16, 1}, {sh, 0, 16, 1}, {sh, 0, 16, 1}, 64, 16, 16,
                       kir::Precision::f16, false),
                 Error);                                                     // C = A B into one
    b.each(f, [&](Expr r, Expr c) { b.put(f, b.here(v) + to_f32(r + c)); }); // fine
    b.mma({f, 0, 16, 1}, {sh, 0, 16, 1}, {sh, 0, 16, 1}, 64, 16, 16, kir::Precision::f16);
    EXPECT_NO_THROW(b.finish());
}

} // namespace
} // namespace rag
