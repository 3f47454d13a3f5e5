// matmul against per-sample dense loops: x @ W over packed rows (sequence, square pair,
// unbatched), per-sample products creating and contracting a pair axis, every VJP against
// float64 central differences, and the type and runtime errors.
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

// x @ W on the last axis of a dense array: every index tuple of the other axes is a row.
Nd times_weight(const Nd& x, const Nd& w) {
    const std::int64_t C = w.shape[0], D = w.shape[1];
    Shape_ s = x.shape;
    s.back() = D;
    Nd y(s);
    for (std::int64_t r = 0; r < x.numel() / C; ++r)
        for (std::int64_t d = 0; d < D; ++d)
            for (std::int64_t c = 0; c < C; ++c) y.v[r * D + d] += x.v[r * C + c] * w({c, d});
    return y;
}

// Matrix product over the last two axes of dense arrays with equal leading axes.
Nd batched_product(const Nd& a, const Nd& b) {
    const std::size_t r = a.shape.size();
    const std::int64_t P = a.shape[r - 2], K = a.shape[r - 1], Q = b.shape[r - 1];
    Shape_ s = a.shape;
    s.back() = Q;
    Nd y(s);
    std::int64_t lead = 1;
    for (std::size_t k = 0; k + 2 < r; ++k) lead *= a.shape[k];
    for (std::int64_t l = 0; l < lead; ++l)
        for (std::int64_t p = 0; p < P; ++p)
            for (std::int64_t q = 0; q < Q; ++q)
                for (std::int64_t k = 0; k < K; ++k)
                    y.v[(l * P + p) * Q + q] += a.v[(l * P + p) * K + k] * b.v[(l * K + k) * Q + q];
    return y;
}

std::vector<Nd> weight_reference(const RaggedTensor& x, const RaggedTensor& w) {
    std::vector<Nd> want;
    for (const Nd& s : samples(x)) want.push_back(times_weight(s, Nd::of(w.to_dense())));
    return want;
}

std::vector<Nd> batched_reference(const RaggedTensor& a, const RaggedTensor& b) {
    auto as = samples(a), bs = samples(b);
    std::vector<Nd> want;
    for (std::size_t i = 0; i < as.size(); ++i) want.push_back(batched_product(as[i], bs[i]));
    return want;
}

// Sample shapes of `axes`, whose one ragged name takes the k-th entry of each lengths row.
std::vector<Shape_> shapes_with(std::string_view axes, const std::vector<Shape_>& lengths,
                                std::size_t k) {
    std::vector<Shape_> one;
    for (const auto& l : lengths) one.push_back({l[k]});
    return shapes_for(axes, one);
}

const std::vector<Shape_> seq_lengths = {{0}, {1}, {5}, {3}};

TEST(LinalgWeight, RaggedSequenceRows) {
    auto x = random_batch(DType::f64, "~N, 8", shapes_for("~N, 8", seq_lengths));
    auto w = random_dense(DType::f64, {8, 5});
    auto y = evaluate("matmul", {x, w});
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, 5]");
    EXPECT_EQ(y.structure().offsets(), x.structure().offsets());
    EXPECT_TRUE(samples_close(y, weight_reference(x, w), 1e-12, 1e-12));
    check_vjp("matmul", {x, w});
}

TEST(LinalgWeight, SquarePairRows) {
    auto x = random_batch(DType::f64, "~N, ~N, 4", shapes_for("~N, ~N, 4", {{2}, {0}, {1}, {3}}));
    auto w = random_dense(DType::f64, {4, 3});
    auto y = evaluate("matmul", {x, w});
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, ~N, 3]");
    EXPECT_TRUE(samples_close(y, weight_reference(x, w), 1e-12, 1e-12));
    check_vjp("matmul", {x, w});
}

TEST(LinalgWeight, UnbatchedMatrixAndVector) {
    auto w = random_dense(DType::f64, {4, 3});
    for (Shape_ shape : {Shape_{5, 4}, Shape_{4}, Shape_{2, 3, 4}}) {
        auto x = random_dense(DType::f64, shape);
        auto y = evaluate("matmul", {x, w});
        EXPECT_FALSE(y.shape().batched);
        EXPECT_TRUE(close(Nd::of(y.to_dense()),
                          times_weight(Nd::of(x.to_dense()), Nd::of(w.to_dense())), 1e-12, 1e-12));
        check_vjp("matmul", {x, w});
    }
}

