// The GEMM tile program (jit/gemm_programs.hpp) run here on the CPU through the kernel IR's
// host lowering: shapes with partial tiles in every direction, a transposed operand, every
// dtype it takes, and the GEMM steps of functions (x @ W over ragged rows, the weight
// gradient) against the reference kernels. Its PTX uses tensor cores and shared memory for the
// half types and assembles for sm_80 and sm_90. The GPU tier runs the same program on the
// device (gpu_exec_test.cpp).
#include "ir/op_table.hpp"
#include "jit/gemm_programs.hpp"
#include "jit/kir_cpu.hpp"
#include "jit/kir_gpu.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/norm_programs.hpp"
#include "runtime/cuda.hpp"
#include "tests/gpu/ptxas.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <map>

namespace rag {
namespace {

using namespace rag::testing;

const DType gemm_dtypes[] = {DType::f32, DType::f16, DType::bf16};

const jit::CpuKernel& program(DType t) {
    static std::map<DType, std::unique_ptr<jit::CpuKernel>> kernels;
    auto& k = kernels[t];
    if (!k) k = jit::compile_kernel_cpu(jit::gemm_program(t));
    return *k;
}

// Half an ulp of t at |x| (the output's rounding) plus f32 sums of `terms` of magnitude `mag`.
double tolerance(DType t, double x, double mag) {
    const double ulp = t == DType::f16 ? std::ldexp(1.0, -10) : t == DType::bf16 ? 1.0 / 128 : 0;
    return std::abs(x) * ulp + mag * 1e-5 + 1e-30;
}

struct Operands {
    RaggedTensor a, b, c;
    jit::GemmJob job;
};

Operands random_operands(DType t, std::int64_t M, std::int64_t N, std::int64_t K, bool transposed) {
    Operands o{random_dense(t, transposed ? Shape_{K, M} : Shape_{M, K}),
               random_dense(t, {K, N}),
               random_dense(t, {M, N}),
               {}}; // c: overwritten everywhere, or the check fails
    o.job.M = M;
    o.job.N = N;
    o.job.K = K;
    o.job.a_transposed = transposed;
    return o;
}

// C = A B, A read from a[M, K] or, transposed, from a[K, M], against a float64 sum of the stored
// values.
void expect_gemm(DType t, std::int64_t M, std::int64_t N, std::int64_t K, bool transposed) {
    SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(M) + "x" + std::to_string(N) +
                 "x" + std::to_string(K) + (transposed ? " A transposed" : ""));
    Operands o = random_operands(t, M, N, K, transposed);
    std::vector<void*> bufs = {const_cast<void*>(o.a.data()), const_cast<void*>(o.b.data()),
                               o.c.mutable_data()};
    program(t).launch(o.job.grid(), bufs, o.job.params());
    const auto av = o.a.to_f64(), bv = o.b.to_f64(), cv = o.c.to_f64();
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j) {
            double want = 0, mag = 0;
            for (std::int64_t l = 0; l < K; ++l) {
                const double x = av[std::size_t(transposed ? l * M + i : i * K + l)];
                want += x * bv[std::size_t(l * N + j)];
                mag += std::abs(x * bv[std::size_t(l * N + j)]);
            }
            ASSERT_NEAR(cv[std::size_t(i * N + j)], want, tolerance(t, want, mag))
                << "C(" << i << ", " << j << ")";
        }
}

TEST(GemmProgram, MatchesFloat64ProductsOfTheStoredValues) {
    for (DType t : gemm_dtypes)
        for (bool transposed : {false, true}) {
            expect_gemm(t, 1, 1, 1, transposed);
            expect_gemm(t, 64, 64, 32, transposed); // exactly one tile and slice
            expect_gemm(t, 70, 33, 45, transposed); // partial tiles in M, N and K
            expect_gemm(t, 5, 130, 97, transposed);
        }
}

// The GEMM steps of a function as the GPU tier launches them (gemm_job), on ragged rows with
// an empty sample, against the reference kernels.
// Split K: per-split f32 partials summed in split order (column_sums_program) give the
// product, and split_for splits only what has too few tiles.
TEST(GemmProgram, SplitKPartialsSumToTheProduct) {
    for (DType t : gemm_dtypes)
        for (std::int64_t splits : {2, 3, 7}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " splits " + std::to_string(splits));
            Operands o = random_operands(t, 70, 33, 500, true);
            o.job.splits = splits;
            std::vector<float> part(std::size_t(splits * 70 * 33), NAN);
            std::vector<void*> bufs = {const_cast<void*>(o.a.data()), const_cast<void*>(o.b.data()),
                                       part.data()};
            jit::compile_kernel_cpu(jit::gemm_program(t, true))
                ->launch(o.job.grid(), bufs, o.job.params());
            void* sb[] = {part.data(), o.c.mutable_data()};
            const std::int64_t sp[] = {splits, 70 * 33};
            jit::compile_kernel_cpu(jit::column_sums_program(t))
                ->launch(jit::column_sums_grid(70 * 33), sb, sp);
            const auto av = o.a.to_f64(), bv = o.b.to_f64(), cv = o.c.to_f64();
            for (std::int64_t i = 0; i < 70; ++i)
                for (std::int64_t j = 0; j < 33; ++j) {
                    double want = 0, mag = 0;
                    for (std::int64_t l = 0; l < 500; ++l) {
                        const double p = av[std::size_t(l * 70 + i)] * bv[std::size_t(l * 33 + j)];
                        want += p;
                        mag += std::abs(p);
                    }
                    ASSERT_NEAR(cv[std::size_t(i * 33 + j)], want, tolerance(t, want, mag));
                }
        }
    jit::GemmJob w; // a weight gradient: [128, 128] over 16384 rows
    w.M = w.N = 128;
    w.K = 16384;
    w.split_for(132);
    EXPECT_EQ(w.splits, 64); // 66 would fill the device; at least 8 slices each allows 64
    EXPECT_EQ(w.Kc(), 256);
    jit::GemmJob x; // x @ W over many rows: tiles enough
    x.M = 16384;
    x.N = x.K = 128;
    x.split_for(132);
    EXPECT_EQ(x.splits, 1);
    EXPECT_GE(x.Kc(), x.K);
}

