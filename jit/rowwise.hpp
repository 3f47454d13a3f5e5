// Normalisations over the static last axis on the CPU tier: layernorm, rmsnorm and their
// gradients as LLVM row loops. The last axis is innermost in storage, so the packed values are
// rows of C contiguous features whatever the ragged structure: each kernel takes a row range
// and C at run time (nothing compiled depends on a length), rows are split over threads, and
// the parameter gradients (sums over every row) are accumulated in fixed blocks of rows and
// added in block order, so results do not depend on the thread count. Internal to jit/.
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

// Whether node n (layernorm, rmsnorm, layernorm_grad, rmsnorm_grad of f32/f64) runs here.
bool is_rowwise(const ir::Node& n);
// Whether gradient nodes a and b differ only in `wrt`, so one pass computes both.
bool same_norm_grad(const ir::Node& a, const ir::Node& b);
// Runs node `i` of f and the sibling gradient nodes `also` (same_norm_grad), writing vals.
void run_rowwise(const ir::Function& f, int i, const std::vector<int>& also,
                 std::vector<RaggedTensor>& vals);

} // namespace rag::jit
