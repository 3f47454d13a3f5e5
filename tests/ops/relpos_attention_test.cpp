// relpos_attention against an independent float64 reference that gathers the relation terms
// of every (i, j) with plain loops: the four mechanisms of REFERENCE.md section 2, each
// bidirectional and causal, on ragged lengths including 0, 1 and lengths past the map's
// saturation; every gradient by central differences; f32 and bf16 against section 3's criterion.
#include "runtime/relpos_map.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <limits>

namespace rag {
namespace {

using namespace rag::testing;

constexpr std::int64_t H = 2, D = 3, Dv = 4;

// One mechanism: its map, which tables it has, their values, and the op's attrs.
struct Mechanism {
    std::string name;
    RelposMap map;
    Attrs attrs; // map, map parameters, table flags, scale
    std::int64_t max_len;
    bool aq = false, ak = false, bias = false;
    double scale = 1.0 / std::sqrt(double(D));
};

Mechanism shaw() {
    return {"Shaw",
            RelposMap::clip(3),
            {{"map", std::string("clip")}, {"distance", std::int64_t(3)}, {"aq", true}},
            20,
            true};
}
Mechanism transformer_xl() {
    return {"Transformer-XL",
            RelposMap::identity(12),
            {{"map", std::string("identity")}, {"aq", true}, {"ak", true}, {"bias", true}},
            12,
            true,
            true,
            true};
}
Mechanism deberta(std::int64_t size = 8, std::int64_t max_position = 16, std::int64_t max_len = 30,
                  bool aq = true, bool ak = true) {
    const double scale = 1.0 / std::sqrt(3.0 * D);
    return {"DeBERTa",
            RelposMap::log_buckets(size, max_position),
            {{"map", std::string("log_buckets")},
             {"size", size},
             {"max_position", max_position},
             {"aq", aq},
             {"ak", ak},
             {"scale", scale}},
            max_len,
            aq,
            ak,
            false,
            scale};
}
Mechanism t5() {
    return {"T5",
            RelposMap::t5_buckets(8, 16),
            {{"map", std::string("t5_buckets")},
             {"num", std::int64_t(8)},
             {"max_distance", std::int64_t(16)},
             {"bias", true},
             {"scale", 1.0}},
            12,
            false,
            false,
            true,
            1.0};
}

std::vector<Mechanism> mechanisms() {
    return {shaw(), transformer_xl(), deberta(), t5()};
}

// Lengths 0, 1, the mechanism's largest and random ones in between.
std::vector<Shape_> lengths_for(const Mechanism& m, std::int64_t B = 5) {
    auto l = random_lengths(B, 1, 0, m.max_len);
    l[1] = {1};
    l[2] = {m.max_len};
    return l;
}

// q, k, v and the mechanism's tables, in the op's input order.
std::vector<RaggedTensor> make_inputs(const Mechanism& m, const std::vector<Shape_>& lengths) {
    std::vector<RaggedTensor> in;
    for (std::int64_t width : {D, D, Dv}) {
        std::string axes = "~N, " + std::to_string(H) + ", " + std::to_string(width);
        in.push_back(random_batch(DType::f64, axes, shapes_for(axes, lengths)));
    }
    const std::int64_t R = m.map.rows();
    if (m.name == "Transformer-XL") {
        // aq = positions p_r, ak = the content bias u on every row, bias[r] = v.p_r.
        auto p = Nd::of(random_dense(DType::f64, {R, H, D}).to_dense());
        auto u = Nd::of(random_dense(DType::f64, {H, D}).to_dense());
        auto vb = Nd::of(random_dense(DType::f64, {H, D}).to_dense());
        Nd ak({R, H, D}), b({R, H});
        for (std::int64_t r = 0; r < R; ++r)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t c = 0; c < D; ++c) {
                    ak({r, h, c}) = u({h, c});
                    b({r, h}) += vb({h, c}) * p({r, h, c});
                }
        for (const Nd* t : {&p, &ak, &b})
            in.push_back(RaggedTensor::dense(DenseArray::from_f64(DType::f64, t->shape, t->v)));
        return in;
    }
    if (m.aq) in.push_back(random_dense(DType::f64, {R, H, D}));
    if (m.ak) in.push_back(random_dense(DType::f64, {R, H, D}));
    if (m.bias) in.push_back(random_dense(DType::f64, {R, H}));
    return in;
}

Attrs with_causal(Attrs a, bool causal) {
    return a.set("causal", causal);
}

// The float64 reference from the equations: for every (i, j) gather the relation row
// r = phi(i - j) and add q_i.aq[r], k_j.ak[r] and bias[r] to q_i.k_j; mask j > i when causal.
std::vector<Nd> reference(const Mechanism& m, const std::vector<RaggedTensor>& in, bool causal) {
    auto qs = samples(in[0]), ks = samples(in[1]), vs = samples(in[2]);
    std::size_t next = 3;
    auto table = [&](bool present) { return present ? Nd::of(in[next++].to_dense()) : Nd(); };
    const Nd aq = table(m.aq), ak = table(m.ak), b = table(m.bias);
    std::vector<Nd> out;
    for (std::size_t s = 0; s < qs.size(); ++s) {
        const Nd &q = qs[s], &k = ks[s], &v = vs[s];
        const std::int64_t n = q.shape[0];
        Nd o({n, H, Dv});
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < n; ++i) {
                auto sc = std::vector<double>(std::size_t(n));
                for (std::int64_t j = 0; j < n; ++j) {
                    const std::int64_t r = m.map.row(i - j);
                    double x = 0;
                    for (std::int64_t c = 0; c < D; ++c) {
                        x += q({i, h, c}) * k({j, h, c});
                        if (m.aq) x += q({i, h, c}) * aq({r, h, c});
                        if (m.ak) x += k({j, h, c}) * ak({r, h, c});
                    }
                    if (m.bias) x += b({r, h});
                    sc[std::size_t(j)] =
                        causal && j > i ? -std::numeric_limits<double>::infinity() : m.scale * x;
                }
                double top = *std::max_element(sc.begin(), sc.end()), z = 0;
                for (double& x : sc) z += x = std::exp(x - top);
                for (std::int64_t j = 0; j < n; ++j)
                    for (std::int64_t c = 0; c < Dv; ++c)
                        o({i, h, c}) += sc[std::size_t(j)] / z * v({j, h, c});
            }
        out.push_back(o);
    }
    return out;
}

