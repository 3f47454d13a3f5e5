// NumPy broadcasting over logical shapes with ragged axes. Shapes align from the right; batch
// axes align with each other; an extent-1 static axis broadcasts against anything, including a
// ragged axis, which is how `[B, ~N, 1, C] + [B, 1, ~N, C]` creates the pair `[B, ~N, ~N, C]`.
// Two different ragged names on one axis, or a ragged axis against a static extent other
// than 1, are type errors; equal names with unequal runtime extents are runtime errors that
// name the sample.
#pragma once
#include "ir/ops/kernel_util.hpp"

namespace rag::kern {

Shape broadcast_shapes(std::span<const Shape> in, std::string_view op);

// out = fn(in_0, ..., in_n) elementwise over the broadcast shape.
RaggedTensor broadcast_apply(std::span<const RaggedTensor> in, DType out, std::string_view op,
                             const std::function<double(const double*)>& fn);

// Sums g over the axes along which `like` was broadcast to reach g's shape: the cotangent of
// an operand `like` given the cotangent g of a broadcast result. Same schema as `like`.
RaggedTensor sum_to(const RaggedTensor& g, const RaggedTensor& like);

} // namespace rag::kern
