// ./dev demo: the single-pair-single example end to end on the reference tier.
// Builds a pair state from ragged singles (no padding), prints its ragged structure, derives a
// gradient from the program and prints its norm, then trains for a few steps.
#include "dsl/module.hpp"

#include <cmath>
#include <cstdio>

using namespace rag;

namespace {

RaggedTensor singles(const std::vector<std::int64_t>& lengths, std::int64_t features) {
    std::vector<DenseArray> samples;
    std::uint64_t k = 0;
    for (auto n : lengths) {
        std::vector<double> v(static_cast<std::size_t>(n * features));
        for (double& x : v) x = std::sin(0.37 * double(++k)); // deterministic, no RNG needed
        samples.push_back(DenseArray::from_f64(DType::f32, {n, features}, v));
    }
    return RaggedTensor::from_list(samples, "~N, " + std::to_string(features));
}

std::string join(const std::vector<std::int64_t>& v) {
    std::string s = "[";
    for (std::size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
    return s + "]";
}

} // namespace

int main(int argc, char** argv) {
    const std::string path = argc > 1 ? argv[1] : "examples/single_pair_single.rag";
    try {
        auto m = Module::load(path);
        Value p = m->init("PairBlock", 0);
        RaggedTensor x = singles({2, 3, 5}, 384);
        std::printf("singles   %s, offsets %s\n", describe(x).c_str(),
                    join(x.structure().offsets()).c_str());

        Value out = m->call("block", {x, p});
        const RaggedTensor& pair = out.elems[1].tensor;
        std::printf("pair      %s\n", describe(pair).c_str());
        std::printf("          offsets %s (lengths 2, 3, 5 -> pair sizes 4, 9, 25)\n",
                    join(pair.structure().offsets()).c_str());
        std::printf("          %lld stored rows; padding to 5 x 5 would store %lld\n",
                    (long long)pair.structure().rows(), 3LL * 5 * 5);

        Value g = m->call("gradient", {x, p});
        double sq = 0;
        for (const auto& [name, t] : g.fields)
            for (double v : t.to_f64()) sq += v * v;
        std::printf("gradient  |dloss/dp| = %.6g over %zu params tensors\n", std::sqrt(sq),
                    g.fields.size());

        for (int step = 1; step <= 5; ++step) {
            Value r = m->call("train_step", {singles({2 + step % 3, 7, 4}, 384), p});
            p = r.elems[1];
            std::printf("step %d    loss %.6f\n", step, r.elems[0].tensor.item());
        }
        const FnStats s = m->stats().at("train_step");
        std::printf("train_step compiled %d time(s), reused %d time(s) across lengths\n",
                    s.compilations, s.cache_hits);
    } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