TEST(LinalgWeight, StaticAxesBeforeTheRaggedTail) {
    // [B, 3, ~H, 2] @ [2, 4]: the last axis is innermost in storage after the ragged H.
    auto x = random_batch(DType::f64, "3, ~H, 2", shapes_for("3, ~H, 2", {{1}, {0}, {4}}));
    auto w = random_dense(DType::f64, {2, 4});
    auto y = evaluate("matmul", {x, w});
    EXPECT_EQ(y.schema().str(), "f64[B, 3, ~H, 4]");
    EXPECT_TRUE(samples_close(y, weight_reference(x, w), 1e-12, 1e-12));
    check_vjp("matmul", {x, w});
}

TEST(LinalgWeight, WeightGradIsSumOfRowOuterProducts) {
    auto x = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", seq_lengths));
    auto g = random_batch(DType::f64, "~N, 2", shapes_for("~N, 2", seq_lengths));
    auto dw = evaluate("matmul_weight_grad", {x, g});
    EXPECT_EQ(dw.schema().str(), "f64[3, 2]");
    Nd want({3, 2});
    auto xs = samples(x), gs = samples(g);
    for (std::size_t i = 0; i < xs.size(); ++i)
        for (std::int64_t n = 0; n < xs[i].shape[0]; ++n)
            for (std::int64_t c = 0; c < 3; ++c)
                for (std::int64_t d = 0; d < 2; ++d) want({c, d}) += xs[i]({n, c}) * gs[i]({n, d});
    EXPECT_TRUE(close(Nd::of(dw.to_dense()), want, 1e-12, 1e-12));
    // No rows at all: zeros.
    auto empty = random_batch(DType::f64, "~N, 3", {{0, 3}});
    auto gz = random_batch(DType::f64, "~N, 2", {{0, 2}});
    EXPECT_EQ(evaluate("matmul_weight_grad", {empty, gz}).to_f64(), std::vector<double>(6, 0.0));
}

TEST(LinalgWeight, TypeErrors) {
    auto x = random_batch(DType::f32, "~N, 384", {{2, 384}});
    auto w = random_dense(DType::f32, {128, 64});
    EXPECT_EQ(error_of([&] {
                  evaluate("matmul", {x, w});
              }),
              "matmul: x has last axis 384 but W has 128 rows");
    auto img = random_batch(DType::f32, "3, ~H, ~W", {{3, 2, 2}});
    auto msg = error_of([&] { evaluate("matmul", {img, random_dense(DType::f32, {2, 4})}); });
    EXPECT_NE(msg.find("matmul: the last axis of x must be a static axis, got ragged ~W"),
              std::string::npos)
        << msg;
    auto scalar = random_dense(DType::f32, {});
    EXPECT_NE(error_of([&] {
                  evaluate("matmul", {scalar, w});
              }).find("no axis"),
              std::string::npos);
    auto w64 = random_dense(DType::f64, {384, 4});
    EXPECT_NE(error_of([&] {
                  evaluate("matmul", {x, w64});
              }).find("different dtypes"),
              std::string::npos);
    auto xi = random_batch(DType::i32, "~N, 4", {{2, 4}});
    EXPECT_NE(error_of([&] {
                  evaluate("matmul", {xi, random_dense(DType::i32, {4, 4})});
              }).find("floating-point"),
              std::string::npos);
}

TEST(LinalgBatched, ScoresCreateARectangularPair) {
    // Q K^T: [B, ~N, D] @ [B, D, ~M] -> [B, ~N, ~M].
    std::vector<Shape_> lengths = {{0, 2}, {1, 1}, {3, 0}, {4, 5}, {2, 3}};
    auto q = random_batch(DType::f64, "~N, 4", shapes_for("~N, 4", lengths));
    auto kt = random_batch(DType::f64, "4, ~M", shapes_with("4, ~M", lengths, 1));
    auto s = evaluate("matmul", {q, kt});
    EXPECT_EQ(s.schema().str(), "f64[B, ~N, ~M]");
    EXPECT_EQ(s.structure().offsets(), (std::vector<std::int64_t>{0, 0, 1, 1, 21, 27}));
    EXPECT_TRUE(samples_close(s, batched_reference(q, kt), 1e-12, 1e-12));
    check_vjp("matmul", {q, kt});
}

TEST(LinalgBatched, ValuesContractThePair) {
    // P V: [B, ~N, ~M] @ [B, ~M, D] -> [B, ~N, D].
    std::vector<Shape_> lengths = {{0, 2}, {1, 1}, {3, 0}, {4, 5}, {1, 0}};
    auto p = random_batch(DType::f64, "~N, ~M", shapes_for("~N, ~M", lengths));
    auto v = random_batch(DType::f64, "~M, 3", shapes_with("~M, 3", lengths, 1));
    auto y = evaluate("matmul", {p, v});
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, 3]");
    auto want = batched_reference(p, v);
    EXPECT_TRUE(samples_close(y, want, 1e-12, 1e-12));
    // Sample 2 has M = 0: its rows are zeros.
    for (double e : want[2].v) EXPECT_EQ(e, 0.0);
    check_vjp("matmul", {p, v});
}

