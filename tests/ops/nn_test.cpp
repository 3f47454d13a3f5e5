// NN ops against per-sample dense references: layernorm and rmsnorm over the static feature
// axis, counter-based dropout, the mse and cross_entropy losses, and pad / mask / lengths; every
// VJP against float64 central differences.
#include "tests/support/testing.hpp"

#include <algorithm>
#include <cmath>

namespace rag {
namespace {

using namespace rag::testing;

// Lengths for B samples and `names` ragged names, with sample 0 of length 0 and sample 1 of 1.
std::vector<Shape_> lengths_with_0_and_1(std::int64_t B, int names, std::int64_t hi) {
    auto l = random_lengths(B, names, 0, hi);
    l[1] = Shape_(std::size_t(names), 1);
    return l;
}

RaggedTensor batch(DType t, std::string_view axes, const std::vector<Shape_>& lengths,
                   double lo = -2, double hi = 2) {
    return random_batch(t, axes, shapes_for(axes, lengths), lo, hi);
}

bool contains(const std::string& msg, std::string_view part) {
    return msg.find(part) != std::string::npos;
}

// Applies fn to every row of C contiguous features of a dense sample (the last axis is C).
template <class Fn> Nd map_rows(Nd s, std::int64_t C, Fn&& fn) {
    for (std::int64_t r = 0; C && r < s.numel() / C; ++r) fn(s.v.data() + r * C);
    return s;
}

std::vector<Nd> layernorm_ref(const RaggedTensor& x, const RaggedTensor& g, const RaggedTensor& b,
                              double eps) {
    auto gv = g.to_f64(), bv = b.to_f64();
    const auto C = std::int64_t(gv.size());
    std::vector<Nd> want;
    for (const Nd& s : samples(x))
        want.push_back(map_rows(s, C, [&](double* row) {
            double mean = 0, var = 0;
            for (std::int64_t j = 0; j < C; ++j) mean += row[j] / double(C);
            for (std::int64_t j = 0; j < C; ++j)
                var += (row[j] - mean) * (row[j] - mean) / double(C);
            for (std::int64_t j = 0; j < C; ++j)
                row[j] = (row[j] - mean) / std::sqrt(var + eps) * gv[j] + bv[j];
        }));
    return want;
}

std::vector<Nd> rmsnorm_ref(const RaggedTensor& x, const RaggedTensor& g, double eps) {
    auto gv = g.to_f64();
    const auto C = std::int64_t(gv.size());
    std::vector<Nd> want;
    for (const Nd& s : samples(x))
        want.push_back(map_rows(s, C, [&](double* row) {
            double ms = 0;
            for (std::int64_t j = 0; j < C; ++j) ms += row[j] * row[j] / double(C);
            for (std::int64_t j = 0; j < C; ++j) row[j] = row[j] / std::sqrt(ms + eps) * gv[j];
        }));
    return want;
}

const char* norm_axes[] = {"~N, 8", "~N, ~N, 4"};

TEST(NnLayerNorm, MatchesPerSampleReferenceAndKeepsStructure) {
    for (const char* axes : norm_axes) {
        const std::int64_t C = parse_axes(axes).back().extent;
        auto x = batch(DType::f64, axes, lengths_with_0_and_1(5, 1, 5));
        auto g = random_dense(DType::f64, {C}), b = random_dense(DType::f64, {C});
        auto y = evaluate("layernorm", {x, g, b});
        EXPECT_EQ(y.structure_ptr(), x.structure_ptr()) << axes;
        EXPECT_TRUE(samples_close(y, layernorm_ref(x, g, b, 1e-5), 1e-12, 1e-12)) << axes;
        auto y2 = evaluate("layernorm", {x, g, b}, {{"eps", 0.5}});
        EXPECT_TRUE(samples_close(y2, layernorm_ref(x, g, b, 0.5), 1e-12, 1e-12)) << axes;
    }
}

TEST(NnLayerNorm, Gradients) {
    for (const char* axes : norm_axes) {
        const std::int64_t C = parse_axes(axes).back().extent;
        auto x = batch(DType::f64, axes, {{0}, {1}, {3}});
        auto g = random_dense(DType::f64, {C}), b = random_dense(DType::f64, {C});
        check_vjp("layernorm", {x, g, b});
        check_vjp("layernorm", {x, g, b}, {{"eps", 0.25}});
    }
}

TEST(NnRmsNorm, MatchesPerSampleReferenceAndKeepsStructure) {
    for (const char* axes : norm_axes) {
        const std::int64_t C = parse_axes(axes).back().extent;
        auto x = batch(DType::f64, axes, lengths_with_0_and_1(5, 1, 5));
        auto g = random_dense(DType::f64, {C});
        auto y = evaluate("rmsnorm", {x, g});
        EXPECT_EQ(y.structure_ptr(), x.structure_ptr()) << axes;
        EXPECT_TRUE(samples_close(y, rmsnorm_ref(x, g, 1e-6), 1e-12, 1e-12)) << axes;
        auto y2 = evaluate("rmsnorm", {x, g}, {{"eps", 0.5}});
        EXPECT_TRUE(samples_close(y2, rmsnorm_ref(x, g, 0.5), 1e-12, 1e-12)) << axes;
    }
}

TEST(NnRmsNorm, Gradients) {
    for (const char* axes : norm_axes) {
        const std::int64_t C = parse_axes(axes).back().extent;
        auto x = batch(DType::f64, axes, {{0}, {1}, {3}});
        auto g = random_dense(DType::f64, {C});
        check_vjp("rmsnorm", {x, g});
        check_vjp("rmsnorm", {x, g}, {{"eps", 0.25}});
    }
}

TEST(NnNorm, LowPrecisionForward) {
    for (auto [t, tol] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 1e-2}}) {
        auto x = batch(t, "~N, 8", lengths_with_0_and_1(4, 1, 6));
        auto g = random_dense(t, {8}), b = random_dense(t, {8});
        auto y = evaluate("layernorm", {x, g, b});
        EXPECT_EQ(y.dtype(), t);
        // The reference reads the same rounded inputs; only the output rounding differs.
        EXPECT_TRUE(samples_close(y, layernorm_ref(x, g, b, 1e-5), tol, tol));
        auto r = evaluate("rmsnorm", {x, g});
        EXPECT_EQ(r.dtype(), t);
        EXPECT_TRUE(samples_close(r, rmsnorm_ref(x, g, 1e-6), tol, tol));
    }
}

