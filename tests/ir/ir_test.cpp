// The IR: builder, verifier, printer, dead-code elimination, inlining, the interpreter and
// reverse-mode autodiff on functions built by hand.
#include "ir/autodiff.hpp"
#include "ir/interpreter.hpp"
#include "tests/support/program.hpp"
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

Schema ragged(DType t, std::string_view axes) {
    return {t, Shape{true, parse_axes(axes)}};
}
Schema dense(DType t, std::string_view axes) {
    return {t, Shape{false, parse_axes(axes)}};
}

// loss(x, w) = mean(tanh(x * w) * x) + sum(x) * 0.5
ir::Function small_loss(DType t) {
    ir::Function f;
    f.name = "small";
    ir::Builder b(f);
    int x = b.input(ragged(t, "~N, 3"), "x");
    int w = b.input(dense(t, "3"), "w");
    int h = b.op("tanh", {b.op("mul", {x, w})}, {}, "h");
    int m = b.op("mean", {b.op("mul", {h, x})});
    int s = b.op("mul", {b.op("sum", {x}), b.constant(0.5, t)});
    b.op("exp", {x}); // dead
    f.outputs = {b.op("add", {m, s}, {}, "loss")};
    return f;
}

TEST(Ir, BuilderInfersSchemasAndPrints) {
    ir::Function f = small_loss(DType::f32);
    ir::verify(f);
    std::string text = ir::print(f);
    EXPECT_NE(text.find("fn small(%0: f32[B, ~N, 3] x, %1: f32[3] w) -> (f32[])"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("= tanh(%2) : f32[B, ~N, 3]  # h"), std::string::npos) << text;
    EXPECT_NE(text.find("= const 0.5 : f32[]"), std::string::npos) << text;
}

TEST(Ir, DeadCodeIsRemoved) {
    ir::Function f = small_loss(DType::f32);
    ir::Function g = ir::eliminate_dead_code(f);
    ir::verify(g);
    EXPECT_EQ(g.nodes.size() + 1, f.nodes.size());
    EXPECT_EQ(ir::print(g).find("exp"), std::string::npos);
}

TEST(Ir, VerifierRejectsBrokenFunctions) {
    ir::Function f = small_loss(DType::f32);
    f.nodes[3].type.dtype = DType::f64;
    EXPECT_NE(error_of([&] { ir::verify(f); }).find("type rule gives"), std::string::npos);
    ir::Function g = small_loss(DType::f32);
    g.nodes[2].args = {5, 1};
    EXPECT_NE(error_of([&] { ir::verify(g); }).find("before it is defined"), std::string::npos);
}

TEST(Ir, InterpreterChecksArguments) {
    ir::Function f = small_loss(DType::f32);
    auto x = random_batch(DType::f32, "~N, 3", {{2, 3}});
    auto w = random_dense(DType::f32, {4});
    auto msg = error_of([&] { ir::interpret(f, {x, w}); });
    EXPECT_NE(msg.find("argument 1 (w) has schema f32[4], expected f32[3]"), std::string::npos)
        << msg;
    EXPECT_NE(error_of([&] { ir::interpret(f, {x}); }).find("takes 2 tensors"), std::string::npos);
}

TEST(Ir, InterpreterMatchesPerSampleComputation) {
    ir::Function f = small_loss(DType::f64);
    auto x = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", {{0}, {1}, {4}}));
    auto w = random_dense(DType::f64, {3});
    double want = 0, total = 0, count = 0;
    auto wv = w.to_f64();
    for (const Nd& s : samples(x))
        for (std::int64_t k = 0; k < s.numel(); ++k) {
            want += std::tanh(s.v[k] * wv[k % 3]) * s.v[k];
            total += s.v[k];
            ++count;
        }
    EXPECT_NEAR(ir::interpret(f, {x, w})[0].item(), want / count + 0.5 * total, 1e-12);
}

TEST(Autodiff, GradientsMatchFiniteDifferences) {
    ir::Function f = small_loss(DType::f64);
    auto x = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", {{0}, {1}, {4}}));
    auto w = random_dense(DType::f64, {3});
    check_program_gradient(f, {x, w}, {0, 1});
    check_program_gradient(f, {x, w}, {1});
}

TEST(Autodiff, UnusedInputsGetZeroGradients) {
    ir::Function f;
    f.name = "unused";
    ir::Builder b(f);
    int x = b.input(ragged(DType::f64, "~N"), "x");
    int y = b.input(dense(DType::f64, "2"), "y");
    f.outputs = {b.op("sum", {b.op("exp", {x})})};
    auto d = ir::differentiate(f, 0, {1});
    auto out =
        ir::interpret(d, {random_batch(DType::f64, "~N", {{3}}), random_dense(DType::f64, {2})});
    EXPECT_EQ(out[1].to_f64(), (std::vector<double>{0, 0}));
    (void)y;
}

TEST(Autodiff, SharedValuesAccumulate) {
    // loss = sum(x * x + x): d/dx = 2x + 1, x used three times.
    ir::Function f;
    f.name = "shared";
    ir::Builder b(f);
    int x = b.input(ragged(DType::f64, "~N, 2"), "x");
    f.outputs = {b.op("sum", {b.op("add", {b.op("mul", {x, x}), x})})};
    auto xs = random_batch(DType::f64, "~N, 2", {{2, 2}, {1, 2}});
    auto g = ir::interpret(ir::differentiate(f, 0, {0}), {xs})[1].to_f64();
    auto xv = xs.to_f64();
    for (std::size_t k = 0; k < xv.size(); ++k) EXPECT_NEAR(g[k], 2 * xv[k] + 1, 1e-12);
}

// The seed dL/dL is a constant, so a gradient that does not return the loss does not read
// it: the loss's last op (a cross entropy's log-sum-exp over every row) is dead code.
TEST(Autodiff, AGradientAloneDoesNotComputeTheLoss) {
    ir::Function f;
    f.name = "ce";
    ir::Builder b(f);
    int z = b.input(ragged(DType::f32, "~N, 4"), "z");
    int y = b.input(ragged(DType::i64, "~N"), "y");
    f.outputs = {b.op("cross_entropy", {z, y})};
    ir::Function d = ir::differentiate(f, 0, {0});
    d.outputs.erase(d.outputs.begin()); // keep the gradient only
    d = ir::eliminate_dead_code(d);
    for (const ir::Node& n : d.nodes) EXPECT_NE(n.op, "cross_entropy") << ir::print(d);
}

TEST(Autodiff, RejectsNonScalarResults) {
    ir::Function f;
    f.name = "vec";
    ir::Builder b(f);
    f.outputs = {b.op("exp", {b.input(ragged(DType::f32, "~N"), "x")})};
    EXPECT_NE(
        error_of([&] { ir::differentiate(f, 0, {0}); }).find("must return a floating-point scalar"),
        std::string::npos);
}

TEST(Ir, InlineCall) {
    ir::Function callee = small_loss(DType::f64);
    ir::Function f;
    f.name = "caller";
    ir::Builder b(f);
    int x = b.input(ragged(DType::f64, "~N, 3"), "x");
    int w = b.input(dense(DType::f64, "3"), "w");
    auto outs = ir::inline_call(f, callee, {x, w});
    f.outputs = {b.op("scale", {outs[0]}, {{"c", 2.0}})};
    ir::verify(f);
    auto xs = random_batch(DType::f64, "~N, 3", {{2, 3}});
    auto ws = random_dense(DType::f64, {3});
    EXPECT_NEAR(ir::interpret(f, {xs, ws})[0].item(), 2 * ir::interpret(callee, {xs, ws})[0].item(),
                1e-12);
}

TEST(Ir, WithDtypeRetypesAProgram) {
    ir::Function f = with_dtype(small_loss(DType::f32), DType::f32, DType::f64);
    ir::verify(f);
    EXPECT_EQ(f.type(f.outputs[0]).str(), "f64[]");
}

} // namespace
} // namespace rag
