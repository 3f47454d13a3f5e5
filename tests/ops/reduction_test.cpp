// Reductions, softmax and logsumexp against per-sample dense references on sequence, square
// pair, rectangular pair, non-leading ragged and unbatched layouts; every VJP against float64
// central differences; empty reductions, ties, dtypes and error messages.
#include "tests/support/testing.hpp"

#include <cmath>
#include <limits>
#include <optional>

namespace rag {
namespace {

using namespace rag::testing;

constexpr double inf = std::numeric_limits<double>::infinity();

enum class K { sum, mean, max, min };
const std::pair<const char*, K> kinds[] = {
    {"sum", K::sum}, {"mean", K::mean}, {"max", K::max}, {"min", K::min}};

double ref_of(K k, const std::vector<double>& v) {
    double r = k == K::max ? -inf : k == K::min ? inf : 0.0;
    for (double x : v) {
        if (k == K::max)
            r = std::max(r, x);
        else if (k == K::min)
            r = std::min(r, x);
        else
            r += x;
    }
    return k == K::mean && !v.empty() ? r / double(v.size()) : r;
}

std::int64_t prod(const Shape_& s, std::size_t from, std::size_t to) {
    std::int64_t n = 1;
    for (std::size_t a = from; a < to; ++a) n *= s[a];
    return n;
}

// Dense array s reduced along its axis p.
Nd ref_axis(const Nd& s, std::size_t p, K k) {
    Shape_ out = s.shape;
    out.erase(out.begin() + std::ptrdiff_t(p));
    const std::int64_t outer = prod(s.shape, 0, p), n = s.shape[p],
                       inner = prod(s.shape, p + 1, s.shape.size());
    Nd r(out);
    for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t i = 0; i < inner; ++i) {
            std::vector<double> g;
            for (std::int64_t j = 0; j < n; ++j)
                g.push_back(s.v[std::size_t((o * n + j) * inner + i)]);
            r.v[std::size_t(o * inner + i)] = ref_of(k, g);
        }
    return r;
}

// Dense softmax (or logsumexp) of s along axis p, computed naively (inputs stay small).
Nd ref_softmax(const Nd& s, std::size_t p, bool lse) {
    const std::int64_t outer = prod(s.shape, 0, p), n = s.shape[p],
                       inner = prod(s.shape, p + 1, s.shape.size());
    Shape_ out = s.shape;
    if (lse) out.erase(out.begin() + std::ptrdiff_t(p));
    Nd r(out);
    for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t i = 0; i < inner; ++i) {
            auto at = [&](std::int64_t j) { return std::size_t((o * n + j) * inner + i); };
            double z = 0;
            for (std::int64_t j = 0; j < n; ++j) z += std::exp(s.v[at(j)]);
            if (lse)
                r.v[std::size_t(o * inner + i)] = std::log(z);
            else
                for (std::int64_t j = 0; j < n; ++j) r.v[at(j)] = std::exp(s.v[at(j)]) / z;
        }
    return r;
}

// Random lengths for B samples; sample 0 has every ragged extent 0, sample 1 has them all 1.
std::vector<Shape_> lengths_with_0_and_1(std::int64_t B, int names) {
    auto l = random_lengths(B, names, 0, 4);
    l[1].assign(std::size_t(names), 1);
    return l;
}

Attrs axis_attr(std::optional<std::int64_t> axis) {
    Attrs a;
    if (axis) a.set("axis", *axis);
    return a;
}

// Every reduction of x along `axis` (nullopt: global) against the dense reference; the result
// must have schema `want`.
void check_forward(const RaggedTensor& x, std::optional<std::int64_t> axis, const char* want,
                   double tol = 1e-12) {
    const auto xs = samples(x);
    const int rank = x.shape().logical_rank();
    for (auto [name, k] : kinds) {
        SCOPED_TRACE(std::string(name) + " axis " + (axis ? std::to_string(*axis) : "none") +
                     " of " + x.schema().str());
        RaggedTensor y = evaluate(name, {x}, axis_attr(axis));
        EXPECT_EQ(y.schema().str(), want);
        if (!axis) {
            std::vector<double> all;
            for (const Nd& s : xs) all.insert(all.end(), s.v.begin(), s.v.end());
            EXPECT_TRUE(close(Nd({}, {y.item()}), Nd({}, {ref_of(k, all)}), tol, tol));
            continue;
        }
        const std::int64_t a = *axis < 0 ? *axis + rank : *axis;
        std::vector<Nd> want_samples;
        for (const Nd& s : xs) {
            if (x.shape().batched && a == 0)
                want_samples.push_back(Nd({}, {ref_of(k, s.v)}));
            else
                want_samples.push_back(ref_axis(s, std::size_t(a - x.shape().batched), k));
        }
        EXPECT_TRUE(samples_close(y, want_samples, tol, tol));
    }
}

