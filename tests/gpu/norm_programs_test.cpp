// The normalisation programs (jit/norm_programs.hpp: layernorm, rmsnorm and their gradients)
// run here on the CPU through the kernel IR's host lowering and on the emulated GPU, against
// the reference kernels, for f32, f16 and bf16 on ragged rows with empty samples; which nodes
// they take; and their PTX through ptxas. The GPU tier runs the same programs on the device.
#include "ir/op_table.hpp"
#include "jit/cpu_jit.hpp"
#include "jit/gpu_function.hpp"
#include "jit/kir_cpu.hpp"
#include "jit/kir_emulator.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/norm_programs.hpp"
#include "runtime/cuda.hpp"
#include "tests/gpu/ptxas.hpp"
#include "tests/gpu/relpos_cases.hpp"
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

// NaNs of structure st, so that an element a program misses shows.
RaggedTensor nans(DType t, const StructurePtr& st) {
    return RaggedTensor::from_f64(t, st, std::vector<double>(std::size_t(st->numel()), NAN));
}

// The job's results as the GPU tier assembles them: y, or every gradient in wrt order.
std::vector<RaggedTensor> run(const jit::NormJob& job, bool emulated) {
    auto compile = [&](const kir::Kernel& k) {
        return emulated ? jit::compile_kernel_emulated(k) : jit::compile_kernel_cpu(k);
    };
    const bool grad = job.op == jit::NormOp::layernorm_grad || job.op == jit::NormOp::rmsnorm_grad;
    const bool layer = job.op == jit::NormOp::layernorm || job.op == jit::NormOp::layernorm_grad;
    const RaggedTensor& x = job.inputs[0];
    const RaggedTensor& g = job.inputs[1];
    std::vector<void*> bufs;
    for (const RaggedTensor& in : job.inputs) bufs.push_back(const_cast<void*>(in.data()));
    RaggedTensor out = nans(job.dtype, x.structure_ptr());
    bufs.push_back(out.mutable_data());
    const std::size_t parts = std::size_t(std::max<std::int64_t>(job.grid() * job.C, 1));
    std::vector<float> dg_part(parts, NAN), db_part(parts, NAN);
    if (grad) bufs.push_back(dg_part.data());
    if (grad && layer) bufs.push_back(db_part.data());
    const std::int64_t params[] = {job.rows, job.C};
    compile(jit::norm_program(job.op, job.dtype, job.eps))->launch(job.grid(), bufs, params);
    if (!grad) return {out};
    std::vector<RaggedTensor> result = {out};
    for (std::vector<float>* part : {&dg_part, &db_part}) {
        if (part == &db_part && !layer) break;
        RaggedTensor sum = nans(job.dtype, g.structure_ptr());
        void* sb[] = {part->data(), sum.mutable_data()};
        const std::int64_t sp[] = {job.grid(), job.C};
        compile(jit::column_sums_program(job.dtype))->launch(jit::column_sums_grid(job.C), sb, sp);
        result.push_back(sum);
    }
    return result;
}

struct NormCase {
    ir::Function f;
    std::vector<RaggedTensor> vals;
};

// op's forward, or its gradient nodes (every wrt), over x [B, ~N, C] with empty samples.
NormCase norm_case(const std::string& op, DType t, std::int64_t C) {
    const std::vector<Shape_> n = {{0, C}, {37, C}, {5, C}, {70, C}};
    const std::string axes = "~N, " + std::to_string(C);
    const bool layer = op == "layernorm";
    NormCase c;
    c.vals = {random_batch(t, axes, n, -2, 3), random_dense(t, {C}), random_dense(t, {C}),
              random_batch(t, axes, n)};
    if (!layer) c.vals.erase(c.vals.begin() + 2);
    ir::Builder b(c.f);
    std::vector<int> in;
    const char* names[] = {"x", "g", "b", "dy"};
    for (std::size_t k = 0; k < c.vals.size(); ++k)
        in.push_back(b.input(c.vals[k].schema(), names[layer || k < 2 ? k : k + 1]));
    const Attrs eps{{"eps", 1e-3}};
    c.f.outputs = {b.op(op, std::vector<int>(in.begin(), in.end() - 1), eps)};
    for (std::int64_t w = 0; w < (layer ? 3 : 2); ++w)
        c.f.outputs.push_back(b.op(op + "_grad", in, Attrs(eps).set("wrt", w)));
    c.vals.resize(c.f.nodes.size());
    return c;
}

