// Elementwise ops against per-sample dense references, broadcasting that creates ragged axes,
// and every VJP against float64 central differences.
#include "tests/support/testing.hpp"

#include <cmath>

namespace rag {
namespace {

using namespace rag::testing;

const char* unary_names[] = {"neg",  "exp",     "log",  "sqrt", "rsqrt", "abs",
                             "tanh", "sigmoid", "relu", "gelu", "silu"};

double unary_ref(std::string_view op, double x) {
    if (op == "neg") return -x;
    if (op == "exp") return std::exp(x);
    if (op == "log") return std::log(x);
    if (op == "sqrt") return std::sqrt(x);
    if (op == "rsqrt") return 1 / std::sqrt(x);
    if (op == "abs") return std::fabs(x);
    if (op == "tanh") return std::tanh(x);
    if (op == "sigmoid") return 1 / (1 + std::exp(-x));
    if (op == "relu") return std::max(x, 0.0);
    if (op == "gelu") return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    if (op == "silu") return x / (1 + std::exp(-x));
    return NAN;
}

bool positive_domain(std::string_view op) {
    return op == "log" || op == "sqrt" || op == "rsqrt";
}

TEST(Unary, MatchesPerSampleReferenceAndKeepsStructure) {
    for (const char* op : unary_names) {
        auto lengths = random_lengths(5, 1, 0, 6);
        double lo = positive_domain(op) ? 0.2 : -2, hi = 2;
        auto x = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", lengths), lo, hi);
        auto y = evaluate(op, {x});
        EXPECT_EQ(y.structure_ptr(), x.structure_ptr()) << op;
        std::vector<Nd> want;
        for (Nd s : samples(x)) {
            for (double& v : s.v) v = unary_ref(op, v);
            want.push_back(s);
        }
        EXPECT_TRUE(samples_close(y, want, 1e-12, 1e-12)) << op;
    }
}

TEST(Unary, Gradients) {
    for (const char* op : unary_names) {
        double lo = positive_domain(op) ? 0.3 : -2, hi = 2;
        auto x =
            random_batch(DType::f64, "~N, ~N, 2", shapes_for("~N, ~N, 2", {{0}, {1}, {3}}), lo, hi);
        check_vjp(op, {x});
    }
}

TEST(Unary, RejectsIntegers) {
    auto x = random_batch(DType::i32, "~N", {{2}, {3}});
    EXPECT_NE(error_of([&] { evaluate("exp", {x}); }).find("floating-point"), std::string::npos);
}

TEST(Binary, BroadcastCreatesSquarePairAxes) {
    // a[:, :, new, :] + b[:, new, :, :] as [B, ~N, 1, C] + [B, 1, ~N, C].
    auto lengths = std::vector<Shape_>{{2}, {3}};
    auto a = random_batch(DType::f64, "~N, 1, 4", shapes_for("~N, 1, 4", lengths));
    auto b = random_batch(DType::f64, "1, ~N, 4", shapes_for("1, ~N, 4", lengths));
    auto y = evaluate("add", {a, b});
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, ~N, 4]");
    EXPECT_EQ(y.structure().offsets(), (std::vector<std::int64_t>{0, 4, 13}));
    auto as = samples(a), bs = samples(b);
    std::vector<Nd> want;
    for (std::size_t i = 0; i < 2; ++i) {
        std::int64_t n = lengths[i][0];
        Nd s({n, n, 4});
        for (std::int64_t p = 0; p < n; ++p)
            for (std::int64_t q = 0; q < n; ++q)
                for (std::int64_t c = 0; c < 4; ++c)
                    s({p, q, c}) = as[i]({p, 0, c}) + bs[i]({0, q, c});
        want.push_back(s);
    }
    EXPECT_TRUE(samples_close(y, want));
    check_vjp("add", {a, b});
    check_vjp("mul", {a, b});
}

TEST(Binary, BroadcastCreatesRectangularPairAxes) {
    auto lengths = std::vector<Shape_>{{2, 5}, {0, 3}, {4, 1}};
    auto a = random_batch(DType::f64, "~N, 1, 2", shapes_for("~N, 1, 2", lengths));
    auto b = random_batch(DType::f64, "1, ~M, 2", {{1, 5, 2}, {1, 3, 2}, {1, 1, 2}});
    auto y = evaluate("sub", {a, b});
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, ~M, 2]");
    EXPECT_EQ(y.structure().offsets(), (std::vector<std::int64_t>{0, 10, 10, 14}));
    auto as = samples(a), bs = samples(b);
    for (std::size_t i = 0; i < 3; ++i) {
        auto ys = samples(y)[i];
        for (std::int64_t p = 0; p < lengths[i][0]; ++p)
            for (std::int64_t q = 0; q < lengths[i][1]; ++q)
                EXPECT_DOUBLE_EQ(ys({p, q, 1}), as[i]({p, 0, 1}) - bs[i]({0, q, 1}));
    }
    check_vjp("sub", {a, b});
}