// Gradients of every reduction. An empty group makes max/min infinite, and with it the
// objective of the finite-difference check, so those two are checked on `nonempty` (same layout,
// every ragged extent >= 1).
void check_grads(const RaggedTensor& x, const RaggedTensor& nonempty,
                 std::optional<std::int64_t> axis) {
    for (auto [name, k] : kinds) {
        SCOPED_TRACE(std::string(name) + " axis " + (axis ? std::to_string(*axis) : "none"));
        check_vjp(name, {k == K::max || k == K::min ? nonempty : x}, axis_attr(axis));
    }
}

struct Case {
    std::optional<std::int64_t> axis;
    const char* schema;
};

void check_layout(const char* axes, int names, const std::vector<Case>& cases) {
    auto x =
        random_batch(DType::f64, axes, shapes_for(axes, lengths_with_0_and_1(6, names)), -2, 2);
    auto nonempty =
        random_batch(DType::f64, axes, shapes_for(axes, random_lengths(5, names, 1, 4)), -2, 2);
    for (const Case& c : cases) {
        check_forward(x, c.axis, c.schema);
        check_grads(x, nonempty, c.axis);
    }
}

TEST(ReduceAxis, Sequence) {
    check_layout("~N, 4", 1,
                 {{1, "f64[B, 4]"},
                  {2, "f64[B, ~N]"},
                  {-1, "f64[B, ~N]"},
                  {0, "f64[B]"},
                  {std::nullopt, "f64[]"}});
}

TEST(ReduceAxis, SymbolicAxis) {
    check_layout("~N, D", 1, {{2, "f64[B, ~N]"}, {1, "f64[B, D]"}, {-3, "f64[B]"}});
}

TEST(ReduceAxis, SquarePair) {
    check_layout("~N, ~N, 3", 1,
                 {{1, "f64[B, ~N, 3]"},
                  {2, "f64[B, ~N, 3]"},
                  {3, "f64[B, ~N, ~N]"},
                  {-2, "f64[B, ~N, 3]"},
                  {0, "f64[B]"},
                  {std::nullopt, "f64[]"}});
}

TEST(ReduceAxis, RectangularPair) {
    check_layout("~N, ~M, 2", 2,
                 {{1, "f64[B, ~M, 2]"},
                  {2, "f64[B, ~N, 2]"},
                  {3, "f64[B, ~N, ~M]"},
                  {0, "f64[B]"},
                  {std::nullopt, "f64[]"}});
}

TEST(ReduceAxis, NonLeadingRagged) {
    check_layout("3, ~H, ~W", 2,
                 {{1, "f64[B, ~H, ~W]"},
                  {2, "f64[B, 3, ~W]"},
                  {3, "f64[B, 3, ~H]"},
                  {0, "f64[B]"},
                  {std::nullopt, "f64[]"}});
}

TEST(ReduceAxis, UnbatchedDense) {
    auto x = random_dense(DType::f64, {4, 5}, -2, 2);
    for (Case c :
         std::vector<Case>{{0, "f64[5]"}, {1, "f64[4]"}, {-1, "f64[4]"}, {std::nullopt, "f64[]"}}) {
        check_forward(x, c.axis, c.schema);
        check_grads(x, x, c.axis);
    }
}

TEST(ReduceAxis, Axis0ReducesEachSampleAndStacks) {
    auto x = RaggedTensor::from_list({DenseArray::from_f64(DType::f64, {2}, {1, 2}),
                                      DenseArray::from_f64(DType::f64, {2}, {3, 4})},
                                     "~N");
    auto y = evaluate("sum", {x}, {{"axis", std::int64_t(0)}});
    EXPECT_EQ(y.schema().str(), "f64[B]");
    EXPECT_EQ(y.to_f64(), (std::vector<double>{3, 7}));
}

TEST(ReduceAxis, GlobalWeightsEveryStoredEntryEqually) {
    // Samples of 1 and 3 entries: the global mean is over 4 entries, not a mean of means.
    auto x = RaggedTensor::from_list({DenseArray::from_f64(DType::f64, {1}, {8}),
                                      DenseArray::from_f64(DType::f64, {3}, {0, 0, 4})},
                                     "~N");
    EXPECT_DOUBLE_EQ(evaluate("mean", {x}).item(), 3.0);
}