TEST(NormPrograms, MatchTheReferenceOnTheCpuAndTheEmulatedGpu) {
    for (const char* op : {"layernorm", "rmsnorm"})
        for (DType t : {DType::f32, DType::f16, DType::bf16})
            for (std::int64_t C : {1, 24, 64}) {
                SCOPED_TRACE(std::string(op) + " " + std::string(dtype_name(t)) +
                             " C = " + std::to_string(C));
                NormCase c = norm_case(op, t, C);
                const int fwd = c.f.outputs[0];
                const std::vector<int> grads(c.f.outputs.begin() + 1, c.f.outputs.end());
                const double tol = t == DType::f32 ? 2e-5 : t == DType::f16 ? 2e-3 : 1e-2;
                for (bool emulated : {false, true}) {
                    if (emulated && C != 24) continue; // the emulator is slow: one width
                    for (int node : {fwd, grads[0]}) {
                        const std::vector<int> also =
                            node == fwd ? std::vector<int>{}
                                        : std::vector<int>(grads.begin() + 1, grads.end());
                        auto job = jit::norm_job(c.f, node, also, c.vals);
                        ASSERT_TRUE(job.has_value());
                        const auto got = run(*job, emulated);
                        for (const auto& [at, wrt] :
                             node == fwd ? std::vector<std::pair<int, std::int64_t>>{{fwd, 0}}
                                         : job->wants) {
                            const ir::Node& m = c.f.nodes[std::size_t(at)];
                            std::vector<RaggedTensor> args;
                            for (int a : m.args) args.push_back(c.vals[std::size_t(a)]);
                            const RaggedTensor want = evaluate(m.op, args, m.attrs);
                            const RaggedTensor& mine = got[std::size_t(wrt)];
                            EXPECT_TRUE(mine.structure().same_as(want.structure())) << m.op;
                            EXPECT_LE(rel_l2(mine, want), tol)
                                << m.op << " wrt " << wrt << (emulated ? " emulated" : "");
                        }
                    }
                }
            }
}

// The GPU tier's norm steps (forward and every gradient, one pass for the siblings) against
// the CPU tier, in every dtype the programs take.
TEST(NormPrograms, GpuTierRunsThemOnTheDevice) {
    // The functions and the CPU tier's results are made without a device too.
    std::vector<std::pair<NormCase, std::vector<RaggedTensor>>> cases;
    for (const char* op : {"layernorm", "rmsnorm"})
        for (DType t : {DType::f32, DType::f16, DType::bf16}) {
            NormCase c = norm_case(op, t, 40);
            std::vector<RaggedTensor> in;
            for (const auto& n : c.f.nodes)
                if (n.op == "input") in.push_back(c.vals[in.size()]);
            cases.push_back({c, in});
        }
    std::vector<std::vector<RaggedTensor>> want;
    for (const auto& [c, in] : cases) want.push_back(jit::compile_cpu(c.f)->run(in));
    if (!cuda::available())
        GTEST_SKIP() << "SKIPPED: no CUDA device (" << cuda::unavailable_reason() << ")";
    for (std::size_t k = 0; k < cases.size(); ++k) {
        const auto& [c, in] = cases[k];
        const auto got = jit::compile_gpu(c.f)->run(in);
        const double tol = in[0].dtype() == DType::f32 ? 1e-5 : 1e-2;
        ASSERT_EQ(got.size(), want[k].size());
        for (std::size_t o = 0; o < got.size(); ++o)
            EXPECT_LE(rel_l2(got[o], want[k][o]), tol) << c.f.nodes[std::size_t(c.f.outputs[o])].op;
    }
}

