// Segmented reductions on the CPU tier: `sum`/`mean` over one axis (a ragged, static or the
// whole sample) and their gradients, `max`/`min` (over one axis, a whole sample or globally),
// `softmax`/`logsumexp` (over one per-sample axis) and their gradients (`reduce_grad` of
// max/min, `softmax_grad`, `logsumexp_grad`), as LLVM loop nests over per-sample segments. Every
// sample's block is row-major in storage order, so reducing one axis is, per sample, a loop
// over (outer, n, inner) extents that the host reads off the structure: nothing compiled
// depends on a length. Internal to jit/.
#pragma once
#include "ir/ir.hpp"
#include <optional>

namespace rag::jit {

// Whether node n (one of the ops above, f32/f64, with axis= on a batched value, or for the
// max/min/softmax/logsumexp family also on an unbatched array; sum/mean/max/min also without
// axis=) runs as a segmented loop.
bool is_segmented(const ir::Function& f, const ir::Node& n);
// The optimised LLVM IR of the line kernel for `op` (max, min, softmax, logsumexp, softmax_grad,
// logsumexp_grad, extreme_grad: reduce_grad of max/min) and dtype t (f32, f64), for tests.
std::string line_kernel_ir(std::string_view op, DType t);
// y = softmax of each row of a dense row-major [rows, width] block x (f32 or f64; y must not
// overlap x) with the line kernel, on this thread; causal: row r sees its first r + 1 entries,
// the rest of y's row is 0. For attention_cpu's probabilities.
void softmax_rows(DType t, const void* x, void* y, std::int64_t rows, std::int64_t width,
                  bool causal);
// y[r] = logsumexp of row r of a dense row-major [rows, width] block x (f32 or f64) with the line
// kernel, on this thread. For cross_entropy (jit/nn_steps.hpp).
void logsumexp_rows(DType t, const void* x, void* y, std::int64_t rows, std::int64_t width);
// Runs it; `vals` holds its arguments.
RaggedTensor run_segmented(const ir::Node& n, const std::vector<RaggedTensor>& vals);
// The width of the rows sum_to(g, like) adds up when like is unbatched, after its leading 1s
// equal to g's trailing static axes (a bias gradient: g's innermost storage is like's elements,
// so the result is the sum of g's rows of that many elements); else nullopt.
std::optional<std::int64_t> sum_to_columns(const Shape& g, const Shape& like);

} // namespace rag::jit