TEST(ReduceEmpty, DocumentedValues) {
    auto x = RaggedTensor::from_list({DenseArray::from_f64(DType::f64, {0, 2}, {}),
                                      DenseArray::from_f64(DType::f64, {1, 2}, {5, 6})},
                                     "~N, 2");
    const Attrs whole{{"axis", std::int64_t(0)}}, rows{{"axis", std::int64_t(1)}};
    EXPECT_EQ(evaluate("sum", {x}, whole).to_f64(), (std::vector<double>{0, 11}));
    EXPECT_EQ(evaluate("mean", {x}, whole).to_f64(), (std::vector<double>{0, 5.5}));
    EXPECT_EQ(evaluate("max", {x}, whole).to_f64(), (std::vector<double>{-inf, 6}));
    EXPECT_EQ(evaluate("min", {x}, rows).to_f64(), (std::vector<double>{inf, inf, 5, 6}));
    // An empty group gets no gradient; the other groups still get theirs.
    auto g = RaggedTensor::from_f64(DType::f64, evaluate("mean", {x}, rows).structure_ptr(),
                                    {1, 1, 2, 4});
    auto dx = evaluate_vjp("mean", std::vector<RaggedTensor>{x}, rows, g)[0];
    EXPECT_EQ(dx->to_f64(), (std::vector<double>{2, 4}));
    for (const char* op : {"sum", "mean", "max", "min"})
        EXPECT_TRUE(std::isfinite(evaluate(op, {x}).item()));
}

TEST(ReduceEmpty, IntegerExtremesAreTheDtypeLimits) {
    auto x = random_batch(DType::i32, "~N", {{0}, {3}}, -5, 5);
    auto mx = evaluate("max", {x}, {{"axis", std::int64_t(0)}}).to_f64();
    auto mn = evaluate("min", {x}, {{"axis", std::int64_t(0)}}).to_f64();
    EXPECT_EQ(mx[0], std::numeric_limits<std::int32_t>::lowest());
    EXPECT_EQ(mn[0], std::numeric_limits<std::int32_t>::max());
}

TEST(ReduceGrad, MaxAndMinSendTheGradientToTheFirstExtremum) {
    auto x =
        RaggedTensor::from_list({DenseArray::from_f64(DType::f64, {5}, {2, 5, 1, 5, 1})}, "~N");
    auto g = RaggedTensor::from_f64(DType::f64, evaluate("sum", {x}).structure_ptr(), {3});
    auto dmax = evaluate_vjp("max", std::vector<RaggedTensor>{x}, {}, g)[0];
    auto dmin = evaluate_vjp("min", std::vector<RaggedTensor>{x}, {}, g)[0];
    EXPECT_EQ(dmax->to_f64(), (std::vector<double>{0, 3, 0, 0, 0}));
    EXPECT_EQ(dmin->to_f64(), (std::vector<double>{0, 0, 3, 0, 0}));
}

TEST(ReduceGrad, IntegerInputsGetNoGradient) {
    auto x = random_batch(DType::i32, "~N", {{2}, {3}}, -5, 5);
    auto y = evaluate("sum", {x}, {{"axis", std::int64_t(1)}});
    EXPECT_EQ(y.schema().str(), "i32[B]");
    EXPECT_FALSE(
        evaluate_vjp("sum", std::vector<RaggedTensor>{x}, {{"axis", std::int64_t(1)}}, y)[0]);
}

TEST(ReduceGrad, MismatchedLengthsNameTheSample) {
    // Backward ops called directly with a y or g from other lengths: runtime errors.
    auto x = random_batch(DType::f64, "~N, 2", {{2, 2}, {3, 2}});
    auto x2 = random_batch(DType::f64, "~N, 2", {{2, 2}, {5, 2}});
    const Attrs rows{{"axis", std::int64_t(2)}};
    auto y = evaluate("max", {x}, rows);
    auto msg = error_of([&] {
        evaluate("reduce_grad", {x2, y, y},
                 {{"kind", std::string("max")}, {"axis", std::int64_t(2)}});
    });
    EXPECT_EQ(msg, "reduce_grad: sample 1: y has shape (3,), expected (5,)");
    auto lse = evaluate("logsumexp", {x}, rows);
    msg = error_of([&] { evaluate("logsumexp_grad", {x2, lse, lse}, rows); });
    EXPECT_EQ(msg, "logsumexp_grad: sample 1: y has shape (3,), expected (5,)");
    auto sm = evaluate("softmax", {x}, rows);
    msg = error_of([&] { evaluate("softmax_grad", {sm, x2}, rows); });
    EXPECT_EQ(msg, "softmax_grad: sample 1: g has shape (5, 2), expected (3, 2)");
    auto batch1 = random_batch(DType::f64, "~N, 2", {{2, 2}});
    msg = error_of([&] { evaluate("softmax_grad", {sm, batch1}, rows); });
    EXPECT_EQ(msg, "softmax_grad: g has batch size 1, expected 2");
}

