// Packed softmax attention on the CPU tier: per sample and head, the scores, probabilities and
// gradients of that sample's rows and keys only, as BLAS GEMMs over strided head slices of the
// packed [~N, H, D] storage plus row loops for the softmax. (sample, head) units are spread
// over threads; attention_grad's three cotangents (wrt q, k, v) come from one pass that
// recomputes the probabilities once. Internal to jit/.
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

// Whether node n (attention or attention_grad of f32/f64) runs here.
bool is_attention(const ir::Node& n);
// Whether attention_grad (biased_attention_grad) nodes a and b differ only in `wrt`.
bool same_attention_grad(const ir::Node& a, const ir::Node& b);
// Runs node i of f and the sibling gradient nodes `also`, writing vals.
void run_attention(const ir::Function& f, int i, const std::vector<int>& also,
                   std::vector<RaggedTensor>& vals);

} // namespace rag::jit
