// Test inputs shared by the GPU execution tests and the emulator tests: the four
// relative-position mechanisms of REFERENCE.md section 2 with small map parameters, random
// inputs for them.
#pragma once
#include "tests/support/testing.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace rag::testing {

// One relative-position mechanism of REFERENCE.md section 2 with small map parameters, so
// that saturated and band tiles both occur at these lengths.
struct Mechanism {
    std::string name;
    std::int64_t R;
    Attrs attrs;
    bool aq, ak, bias;
};

inline std::vector<Mechanism> mechanisms(std::int64_t longest) {
    using A = Attrs;
    const std::string s = "map";
    return {
        {"Shaw clip(8)", 17,
         A{{s, std::string("clip")}, {"distance", std::int64_t(8)}, {"aq", true}}, true, false,
         false},
        {"Transformer-XL identity", 2 * (longest + 3) - 1,
         A{{s, std::string("identity")}, {"aq", true}, {"ak", true}, {"bias", true}}, true, true,
         true},
        {"DeBERTa log_buckets(8, 16)", 16,
         A{{s, std::string("log_buckets")},
           {"size", std::int64_t(8)},
           {"max_position", std::int64_t(16)},
           {"aq", true},
           {"ak", true}},
         true, true, false},
        {"T5 t5_buckets(8, 16)", 8,
         A{{s, std::string("t5_buckets")},
           {"num", std::int64_t(8)},
           {"max_distance", std::int64_t(16)},
           {"bias", true},
           {"scale", 1.0}},
         false, false, true},
    };
}

struct RelposCase {
    std::vector<RaggedTensor> in; // q, k, v, the tables
    RaggedTensor dO;
    Attrs at;
};

// Dv != D, so a swapped width shows; Dv = 32 makes both head dimensions whole mma k steps
// (the tensor-core programs' FlashAttention structure, relpos_flash).
inline RelposCase relpos_case(const Mechanism& m, DType t, bool causal,
                              const std::vector<std::int64_t>& lengths, std::int64_t Dv = 24) {
    const std::int64_t H = 2, D = 16;
    auto tokens = [&](std::int64_t width) {
        const std::string axes = "~N, " + std::to_string(H) + ", " + std::to_string(width);
        std::vector<Shape_> shapes;
        for (auto n : lengths) shapes.push_back({n, H, width});
        return random_batch(t, axes, shapes);
    };
    RelposCase c{
        {tokens(D), tokens(D), tokens(Dv)}, tokens(Dv), Attrs(m.attrs).set("causal", causal)};
    if (m.aq) c.in.push_back(random_dense(t, {m.R, H, D}));
    if (m.ak) c.in.push_back(random_dense(t, {m.R, H, D}));
    if (m.bias) c.in.push_back(random_dense(t, {m.R, H}));
    return c;
}

} // namespace rag::testing
