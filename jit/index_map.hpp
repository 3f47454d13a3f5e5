// Index maps of fused loops over broadcast operands, derived at run time from sizes and offsets
// (internal to jit/). A loop over a result [B, ~N, ~N, C] built by broadcasting [B, ~N, 1, C]
// and [B, 1, ~N, C] never materialises the broadcast operands: row r of the result reads row
// map[r] of each operand, so the compiled loop (which only sees the maps) serves every length.
#pragma once
#include "runtime/tensor.hpp"

#include <vector>

namespace rag::jit {

// The structure of a loop over `out` whose operands (`ins`, each of out's shape or broadcast to
// it along extent-1 axes) must agree on every axis they do not broadcast; null when their
// runtime extents disagree (the reference kernels then name the sample).
StructurePtr broadcast_structure(const Shape& out, const std::vector<const RaggedTensor*>& ins);

// For each row of `out`: the storage offset (in elements) of the row of `operand` it reads.
std::vector<std::int64_t> gather_rows(const Structure& out, const RaggedTensor& operand);

} // namespace rag::jit
