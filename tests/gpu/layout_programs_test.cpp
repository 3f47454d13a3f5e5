// The transpose program (jit/layout_programs.hpp) here on the CPU through the kernel IR's host
// lowering and on the emulated GPU (race detector on), against the reference transpose, for
// f32, f16 and bf16: a weight's two axes, static axes of a ragged batch with a middle and an
// inner axis, empty samples; which transposes it takes; and its PTX through ptxas.
#include "ir/interpreter.hpp"
#include "jit/kir_cpu.hpp"
#include "jit/kir_emulator.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/layout_programs.hpp"
#include "tests/gpu/ptxas.hpp"
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

ir::Node transpose_node(const RaggedTensor& x, std::int64_t a, std::int64_t b) {
    const Attrs at{{"a", a}, {"b", b}};
    return {"transpose", {0}, at, evaluate("transpose", {x}, at).schema(), ""};
}

TEST(LayoutPrograms, TransposesMatchTheReference) {
    struct Case {
        const char* axes;
        std::vector<Shape_> shapes; // per sample; one for an unbatched value
        std::int64_t a, b;          // logical numbering: a batch's per-sample axes from 1
    };
    const std::vector<Case> cases = {
        {"", {{37, 70}}, 0, 1},                                                        // a weight
        {"~N, 3, 5, 4, 2", {{2, 3, 5, 4, 2}, {0, 3, 5, 4, 2}, {7, 3, 5, 4, 2}}, 2, 4}, // mid, inner
        {"~N, 16, 4", {{3, 16, 4}, {0, 16, 4}, {5, 16, 4}}, 3, 2},
    };
    for (const DType t : {DType::f32, DType::f16, DType::bf16})
        for (const Case& c : cases) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " " + c.axes);
            const RaggedTensor x =
                *c.axes ? random_batch(t, c.axes, c.shapes) : random_dense(t, c.shapes[0]);
            const ir::Node n = transpose_node(x, c.a, c.b);
            const RaggedTensor want = evaluate("transpose", {x}, n.attrs);
            const std::optional<jit::TransposeJob> job = jit::transpose_job(n, x);
            ASSERT_TRUE(job.has_value());
            ASSERT_EQ(job->out->sizes(), want.structure().sizes());
            const kir::Kernel k = jit::transpose_program(t);
            for (const bool emulated : {false, true}) {
                RaggedTensor got = RaggedTensor::from_f64(
                    t, job->out, std::vector<double>(std::size_t(x.numel()), NAN));
                std::vector<void*> bufs = {const_cast<void*>(x.data()), got.mutable_data()};
                const auto params = job->params();
                (emulated ? jit::compile_kernel_emulated(k) : jit::compile_kernel_cpu(k))
                    ->launch(job->grid(), bufs, params);
                EXPECT_EQ(got.to_f64(), want.to_f64()) << (emulated ? "emulated" : "cpu");
            }
        }
}

TEST(LayoutPrograms, TakeStaticAxesThatMoveElementsOnly) {
    const RaggedTensor ragged = random_batch(DType::f32, "~N, 4", {{3, 4}, {2, 4}});
    EXPECT_FALSE(jit::transpose_job(transpose_node(ragged, 1, 2), ragged).has_value()); // ~N
    const RaggedTensor ones = random_dense(DType::f32, {1, 6});
    EXPECT_FALSE(jit::transpose_job(transpose_node(ones, 0, 1), ones).has_value()); // a view
    const RaggedTensor f64 = random_dense(DType::f64, {3, 6});
    EXPECT_FALSE(jit::transpose_job(transpose_node(f64, 0, 1), f64).has_value());
    const RaggedTensor w = random_dense(DType::f16, {3, 6});
    EXPECT_TRUE(jit::transpose_job(transpose_node(w, 0, 1), w).has_value());
}

TEST(LayoutPrograms, PtxAssembles) {
    for (const DType t : {DType::f32, DType::f16, DType::bf16})
        for (const char* arch : {"sm_80", "sm_90"}) {
            const PtxasResult r = run_ptxas(jit::kir_ptx(jit::transpose_program(t), arch), arch);
            EXPECT_EQ(r.status, 0) << dtype_name(t) << " " << arch << ":\n" << r.output;
        }
}

} // namespace
} // namespace rag