TEST(Binary, DenseWeightAndScalarBroadcastAgainstRaggedBatch) {
    auto x = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", random_lengths(4, 1, 0, 5)));
    auto w = random_dense(DType::f64, {3});
    auto s = random_dense(DType::f64, {});
    auto y = evaluate("mul", {evaluate("add", {x, w}), s});
    std::vector<Nd> want;
    auto wv = w.to_f64();
    for (Nd xs : samples(x)) {
        for (std::int64_t k = 0; k < xs.numel(); ++k) xs.v[k] = (xs.v[k] + wv[k % 3]) * s.item();
        want.push_back(xs);
    }
    EXPECT_TRUE(samples_close(y, want));
    for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum"}) {
        check_vjp(op, {x, w});
        check_vjp(op, {s, x});
    }
}

TEST(Binary, PerSampleScalarBroadcast) {
    // [B] scalars per sample, used as [B, 1] against [B, ~N].
    auto lengths = random_lengths(3, 1, 0, 4);
    auto x = random_batch(DType::f64, "~N", shapes_for("~N", lengths));
    auto s = random_batch(DType::f64, "1", {{1}, {1}, {1}});
    auto y = evaluate("div", {x, s});
    auto xs = samples(x), ss = samples(s);
    std::vector<Nd> want;
    for (std::size_t i = 0; i < xs.size(); ++i) {
        for (double& v : xs[i].v) v /= ss[i].v[0];
        want.push_back(xs[i]);
    }
    EXPECT_TRUE(samples_close(y, want));
    check_vjp("div", {x, s});
}

TEST(Binary, PowMaximumMinimumGradients) {
    auto shapes = shapes_for("~N, 2", {{1}, {4}, {0}});
    auto a = random_batch(DType::f64, "~N, 2", shapes, 0.5, 2);
    auto b = random_batch(DType::f64, "~N, 2", shapes, -1.5, 1.5);
    check_vjp("pow", {a, b});
    check_vjp("maximum", {a, b});
    check_vjp("minimum", {a, b});
    auto y = evaluate("pow", {a, b});
    auto as = samples(a), bs = samples(b), ys = samples(y);
    for (std::size_t i = 0; i < as.size(); ++i)
        for (std::size_t k = 0; k < as[i].v.size(); ++k)
            EXPECT_DOUBLE_EQ(ys[i].v[k], std::pow(as[i].v[k], bs[i].v[k]));
}

TEST(Binary, ShapesHoldingEqualRowsAreNotAddable) {
    // (2, 6, C) and (3, 4, C) both hold twelve rows.
    auto a = random_batch(DType::f32, "~N, ~M, 4", {{2, 6, 4}});
    auto b = random_batch(DType::f32, "~N, ~M, 4", {{3, 4, 4}});
    auto msg = error_of([&] { evaluate("add", {a, b}); });
    EXPECT_NE(msg.find("sample 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(2, 6, 4)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(3, 4, 4)"), std::string::npos) << msg;
}