TEST(NnNorm, TypeAndRuntimeErrors) {
    auto x = batch(DType::f32, "~N, 8", {{2}, {3}});
    auto g = random_dense(DType::f32, {8}), b = random_dense(DType::f32, {8});
    auto ragged_last = batch(DType::f32, "4, ~N", {{2}, {3}});
    auto msg = error_of([&] { evaluate("layernorm", {ragged_last, g, b}); });
    EXPECT_TRUE(contains(msg, "layernorm: the last axis of x must be a static axis")) << msg;
    msg = error_of([&] { evaluate("rmsnorm", {x, random_dense(DType::f32, {7})}); });
    EXPECT_TRUE(contains(msg, "rmsnorm: parameter 1 must be f32[8]")) << msg;
    msg = error_of([&] { evaluate("layernorm", {x, g, random_dense(DType::f64, {8})}); });
    EXPECT_TRUE(contains(msg, "layernorm: operands have different dtypes")) << msg;
    auto xi = batch(DType::i32, "~N, 8", {{2}});
    msg = error_of([&] { evaluate("rmsnorm", {xi, random_dense(DType::i32, {8})}); });
    EXPECT_TRUE(contains(msg, "rmsnorm: x must be a floating-point")) << msg;
    msg = error_of([&] { evaluate("layernorm_grad", {x, g, b, x}, {{"wrt", 3}}); });
    EXPECT_TRUE(contains(msg, "layernorm_grad: wrt must be in [0, 2]")) << msg;
    auto dy = batch(DType::f32, "~N, 8", {{2}, {4}});
    msg = error_of([&] { evaluate("layernorm_grad", {x, g, b, dy}, {{"wrt", 0}}); });
    EXPECT_TRUE(contains(msg, "layernorm_grad: sample 1 has shape (3, 8) in x but (4, 8) in dy"))
        << msg;
    msg = error_of([&] { evaluate("rmsnorm_grad", {x, g, dy}, {{"wrt", 1}}); });
    EXPECT_TRUE(contains(msg, "rmsnorm_grad: sample 1 has shape (3, 8)")) << msg;
}

// The documented generator, written out independently.
bool kept(std::int64_t seed, std::int64_t k, double p) {
    std::uint64_t z = std::uint64_t(seed) * 0x9E3779B97F4A7C15ull + std::uint64_t(k);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return double(z >> 11) / 9007199254740992.0 >= p;
}

