// The segment programs (jit/reduce_programs.hpp: sum, mean, their gradients, softmax and its
// gradient over one axis) run here on the CPU through the kernel IR's host lowering, against
// the reference kernels on ragged batches with empty samples and every axis (ragged, static,
// the whole sample); which nodes they take; and their PTX through ptxas for sm_80 and sm_90.
// The same programs run on the GPU in gpu_exec_test.cpp.
#include "ir/op_table.hpp"
#include "jit/kir_cpu.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/reduce_programs.hpp"
#include "tests/gpu/ptxas.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <limits>
#include <map>

namespace rag {
namespace {

using namespace rag::testing;

const jit::SegOp all_ops[] = {jit::SegOp::sum,        jit::SegOp::mean,
                              jit::SegOp::expand_sum, jit::SegOp::expand_mean,
                              jit::SegOp::softmax,    jit::SegOp::softmax_grad};

// The job's program on the host; the result starts as NaN so that a missed element shows.
RaggedTensor run_on_cpu(const jit::SegmentJob& job) {
    static std::map<jit::SegOp, std::unique_ptr<jit::CpuKernel>> kernels;
    auto& k = kernels[job.op];
    if (!k) k = jit::compile_kernel_cpu(jit::segment_program(job.op));
    RaggedTensor out =
        RaggedTensor::from_f64(DType::f32, job.out,
                               std::vector<double>(std::size_t(job.out->numel()),
                                                   std::numeric_limits<double>::quiet_NaN()));
    std::vector<void*> bufs = {const_cast<std::int64_t*>(job.seg.data())};
    for (const RaggedTensor& t : job.inputs) bufs.push_back(const_cast<void*>(t.data()));
    bufs.push_back(out.mutable_data());
    k->launch(job.grid(), bufs, {});
    return out;
}

// Uniform values in [-1, 1] with t's structure.
RaggedTensor random_like(const RaggedTensor& t) {
    std::vector<double> v(std::size_t(t.numel()));
    for (double& x : v) x = uniform();
    return RaggedTensor::from_f64(DType::f32, t.structure_ptr(), v);
}

ir::Node node(const std::string& op, const Schema& type, Attrs at) {
    return ir::Node{op, {}, std::move(at), type, ""};
}

// The program's result for `op` on args equals the reference kernel's, to f32 rounding.
void expect_matches_reference(const std::string& op, const std::vector<RaggedTensor>& args,
                              const Attrs& at) {
    SCOPED_TRACE(op + "(" + at.str() + ") on " + args[0].schema().str());
    const RaggedTensor want = evaluate(op, args, at);
    auto job = jit::segment_job(node(op, want.schema(), at), args);
    ASSERT_TRUE(job.has_value());
    const RaggedTensor got = run_on_cpu(*job);
    ASSERT_TRUE(got.structure().same_as(want.structure()));
    const auto g = got.to_f64(), w = want.to_f64();
    for (std::size_t i = 0; i < g.size(); ++i)
        ASSERT_NEAR(g[i], w[i], 2e-5 * (1 + std::abs(w[i]))) << "element " << i;
}

TEST(SegmentPrograms, MatchTheReferenceOnTheCpuForEveryAxis) {
    // Storage puts ragged axes first: "3, ~M" reduces a static axis stored after the ragged
    // one; lengths give empty samples (0), single rows and samples cut into several entries.
    const std::pair<const char*, std::vector<Shape_>> cases[] = {
        {"~N, 5", {{3}, {0}, {1}, {300}, {40}}},
        {"~N, ~M, 3", {{3, 2}, {0, 4}, {5, 0}, {1, 1}, {70, 9}}},
        {"3, ~M", {{4}, {0}, {200}}},
    };
    for (const auto& [axes, lengths] : cases) {
        const auto shapes = shapes_for(axes, lengths);
        const RaggedTensor x = random_batch(DType::f32, axes, shapes, -3.0, 3.0);
        const std::int64_t rank = x.shape().logical_rank();
        for (std::int64_t axis = 0; axis < rank; ++axis) {
            for (const char* op : {"sum", "mean"}) {
                const Attrs at{{"axis", axis}};
                expect_matches_reference(op, {x}, at);
                const RaggedTensor y = evaluate(op, {x}, at);
                const RaggedTensor gy = random_like(y);
                expect_matches_reference("reduce_grad", {x, y, gy},
                                         Attrs(at).set("kind", std::string(op)));
            }
            if (axis == 0) continue; // softmax over the batch axis is an error
            // Negative axes count from the end, as in the language.
            const Attrs at{{"axis", axis - rank}};
            expect_matches_reference("softmax", {x}, at);
            const RaggedTensor y = evaluate("softmax", {x}, at);
            expect_matches_reference("softmax_grad", {y, random_like(y)}, at);
        }
    }
}

// An unbatched value (a relation table's gradient on the GPU tier) is one sample: every axis,
// counted from 0, including the first.
TEST(SegmentPrograms, MatchTheReferenceOnUnbatchedValues) {
    const RaggedTensor x = random_dense(DType::f32, {127, 4, 16}, -3.0, 3.0);
    for (std::int64_t axis = 0; axis < 3; ++axis) {
        for (const char* op : {"sum", "mean"}) {
            const Attrs at{{"axis", axis}};
            expect_matches_reference(op, {x}, at);
            const RaggedTensor y = evaluate(op, {x}, at);
            expect_matches_reference("reduce_grad", {x, y, random_like(y)},
                                     Attrs(at).set("kind", std::string(op)));
        }
        const Attrs at{{"axis", axis}};
        expect_matches_reference("softmax", {x}, at);
        const RaggedTensor y = evaluate("softmax", {x}, at);
        expect_matches_reference("softmax_grad", {y, random_like(y)}, at);
    }
}

TEST(SegmentPrograms, SoftmaxOfInfinitiesAndNansFollowsTheReference) {
    // A line of -inf only, a line with +inf, a line with a NaN, and an ordinary line.
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    RaggedTensor batch =
        RaggedTensor::from_list({DenseArray::from_f64(DType::f32, {3}, {-inf, -inf, -inf}),
                                 DenseArray::from_f64(DType::f32, {3}, {1, inf, 2}),
                                 DenseArray::from_f64(DType::f32, {3}, {0, nan, 1}),
                                 DenseArray::from_f64(DType::f32, {3}, {0.5, -1, 2})},
                                "~N");
    const Attrs at{{"axis", std::int64_t(-1)}};
    const RaggedTensor want = evaluate("softmax", {batch}, at);
    auto job = jit::segment_job(node("softmax", want.schema(), at), {&batch, 1});
    ASSERT_TRUE(job.has_value());
    const auto got = run_on_cpu(*job).to_f64(), w = want.to_f64();
    for (std::size_t i = 0; i < w.size(); ++i) {
        if (std::isnan(w[i]))
            EXPECT_TRUE(std::isnan(got[i])) << i;
        else
            EXPECT_NEAR(got[i], w[i], 1e-6) << i;
    }
}

TEST(SegmentPrograms, TakeOnlyTheNodesTheyCompute) {
    const RaggedTensor x = random_batch(DType::f32, "~N, 4", shapes_for("~N, 4", {{3}, {2}}));
    const Schema s = x.schema();
    auto job = [&](const std::string& op, Attrs at, std::vector<RaggedTensor> args, Schema type) {
        return jit::segment_job(node(op, type, std::move(at)), args);
    };
    const Attrs ax1{{"axis", std::int64_t(1)}};
    const RaggedTensor y = evaluate("sum", {x}, ax1);
    EXPECT_TRUE(job("sum", ax1, {x}, y.schema()).has_value());
    EXPECT_FALSE(job("sum", {}, {x}, y.schema()).has_value()); // global: the CPU's own kernel
    EXPECT_FALSE(job("max", ax1, {x}, y.schema()).has_value());
    const RaggedTensor x64 = x.astype(DType::f64);
    EXPECT_FALSE(job("sum", ax1, {x64}, x64.schema()).has_value()); // f32 only
    const RaggedTensor w = random_dense(DType::f32, {3, 4});        // one sample
    const Attrs ax0{{"axis", std::int64_t(0)}};
    EXPECT_TRUE(job("sum", ax0, {w}, evaluate("sum", {w}, ax0).schema()).has_value());
    EXPECT_FALSE(job("softmax", {{"axis", std::int64_t(0)}}, {x}, s).has_value());
    EXPECT_FALSE(
        job("reduce_grad", Attrs(ax1).set("kind", std::string("max")), {x, y, y}, s).has_value());
    // A gradient whose lengths disagree goes to the reference, which names the sample.
    const RaggedTensor other = random_batch(DType::f32, "~N, 4", shapes_for("~N, 4", {{3}, {5}}));
    EXPECT_FALSE(job("softmax_grad", {{"axis", std::int64_t(-1)}}, {x, other}, s).has_value());
    const Attrs ax2{{"axis", std::int64_t(2)}}; // keeps ~N, so the lengths must agree
    const RaggedTensor y_other = evaluate("sum", {other}, ax2);
    EXPECT_TRUE(
        job("reduce_grad", Attrs(ax2).set("kind", std::string("sum")), {other, y_other, y_other}, s)
            .has_value());
    EXPECT_FALSE(
        job("reduce_grad", Attrs(ax2).set("kind", std::string("sum")), {x, y_other, y_other}, s)
            .has_value());
}

TEST(SegmentPrograms, EntriesCutLongSamplesAndSkipEmptyOnes) {
    // [B, ~N, 2] summed over ~N: per sample outer 1, n = N, inner 2; over the static axis:
    // outer N (cut into kSegmentLines pieces), n 2, inner 1.
    const RaggedTensor x =
        random_batch(DType::f32, "~N, 2", shapes_for("~N, 2", {{3}, {0}, {300}}));
    const Attrs over_n{{"axis", std::int64_t(1)}}, over_2{{"axis", std::int64_t(2)}};
    const RaggedTensor yn = evaluate("sum", {x}, over_n), y2 = evaluate("sum", {x}, over_2);
    auto seg_n = jit::segment_entries(x.structure(), yn.structure(), 0);
    EXPECT_EQ(seg_n, (std::vector<std::int64_t>{0, 0, 1, 3, 2, 6, 2, 1, 0, 2, 6, 4, 1, 300, 2}));
    auto seg_2 = jit::segment_entries(x.structure(), y2.structure(), 1);
    // Sample 0: one entry of 3 lines; sample 1 is empty; sample 2: 300 lines in 128 + 128 + 44.
    ASSERT_EQ(seg_2.size(), 4u * 5);
    EXPECT_EQ((std::vector<std::int64_t>(seg_2.begin(), seg_2.begin() + 5)),
              (std::vector<std::int64_t>{0, 0, 3, 2, 1}));
    EXPECT_EQ((std::vector<std::int64_t>(seg_2.begin() + 15, seg_2.end())),
              (std::vector<std::int64_t>{6 + 256 * 2, 3 + 256, 44, 2, 1}));
}

TEST(SegmentPrograms, AssembleForSm80AndSm90) {
    if (ptxas_path().empty())
        GTEST_SKIP() << "SKIPPED: no ptxas (set RAG_PTXAS or CUDA_HOME); PTX not assembled";
    for (jit::SegOp op : all_ops) {
        const kir::Kernel k = jit::segment_program(op);
        for (const char* arch : {"sm_80", "sm_90"}) {
            const std::string ptx = jit::kir_ptx(k, arch);
            EXPECT_NE(ptx.find(".entry " + k.name + "("), std::string::npos) << k.name;
            PtxasResult r = run_ptxas(ptx, arch);
            EXPECT_EQ(r.status, 0) << k.name << " for " << arch << ":\n" << r.output;
        }
    }
}

} // namespace
} // namespace rag