// REFERENCE.md section 3: each value cast to float32 against the float64 reference. f32 needs
// relative l2 <= 1e-5; f16 and bf16 pass elementwise |x - ref| <= 0.03 + 0.05 |ref| or with a
// relative l2 within eight machine epsilons (8 * 2^-10 for f16, 8 * 2^-7 for bf16).
::testing::AssertionResult meets_criterion(DType t, const RaggedTensor& got,
                                           const std::vector<Nd>& ref) {
    auto gs = samples(got);
    if (gs.size() != ref.size()) return ::testing::AssertionFailure() << "sample count differs";
    double err2 = 0, ref2 = 0;
    bool elementwise = true;
    for (std::size_t s = 0; s < gs.size(); ++s) {
        if (gs[s].shape != ref[s].shape)
            return ::testing::AssertionFailure() << "sample " << s << ": shape differs";
        for (std::size_t e = 0; e < gs[s].v.size(); ++e) {
            const double x = double(float(gs[s].v[e])), r = ref[s].v[e];
            err2 += (x - r) * (x - r);
            ref2 += r * r;
            elementwise = elementwise && std::fabs(x - r) <= 0.03 + 0.05 * std::fabs(r);
        }
    }
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    if (t == DType::f32 ? rel <= 1e-5
                        : elementwise || rel <= 8 * std::ldexp(1.0, t == DType::f16 ? -10 : -7))
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << dtype_name(t) << ": relative l2 error " << rel
                                         << (elementwise ? "" : ", elementwise bound broken");
}

TEST(RelposAttention, MechanismsMatchTheGatheringReference) {
    for (const auto& m : mechanisms()) {
        if (m.map.name() != "identity") {
            ASSERT_GT(m.max_len, m.map.saturation() + 1) << m.name;
        }
        auto in = make_inputs(m, lengths_for(m));
        for (bool causal : {false, true}) {
            auto y = evaluate("relpos_attention", in, with_causal(m.attrs, causal));
            EXPECT_EQ(y.schema().str(), "f64[B, ~N, 2, 4]");
            EXPECT_EQ(y.structure_ptr(), in[2].structure_ptr());
            EXPECT_TRUE(samples_close(y, reference(m, in, causal), 1e-12, 1e-12))
                << m.name << (causal ? " causal" : "");
        }
    }
}