TEST(NnDropout, CounterBasedMask) {
    const double p = 0.3;
    auto x = batch(DType::f64, "~N, 16", lengths_with_0_and_1(40, 1, 60), 0.5, 1.5);
    Attrs at{{"p", p}, {"seed", std::int64_t(1234)}};
    auto y = evaluate("dropout", {x}, at);
    EXPECT_EQ(y.structure_ptr(), x.structure_ptr());
    auto xv = x.to_f64(), yv = y.to_f64();
    std::int64_t kept_count = 0;
    for (std::size_t k = 0; k < xv.size(); ++k) {
        bool keep = kept(1234, std::int64_t(k), p);
        kept_count += keep;
        ASSERT_EQ(yv[k], keep ? xv[k] / (1 - p) : 0.0) << "element " << k;
    }
    // Binomial(n, 0.7): six standard deviations are well under 0.03 here.
    ASSERT_GT(xv.size(), 800u);
    EXPECT_NEAR(double(kept_count) / double(xv.size()), 1 - p, 0.03);
    EXPECT_EQ(evaluate("dropout", {x}, at).to_f64(), yv); // equal seeds, equal masks
    auto other = evaluate("dropout", {x}, {{"p", p}, {"seed", std::int64_t(1235)}}).to_f64();
    std::size_t differ = 0;
    for (std::size_t k = 0; k < yv.size(); ++k) differ += (other[k] == 0) != (yv[k] == 0);
    EXPECT_GT(differ, xv.size() / 5);
}

TEST(NnDropout, IdentityAtZeroGradientsAndErrors) {
    auto x = batch(DType::f64, "~N, ~N, 2", {{0}, {1}, {4}});
    EXPECT_EQ(evaluate("dropout", {x}, {{"p", 0.0}, {"seed", std::int64_t(9)}}).to_f64(),
              x.to_f64());
    check_vjp("dropout", {x}, {{"p", 0.5}, {"seed", std::int64_t(-3)}});
    for (double p : {1.0, -0.1}) {
        auto msg = error_of([&] {
            evaluate("dropout", {x}, {{"p", p}, {"seed", std::int64_t(1)}});
        });
        EXPECT_TRUE(contains(msg, "dropout: p must be in [0, 1)")) << msg;
    }
    for (DType t : {DType::f32, DType::bf16}) {
        auto xt = x.astype(t);
        auto y = evaluate("dropout", {xt}, {{"p", 0.5}, {"seed", std::int64_t(5)}});
        EXPECT_EQ(y.dtype(), t);
        auto xv = xt.to_f64(), yv = y.to_f64();
        for (std::size_t k = 0; k < xv.size(); ++k)
            EXPECT_EQ(yv[k], kept(5, std::int64_t(k), 0.5) ? 2 * xv[k] : 0.0);
    }
}

TEST(NnMse, MatchesPerSampleLoopAndGradients) {
    auto lengths = lengths_with_0_and_1(5, 1, 6);
    auto a = batch(DType::f64, "~N, 3", lengths), b = batch(DType::f64, "~N, 3", lengths);
    double s = 0, n = 0;
    auto as = samples(a), bs = samples(b);
    for (std::size_t i = 0; i < as.size(); ++i)
        for (std::int64_t k = 0; k < as[i].numel(); ++k, ++n)
            s += std::pow(as[i].v[std::size_t(k)] - bs[i].v[std::size_t(k)], 2);
    auto y = evaluate("mse", {a, b});
    EXPECT_EQ(y.schema().str(), "f64[]");
    EXPECT_NEAR(y.item(), s / n, 1e-12);
    check_vjp("mse", {a, b});
    auto w = random_dense(DType::f64, {2, 3}), v = random_dense(DType::f64, {2, 3});
    check_vjp("mse", {w, v});
    auto e = batch(DType::f64, "~N, 3", {{0}, {0}});
    EXPECT_EQ(evaluate("mse", {e, e}).item(), 0.0);
    auto y32 = evaluate("mse", {a.astype(DType::f32), b.astype(DType::f32)});
    EXPECT_EQ(y32.schema().str(), "f32[]");
    EXPECT_NEAR(y32.item(), s / n, 1e-5);
    EXPECT_NEAR(evaluate("mse", {a.astype(DType::bf16), b.astype(DType::bf16)}).item(), s / n,
                0.02 * s / n);
}