TEST(LinalgBatched, SquarePairAndLeadingAxes) {
    std::vector<Shape_> lengths = {{0}, {1}, {4}};
    auto a = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", lengths));
    auto bt = random_batch(DType::f64, "3, ~N", shapes_for("3, ~N", lengths));
    auto s = evaluate("matmul", {a, bt});
    EXPECT_EQ(s.schema().str(), "f64[B, ~N, ~N]");
    EXPECT_TRUE(samples_close(s, batched_reference(a, bt), 1e-12, 1e-12));
    check_vjp("matmul", {a, bt});
    // Heads before the ragged axis: [B, 2, ~N, 3] @ [B, 2, 3, ~M].
    std::vector<Shape_> nm = {{0, 1}, {1, 3}, {3, 2}};
    auto h = random_batch(DType::f64, "2, ~N, 3", shapes_for("2, ~N, 3", nm));
    auto k = random_batch(DType::f64, "2, 3, ~M", shapes_with("2, 3, ~M", nm, 1));
    auto hk = evaluate("matmul", {h, k});
    EXPECT_EQ(hk.schema().str(), "f64[B, 2, ~N, ~M]");
    EXPECT_TRUE(samples_close(hk, batched_reference(h, k), 1e-12, 1e-12));
    check_vjp("matmul", {h, k});
}

TEST(LinalgBatched, ContractedExtentsMustAgreePerSample) {
    auto p = random_batch(DType::f32, "~N, ~M", {{2, 3}, {1, 3}});
    auto v = random_batch(DType::f32, "~M, 2", {{3, 2}, {5, 2}});
    auto msg = error_of([&] { evaluate("matmul", {p, v}); });
    EXPECT_EQ(msg, "matmul: sample 1: axis ~M is 3 in a but 5 in b");
    auto v1 = random_batch(DType::f32, "~M, 2", {{3, 2}});
    EXPECT_EQ(error_of([&] {
                  evaluate("matmul", {p, v1});
              }),
              "matmul: batch sizes differ, 2 and 1");
}

TEST(LinalgBatched, TypeErrors) {
    auto a = random_batch(DType::f32, "~N, 4", {{2, 4}});
    auto b = random_batch(DType::f32, "~M, 4", {{2, 4}});
    EXPECT_EQ(error_of([&] {
                  evaluate("matmul", {a, b});
              }),
              "matmul: a has last axis 4 but b has second-to-last axis ~M");
    auto c = random_batch(DType::f32, "2, 4, ~M", {{2, 4, 3}});
    EXPECT_NE(error_of([&] {
                  evaluate("matmul", {a, c});
              }).find("differ before their last two"),
              std::string::npos);
    auto d = random_batch(DType::f32, "4, ~N", {{4, 2}});
    auto msg = error_of([&] { evaluate("matmul", {random_dense(DType::f32, {3, 4}), d}); });
    EXPECT_NE(msg.find("matmul: expects x @ W"), std::string::npos) << msg;
    auto vec = random_batch(DType::f32, "~N", {{2}});
    EXPECT_NE(error_of([&] {
                  evaluate("matmul", {vec, vec});
              }).find("matmul: expects"),
              std::string::npos);
}

TEST(LinalgMatmul, LowPrecisionForward) {
    for (DType t : {DType::f32, DType::bf16}) {
        const double tol = t == DType::f32 ? 1e-5 : 2e-2;
        auto x = random_batch(t, "~N, 8", shapes_for("~N, 8", seq_lengths));
        auto w = random_dense(t, {8, 5});
        auto y = evaluate("matmul", {x, w});
        EXPECT_EQ(y.dtype(), t);
        EXPECT_TRUE(samples_close(y, weight_reference(x, w), tol, tol));
        std::vector<Shape_> lengths = {{0, 2}, {1, 1}, {3, 4}};
        auto p = random_batch(t, "~N, ~M", shapes_for("~N, ~M", lengths));
        auto v = random_batch(t, "~M, 3", shapes_with("~M, 3", lengths, 1));
        EXPECT_TRUE(samples_close(evaluate("matmul", {p, v}), batched_reference(p, v), tol, tol));
    }
}

} // namespace
} // namespace rag