TEST(NormPrograms, TakeOnlyTheirNodesAndTypes) {
    NormCase c = norm_case("layernorm", DType::f64, 4);
    EXPECT_FALSE(jit::norm_job(c.f, c.f.outputs[0], {}, c.vals).has_value()); // f64: host
    NormCase d = norm_case("rmsnorm", DType::f32, 4);
    auto job = jit::norm_job(d.f, d.f.outputs[1], {d.f.outputs[2]}, d.vals);
    ASSERT_TRUE(job.has_value());
    EXPECT_EQ(job->wants.size(), 2u);
    EXPECT_EQ(job->grid(), (112 + jit::kNormRows - 1) / jit::kNormRows);
}

TEST(NormPrograms, AssembleForSm80AndSm90) {
    if (ptxas_path().empty()) GTEST_SKIP() << "SKIPPED: no ptxas; PTX not assembled";
    for (jit::NormOp op : {jit::NormOp::layernorm, jit::NormOp::rmsnorm,
                           jit::NormOp::layernorm_grad, jit::NormOp::rmsnorm_grad})
        for (const char* arch : {"sm_80", "sm_90"}) {
            const std::string ptx = jit::kir_ptx(jit::norm_program(op, DType::bf16, 1e-5), arch);
            PtxasResult r = run_ptxas(ptx, arch);
            EXPECT_EQ(r.status, 0) << r.output;
        }
    const std::string ptx = jit::kir_ptx(jit::column_sums_program(DType::f16), "sm_90");
    EXPECT_EQ(run_ptxas(ptx, "sm_90").status, 0);
    for (const char* arch : {"sm_80", "sm_90"})
        EXPECT_EQ(run_ptxas(jit::kir_ptx(jit::row_sums_program(DType::bf16), arch), arch).status,
                  0);
}

// sum_to onto a bias on the GPU tier: row_sums' per-block partials (rows in order), then
// column_sums in block order; on the CPU lowering and the emulator, against a float64 sum of
// the rows (R not a multiple of kSumRows; one row; C = 1).
TEST(NormPrograms, RowSumsThenColumnSumsAddUpRows) {
    for (const DType t : {DType::f32, DType::f16, DType::bf16})
        for (const auto& [R, C] :
             std::vector<std::pair<std::int64_t, std::int64_t>>{{200, 48}, {1, 5}, {130, 1}})
            for (const bool emulated : {false, true}) {
                SCOPED_TRACE(std::string(dtype_name(t)) + " R=" + std::to_string(R) +
                             " C=" + std::to_string(C) + (emulated ? " emulated" : ""));
                auto compile = [&](const kir::Kernel& k) {
                    return emulated ? jit::compile_kernel_emulated(k) : jit::compile_kernel_cpu(k);
                };
                const RaggedTensor x = random_dense(t, {R, C});
                const std::int64_t P = jit::row_sums_grid(R);
                std::vector<float> part(std::size_t(P * C), NAN);
                void* rb[] = {const_cast<void*>(x.data()), part.data()};
                const std::int64_t rp[] = {R, C};
                compile(jit::row_sums_program(t))->launch(P, rb, rp);
                RaggedTensor sum = nans(t, random_dense(t, {C}).structure_ptr());
                void* sb[] = {part.data(), sum.mutable_data()};
                const std::int64_t sp[] = {P, C};
                compile(jit::column_sums_program(t))->launch(jit::column_sums_grid(C), sb, sp);
                const std::vector<double> xs = x.to_f64(), got = sum.to_f64();
                for (std::int64_t c = 0; c < C; ++c) {
                    double want = 0;
                    for (std::int64_t r = 0; r < R; ++r) want += xs[std::size_t(r * C + c)];
                    // f32 sums of R terms of at most 1, then rounded to t.
                    const double tol = (t == DType::f32   ? 1e-5
                                        : t == DType::f16 ? 2e-3
                                                          : 1.6e-2) *
                                       std::max(1.0, std::abs(want));
                    EXPECT_NEAR(got[std::size_t(c)], want, tol) << "column " << c;
                }
            }
}

} // namespace
} // namespace rag