TEST(RelposAttention, GeneralBucketTable) {
    // map=buckets with a table: the gathering reference, its gradients, and a table that
    // is not an interval per row is an error naming the map.
    const std::vector<std::int64_t> table = {0, 0, 1, 2, 2, 3, 4};
    Mechanism m{"buckets",
                RelposMap::buckets(table, 3),
                {{"map", std::string("buckets")},
                 {"distance", std::int64_t(3)},
                 {"table", table},
                 {"aq", true},
                 {"bias", true}},
                12,
                true,
                false,
                true};
    auto in = make_inputs(m, lengths_for(m));
    for (bool causal : {false, true}) {
        EXPECT_TRUE(samples_close(evaluate("relpos_attention", in, with_causal(m.attrs, causal)),
                                  reference(m, in, causal), 1e-12, 1e-12));
        check_vjp("relpos_attention", make_inputs(m, lengths_for(m, 4)),
                  with_causal(m.attrs, causal), 1e-6);
    }
    Attrs bad = m.attrs;
    bad.set("table", std::vector<std::int64_t>{0, 1, 0, 2, 3, 4, 4});
    EXPECT_NE(error_of([&] { evaluate("relpos_attention", in, bad); }).find("buckets"),
              std::string::npos);
}

TEST(RelposAttention, DebertaDefaultBucketsAtSmallN) {
    auto m = deberta(256, 512, 9);
    auto in = make_inputs(m, lengths_for(m, 3));
    for (bool causal : {false, true})
        EXPECT_TRUE(samples_close(evaluate("relpos_attention", in, with_causal(m.attrs, causal)),
                                  reference(m, in, causal), 1e-12, 1e-12));
}

TEST(RelposAttention, ContentToPositionAndPositionToContentSeparately) {
    // A swapped p2c sign (phi(j - i) for aK) once shipped in a public kernel.
    for (auto m : {deberta(8, 16, 30, true, false), deberta(8, 16, 30, false, true)}) {
        auto in = make_inputs(m, lengths_for(m));
        for (bool causal : {false, true})
            EXPECT_TRUE(
                samples_close(evaluate("relpos_attention", in, with_causal(m.attrs, causal)),
                              reference(m, in, causal), 1e-12, 1e-12))
                << (m.aq ? "c2p" : "p2c") << (causal ? " causal" : "");
    }
}

TEST(RelposAttention, Gradients) {
    for (const auto& m : mechanisms()) {
        auto in = make_inputs(m, lengths_for(m, 4));
        for (bool causal : {false, true}) {
            SCOPED_TRACE(m.name + (causal ? " causal" : ""));
            check_vjp("relpos_attention", in, with_causal(m.attrs, causal), 1e-6);
        }
    }
}

TEST(RelposAttention, F32AndBf16MeetTheCriterion) {
    for (const auto& m : mechanisms()) {
        auto in = make_inputs(m, lengths_for(m));
        for (DType t : {DType::f32, DType::bf16})
            for (bool causal : {false, true}) {
                std::vector<RaggedTensor> low;
                for (const auto& x : in) low.push_back(x.astype(t));
                auto y = evaluate("relpos_attention", low, with_causal(m.attrs, causal));
                ASSERT_EQ(y.dtype(), t);
                // The reference reads the same rounded inputs, in float64.
                std::vector<RaggedTensor> rounded;
                for (const auto& x : low) rounded.push_back(x.astype(DType::f64));
                EXPECT_TRUE(meets_criterion(t, y, reference(m, rounded, causal)))
                    << m.name << (causal ? " causal" : "");
            }
    }
}

