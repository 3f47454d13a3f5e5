// `a @ b` with both operands batched (per-sample products over the last two axes, say the
// [B, H, N, d] @ [B, H, d, M] scores of padded attention) on the CPU tier: one BLAS GEMM per
// (sample, leading index), spread over threads. Ragged last axes are fine: storage strides
// decide whether BLAS reads an operand as it is or transposed. No LLVM here.
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

bool is_batched_gemm(const ir::Function& f, const ir::Node& n);
// n's value from its arguments in vals; shape errors come from the reference kernel.
RaggedTensor run_batched_gemm(const ir::Node& n, const std::vector<RaggedTensor>& vals);

} // namespace rag::jit