TEST(NnMse, Errors) {
    auto a = batch(DType::f64, "~N, 3", {{2}, {3}});
    auto msg = error_of([&] { evaluate("mse", {a, batch(DType::f64, "~N, 4", {{2}, {3}})}); });
    EXPECT_TRUE(contains(msg, "mse: a and b must have the same schema")) << msg;
    msg = error_of([&] { evaluate("mse", {a, a.astype(DType::f32)}); });
    EXPECT_TRUE(contains(msg, "mse: a and b must have the same schema")) << msg;
    auto b = batch(DType::f64, "~N, 3", {{2}, {5}});
    msg = error_of([&] { evaluate("mse", {a, b}); });
    EXPECT_TRUE(contains(msg, "mse: sample 1 has shape (3, 3) in a but (5, 3) in b")) << msg;
    msg = error_of([&] { evaluate("mse", {a, batch(DType::f64, "~N, 3", {{2}})}); });
    EXPECT_TRUE(contains(msg, "mse: a has 2 samples but b has 1")) << msg;
}

// Mean over positions of logsumexp(row) - row[label], from dense samples.
double cross_entropy_ref(const RaggedTensor& logits, const RaggedTensor& labels, std::int64_t K) {
    auto zs = samples(logits), ys = samples(labels);
    double s = 0, n = 0;
    for (std::size_t i = 0; i < zs.size(); ++i)
        for (std::int64_t p = 0; p < ys[i].numel(); ++p, ++n) {
            const double* row = zs[i].v.data() + p * K;
            double z = 0;
            for (std::int64_t j = 0; j < K; ++j) z += std::exp(row[j]);
            s += std::log(z) - row[std::int64_t(ys[i].v[std::size_t(p)])];
        }
    return n ? s / n : 0.0;
}

TEST(NnCrossEntropy, MatchesPerSampleLoopAndGradients) {
    // "2, ~N, 4": a static axis before the ragged one, so storage order is not logical order.
    for (auto [z_axes, y_axes] : {std::pair{"~N, 5", "~N"}, std::pair{"~N, ~N, 3", "~N, ~N"},
                                  std::pair{"2, ~N, 4", "2, ~N"}}) {
        const std::int64_t K = parse_axes(z_axes).back().extent;
        auto lengths = lengths_with_0_and_1(5, 1, 4);
        auto z = batch(DType::f64, z_axes, lengths, -3, 3);
        for (DType lt : {DType::i32, DType::i64}) {
            auto y = batch(lt, y_axes, lengths, 0, double(K));
            auto loss = evaluate("cross_entropy", {z, y});
            EXPECT_EQ(loss.schema().str(), "f64[]");
            EXPECT_NEAR(loss.item(), cross_entropy_ref(z, y, K), 1e-12) << z_axes;
            check_vjp("cross_entropy", {z, y});
        }
    }
    auto w = random_dense(DType::f64, {4});
    auto label = RaggedTensor::dense(DenseArray::from_f64(DType::i64, {}, {2}));
    check_vjp("cross_entropy", {w, label});
    auto e = batch(DType::f64, "~N, 5", {{0}, {0}});
    EXPECT_EQ(evaluate("cross_entropy", {e, batch(DType::i64, "~N", {{0}, {0}})}).item(), 0.0);
}

TEST(NnCrossEntropy, LowPrecisionForward) {
    auto lengths = lengths_with_0_and_1(4, 1, 5);
    auto y = batch(DType::i64, "~N", lengths, 0, 6);
    for (auto [t, tol] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 2e-2}}) {
        auto z = batch(t, "~N, 6", lengths);
        auto loss = evaluate("cross_entropy", {z, y});
        EXPECT_EQ(loss.dtype(), t);
        double want = cross_entropy_ref(z, y, 6);
        EXPECT_NEAR(loss.item(), want, tol * want);
    }
}