TEST(RelposAttention, TypeErrors) {
    auto m = shaw();
    auto in = make_inputs(m, {{2}, {3}});
    auto err = [&](std::vector<RaggedTensor> args, const Attrs& at) {
        return error_of([&] { evaluate("relpos_attention", args, at); });
    };
    auto has = [](const std::string& msg, const std::string& part) {
        return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                                   : ::testing::AssertionFailure() << msg;
    };
    EXPECT_TRUE(
        has(err({in[0], in[1], in[2]}, m.attrs),
            "relpos_attention: the attrs aq, ak, bias ask for 4 inputs (q, k, v, aq), got 3"));
    auto short_table = random_dense(DType::f64, {5, H, D});
    EXPECT_TRUE(has(err({in[0], in[1], in[2], short_table}, m.attrs),
                    "relpos_attention: clip(3) has 7 rows but the tables have 5"));
    auto wrong_heads = random_dense(DType::f64, {7, 3, D});
    EXPECT_TRUE(has(err({in[0], in[1], in[2], wrong_heads}, m.attrs),
                    "relpos_attention: aq must be an unbatched [R, 2, 3] table"));
    Attrs identity{{"map", std::string("identity")}, {"aq", true}};
    EXPECT_TRUE(has(err({in[0], in[1], in[2], random_dense(DType::f64, {6, H, D})}, identity),
                    "needs R = 2L - 1 table rows, got 6"));
    EXPECT_TRUE(has(err({in[0], in[1], in[2]}, {{"map", std::string("identity")}}),
                    "takes L from the table rows"));
    EXPECT_TRUE(has(err(in, Attrs(m.attrs).set("map", std::string("alibi"))),
                    "relpos_attention: unknown map \"alibi\""));
    EXPECT_TRUE(has(err({in[0], in[1], in[2]}, {{"map", std::string("clip")}}),
                    "relpos_attention: missing attribute distance"));
    EXPECT_TRUE(has(
        err({in[0], in[1], in[2]}, {{"map", std::string("t5_buckets")}, {"num", std::int64_t(7)}}),
        "relpos_attention: t5_buckets(7, 128): num must be even"));
    auto other_tokens = random_batch(DType::f64, "~M, 2, 3", {{2, H, D}, {3, H, D}});
    EXPECT_TRUE(has(err({in[0], other_tokens, in[2], in[3]}, m.attrs),
                    "q, k and v must share one token axis (self-attention)"));
    auto three_heads = random_batch(DType::f64, "~N, 3, 4", {{2, 3, Dv}, {3, 3, Dv}});
    EXPECT_TRUE(has(err({in[0], in[1], three_heads, in[3]}, m.attrs), "with one H"));
    auto f32 = in[3].astype(DType::f32);
    EXPECT_TRUE(has(err({in[0], in[1], in[2], f32}, m.attrs), "different dtypes"));
}

TEST(RelposAttention, RuntimeErrorsNameTheSample) {
    auto m = transformer_xl(); // identity(12)
    auto in = make_inputs(m, {{3}, {2}, {13}});
    auto msg = error_of([&] { evaluate("relpos_attention", in, m.attrs); });
    EXPECT_NE(msg.find("relpos_attention: sample 2 has N = 13 tokens but identity(12) covers N <= "
                       "L = 12"),
              std::string::npos)
        << msg;
    auto s = shaw();
    auto a = make_inputs(s, {{3}, {2}});
    auto b = make_inputs(s, {{3}, {4}});
    msg = error_of([&] { evaluate("relpos_attention", {a[0], b[1], a[2], a[3]}, s.attrs); });
    EXPECT_NE(msg.find("relpos_attention: sample 1: q has N = 2 tokens but k has 4"),
              std::string::npos)
        << msg;
    auto c = make_inputs(s, {{3}});
    msg = error_of([&] { evaluate("relpos_attention", {a[0], a[1], c[2], a[3]}, s.attrs); });
    EXPECT_NE(msg.find("batch sizes differ: q has 2 samples, v has 1"), std::string::npos) << msg;
}

TEST(RelposAttention, GradOpChecksItsArguments) {
    auto m = shaw();
    auto in = make_inputs(m, {{2}, {3}});
    auto y = evaluate("relpos_attention", in, m.attrs);
    auto args = in;
    args.push_back(y);
    auto msg = error_of([&] {
        evaluate("relpos_attention_grad", args, Attrs(m.attrs).set("wrt", std::int64_t(4)));
    });
    EXPECT_NE(msg.find("relpos_attention_grad: wrt must name one of the 4 inputs, got 4"),
              std::string::npos)
        << msg;
    args.back() = in[0];
    msg = error_of([&] {
        evaluate("relpos_attention_grad", args, Attrs(m.attrs).set("wrt", std::int64_t(0)));
    });
    EXPECT_NE(msg.find("relpos_attention_grad: dO must be f64[B, ~N, 2, 4]"), std::string::npos)
        << msg;
    // The grad op's own dtype path: f32 gradients against the f64 ones on the same values.
    args.back() = y;
    for (std::int64_t wrt = 0; wrt < 4; ++wrt) {
        std::vector<RaggedTensor> low;
        for (const auto& x : args) low.push_back(x.astype(DType::f32).astype(DType::f64));
        auto at = Attrs(m.attrs).set("wrt", wrt);
        auto want = samples(evaluate("relpos_attention_grad", low, at));
        for (auto& x : low) x = x.astype(DType::f32);
        EXPECT_TRUE(meets_criterion(DType::f32, evaluate("relpos_attention_grad", low, at), want))
            << "wrt " << wrt;
    }
}

} // namespace
} // namespace rag