// Softmax and logsumexp along `axis` of x against the naive dense reference.
void check_softmax(const RaggedTensor& x, std::int64_t axis, const char* lse_schema,
                   double tol = 1e-12) {
    SCOPED_TRACE("axis " + std::to_string(axis) + " of " + x.schema().str());
    const Attrs at{{"axis", axis}};
    const std::int64_t a = axis < 0 ? axis + x.shape().logical_rank() : axis;
    const auto p = std::size_t(a - x.shape().batched);
    std::vector<Nd> want_sm, want_lse;
    for (const Nd& s : samples(x)) {
        want_sm.push_back(ref_softmax(s, p, false));
        want_lse.push_back(ref_softmax(s, p, true));
    }
    auto sm = evaluate("softmax", {x}, at);
    EXPECT_EQ(sm.structure_ptr(), x.structure_ptr());
    EXPECT_TRUE(samples_close(sm, want_sm, tol, tol));
    auto lse = evaluate("logsumexp", {x}, at);
    EXPECT_EQ(lse.schema().str(), lse_schema);
    EXPECT_TRUE(samples_close(lse, want_lse, tol, tol));
}

// Forward on a layout with ragged extents 0 and 1, gradients of softmax on it too; logsumexp's
// gradient on `nonempty` (an empty axis gives -inf, which the finite-difference check cannot
// weigh).
void check_softmax_layout(const char* axes, int names, std::int64_t axis, const char* lse_schema) {
    auto x =
        random_batch(DType::f64, axes, shapes_for(axes, lengths_with_0_and_1(5, names)), -3, 3);
    auto nonempty =
        random_batch(DType::f64, axes, shapes_for(axes, random_lengths(4, names, 1, 4)), -3, 3);
    check_softmax(x, axis, lse_schema);
    const Attrs at{{"axis", axis}};
    check_vjp("softmax", {x}, at);
    check_vjp("softmax", {nonempty}, at);
    check_vjp("logsumexp", {nonempty}, at);
}

TEST(ReduceSoftmax, RaggedAndStaticAxes) {
    check_softmax_layout("~N, 3", 1, 1, "f64[B, 3]");
    check_softmax_layout("~N, 3", 1, 2, "f64[B, ~N]");
    check_softmax_layout("~N, 3", 1, -1, "f64[B, ~N]");
    check_softmax_layout("~N, ~N, 3", 1, 2, "f64[B, ~N, 3]");
    check_softmax_layout("~N, ~M, 2", 2, 2, "f64[B, ~N, 2]");
    check_softmax_layout("~N, ~M, 2", 2, 1, "f64[B, ~M, 2]");
    check_softmax_layout("3, ~H, ~W", 2, 3, "f64[B, 3, ~H]");
    check_softmax_layout("3, ~H, ~W", 2, 1, "f64[B, ~H, ~W]");
    auto d = random_dense(DType::f64, {4, 5}, -3, 3);
    for (auto [axis, schema] :
         {std::pair{std::int64_t(1), "f64[4]"}, std::pair{std::int64_t(0), "f64[5]"}}) {
        check_softmax(d, axis, schema);
        check_vjp("softmax", {d}, {{"axis", axis}});
        check_vjp("logsumexp", {d}, {{"axis", axis}});
    }
}

TEST(ReduceSoftmax, LogsumexpOfAnEmptyAxisIsMinusInfinity) {
    auto x = random_batch(DType::f64, "~N, 2", {{0, 2}, {2, 2}});
    auto lse = evaluate("logsumexp", {x}, {{"axis", std::int64_t(1)}}).to_f64();
    EXPECT_EQ(lse[0], -inf);
    EXPECT_EQ(lse[1], -inf);
    EXPECT_TRUE(std::isfinite(lse[2]));
}