TEST(NnCrossEntropy, Errors) {
    auto z = batch(DType::f64, "~N, 5", {{2}, {3}, {1}});
    std::vector<DenseArray> list;
    for (auto [n, bad] : {std::pair{2, 0.0}, std::pair{3, 0.0}, std::pair{1, 5.0}})
        list.push_back(
            DenseArray::from_f64(DType::i64, {n}, std::vector<double>(std::size_t(n), bad)));
    auto y = RaggedTensor::from_list(list, "~N");
    auto msg = error_of([&] { evaluate("cross_entropy", {z, y}); });
    EXPECT_TRUE(contains(msg, "cross_entropy: sample 2 has label 5 outside [0, 5)")) << msg;
    list[2] = DenseArray::from_f64(DType::i64, {1}, {-1});
    msg = error_of([&] { evaluate("cross_entropy", {z, RaggedTensor::from_list(list, "~N")}); });
    EXPECT_TRUE(contains(msg, "sample 2 has label -1")) << msg;
    auto w = random_dense(DType::f64, {4});
    auto big = RaggedTensor::dense(DenseArray::from_f64(DType::i32, {}, {4}));
    msg = error_of([&] { evaluate("cross_entropy", {w, big}); });
    EXPECT_TRUE(contains(msg, "cross_entropy: label 4 is outside [0, 4)")) << msg;

    msg = error_of([&] { evaluate("cross_entropy", {z, y.astype(DType::f32)}); });
    EXPECT_TRUE(contains(msg, "cross_entropy: labels must be i32 or i64")) << msg;
    msg = error_of([&] { evaluate("cross_entropy", {z, batch(DType::i64, "~N, 5", {{2}})}); });
    EXPECT_TRUE(contains(msg, "cross_entropy: labels must have shape [B, ~N]")) << msg;
    auto ragged_classes = batch(DType::f64, "~N", {{2}});
    msg = error_of([&] {
        evaluate("cross_entropy", {ragged_classes, random_dense(DType::i64, {})});
    });
    EXPECT_TRUE(contains(msg, "cross_entropy: the class axis (last) of logits must be a static"))
        << msg;
    auto short_labels = batch(DType::i64, "~N", {{2}, {2}, {1}}, 0, 5);
    msg = error_of([&] { evaluate("cross_entropy", {z, short_labels}); });
    EXPECT_TRUE(contains(msg, "cross_entropy: sample 1 has logits of shape (3, 5) but labels of "
                              "shape (2,)"))
        << msg;
}

// The padded batch built element by element: sample i's entry at idx goes to [i, idx...].
Nd pad_ref(const std::vector<Nd>& ss, const Shape_& env, double value) {
    Shape_ shape = env;
    shape.insert(shape.begin(), std::int64_t(ss.size()));
    Nd out(shape, value);
    std::int64_t per = 1;
    for (auto e : env) per *= e;
    for (std::size_t i = 0; i < ss.size(); ++i)
        for (std::int64_t f = 0; f < ss[i].numel(); ++f) {
            std::int64_t rest = f, dst = 0, stride = per;
            for (std::size_t a = 0; a < env.size(); ++a) {
                std::int64_t inner = 1;
                for (std::size_t b = a + 1; b < env.size(); ++b) inner *= ss[i].shape[b];
                stride /= env[a];
                dst += rest / inner * stride;
                rest %= inner;
            }
            out.v[std::size_t(std::int64_t(i) * per + dst)] = ss[i].v[std::size_t(f)];
        }
    return out;
}

struct PadCase {
    const char* axes;
    const char* padded;
    int names;
};

const PadCase pad_cases[] = {{"~N, 3", "[B, N_max, 3]", 1},
                             {"~N, ~M, 2", "[B, N_max, M_max, 2]", 2},
                             {"3, ~H, ~W", "[B, 3, H_max, W_max]", 2},
                             {"~N, ~N, 4", "[B, N_max, N_max, 4]", 1}};

TEST(NnPad, PadAndMaskMatchToPaddedAndALoop) {
    for (const PadCase& c : pad_cases) {
        auto x = batch(DType::f64, c.axes, lengths_with_0_and_1(5, c.names, 4));
        auto ss = samples(x);
        Shape_ env(ss[0].shape.size(), 0);
        for (const Nd& s : ss)
            for (std::size_t a = 0; a < env.size(); ++a) env[a] = std::max(env[a], s.shape[a]);

        auto y = evaluate("pad", {x}, {{"value", -7.5}});
        EXPECT_EQ(y.schema().str(), std::string("f64") + c.padded);
        EXPECT_EQ(y.to_f64(), x.to_padded(-7.5).to_f64()) << c.axes;
        EXPECT_EQ(y.to_f64(), pad_ref(ss, env, -7.5).v) << c.axes;
        EXPECT_EQ(evaluate("pad", {x}).to_f64(), pad_ref(ss, env, 0.0).v) << c.axes;

        std::vector<Nd> ones;
        for (const Nd& s : ss) ones.emplace_back(s.shape, 1.0);
        auto m = evaluate("mask", {x});
        EXPECT_EQ(m.schema().str(), std::string("bool") + c.padded);
        EXPECT_EQ(m.to_f64(), x.mask().to_f64()) << c.axes;
        EXPECT_EQ(m.to_f64(), pad_ref(ones, env, 0.0).v) << c.axes;
    }
}

