// cross_entropy, its gradient and dropout on the CPU tier (f32, f64). cross_entropy takes each
// row's log-sum-exp with the segmented line kernel (jit/segmented.hpp), rows split over
// threads, then sums lse - z[label] over rows in packed order in double: the loss does not
// depend on the thread count. Its gradient is the line kernel's softmax of each row, scaled by
// g / positions, minus that at the label. dropout draws each element's mask from its counter
// (ir/ops/nn.hpp) and scales in double, rounded once: bitwise the reference kernel's. Labels are
// checked as the reference checks them, with its messages. Internal to jit/; no LLVM.
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

bool is_nn_step(const ir::Node& n);
// Runs node n (is_nn_step); vals holds its arguments.
RaggedTensor run_nn_step(const ir::Node& n, const std::vector<RaggedTensor>& vals);

} // namespace rag::jit
