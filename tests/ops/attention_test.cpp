// Packed attention against an independent per-sample dense reference (self and cross, causal
// and not, custom scale), its gradients against float64 central differences, low-precision
// forward against the criterion of REFERENCE.md section 3, isolation between samples, and
// type and runtime errors.
#include "tests/support/testing.hpp"

#include <cmath>
#include <limits>

namespace rag {
namespace {

using namespace rag::testing;

constexpr std::int64_t H = 2, D = 4, Dv = 3;

// One sample's attention from the formula O = softmax(q k^T * scale + mask) v: scores over all
// M keys, masked ones set to -inf, softmax through exp(-inf) = 0. A row whose keys are all
// masked (M = 0) outputs 0.
Nd reference(const Nd& q, const Nd& k, const Nd& v, bool causal, double scale) {
    const std::int64_t N = q.shape[0], M = k.shape[0];
    const double inf = std::numeric_limits<double>::infinity();
    Nd o({N, H, Dv});
    for (std::int64_t i = 0; i < N; ++i)
        for (std::int64_t h = 0; h < H; ++h) {
            std::vector<double> s(static_cast<std::size_t>(M));
            double top = -inf;
            for (std::int64_t j = 0; j < M; ++j) {
                double dot = 0;
                for (std::int64_t d = 0; d < D; ++d) dot += q({i, h, d}) * k({j, h, d});
                s[std::size_t(j)] = causal && j > i ? -inf : dot * scale;
                top = std::max(top, s[std::size_t(j)]);
            }
            if (top == -inf) continue;
            double z = 0;
            for (double& x : s) z += x = std::exp(x - top);
            for (std::int64_t c = 0; c < Dv; ++c)
                for (std::int64_t j = 0; j < M; ++j)
                    o({i, h, c}) += s[std::size_t(j)] / z * v({j, h, c});
        }
    return o;
}

std::vector<Nd> reference(const RaggedTensor& q, const RaggedTensor& k, const RaggedTensor& v,
                          bool causal, double scale) {
    auto qs = samples(q), ks = samples(k), vs = samples(v);
    std::vector<Nd> out;
    for (std::size_t i = 0; i < qs.size(); ++i)
        out.push_back(reference(qs[i], ks[i], vs[i], causal, scale));
    return out;
}

struct Batch {
    RaggedTensor q, k, v;
};

// Self attention: q, k and v share ~N. Lengths cover 0, 1 and 9.
Batch self_batch(DType t, std::vector<Shape_> lengths = {{0}, {1}, {9}, {4}, {2}}) {
    return {random_batch(t, "~N, 2, 4", shapes_for("~N, 2, 4", lengths), -2, 2),
            random_batch(t, "~N, 2, 4", shapes_for("~N, 2, 4", lengths), -2, 2),
            random_batch(t, "~N, 2, 3", shapes_for("~N, 2, 3", lengths))};
}

// Cross attention: queries ~N, keys and values ~M, including rows with no key at all.
Batch cross_batch(DType t,
                  std::vector<Shape_> lengths = {{0, 0}, {2, 0}, {1, 1}, {9, 4}, {3, 9}, {0, 3}}) {
    std::vector<Shape_> n, m;
    for (const auto& l : lengths) {
        n.push_back({l[0]});
        m.push_back({l[1]});
    }
    return {random_batch(t, "~N, 2, 4", shapes_for("~N, 2, 4", n), -2, 2),
            random_batch(t, "~M, 2, 4", shapes_for("~M, 2, 4", m), -2, 2),
            random_batch(t, "~M, 2, 3", shapes_for("~M, 2, 3", m))};
}

Attrs options(bool causal) {
    return {{"causal", causal}};
}

// REFERENCE.md section 3 on values cast to f32: pass if every element has
// |x - ref| <= 0.03 + 0.05 |ref|, or if the relative l2 error is within 8 machine epsilons of
// the dtype. For f32 the relative l2 error must be <= 1e-5.
::testing::AssertionResult meets_criterion(const RaggedTensor& got, const std::vector<Nd>& want) {
    auto g = samples(got);
    bool elementwise = true;
    double err = 0, norm = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
        for (std::size_t e = 0; e < g[i].v.size(); ++e) {
            double x = double(float(g[i].v[e])), r = want[i].v[e];
            elementwise = elementwise && std::fabs(x - r) <= 0.03 + 0.05 * std::fabs(r);
            err += (x - r) * (x - r);
            norm += r * r;
        }
    const double rel = std::sqrt(err) / (norm > 0 ? std::sqrt(norm) : 1.0);
    const DType t = got.dtype();
    const double eps = t == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
    const bool pass = t == DType::f32 ? rel <= 1e-5 : elementwise || rel <= 8 * eps;
    if (pass) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << dtype_name(t) << ": relative l2 error " << rel
                                         << (elementwise ? "" : ", elementwise bound broken");
}

TEST(AttentionForward, SelfAttentionMatchesPerSampleReference) {
    for (bool causal : {false, true}) {
        auto b = self_batch(DType::f64);
        auto y = evaluate("attention", {b.q, b.k, b.v}, options(causal));
        EXPECT_EQ(y.schema().str(), "f64[B, ~N, 2, 3]");
        EXPECT_EQ(y.structure().lengths(0), b.q.structure().lengths(0));
        EXPECT_TRUE(samples_close(y, reference(b.q, b.k, b.v, causal, 0.5), 1e-12, 1e-12))
            << "causal=" << causal;
    }
}

TEST(AttentionForward, RandomLengthsMatchReference) {
    for (bool causal : {false, true}) {
        auto b = self_batch(DType::f64, random_lengths(6, 1, 0, 9));
        auto y = evaluate("attention", {b.q, b.k, b.v}, options(causal));
        EXPECT_TRUE(samples_close(y, reference(b.q, b.k, b.v, causal, 0.5), 1e-12, 1e-12));
        auto c = cross_batch(DType::f64, random_lengths(6, 2, 0, 9));
        auto z = evaluate("attention", {c.q, c.k, c.v}, options(causal));
        EXPECT_TRUE(samples_close(z, reference(c.q, c.k, c.v, causal, 0.5), 1e-12, 1e-12));
    }
}

TEST(AttentionForward, CrossAttentionWithCustomScale) {
    for (bool causal : {false, true}) {
        auto b = cross_batch(DType::f64);
        Attrs at{{"causal", causal}, {"scale", 1.7}};
        auto y = evaluate("attention", {b.q, b.k, b.v}, at);
        EXPECT_EQ(y.schema().str(), "f64[B, ~N, 2, 3]");
        EXPECT_TRUE(samples_close(y, reference(b.q, b.k, b.v, causal, 1.7), 1e-12, 1e-12))
            << "causal=" << causal;
    }
}

TEST(AttentionForward, DefaultScaleIsInverseSqrtOfKeyWidth) {
    auto b = cross_batch(DType::f64);
    auto dflt = evaluate("attention", {b.q, b.k, b.v});
    auto explicit_ = evaluate("attention", {b.q, b.k, b.v}, {{"scale", 0.5}});
    EXPECT_EQ(dflt.to_f64(), explicit_.to_f64());
}

TEST(AttentionForward, QueriesWithoutKeysOutputZero) {
    auto b = cross_batch(DType::f64, {{3, 0}, {2, 2}, {4, 0}});
    for (bool causal : {false, true}) {
        auto s = samples(evaluate("attention", {b.q, b.k, b.v}, options(causal)));
        for (std::size_t i : {0u, 2u}) {
            ASSERT_EQ(s[i].numel(), (i == 0 ? 3 : 4) * H * Dv);
            for (double x : s[i].v) EXPECT_EQ(x, 0.0);
        }
    }
}

TEST(AttentionForward, CausalFirstQuerySeesOnlyFirstKey) {
    auto b = self_batch(DType::f64, {{5}});
    auto y = samples(evaluate("attention", {b.q, b.k, b.v}, options(true)))[0];
    auto v = samples(b.v)[0];
    for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t c = 0; c < Dv; ++c) EXPECT_DOUBLE_EQ(y({0, h, c}), v({0, h, c}));
}

// Changing every other sample's queries, keys and values leaves sample i bit-identical, and
// each sample computed alone in a batch of one gives the same bits.
TEST(AttentionForward, PaddingAndOtherSamplesAreNeverObserved) {
    for (bool causal : {false, true}) {
        std::vector<Shape_> lengths{{0, 2}, {1, 1}, {9, 4}, {3, 9}};
        auto a = cross_batch(DType::f64, lengths), b = cross_batch(DType::f64, lengths);
        auto ya = samples(evaluate("attention", {a.q, a.k, a.v}, options(causal)));
        for (std::size_t i = 0; i < lengths.size(); ++i) {
            // Batch b with sample i taken from a.
            auto mix = [&](const RaggedTensor& from_a, const RaggedTensor& from_b) {
                auto l = from_b.to_list();
                l[i] = from_a.to_list()[i];
                return RaggedTensor::from_list(l, from_b.shape().axes);
            };
            auto y = evaluate("attention", {mix(a.q, b.q), mix(a.k, b.k), mix(a.v, b.v)},
                              options(causal));
            EXPECT_EQ(samples(y)[i].v, ya[i].v) << "sample " << i;
            auto alone = [&](const RaggedTensor& t) {
                return RaggedTensor::from_list({t.to_list()[i]}, t.shape().axes);
            };
            auto y1 = evaluate("attention", {alone(a.q), alone(a.k), alone(a.v)}, options(causal));
            EXPECT_EQ(samples(y1)[0].v, ya[i].v) << "sample " << i;
        }
    }
}

TEST(AttentionForward, F32AndBf16MeetTheReferenceCriterion) {
    for (DType t : {DType::f32, DType::bf16})
        for (bool causal : {false, true}) {
            for (const auto& b : {self_batch(t), cross_batch(t)}) {
                auto y = evaluate("attention", {b.q, b.k, b.v}, options(causal));
                EXPECT_EQ(y.dtype(), t);
                // The reference runs in f64 on the same (rounded) inputs.
                EXPECT_TRUE(meets_criterion(y, reference(b.q, b.k, b.v, causal, 0.5)))
                    << "causal=" << causal;
            }
        }
}

TEST(AttentionGradient, SelfAndCrossCausalAndNot) {
    for (bool causal : {false, true}) {
        auto s = self_batch(DType::f64);
        check_vjp("attention", {s.q, s.k, s.v}, options(causal));
        auto c = cross_batch(DType::f64);
        check_vjp("attention", {c.q, c.k, c.v}, options(causal));
    }
}

TEST(AttentionGradient, CustomScaleAndRandomLengths) {
    for (bool causal : {false, true}) {
        auto c = cross_batch(DType::f64, random_lengths(4, 2, 0, 6));
        check_vjp("attention", {c.q, c.k, c.v}, {{"causal", causal}, {"scale", 0.8}});
    }
}

TEST(AttentionGradient, GradOpChecksItsArguments) {
    auto b = cross_batch(DType::f64, {{2, 3}});
    auto dout = random_batch(DType::f64, "~N, 2, 3", {{2, 2, 3}});
    auto good = evaluate("attention_grad", {b.q, b.k, b.v, dout}, {{"wrt", std::int64_t(1)}});
    EXPECT_EQ(good.schema(), b.k.schema());
    EXPECT_NE(error_of([&] {
                  evaluate("attention_grad", {b.q, b.k, b.v, dout}, {{"wrt", std::int64_t(3)}});
              }).find("attention_grad: wrt must be 0 (q), 1 (k) or 2 (v), got 3"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  evaluate("attention_grad", {b.q, b.k, b.v, dout});
              }).find("attention_grad: missing attribute wrt"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  evaluate("attention_grad", {b.q, b.k, b.v, b.q}, {{"wrt", std::int64_t(0)}});
              }).find("attention_grad: dO must be f64[B, ~N, 2, 3], got f64[B, ~N, 2, 4]"),
              std::string::npos);
    auto short_dout = random_batch(DType::f64, "~N, 2, 3", {{1, 2, 3}});
    EXPECT_NE(
        error_of([&] {
            evaluate("attention_grad", {b.q, b.k, b.v, short_dout}, {{"wrt", std::int64_t(0)}});
        }).find("attention_grad: sample 0: q has 2 rows but dO has 1 (shared ragged axis ~N)"),
        std::string::npos);
}

