// What the reference kernels of dropout and cross_entropy (ir/ops/nn.cpp) share with the CPU
// tier's kernels (jit/nn_steps.cpp), so both tiers draw the same masks and say the same
// thing about bad labels.
#pragma once
#include "ir/attrs.hpp"
#include "ir/ops/kernel_util.hpp"
#include "runtime/tensor.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace rag {

// dropout's p from its attributes, checked to lie in [0, 1).
double dropout_p(const Attrs& at);
// The uniform draw in [0, 1) of element counter k under `seed`.
double dropout_uniform(std::int64_t seed, std::int64_t k);
// The counter of every packed element of x: its packed index, or with shared_axis its logical
// position with the shared axis's index taken as 0 (ir/ops/nn.cpp says how).
std::vector<std::int64_t> dropout_counters(const RaggedTensor& x, const Attrs& at);

// The same counters a run at a time, so a kernel can draw them in parallel without storing
// them: a run is the logical elements [n0, n1) of one sample, in row-major order.
struct DropoutRun {
    std::int64_t sample, n0, n1;
};
// Runs of at most `len` elements covering every element of x once.
std::vector<DropoutRun> dropout_runs(const Structure& st, std::int64_t len);
// The per-sample position of shared_axis among x's axes.
int dropout_shared_axis(const RaggedTensor& x, const Attrs& at);
// The counter weights of a sample of `rank` axes: element idx of sample i has counter
// i place + sum_b idx_b w_b (mod 2^64), w_b = 2^(20 (rank - 1 - b)) and 0 on the shared axis
// (-1: none), place = 2^(20 rank): 20-bit digits.
struct DropoutWeights {
    std::vector<std::uint64_t> w;
    std::uint64_t place = 1;
};
inline DropoutWeights dropout_weights(std::size_t rank, int shared) {
    DropoutWeights d;
    d.w.resize(rank);
    for (std::size_t b = rank; b-- > 0;) {
        d.w[b] = int(b) == shared ? 0 : d.place;
        d.place <<= 20;
    }
    return d;
}

// Calls f(packed offset, counter) for each element of run r, in order. The 20-bit digits make
// the counter linear in the index (dropout_weights), so stepping an odometer adds weights.
template <class F>
void for_each_dropout_counter(const Structure& st, int shared, const DropoutRun& r, F&& f) {
    const kern::SampleView v = kern::sample_view(st, r.sample);
    const std::size_t rank = v.shape.size();
    const auto [w, place] = dropout_weights(rank, shared);
    std::vector<std::int64_t> idx(rank, 0);
    std::uint64_t c = std::uint64_t(r.sample) * place;
    std::int64_t off = v.base;
    for (std::int64_t n = r.n0, b = std::int64_t(rank); b-- > 0;) {
        const std::size_t u = std::size_t(b);
        idx[u] = n % v.shape[u];
        n /= v.shape[u];
        c += w[u] * std::uint64_t(idx[u]);
        off += v.strides[u] * idx[u];
    }
    for (std::int64_t n = r.n0; n < r.n1; ++n) {
        f(off, std::int64_t(c));
        for (std::size_t b = rank; b-- > 0;) {
            c += w[b];
            off += v.strides[b];
            if (++idx[b] < v.shape[b]) break;
            c -= w[b] * std::uint64_t(v.shape[b]);
            off -= v.strides[b] * v.shape[b];
            idx[b] = 0;
        }
    }
}

// cross_entropy's labels as packed i64, after checking them against the logits: the same
// batch, each sample's label shape the logits' without the class axis, every label in [0, K).
// Label k owns the K logits from packed index k * K.
std::vector<std::int64_t> checked_labels(std::string_view op, const RaggedTensor& logits,
                                         const RaggedTensor& labels);

} // namespace rag