TEST(ReduceSoftmax, StableForLargeValues) {
    auto x =
        RaggedTensor::from_list({DenseArray::from_f64(DType::f64, {3}, {1000, 1001, 999})}, "~N");
    const Attrs at{{"axis", std::int64_t(1)}};
    auto sm = evaluate("softmax", {x}, at).to_f64();
    const double z = std::exp(-1.0) + 1 + std::exp(-2.0);
    EXPECT_NEAR(sm[0], std::exp(-1.0) / z, 1e-15);
    EXPECT_NEAR(sm[1], 1 / z, 1e-15);
    EXPECT_NEAR(evaluate("logsumexp", {x}, at).item(), 1001 + std::log(z), 1e-12);
    check_vjp("softmax", {x}, at);
    check_vjp("logsumexp", {x}, at);
}

TEST(ReduceDtype, Float32AndBfloat16Forward) {
    for (auto [dtype, tol] : {std::pair{DType::f32, 2e-6}, std::pair{DType::bf16, 2e-2}}) {
        auto x =
            random_batch(dtype, "~N, ~N, 3", shapes_for("~N, ~N, 3", lengths_with_0_and_1(5, 1)));
        const char* name = dtype == DType::f32 ? "f32" : "bf16";
        check_forward(x, 2, (std::string(name) + "[B, ~N, 3]").c_str(), tol);
        check_forward(x, std::nullopt, (std::string(name) + "[]").c_str(), tol);
        check_softmax(x, 3, (std::string(name) + "[B, ~N, ~N]").c_str(), tol);
    }
}

TEST(ReduceDtype, IntegersForSumMaxMinOnly) {
    auto x = random_batch(DType::i32, "~N, 2", {{0, 2}, {3, 2}}, -9, 9);
    const Attrs at{{"axis", std::int64_t(1)}};
    for (const char* op : {"sum", "max", "min"})
        EXPECT_EQ(evaluate(op, {x}, at).dtype(), DType::i32);
    auto xs = samples(x)[1];
    EXPECT_TRUE(close(samples(evaluate("sum", {x}, at))[1], ref_axis(xs, 0, K::sum)));
    EXPECT_TRUE(close(samples(evaluate("max", {x}, at))[1], ref_axis(xs, 0, K::max)));
    auto msg = error_of([&] { evaluate("mean", {x}, at); });
    EXPECT_NE(msg.find("mean: argument must be a floating-point tensor"), std::string::npos) << msg;
    auto b = random_batch(DType::boolean, "~N", {{2}});
    msg = error_of([&] { evaluate("sum", {b}); });
    EXPECT_NE(msg.find("sum: argument must be numeric"), std::string::npos) << msg;
}

TEST(ReduceErrors, AxisOutOfRangeAndBatchAxis) {
    auto x = random_batch(DType::f32, "~N, 4", {{2, 4}});
    auto msg = error_of([&] { evaluate("max", {x}, {{"axis", std::int64_t(3)}}); });
    EXPECT_NE(msg.find("max: axis 3 is out of range for a value of rank 3"), std::string::npos)
        << msg;
    msg = error_of([&] { evaluate("mean", {x}, {{"axis", std::int64_t(-4)}}); });
    EXPECT_NE(msg.find("mean: axis -4 is out of range"), std::string::npos) << msg;
    msg = error_of([&] { evaluate("softmax", {x}, {{"axis", std::int64_t(0)}}); });
    EXPECT_NE(msg.find("softmax: axis 0 is the batch axis"), std::string::npos) << msg;
    msg = error_of([&] { evaluate("logsumexp", {x}, {{"axis", std::int64_t(-3)}}); });
    EXPECT_NE(msg.find("logsumexp: axis 0 is the batch axis"), std::string::npos) << msg;
    msg = error_of([&] { evaluate("softmax", {x}); });
    EXPECT_EQ(msg, "softmax: axis= is required");
    msg = error_of([&] { evaluate("logsumexp", {x}, {{"axis", std::int64_t(5)}}); });
    EXPECT_NE(msg.find("logsumexp: axis 5 is out of range"), std::string::npos) << msg;
    auto d = random_dense(DType::f32, {4, 5});
    msg = error_of([&] { evaluate("sum", {d}, {{"axis", std::int64_t(2)}}); });
    EXPECT_NE(msg.find("sum: axis 2 is out of range for a value of rank 2"), std::string::npos)
        << msg;
    msg = error_of([&] { evaluate("reduce_grad", {x, x, x}, {{"kind", std::string("prod")}}); });
    EXPECT_NE(msg.find("reduce_grad: unknown kind 'prod'"), std::string::npos) << msg;
}

} // namespace
} // namespace rag