std::string attention_error(const RaggedTensor& q, const RaggedTensor& k, const RaggedTensor& v,
                            const Attrs& at = {}) {
    return error_of([&] { evaluate("attention", {q, k, v}, at); });
}

TEST(AttentionErrors, TypeErrorsNameTheOpAndAxes) {
    auto b = cross_batch(DType::f32, {{2, 3}, {1, 2}});
    auto lens = std::vector<Shape_>{{3}, {2}};
    auto has = [](const std::string& msg, const std::string& part) {
        return msg.find(part) != std::string::npos;
    };
    auto rank3 = random_batch(DType::f32, "~N, 8", {{2, 8}, {1, 8}});
    EXPECT_TRUE(
        has(attention_error(rank3, b.k, b.v),
            "attention: q must be [B, ~L, H, D] (a batch, axis 1 ragged), got f32[B, ~N, 8]"));
    auto dense = random_dense(DType::f32, {3, 2, 4});
    EXPECT_TRUE(has(attention_error(b.q, dense, b.v), "attention: k must be [B, ~L, H, D]"));
    auto heads3 = random_batch(DType::f32, "~M, 3, 4", shapes_for("~M, 3, 4", lens));
    EXPECT_TRUE(has(attention_error(b.q, heads3, b.v),
                    "attention: head axis 2 differs: q f32[B, ~N, 2, 4] has 2, k f32[B, ~M, 3, "
                    "4] has 3"));
    auto vheads = random_batch(DType::f32, "~M, 1, 3", shapes_for("~M, 1, 3", lens));
    EXPECT_TRUE(has(attention_error(b.q, b.k, vheads), "attention: head axis 2 differs: q"));
    auto width5 = random_batch(DType::f32, "~M, 2, 5", shapes_for("~M, 2, 5", lens));
    EXPECT_TRUE(has(attention_error(b.q, width5, b.v),
                    "attention: feature axis 3 differs: q f32[B, ~N, 2, 4] has 4, k f32[B, ~M, "
                    "2, 5] has 5"));
    auto vl = random_batch(DType::f32, "~L, 2, 3", shapes_for("~L, 2, 3", lens));
    EXPECT_TRUE(has(attention_error(b.q, b.k, vl),
                    "attention: k and v must share their ragged axis 1, got k ~M and v ~L"));
    EXPECT_TRUE(has(attention_error(b.q, b.k, b.v.astype(DType::f64)),
                    "attention: operands have different dtypes"));
    auto qi = b.q.astype(DType::i32), ki = b.k.astype(DType::i32), vi = b.v.astype(DType::i32);
    EXPECT_TRUE(has(attention_error(qi, ki, vi),
                    "attention: q must be a floating-point tensor, got i32[B, ~N, 2, 4]"));
    auto symbolic = random_batch(DType::f32, "~N, Hs, 4", {{2, 2, 4}, {1, 2, 4}});
    EXPECT_TRUE(has(attention_error(symbolic, b.k, b.v),
                    "attention: q's head axis 2 must be a static axis, got symbolic Hs"));
    EXPECT_TRUE(has(attention_error(b.q, b.k, b.v, {{"causal", std::int64_t(1)}}),
                    "attention: attribute causal must be true or false"));
}

TEST(AttentionErrors, RuntimeLengthMismatchesNameTheSample) {
    auto b = self_batch(DType::f64, {{2}, {3}, {1}});
    auto v_short = random_batch(DType::f64, "~N, 2, 3", shapes_for("~N, 2, 3", {{2}, {3}, {4}}));
    EXPECT_EQ(attention_error(b.q, b.k, v_short),
              "attention: sample 2: k has 1 keys but v has 4 (shared ragged axis ~N)");
    auto k_long = random_batch(DType::f64, "~N, 2, 4", shapes_for("~N, 2, 4", {{2}, {5}, {1}}));
    auto v_long = random_batch(DType::f64, "~N, 2, 3", shapes_for("~N, 2, 3", {{2}, {5}, {1}}));
    EXPECT_EQ(attention_error(b.q, k_long, v_long),
              "attention: sample 1: q has 3 rows but k has 5 (shared ragged axis ~N)");
    auto c = cross_batch(DType::f64, {{2, 1}, {3, 3}});
    EXPECT_EQ(attention_error(b.q, c.k, c.v),
              "attention: batch sizes differ, q has 3 samples and k has 2");
}

} // namespace
} // namespace rag