TEST(NnPad, Lengths) {
    for (const PadCase& c : pad_cases) {
        auto x = batch(DType::f32, c.axes, lengths_with_0_and_1(5, c.names, 4));
        auto ss = samples(x);
        const int rank = int(ss[0].shape.size());
        for (int axis = 1; axis <= rank; ++axis) {
            auto l = evaluate("lengths", {x}, {{"axis", std::int64_t(axis)}});
            EXPECT_EQ(l.schema().str(), "i64[B]");
            std::vector<double> want;
            for (const Nd& s : ss) want.push_back(double(s.shape[std::size_t(axis - 1)]));
            EXPECT_EQ(l.to_f64(), want) << c.axes << " axis " << axis;
            auto neg = evaluate("lengths", {x}, {{"axis", std::int64_t(axis - rank - 1)}});
            EXPECT_EQ(neg.to_f64(), want);
        }
    }
}

TEST(NnPad, Gradients) {
    for (const PadCase& c : pad_cases) {
        auto x = batch(DType::f64, c.axes, lengths_with_0_and_1(4, c.names, 3));
        check_vjp("pad", {x}, {{"value", 2.0}});
        check_vjp("unpad", {evaluate("pad", {x}), x});
        auto mg = evaluate_vjp("mask", std::vector{x}, {}, evaluate("mask", {x}));
        EXPECT_FALSE(mg[0].has_value());
        auto lg = evaluate_vjp("lengths", std::vector{x}, {{"axis", std::int64_t(1)}},
                               evaluate("lengths", {x}, {{"axis", std::int64_t(1)}}));
        EXPECT_FALSE(lg[0].has_value());
    }
}

TEST(NnPad, LowPrecisionAndEmptyBatch) {
    auto lengths = lengths_with_0_and_1(4, 2, 3);
    for (DType t : {DType::f32, DType::bf16}) {
        auto x = batch(t, "~N, ~M, 2", lengths);
        auto y = evaluate("pad", {x}, {{"value", 0.1}});
        EXPECT_EQ(y.dtype(), t);
        EXPECT_EQ(y.to_f64(), x.to_padded(0.1).to_f64());
    }
    auto empty = RaggedTensor::from_list({}, "~N, 3");
    auto y = evaluate("pad", {empty});
    EXPECT_EQ(y.batch(), 0);
    EXPECT_EQ(y.numel(), 0);
    EXPECT_EQ(evaluate("lengths", {empty}, {{"axis", std::int64_t(1)}}).numel(), 0);
}

TEST(NnPad, Errors) {
    auto w = random_dense(DType::f32, {3, 4});
    for (const char* op : {"pad", "mask"}) {
        auto msg = error_of([&] { evaluate(op, {w}); });
        EXPECT_TRUE(contains(msg, std::string(op) + ": x must be batched")) << msg;
    }
    auto x = batch(DType::f64, "~N, 3", {{2}, {4}});
    auto msg = error_of([&] { evaluate("lengths", {x}, {{"axis", std::int64_t(0)}}); });
    EXPECT_TRUE(contains(msg, "lengths: axis 0 is the batch axis")) << msg;
    msg = error_of([&] { evaluate("lengths", {x}, {{"axis", std::int64_t(3)}}); });
    EXPECT_TRUE(contains(msg, "lengths: axis 3 is out of range")) << msg;
    msg = error_of([&] { evaluate("unpad", {x, x}); });
    EXPECT_TRUE(contains(msg, "unpad: g must be f64[B, N_max, 3]")) << msg;
    auto other = evaluate("pad", {batch(DType::f64, "~N, 3", {{2}, {5}})});
    msg = error_of([&] { evaluate("unpad", {other, x}); });
    EXPECT_TRUE(
        contains(msg, "unpad: g has per-sample shape (5, 3) but the envelope of x is (4, 3)"))
        << msg;
}

} // namespace
} // namespace rag
