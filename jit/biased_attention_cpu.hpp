// Softmax attention with a per-sample additive bias on the CPU tier (op biased_attention: singles
// with a [B, ~N, ~M, H] bias, and triangle attention along axis 2 of pair states). One work
// unit per (sample, head) walks that sample's rows in order: per row, the [N, M] logits
// scale Q K^T + bias as one BLAS GEMM into a per-thread scratch, the softmax line kernel, then
// GEMMs for the output or the gradients. Memory is that scratch per thread (N_b * M_b, or
// N_b * tile in key tiles with an online softmax past RAG_ATTENTION_SCRATCH), never the
// H * N^3 logits of a pair state. The bias gradient sums the logits' cotangent over rows in
// row order inside its unit: no atomics, bitwise the same under any thread count. The gradient
// nodes of one call (wrt q, k, v, bias) come from one pass. Internal to jit/.
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

// Whether node n (biased_attention or its gradient, f32/f64) runs here.
bool is_biased_attention(const ir::Node& n);
// Runs node i of f and the sibling gradient nodes `also` (same args, other wrt), writing vals.
void run_biased_attention(const ir::Function& f, int i, const std::vector<int>& also,
                          std::vector<RaggedTensor>& vals);
// Whether the runtime lengths of q, k, v, bias (and a trailing dO) agree as the op needs; when
// not, the reference kernel runs instead and names the sample.
bool biased_lengths_agree(const std::vector<const RaggedTensor*>& in, int axis);
// The op's result structure: q's sizes with v's width Dv as the last extent, under `shape`
// (the result type's).
StructurePtr biased_out_structure(const RaggedTensor& q, const Shape& shape, std::int64_t Dv);

} // namespace rag::jit