TEST(Binary, DifferentRaggedNamesAreATypeError) {
    auto a = random_batch(DType::f32, "~N, 4", {{2, 4}});
    auto b = random_batch(DType::f32, "~M, 4", {{2, 4}});
    auto msg = error_of([&] { evaluate("add", {a, b}); });
    EXPECT_NE(msg.find("~N against ~M"), std::string::npos) << msg;
    auto c = random_batch(DType::f32, "~N, 5", {{2, 5}});
    EXPECT_NE(error_of([&] { evaluate("add", {a, c}); }).find("4 against 5"), std::string::npos);
    auto d = random_batch(DType::f64, "~N, 4", {{2, 4}});
    EXPECT_NE(error_of([&] {
                  evaluate("add", {a, d});
              }).find("different dtypes"),
              std::string::npos);
    auto e = random_batch(DType::f32, "~N, 4", {{2, 4}, {1, 4}});
    EXPECT_NE(error_of([&] {
                  evaluate("add", {a, e});
              }).find("batch sizes differ"),
              std::string::npos);
}

TEST(Binary, EqualNamesUnequalLengthsNameTheSample) {
    auto a = random_batch(DType::f32, "~N, 4", {{2, 4}, {3, 4}});
    auto b = random_batch(DType::f32, "~N, 4", {{2, 4}, {5, 4}});
    auto msg = error_of([&] { evaluate("mul", {a, b}); });
    EXPECT_NE(msg.find("sample 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 vs 5"), std::string::npos) << msg;
}

TEST(Compare, ComparisonsAndWhere) {
    auto shapes = shapes_for("~N, 2", {{3}, {0}, {2}});
    auto a = random_batch(DType::f64, "~N, 2", shapes);
    auto b = random_batch(DType::f64, "~N, 2", shapes);
    auto c = evaluate("lt", {a, b});
    EXPECT_EQ(c.dtype(), DType::boolean);
    auto as = samples(a), bs = samples(b), cs = samples(c);
    for (std::size_t i = 0; i < as.size(); ++i)
        for (std::size_t k = 0; k < as[i].v.size(); ++k)
            EXPECT_EQ(cs[i].v[k], as[i].v[k] < bs[i].v[k] ? 1.0 : 0.0);
    for (const char* op : {"le", "gt", "ge", "eq", "ne"})
        EXPECT_EQ(evaluate(op, {a, a}).dtype(), DType::boolean);
    EXPECT_EQ(samples(evaluate("eq", {a, a}))[0].v[0], 1.0);
    auto w = evaluate("where", {c, a, b});
    auto ws = samples(w);
    for (std::size_t i = 0; i < as.size(); ++i)
        for (std::size_t k = 0; k < as[i].v.size(); ++k)
            EXPECT_EQ(ws[i].v[k], std::min(as[i].v[k], bs[i].v[k]));
    check_vjp("where", {c, a, b});
    auto z = random_dense(DType::f64, {});
    check_vjp("where", {c, a, z});
    EXPECT_NE(error_of([&] { evaluate("where", {a, a, b}); }).find("bool"), std::string::npos);
}

TEST(Helpers, ScaleCastSumTo) {
    auto x = random_batch(DType::f64, "~N, 2", shapes_for("~N, 2", {{3}, {1}}));
    check_vjp("scale", {x}, {{"c", 2.5}});
    auto f = evaluate("cast", {x}, {{"dtype", std::string("f32")}});
    EXPECT_EQ(f.schema().str(), "f32[B, ~N, 2]");
    auto b = random_dense(DType::f64, {2});
    auto s = evaluate("sum_to", {x, b});
    auto xs = samples(x);
    double want0 = 0;
    for (const auto& sm : xs)
        for (std::int64_t k = 0; k < sm.numel(); k += 2) want0 += sm.v[k];
    EXPECT_NEAR(s.to_f64()[0], want0, 1e-12);
    check_vjp("sum_to", {x, b});
    // An operand whose lengths differ from the gradient's is an error naming the sample.
    auto other = random_batch(DType::f64, "~N, 2", shapes_for("~N, 2", {{3}, {4}}));
    EXPECT_NE(error_of([&] {
                  evaluate("sum_to", {x, other});
              }).find("sample 1"),
              std::string::npos);
}

} // namespace
} // namespace rag
