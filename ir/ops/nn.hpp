// What the reference kernels of dropout and cross_entropy (ir/ops/nn.cpp) share with the CPU
// tier's kernels (jit/nn_steps.cpp), so both tiers draw the same masks and say the same
// thing about bad labels.
#pragma once
#include "ir/attrs.hpp"
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

// cross_entropy's labels as packed i64, after checking them against the logits: the same
// batch, each sample's label shape the logits' without the class axis, every label in [0, K).
// Label k owns the K logits from packed index k * K.
std::vector<std::int64_t> checked_labels(std::string_view op, const RaggedTensor& logits,
                                         const RaggedTensor& labels);

} // namespace rag