TEST(GemmProgram, FunctionStepsMatchTheReference) {
    for (DType t : gemm_dtypes) {
        SCOPED_TRACE(dtype_name(t));
        const std::vector<Shape_> lengths = {{0}, {37}, {70}, {1}};
        const RaggedTensor x = random_batch(t, "~N, 24", shapes_for("~N, 24", lengths));
        const RaggedTensor w = random_dense(t, {24, 40});
        const RaggedTensor g = random_batch(t, "~N, 40", shapes_for("~N, 40", lengths));
        for (const auto& [op, args] :
             std::vector<std::pair<std::string, std::vector<RaggedTensor>>>{
                 {"matmul", {x, w}}, {"matmul_weight_grad", {x, g}}}) {
            SCOPED_TRACE(op);
            const RaggedTensor want = evaluate(op, args, {});
            const ir::Node n{op, {0, 1}, {}, want.schema(), ""};
            const auto job = jit::gemm_job(n, args);
            ASSERT_TRUE(job.has_value());
            ASSERT_EQ(job->a_transposed, op == "matmul_weight_grad");
            RaggedTensor got = RaggedTensor::zeros(t, job->out);
            ASSERT_TRUE(got.structure().same_as(want.structure()));
            std::vector<void*> bufs = {const_cast<void*>(args[0].data()),
                                       const_cast<void*>(args[1].data()), got.mutable_data()};
            program(t).launch(job->grid(), bufs, job->params());
            const auto gv = got.to_f64(), wv = want.to_f64();
            for (std::size_t i = 0; i < gv.size(); ++i)
                ASSERT_NEAR(gv[i], wv[i], tolerance(t, wv[i], 140)) << "element " << i;
        }
    }
}

// On a device: the tensor-core fragments (half types) and the FMA path (f32) give the CPU's
// results, to the accumulation order.
TEST(GemmProgram, RunsOnTheDeviceLikeOnTheCpu) {
    if (!cuda::available())
        GTEST_SKIP() << "SKIPPED: no CUDA device (" << cuda::unavailable_reason() << ")";
    for (DType t : gemm_dtypes)
        for (bool transposed : {false, true}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + (transposed ? " A transposed" : ""));
            Operands o = random_operands(t, 150, 72, 200, transposed);
            // The device's C starts as o.c's random values; the CPU writes another buffer.
            RaggedTensor want = random_dense(t, {150, 72});
            std::vector<void*> bufs = {const_cast<void*>(o.a.data()), const_cast<void*>(o.b.data()),
                                       want.mutable_data()};
            program(t).launch(o.job.grid(), bufs, o.job.params());
            const jit::GpuKernel& k =
                jit::gpu_kernel(std::string("test/gemm/").append(dtype_name(t)),
                                [t] { return jit::gemm_program(t); });
            const cuda::Buffer a = jit::to_device(o.a), b = jit::to_device(o.b),
                               c = jit::to_device(o.c);
            const cuda::Buffer* ptrs[] = {&a, &b, &c};
            k.launch(o.job.grid(), ptrs, o.job.params());
            const auto got = jit::from_device(c, t, o.c.structure_ptr()).to_f64();
            const auto wv = want.to_f64();
            for (std::size_t i = 0; i < got.size(); ++i)
                ASSERT_NEAR(got[i], wv[i], tolerance(t, wv[i], 200)) << "element " << i;
        }
}

TEST(GemmProgram, TakesOnlyUnbatchedWeightsAndWeightGradients) {
    const RaggedTensor x = random_batch(DType::f32, "~N, 4", shapes_for("~N, 4", {{3}, {2}}));
    const RaggedTensor y = random_batch(DType::f32, "~N, 4", shapes_for("~N, 4", {{3}, {2}}));
    const ir::Node add{"add", {0, 1}, {}, x.schema(), ""};
    EXPECT_FALSE(jit::gemm_job(add, {x, y}).has_value());
    const ir::Node neg{"neg", {0}, {}, x.schema(), ""}; // one argument: not even looked at
    EXPECT_FALSE(jit::gemm_job(neg, {x}).has_value());
}

std::size_t count(const std::string& s, const std::string& what) {
    std::size_t n = 0;
    for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
}

TEST(GemmProgram, HalfTypesUseTensorCoresAndSharedMemory) {
    const std::map<DType, std::string> mma = {
        {DType::f16, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"},
        {DType::bf16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}};
    for (DType t : gemm_dtypes)
        for (const char* arch : {"sm_80", "sm_90"}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " " + arch);
            const std::string ptx = jit::kir_ptx(jit::gemm_program(t), arch);
            if (t == DType::f32) {
                EXPECT_EQ(count(ptx, "mma.sync"), 0u); // f32 products: FMAs
            } else {
                EXPECT_NE(ptx.find(mma.at(t)), std::string::npos); // maybe unrolled over K
            }
            EXPECT_EQ(count(ptx, ".shared .align 16 .b8"), 3u) << ptx; // As, Bs, Cs
            EXPECT_GE(count(ptx, "ld.shared"), 1u);
            if (!ptxas_path().empty()) {
                PtxasResult r = run_ptxas(ptx, arch);
                EXPECT_EQ(r.status, 0) << r.output;
            }
        }
}

} // namespace
} // namespace rag
