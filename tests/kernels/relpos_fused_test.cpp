// The fused relative-position attention kernels (jit/relpos.hpp) against the float64 reference
// that gathers the relation vector of every (i, j): the naive `relpos_attention` op and its
// `relpos_attention_grad`, run on the same inputs rounded to the kernel's dtype and widened to
// f64. Covers the four mechanisms of REFERENCE.md section 2, bidirectional and causal, f32, f16
// and bf16, ragged lengths around the 64-row tile (0, 1, 63, 64, 65, 130, 200) with small map
// parameters so saturated and band tiles both occur; the output and every gradient must meet
// REFERENCE.md section 3. Then bitwise determinism across runs and thread counts, and the
// peak extra memory the runtime's accounting sees (runtime/memory.hpp) at N = 4096.
#include "jit/kir_cpu.hpp"
#include "jit/relpos.hpp"
#include "jit/relpos_programs.hpp"
#include "jit/relpos_setup.hpp"
#include "runtime/memory.hpp"
#include "runtime/parallel.hpp"
#include "runtime/relpos_map.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sstream>

namespace rag {
namespace {

using namespace rag::testing;

// One relative-position mechanism: its map, its tables, its scale and the op's attrs.
struct Mechanism {
    std::string name;
    RelposMap map;
    Attrs attrs; // map and its parameters, table flags, scale (causal is set per case)
    bool aq = false, ak = false, bias = false;
    bool txl = false; // Transformer-XL's tied tables: ak = u on every row, bias = v.p_r
};

// Problem sizes of the correctness cases: Dv differs from D so a swapped width shows.
struct Dims {
    std::int64_t H = 2, D = 16, Dv = 24;
};

Mechanism make(std::string name, RelposMap map, Attrs attrs, bool aq, bool ak, bool bias,
               std::optional<double> scale = std::nullopt, bool txl = false) {
    attrs.set("aq", aq).set("ak", ak).set("bias", bias);
    if (scale) attrs.set("scale", *scale);
    return {std::move(name), std::move(map), std::move(attrs), aq, ak, bias, txl};
}

// Shaw: aq only, clipped (tau = 1/sqrt(d), the op's default).
Mechanism shaw(std::int64_t distance = 8) {
    return make("Shaw clip(" + std::to_string(distance) + ")", RelposMap::clip(distance),
                {{"map", std::string("clip")}, {"distance", distance}}, true, false, false);
}
// Transformer-XL: identity map over L >= every length, aq = p_r, ak = u, bias = v.p_r.
Mechanism transformer_xl(std::int64_t L) {
    return make("Transformer-XL identity(" + std::to_string(L) + ")", RelposMap::identity(L),
                {{"map", std::string("identity")}}, true, true, true, std::nullopt, true);
}
// DeBERTa: c2p (aq) and p2c (ak) over log buckets, tau = 1/sqrt(3d).
Mechanism deberta(const Dims& dm, std::int64_t size = 8, std::int64_t max_position = 16,
                  bool aq = true, bool ak = true) {
    std::string which = aq && ak ? "" : aq ? " c2p only" : " p2c only";
    return make(
        "DeBERTa log_buckets(" + std::to_string(size) + ", " + std::to_string(max_position) + ")" +
            which,
        RelposMap::log_buckets(size, max_position),
        {{"map", std::string("log_buckets")}, {"size", size}, {"max_position", max_position}}, aq,
        ak, false, 1.0 / std::sqrt(3.0 * double(dm.D)));
}
// T5: bias only over bidirectional buckets, tau = 1.
Mechanism t5(std::int64_t num = 8, std::int64_t max_distance = 16) {
    return make("T5 t5_buckets(" + std::to_string(num) + ", " + std::to_string(max_distance) + ")",
                RelposMap::t5_buckets(num, max_distance),
                {{"map", std::string("t5_buckets")}, {"num", num}, {"max_distance", max_distance}},
                false, false, true, 1.0);
}

const std::vector<std::int64_t> ragged_lengths = {65, 1, 63, 0, 130, 64, 200};

std::int64_t longest(const std::vector<std::int64_t>& lengths) {
    return *std::max_element(lengths.begin(), lengths.end());
}

std::vector<Mechanism> four_mechanisms(const Dims& dm, std::int64_t max_len) {
    // identity's L exceeds the longest sample so the shared table's centre L - 1 matters.
    return {shaw(), transformer_xl(max_len + 7), deberta(dm), t5()};
}

RaggedTensor tokens(std::int64_t H, std::int64_t width, const std::vector<std::int64_t>& lengths,
                    DType t = DType::f64) {
    std::string axes = "~N, " + std::to_string(H) + ", " + std::to_string(width);
    std::vector<Shape_> shapes;
    for (auto n : lengths) shapes.push_back({n, H, width});
    return random_batch(t, axes, shapes);
}

// q, k, v and the mechanism's tables in the op's input order, float64.
std::vector<RaggedTensor> make_inputs(const Mechanism& m, const std::vector<std::int64_t>& lengths,
                                      const Dims& dm) {
    const std::int64_t H = dm.H, D = dm.D, R = m.map.rows();
    std::vector<RaggedTensor> in = {tokens(H, D, lengths), tokens(H, D, lengths),
                                    tokens(H, dm.Dv, lengths)};
    if (m.txl) {
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

std::vector<RaggedTensor> cast(const std::vector<RaggedTensor>& in, DType t) {
    std::vector<RaggedTensor> out;
    for (const auto& x : in) out.push_back(x.astype(t));
    return out;
}

// The names of the op's inputs, in order, for messages.
std::vector<std::string> input_names(const Mechanism& m) {
    std::vector<std::string> n = {"q", "k", "v"};
    if (m.aq) n.push_back("aq");
    if (m.ak) n.push_back("ak");
    if (m.bias) n.push_back("bias");
    return n;
}

// The float64 reference on the given (already rounded) f64 inputs: O and every gradient.
struct Reference {
    RaggedTensor out;
    std::vector<RaggedTensor> grads;
};

Reference reference(const std::vector<RaggedTensor>& in64, const RaggedTensor& dO64,
                    const Attrs& at) {
    Reference r;
    r.out = evaluate("relpos_attention", in64, at);
    std::vector<RaggedTensor> args = in64;
    args.push_back(dO64);
    for (std::size_t k = 0; k < in64.size(); ++k)
        r.grads.push_back(
            evaluate("relpos_attention_grad", args, Attrs(at).set("wrt", std::int64_t(k))));
    return r;
}

// REFERENCE.md section 3: every value cast to float32 against the float64 reference. f32
// needs relative l2 <= 1e-5; f16 and bf16 pass elementwise |x - ref| <= 0.03 + 0.05 |ref| or
// with a relative l2 within eight machine epsilons (8 * 2^-10 for f16, 8 * 2^-7 for bf16).
// The failure message carries the numbers a kernel author needs.
::testing::AssertionResult meets_criterion(DType t, const RaggedTensor& got,
                                           const RaggedTensor& want) {
    if (got.dtype() != t)
        return ::testing::AssertionFailure()
               << "dtype " << dtype_name(got.dtype()) << ", expected " << dtype_name(t);
    if (got.shape() != want.shape() || got.structure().sizes() != want.structure().sizes())
        return ::testing::AssertionFailure()
               << "layout " << describe(got) << ", expected " << describe(want);
    const auto g = got.to_f64(), r = want.to_f64();
    // The absolute part of the element criterion scales with the outputs' magnitude (their
    // RMS), so a test on large or small values is as strict as one on values near 1.
    double sq = 0;
    for (double v : r) sq += v * v;
    const double scale = r.empty() ? 1.0 : std::max(std::sqrt(sq / double(r.size())), 1e-30);
    double err2 = 0, ref2 = 0, worst = 0;
    std::size_t worst_at = 0, broken = 0;
    for (std::size_t e = 0; e < g.size(); ++e) {
        const double x = double(float(g[e])), d = std::fabs(x - r[e]);
        err2 += d * d;
        ref2 += r[e] * r[e];
        if (!(d <= 0.03 * scale + 0.05 * std::fabs(r[e]))) ++broken;
        if (!(d <= worst)) worst = d, worst_at = e;
    }
    const double rel = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    const double eps8 = 8 * std::ldexp(1.0, t == DType::f16 ? -10 : -7);
    if (t == DType::f32 ? rel <= 1e-5 : (broken == 0 || rel <= eps8))
        return ::testing::AssertionSuccess();
    auto fail = ::testing::AssertionFailure();
    fail << dtype_name(t) << ": relative l2 " << rel << " (bound "
         << (t == DType::f32 ? 1e-5 : eps8) << "), max |x - ref| " << worst << " at packed element "
         << worst_at << " (x = " << (g.empty() ? 0.0 : g[worst_at])
         << ", ref = " << (r.empty() ? 0.0 : r[worst_at]) << "), " << broken << " of " << g.size()
         << " elements outside 0.03 + 0.05|ref|";
    return fail;
}

// The row log-sum-exp of the scores of every token and head, float64, by gathering.
std::vector<double> reference_lse(const Mechanism& m, const std::vector<RaggedTensor>& in64,
                                  bool causal, double scale, const Dims& dm) {
    auto qs = samples(in64[0]), ks = samples(in64[1]);
    std::size_t next = 3;
    auto table = [&](bool present) { return present ? Nd::of(in64[next++].to_dense()) : Nd(); };
    const Nd aq = table(m.aq), ak = table(m.ak), b = table(m.bias);
    std::vector<double> lse;
    for (std::size_t s = 0; s < qs.size(); ++s) {
        const std::int64_t n = qs[s].shape[0];
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t h = 0; h < dm.H; ++h) {
                std::vector<double> sc;
                for (std::int64_t j = 0; j < (causal ? i + 1 : n); ++j) {
                    const std::int64_t r = m.map.row(i - j);
                    double x = 0;
                    for (std::int64_t c = 0; c < dm.D; ++c) {
                        x += qs[s]({i, h, c}) * ks[s]({j, h, c});
                        if (m.aq) x += qs[s]({i, h, c}) * aq({r, h, c});
                        if (m.ak) x += ks[s]({j, h, c}) * ak({r, h, c});
                    }
                    if (m.bias) x += b({r, h});
                    sc.push_back(scale * x);
                }
                const double top = *std::max_element(sc.begin(), sc.end());
                double z = 0;
                for (double x : sc) z += std::exp(x - top);
                lse.push_back(top + std::log(z));
            }
    }
    return lse;
}

double scale_of(const Mechanism& m, const Dims& dm) {
    return m.attrs.get_float("scale", 1.0 / std::sqrt(double(dm.D)));
}

// Runs the fused forward and backward on `in` (any dtype) and checks O and every gradient
// against the float64 reference on the same rounded values.
void check_case(const Mechanism& m, const std::vector<std::int64_t>& lengths, DType t, bool causal,
                const Dims& dm = {}) {
    const Attrs at = Attrs(m.attrs).set("causal", causal);
    const auto in = cast(make_inputs(m, lengths, dm), t);
    const auto dO = tokens(dm.H, dm.Dv, lengths, t);
    const auto in64 = cast(in, DType::f64);
    const Reference ref = reference(in64, dO.astype(DType::f64), at);
    const auto names = input_names(m);

    jit::RelposForward fwd = jit::relpos_forward(in, at);
    EXPECT_TRUE(meets_criterion(t, fwd.out, ref.out)) << "output O";
    std::vector<RaggedTensor> grads = jit::relpos_backward(in, dO, at, &fwd);
    ASSERT_EQ(grads.size(), in.size()) << "one gradient per input";
    for (std::size_t k = 0; k < in.size(); ++k)
        EXPECT_TRUE(meets_criterion(t, grads[k], ref.grads[k])) << "gradient d" << names[k];
}

std::string case_name(const Mechanism& m, DType t, bool causal) {
    return m.name + " " + std::string(dtype_name(t)) + (causal ? " causal" : " bidirectional");
}

// Kernels are compiled per dtype, widths, tables, mask and scale: the cases share Dims{} and the
// mechanisms' scales where they can, so most tests reuse the first test's kernels.
TEST(RelposFused, FourMechanismsForwardAndEveryGradientMeetTheCriterion) {
    const Dims dm;
    for (const auto& m : four_mechanisms(dm, longest(ragged_lengths)))
        for (DType t : {DType::f32, DType::bf16})
            for (bool causal : {false, true}) {
                SCOPED_TRACE(case_name(m, t, causal));
                check_case(m, ragged_lengths, t, causal, dm);
            }
}

TEST(RelposFused, GeneralBucketTable) {
    // A monotone offset -> row table (the op's map=buckets), saturating beyond |delta| = 3,
    // with rows covering one or several offsets.
    const std::vector<std::int64_t> table = {0, 0, 1, 2, 2, 3, 4};
    Mechanism m =
        make("buckets(3)", RelposMap::buckets(table, 3),
             {{"map", std::string("buckets")}, {"distance", std::int64_t(3)}, {"table", table}},
             true, true, true);
    for (bool causal : {false, true}) {
        SCOPED_TRACE(case_name(m, DType::f32, causal));
        check_case(m, {65, 1, 0, 130}, DType::f32, causal);
    }
}

TEST(RelposFused, ContentToPositionAndPositionToContentSeparately) {
    // A public kernel once shipped p2c with the sign of delta swapped: check each term alone.
    const Dims dm;
    // Bidirectional, where both signs of delta occur.
    for (const auto& m : {deberta(dm, 8, 16, true, false), deberta(dm, 8, 16, false, true)}) {
        SCOPED_TRACE(case_name(m, DType::f32, false));
        check_case(m, ragged_lengths, DType::f32, false, dm);
    }
}

TEST(RelposFused, F16ForwardAndEveryGradientMeetTheCriterion) {
    // Transformer-XL has every table (f16 storage, f32 accumulation).
    const Mechanism m = transformer_xl(longest(ragged_lengths) + 7);
    SCOPED_TRACE(case_name(m, DType::f16, true));
    check_case(m, ragged_lengths, DType::f16, true);
}

TEST(RelposFused, ModelMapParametersPastTheirSaturation) {
    // The maps' published parameters (T5: 32 buckets to 128; DeBERTa-v3: 256 buckets to 512,
    // saturating at |delta| = 511; clip(64)) on a sample longer than every saturation point.
    const Dims dm;
    const std::vector<std::int64_t> lengths = {1, 530};
    EXPECT_LT(RelposMap::log_buckets(256, 512).saturation(), 530);
    const std::pair<Mechanism, bool> cases[] = {{t5(32, 128), false},
                                                {deberta(dm, 256, 512), false},
                                                {deberta(dm, 256, 512), true},
                                                {shaw(64), true}};
    for (const auto& [m, causal] : cases) {
        SCOPED_TRACE(case_name(m, DType::f32, causal));
        check_case(m, lengths, DType::f32, causal, dm);
    }
}

TEST(RelposFused, OneFeatureAndOneHead) {
    // Degenerate widths: H = 1, D = Dv = 1, with every table (TXL).
    const Dims dm{1, 1, 1};
    SCOPED_TRACE("Transformer-XL f32 causal");
    check_case(transformer_xl(130), {130, 1, 64}, DType::f32, true, dm);
}

TEST(RelposFused, LogSumExpIsTheRowLogSumExpOfTheScores) {
    const Dims dm;
    for (const auto& m : four_mechanisms(dm, longest(ragged_lengths)))
        for (bool causal : {false, true}) {
            SCOPED_TRACE(case_name(m, DType::f32, causal));
            const auto in = cast(make_inputs(m, ragged_lengths, dm), DType::f32);
            const auto fwd = jit::relpos_forward(in, Attrs(m.attrs).set("causal", causal));
            const auto want = reference_lse(m, cast(in, DType::f64), causal, scale_of(m, dm), dm);
            ASSERT_GE(fwd.lse.nbytes, want.size() * sizeof(float))
                << "one f32 entry per token and head";
            const auto* lse = reinterpret_cast<const float*>(fwd.lse.data.get());
            double worst = 0;
            for (std::size_t e = 0; e < want.size(); ++e)
                worst = std::max(worst, std::fabs(double(lse[e]) - want[e]) /
                                            std::max(1.0, std::fabs(want[e])));
            EXPECT_LE(worst, 1e-5) << "largest relative lse error";
        }
}

// The raw bytes of every result, for bitwise comparisons.
std::vector<std::vector<std::byte>> bytes_of(const jit::RelposForward& f,
                                             const std::vector<RaggedTensor>& grads) {
    auto raw = [](const RaggedTensor& t) {
        const auto* p = static_cast<const std::byte*>(t.data());
        return std::vector<std::byte>(p, p + t.buffer().nbytes);
    };
    std::vector<std::vector<std::byte>> out = {raw(f.out)};
    const auto* l = f.lse.data.get();
    out.emplace_back(l, l + f.lse.nbytes);
    for (const auto& g : grads) out.push_back(raw(g));
    return out;
}

// Restores the default thread count when a test leaves, also on failure.
struct ThreadCount {
    explicit ThreadCount(int n) { set_num_threads(n); }
    ~ThreadCount() { set_num_threads(0); }
};

TEST(RelposFused, BitwiseDeterministicAcrossRunsAndThreadCounts) {
    const Dims dm;
    const std::vector<std::int64_t> lengths = {257, 1, 130, 64, 200};
    for (const auto& m : four_mechanisms(dm, 257))
        for (DType t : {DType::f32, DType::bf16})
            for (bool causal : {false, true}) {
                SCOPED_TRACE(case_name(m, t, causal));
                const Attrs at = Attrs(m.attrs).set("causal", causal);
                const auto in = cast(make_inputs(m, lengths, dm), t);
                const auto dO = tokens(dm.H, dm.Dv, lengths, t);
                std::vector<std::vector<std::vector<std::byte>>> runs;
                for (int threads : {1, 2, 3, 2}) {
                    ThreadCount tc(threads);
                    auto fwd = jit::relpos_forward(in, at);
                    auto grads = jit::relpos_backward(in, dO, at, &fwd);
                    runs.push_back(bytes_of(fwd, grads));
                }
                const auto names = input_names(m);
                for (std::size_t r = 1; r < runs.size(); ++r)
                    for (std::size_t x = 0; x < runs[0].size(); ++x) {
                        std::string what = x == 0 ? "O" : x == 1 ? "lse" : "d" + names[x - 2];
                        EXPECT_TRUE(runs[r][x] == runs[0][x])
                            << what << " differs between run 0 (1 thread) and run " << r
                            << " (threads 1, 2, 3, 2)";
                    }
            }
}

TEST(RelposFused, BackwardRecomputesTheForwardWhenNotGiven) {
    const Dims dm;
    for (const auto& m : four_mechanisms(dm, 200)) {
        SCOPED_TRACE(m.name);
        const auto in = cast(make_inputs(m, {200, 3, 65}, dm), DType::f32);
        const auto dO = tokens(dm.H, dm.Dv, {200, 3, 65}, DType::f32);
        auto fwd = jit::relpos_forward(in, m.attrs);
        auto with = jit::relpos_backward(in, dO, m.attrs, &fwd);
        auto without = jit::relpos_backward(in, dO, m.attrs);
        ASSERT_EQ(with.size(), without.size());
        // Each side from its own forward: a second one must give the same O and lse bits too.
        auto again = jit::relpos_forward(in, m.attrs);
        EXPECT_TRUE(bytes_of(fwd, with) == bytes_of(again, without));
    }
}

// Saving the relation projections in the forward (RelposOptions) changes where the backward
// reads them from, not their values: each is the same f32 dot product in the same order, and
// every later operation is the same, so O, the log-sum-exp and every gradient are bitwise
// those of the recomputing path. Covers aq only (Shaw clip), aq and ak (DeBERTa log buckets),
// aq, ak and bias over an identity map (Transformer-XL) and a bias-only map (T5, nothing to
// save), bidirectional and causal, ragged lengths including 1 and 65. Bitwise equality to the
// recomputing path, which the tests above check against the reference, implies the criterion.
TEST(RelposFused, SavedProjectionsGiveBitwiseTheRecomputedResults) {
    const Dims dm;
    const std::vector<std::int64_t> lengths = {65, 1, 130, 0, 63};
    const jit::RelposOptions save{.save_projections = true};
    for (const auto& m : four_mechanisms(dm, longest(lengths)))
        for (bool causal : {false, true}) {
            SCOPED_TRACE(case_name(m, DType::f32, causal));
            const Attrs at = Attrs(m.attrs).set("causal", causal);
            const auto in = cast(make_inputs(m, lengths, dm), DType::f32);
            const auto dO = tokens(dm.H, dm.Dv, lengths, DType::f32);
            auto fwd = jit::relpos_forward(in, at);
            auto recomputed = jit::relpos_backward(in, dO, at, &fwd);
            auto fwd_saved = jit::relpos_forward(in, at, save);
            EXPECT_FALSE(fwd.saved);
            EXPECT_EQ(fwd_saved.saved, m.aq || m.ak) << "saved only where there is a projection";
            auto with_saved = jit::relpos_backward(in, dO, at, &fwd_saved);
            const auto want = bytes_of(fwd, recomputed);
            const auto names = input_names(m);
            const auto got = bytes_of(fwd_saved, with_saved);
            ASSERT_EQ(got.size(), want.size());
            for (std::size_t x = 0; x < want.size(); ++x)
                EXPECT_TRUE(got[x] == want[x])
                    << (x == 0   ? "O"
                        : x == 1 ? "lse"
                                 : "d" + names[x - 2])
                    << " differs between saved and recomputed projections";
            // Without a forward, the backward's own forward saves as asked.
            jit::RelposOnCpu step(in, at, save);
            const RaggedTensor o = step.forward(); // the step's own O, then its gradients
            const auto* ob = static_cast<const std::byte*>(o.data());
            EXPECT_TRUE(std::vector<std::byte>(ob, ob + o.buffer().nbytes) == want[0]);
            EXPECT_TRUE(bytes_of(fwd, step.backward(dO)) == want);
            EXPECT_TRUE(bytes_of(fwd, jit::relpos_backward(in, dO, at, nullptr, save)) == want);
        }
}

// The causal one-pass backward keeps its key-side table partials within their rows: a diagonal
// tile pair reaches offsets below 0 (its masked pairs, whose dZK is zero), and it once added
// those rows before the partial, out of bounds for the first part. Where that memory was
// mapped the addition of zeros went unseen; here every large block is a mapping of its own
// (glibc's mmap threshold lowered, the block cache emptied) and one thread runs the parts in
// order, so such a write lands before the mapping and faults wherever nothing is mapped
// there (planted: the fix undone, 3 of 6 runs of this test crashed; whole-suite runs had
// crashed intermittently). Transformer-XL and DeBERTa have key-side tables.
TEST(RelposFused, CausalOnePassBackwardWritesOnlyItsOwnPartials) {
    const Dims dm;
    const std::vector<std::int64_t> lengths = {65, 1, 130, 0, 63};
    ThreadCount one(1);
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 1 << 16);
#endif
    for (const auto& m : four_mechanisms(dm, longest(lengths))) {
        if (!m.ak) continue;
        SCOPED_TRACE(case_name(m, DType::f32, true));
        const Attrs at = Attrs(m.attrs).set("causal", true);
        const auto in = cast(make_inputs(m, lengths, dm), DType::f32);
        const auto dO = tokens(dm.H, dm.Dv, lengths, DType::f32);
        for (int k = 0; k < 20; ++k) {
            memory::release_cached();
            const auto fwd = jit::relpos_forward(in, at);
            const auto g = jit::relpos_backward(in, dO, at, &fwd);
            EXPECT_EQ(g.size(), 3 + std::size_t(m.aq) + std::size_t(m.ak) + std::size_t(m.bias));
        }
    }
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 128 * 1024); // glibc's default
#endif
}

// On the host the backward runs in one pass for f32 shapes (jit::relpos_one_pass_backward):
// five tile products per pair where the two passes take seven, and with key-side tables the
// key terms folded per tile pair. dQ and dV sum in the two passes' order, dK's content and
// relation terms interleave by strip, and the programs may reassociate, so the gradients meet
// the f32 criterion against the two passes' rather than matching their bits (each path is
// bitwise deterministic; see above). Shaw (aq), T5 (bias only), Transformer-XL and DeBERTa
// (ak), with and without saved projections, bidirectional and causal, lengths of several
// strips and tiles.
TEST(RelposFused, OnePassBackwardMeetsTheCriterionAgainstTheTwoPasses) {
    const Dims dm;
    const std::vector<std::int64_t> lengths = {257, 1, 130, 0, 63};
    for (const auto& m : four_mechanisms(dm, longest(lengths)))
        for (bool causal : {false, true})
            for (bool saved : {false, true}) {
                SCOPED_TRACE(case_name(m, DType::f32, causal) + (saved ? ", saved" : ""));
                const Attrs at = Attrs(m.attrs).set("causal", causal);
                const auto in = cast(make_inputs(m, lengths, dm), DType::f32);
                const auto dO = tokens(dm.H, dm.Dv, lengths, DType::f32);
                const jit::RelposOptions one{.save_projections = saved};
                const jit::RelposOptions two{.save_projections = saved, .two_pass_backward = true};
                auto fwd = jit::relpos_forward(in, at, one);
                const auto want = jit::relpos_backward(in, dO, at, &fwd, two);
                const auto got = jit::relpos_backward(in, dO, at, &fwd, one);
                const auto names = input_names(m);
                ASSERT_EQ(got.size(), want.size());
                for (std::size_t x = 0; x < want.size(); ++x)
                    EXPECT_TRUE(meets_criterion(DType::f32, got[x], want[x])) << "d" << names[x];
            }
}

// The two-pass backward splits samples into parts of whole strips when there are few
// (jit::relpos_split_backward): each strip's dq, dk and dv rows are summed as before, so they
// are the whole-sample bits; the table gradients group the same terms by part and meet the
// criterion against the reference. DeBERTa (both sides' tables) in f32 (two passes asked for:
// f32 runs one pass, on whole samples) and bf16, Shaw and T5 in bf16, bidirectional and causal,
// from whole samples to one strip per part (the test checks that the host's budget lets them
// split).
TEST(RelposFused, SplitBackwardKeepsTheGradientBitsOfWholeSamples) {
    const Dims dm;
    const std::vector<std::int64_t> lengths = {257, 1, 130, 0, 63};
    const std::pair<Mechanism, DType> cases[] = {{deberta(dm), DType::f32},
                                                 {deberta(dm), DType::bf16},
                                                 {shaw(), DType::bf16},
                                                 {t5(), DType::bf16}};
    for (const auto& [m, t] : cases)
        for (bool causal : {false, true}) {
            SCOPED_TRACE(case_name(m, t, causal));
            const Attrs at = Attrs(m.attrs).set("causal", causal);
            const auto in = cast(make_inputs(m, lengths, dm), t);
            const auto dO = tokens(dm.H, dm.Dv, lengths, t);
            const Reference ref = reference(cast(in, DType::f64), dO.astype(DType::f64), at);
            auto fwd = jit::relpos_forward(in, at);
            // Two passes: f32 would run one pass, on whole samples.
            const auto whole = bytes_of(
                fwd, jit::relpos_backward(in, dO, at, &fwd,
                                          {.two_pass_backward = true, .backward_pieces = 1}));
            for (std::int64_t pieces : {10, 1000}) {
                jit::RelposSetup s = jit::relpos_setup(in, at, "relpos_attention", false);
                jit::relpos_split_backward(s, pieces, jit::relpos_host_partial_budget(s));
                EXPECT_GT(s.part_count(), 4) << "the samples split, " << pieces << " pieces";
                const auto grads = jit::relpos_backward(
                    in, dO, at, &fwd, {.two_pass_backward = true, .backward_pieces = pieces});
                const auto split = bytes_of(fwd, grads);
                for (std::size_t x = 2; x < 5; ++x)
                    EXPECT_TRUE(split[x] == whole[x])
                        << "d" << input_names(m)[x - 2] << " with " << pieces << " pieces";
                for (std::size_t k = 3; k < in.size(); ++k)
                    EXPECT_TRUE(meets_criterion(t, grads[k], ref.grads[k]))
                        << "d" << input_names(m)[k] << " with " << pieces << " pieces";
            }
        }
}

// Parts are runs of whole strips of one sample, halved while there are fewer instances than
// asked and the partials stay within the budget; WP is the most rows one reaches.
TEST(RelposFused, SplitBackwardHalvesPartsWithinTheBudget) {
    const Dims dm;
    const std::vector<std::int64_t> lengths = {257, 1, 130, 0, 63};
    // An identity map (U = 2 x 264 - 1 rows, more than any part reaches), so WP is each
    // split's own reach rather than U.
    const auto m = transformer_xl(longest(lengths) + 7);
    const auto in = cast(make_inputs(m, lengths, dm), DType::f32);
    auto parts_of = [&](std::int64_t pieces, double budget) {
        jit::RelposSetup s = jit::relpos_setup(in, m.attrs, "relpos_attention", false);
        jit::relpos_split_backward(s, pieces, budget);
        std::vector<std::vector<std::int64_t>> runs; // (sample length, first, end)
        for (std::size_t t = 0; t < s.parts.size(); t += 4)
            runs.push_back({s.parts[t + 1], s.parts[t + 2], s.parts[t + 3]});
        return std::pair{runs, s.WP};
    };
    using Runs = std::vector<std::vector<std::int64_t>>;
    // Whole samples (4 x 2 heads = 8 instances are enough), every sample's one part.
    auto [whole, wp_whole] = parts_of(8, 1e12);
    EXPECT_EQ(whole, (Runs{{257, 0, 257}, {1, 0, 1}, {130, 0, 130}, {63, 0, 63}}));
    EXPECT_EQ(wp_whole, 2 * 257 - 1);
    // 10 instances: halved once, 5 strips -> 3 per part (5 parts x 2 heads).
    auto [halved, wp_halved] = parts_of(10, 1e12);
    EXPECT_EQ(halved,
              (Runs{{257, 0, 192}, {257, 192, 257}, {1, 0, 1}, {130, 0, 130}, {63, 0, 63}}));
    EXPECT_EQ(wp_halved, 192 + 257 - 1);
    // Many instances: one strip per part.
    auto [strips, wp_strips] = parts_of(1000, 1e12);
    EXPECT_EQ(strips.size(), 5u + 3u + 1u + 1u);
    for (const auto& r : strips) EXPECT_EQ(r[1] % 64, 0) << "parts start at strips";
    EXPECT_EQ(wp_strips, 64 + 257 - 1);
    // No budget beyond whole samples: split parts' partials take more, so no split.
    EXPECT_EQ(parts_of(1000, 0).first, whole);
}

// Peak bytes the runtime's accounting saw above what was held before fn ran.
template <class Fn> std::size_t peak_extra(Fn&& fn) {
    memory::reset_peak();
    const std::size_t before = memory::stats().current;
    fn();
    return memory::stats().peak - before;
}

struct Footprint {
    std::size_t forward = 0, backward = 0;
};

Footprint measure_footprint(const Mechanism& m, std::int64_t B, std::int64_t N, const Dims& dm) {
    const std::vector<std::int64_t> lengths(std::size_t(B), N);
    const auto in = cast(make_inputs(m, lengths, dm), DType::f32);
    const auto dO = tokens(dm.H, dm.Dv, lengths, DType::f32);
    Footprint f;
    jit::RelposForward fwd;
    f.forward = peak_extra([&] { fwd = jit::relpos_forward(in, m.attrs); });
    f.backward = peak_extra([&] { jit::relpos_backward(in, dO, m.attrs, &fwd); });
    return f;
}

// The memory cases: two heads and the widths of Dims{} (so the kernels are the first test's),
// B * N = 4096 tokens. Measured once per (mechanism, N), shared by the two memory tests, and
// printed: the numbers are worth reading even when the tests pass.
const Dims memory_dims{2, 16, 24};
Footprint footprint(const Mechanism& m, std::int64_t N) {
    static std::map<std::pair<std::string, std::int64_t>, Footprint> seen;
    auto key = std::pair{m.name, N};
    if (!seen.count(key)) {
        seen[key] = measure_footprint(m, 4096 / N, N, memory_dims);
        std::printf("[ memory   ] %s, N = %lld, B = %lld, H = 2: forward %zu, backward %zu bytes\n",
                    m.name.c_str(), (long long)N, (long long)(4096 / N), seen[key].forward,
                    seen[key].backward);
    }
    return seen[key];
}

TEST(RelposFused, PeakExtraMemoryAt4096IsBelowATenthOfTheMaterialisedBias) {
    const Dims& dm = memory_dims;
    const std::int64_t N = 4096;
    const double bias_bytes = double(dm.H) * double(N) * double(N) * 4; // B = 1, f32
    for (const auto& m : {shaw(256), transformer_xl(N), deberta(dm, 256, 512), t5(32, 128)}) {
        const Footprint f = footprint(m, N);
        EXPECT_LT(double(f.forward), bias_bytes / 10)
            << m.name << " forward: " << f.forward << " bytes, materialised bias " << bias_bytes;
        EXPECT_LT(double(f.backward), bias_bytes / 10)
            << m.name << " backward: " << f.backward << " bytes, materialised bias " << bias_bytes;
    }
}

TEST(RelposFused, PeakMemoryIsFlatInNBeyond1KForClipAndBucketMaps) {
    // A fixed token count B * N = 4096: the outputs and gradients keep their size, so only
    // state growing with N (an N x N buffer, projections over every offset) can grow.
    for (const auto& m : {shaw(256), deberta(memory_dims, 256, 512), t5(32, 128)}) {
        std::vector<Footprint> f;
        for (std::int64_t N : {1024, 2048, 4096}) f.push_back(footprint(m, N));
        for (std::size_t k = 1; k < f.size(); ++k) {
            // 5% (and 64 KiB) of slack for per-sample bookkeeping.
            EXPECT_LE(double(f[k].forward), 1.05 * double(f[0].forward) + 65536)
                << m.name << " forward at N = " << (1024 << k) << ": " << f[k].forward
                << " bytes vs " << f[0].forward << " at N = 1024";
            EXPECT_LE(double(f[k].backward), 1.05 * double(f[0].backward) + 65536)
                << m.name << " backward at N = " << (1024 << k) << ": " << f[k].backward
                << " bytes vs " << f[0].backward << " at N = 1024";
        }
    }
}

TEST(RelposFused, ErrorsNameTheOpAndTheSample) {
    const Dims dm;
    auto has = [](const std::string& msg, const std::string& part) {
        return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                                   : ::testing::AssertionFailure() << msg;
    };
    // A sample longer than the identity table covers.
    const auto txl = transformer_xl(12);
    const auto in = cast(make_inputs(txl, {3, 2, 13}, dm), DType::f32);
    EXPECT_TRUE(has(error_of([&] { jit::relpos_forward(in, txl.attrs); }),
                    "relpos_attention: sample 2 has N = 13 tokens but identity(12) covers"));
    // q and k of different lengths.
    const auto s = shaw();
    auto a = cast(make_inputs(s, {3, 2}, dm), DType::f32);
    auto b = cast(make_inputs(s, {3, 4}, dm), DType::f32);
    const std::vector<RaggedTensor> mixed = {a[0], b[1], a[2], a[3]};
    EXPECT_TRUE(has(error_of([&] { jit::relpos_forward(mixed, s.attrs); }),
                    "sample 1: q has N = 2 tokens but k has 4"));
    // dO of other lengths than v.
    const auto dO = tokens(dm.H, dm.Dv, {3, 5}, DType::f32);
    EXPECT_TRUE(has(error_of([&] { jit::relpos_backward(a, dO, s.attrs); }), "sample 1"));
    // A table with the wrong row count.
    a[3] = random_dense(DType::f32, {5, dm.H, dm.D});
    EXPECT_TRUE(has(error_of([&] { jit::relpos_forward(a, s.attrs); }),
                    "clip(8) has 17 rows but the tables have 5"));
}

// Compile time (issue 18, item 5): O3 fully unrolled the programs' constant-trip loops (a
// tile's 64 columns, a head's 64 features) before the loop vectoriser, which then turned the
// enclosing runtime loops into hundreds of strided reductions: 700 KB of optimised IR and
// about 3 s of LLVM per backward program. The CPU lowering keeps constant loops as loops
// (jit/kir_llvm.cpp); this bounds each program's optimised IR for the paper's head size. The
// bound depends on the host's vector ISA: under 300 KB with AVX2, 320 KB for the largest program
// (the key pass with aq and ak) with AVX-512, whose 16-lane bodies and remainder loops are
// longer; the unrolled programs were 700 KB.
TEST(RelposFused, ProgramsCompileToCompactIr) {
    for (bool aq : {false, true})
        for (bool ak : {false, true}) {
            const jit::RelposShape s{DType::f32, 64, 64, aq, ak, aq && ak, false, 0.125};
            std::vector<kir::Kernel> programs = {
                jit::relpos_forward_program(s), jit::relpos_host_forward_program(s),
                jit::relpos_query_grad_program(s), jit::relpos_key_grad_program(s)};
            if (jit::relpos_one_pass_backward(s)) programs.push_back(jit::relpos_grad_program(s));
            std::size_t two_passes = 0; // the query and key passes' IR
            for (const auto& k : programs) {
                const auto compiled = jit::compile_kernel_cpu(k);
                const std::size_t bytes = compiled->llvm_ir().size();
                if (k.name == "relpos_query_grad" || k.name == "relpos_key_grad")
                    two_passes += bytes;
                // The one pass with both sides' tables folds them both (490 KB with AVX-512);
                // it compiles in place of the two passes, so it must stay below them.
                if (k.name == "relpos_grad") {
                    EXPECT_LT(bytes, two_passes) << "aq " << aq << " ak " << ak;
                    EXPECT_LT(bytes, 560'000u) << k.name << " aq " << aq << " ak " << ak;
                } else
                    EXPECT_LT(bytes, 400'000u) << k.name << " aq " << aq << " ak " << ak;
                // The products still vectorise along their contiguous index.
                EXPECT_NE(compiled->llvm_ir().find("x float>"), std::string::npos) << k.name;
            }
        }
}

// The executed FLOP count (bench/relpos) follows the tile schedule: one strip and one key tile
// of n = 64 tokens, no relation terms: S and P V forward; the one-pass backward's S, dP, dQ,
// dV, dK (f32), or the two passes' S, dP, dQ, then S, dP, dV, dK (bf16).
TEST(RelposFused, ExecutedFlopsFollowTheTileSchedule) {
    const jit::RelposShape s{DType::f32, 16, 24, false, false, false, false, 0.25};
    const auto f = jit::relpos_executed_flops(s, {64}, 2, 8);
    const double J = 64, D = 16, Dv = 24, H = 2;
    EXPECT_EQ(f.forward, H * (2 * J * J * D + 2 * J * J * Dv));
    EXPECT_EQ(f.backward, H * 2 * J * J * (D + Dv + D + Dv + D));
    auto two = s;
    two.dtype = DType::bf16;
    EXPECT_EQ(jit::relpos_executed_flops(two, {64}, 2, 8).backward,
              H * (2 * J * J * (D + Dv + D) + 2 * J * J * (D + Dv + Dv + D)));
    // Two samples of 64 cost twice one; a 65th token adds a strip and a tile (padded to 4 rows).
    EXPECT_EQ(jit::relpos_executed_flops(s, {64, 64}, 2, 8).forward, 2 * f.forward);
    EXPECT_GT(jit::relpos_executed_flops(s, {65}, 2, 8).forward, f.forward);
    // Key-side tables add, per pair, the keys' projections onto the pair's rows (offsets -63..63
    // clamped to +-8: 17 rows, padded to 20) and the one pass's fold and partial of dZK.
    auto ak = s;
    ak.ak = true;
    EXPECT_EQ(jit::relpos_executed_flops(ak, {64}, 2, 8).backward,
              f.backward + H * (2 * 20 * J * D + 2 * 2 * J * 17 * D));
}

} // namespace
} // namespace rag
