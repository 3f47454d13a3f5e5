// The kernel-IR programs of attention with a bias (jit/biased_attention_programs.hpp), run on
// the CPU as the GPU tier launches them: forward and every gradient against the reference op
// (f32 relative l2 <= 1e-5), singles and triangle attention, causal, lengths 0 and 1, rows and
// keys past one tile; bitwise the same across thread counts.
#include "jit/biased_attention_programs.hpp"
#include "jit/placement.hpp"
#include "runtime/parallel.hpp"
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

struct Case {
    const char* name;
    int axis;
    bool causal;
    std::vector<std::int64_t> N, M; // per sample; triangle attention: M = N
};

std::vector<RaggedTensor> inputs(const Case& c) {
    const std::int64_t H = 2, D = 5, Dv = 3;
    std::vector<Shape_> qs, ks, vs, bs;
    for (std::size_t i = 0; i < c.N.size(); ++i) {
        const std::int64_t n = c.N[i], m = c.M[i];
        if (c.axis == 1) {
            qs.push_back({n, H, D});
            ks.push_back({m, H, D});
            vs.push_back({m, H, Dv});
        } else {
            qs.push_back({n, n, H, D});
            ks.push_back({n, n, H, D});
            vs.push_back({n, n, H, Dv});
        }
        bs.push_back({n, m, H});
    }
    const char* q_axes = c.axis == 1 ? "~N, 2, 5" : "~N, ~N, 2, 5";
    const char* k_axes = c.axis == 1 ? "~M, 2, 5" : "~N, ~N, 2, 5";
    const char* v_axes = c.axis == 1 ? "~M, 2, 3" : "~N, ~N, 2, 3";
    const char* b_axes = c.axis == 1 ? "~N, ~M, 2" : "~N, ~N, 2";
    return {random_batch(DType::f32, q_axes, qs), random_batch(DType::f32, k_axes, ks),
            random_batch(DType::f32, v_axes, vs), random_batch(DType::f32, b_axes, bs, -2, 2)};
}

Attrs attrs_of(const Case& c) {
    Attrs at{{"axis", std::int64_t(c.axis)}};
    at.set("causal", c.causal);
    if (c.causal) at.set("scale", 0.37);
    return at;
}

// A random cotangent shaped like the output `out`.
RaggedTensor cotangent(const Case& c, const RaggedTensor& out) {
    std::vector<Shape_> shapes;
    for (std::int64_t s = 0; s < out.batch(); ++s) {
        const auto shape = out.structure().sample_shape(s);
        shapes.push_back(Shape_(shape.begin(), shape.end()));
    }
    return random_batch(DType::f32, c.axis == 1 ? "~N, 2, 3" : "~N, ~N, 2, 3", shapes);
}

const Case cases[] = {
    // 200 keys: 4 tiles, so most rows meet a larger score after the first (the rescale runs).
    {"singles", 1, false, {3, 1, 0, 40, 17}, {200, 2, 5, 1, 0}},
    {"singles_causal", 1, true, {70, 1, 20}, {70, 1, 20}},
    {"triangle", 2, false, {20, 1, 0, 3, 70}, {20, 1, 0, 3, 70}},
};

TEST(BiasedPrograms, ForwardAndGradientsMatchTheReference) {
    for (const Case& c : cases) {
        SCOPED_TRACE(c.name);
        std::vector<RaggedTensor> in = inputs(c);
        const Attrs at = attrs_of(c);
        const RaggedTensor want = jit::reference_kernel("biased_attention", in, at);
        const auto got = jit::biased_attention_programs_cpu(in, at, nullptr);
        EXPECT_LE(rel_l2(got[0], want), 1e-5);
        std::vector<RaggedTensor> with_dO = in;
        with_dO.push_back(cotangent(c, want));
        const auto grads = jit::biased_attention_programs_cpu(in, at, &with_dO.back());
        for (std::int64_t wrt = 0; wrt < 4; ++wrt) {
            const RaggedTensor ref =
                jit::reference_kernel("biased_attention_grad", with_dO, Attrs(at).set("wrt", wrt));
            EXPECT_LE(rel_l2(grads[std::size_t(wrt)], ref), 1e-5) << "wrt " << wrt;
        }
    }
}

TEST(BiasedPrograms, BitwiseTheSameAcrossThreadCounts) {
    const Case c{"triangle", 2, false, {20, 1, 0, 3}, {20, 1, 0, 3}};
    std::vector<RaggedTensor> in = inputs(c);
    const Attrs at = attrs_of(c);
    const RaggedTensor dO = cotangent(c, jit::reference_kernel("biased_attention", in, at));
    std::vector<std::vector<float>> runs;
    for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        std::vector<float> bits;
        for (const RaggedTensor& g : jit::biased_attention_programs_cpu(in, at, &dO)) {
            const auto* p = static_cast<const float*>(g.data());
            bits.insert(bits.end(), p, p + g.numel());
        }
        runs.push_back(bits);
    }
    set_num_threads(0);
    EXPECT_EQ(runs[0], runs[1]);
    EXPECT_EQ(runs[0], runs[2]);
}

} // namespace
} // namespace rag
