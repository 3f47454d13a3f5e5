// Shape ops on the CPU tier without their reference kernels' per-element index walks.
// Storage keeps ragged axes first, then the others, each in logical order (runtime/structure.hpp),
// so many shape ops leave the bytes where they are:
//   view      index with only ':' and 'new' items, its index_grad, and a transpose that keeps the
//             storage order (say [B, ~N, 128] <-> [B, 128, ~N]) share their operand's buffer
//             under a new structure;
//   permute   a transpose that only reorders ragged axes ([B, 128, ~N, ~M] -> [B, ~M, ~N, 128])
//             copies whole rows through a row map built from the sizes and offsets; any other
//             transpose (a weight's [C, D] -> [D, C], [B, ~N, 4, 16] -> [B, ~N, 16, 4]) copies
//             elements in cache-sized tiles of the swapped axes, through per-sample strides;
//   slice     index that slices ragged axes (steps too) and keeps every other non-ragged axis
//             whole copies whole rows through a row map; its index_grad zero-fills and copies
//             the rows back (a slice reads each row at most once, so no sums).
// Internal to jit/; no LLVM (the copies are memcpy of contiguous rows, split over threads).
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

enum class LayoutKind { none, view, permute, slice };

LayoutKind layout_kind(const ir::Function& f, const ir::Node& n);
// Runs node n (layout_kind != none); vals holds its arguments.
RaggedTensor run_layout(const ir::Node& n, const std::vector<RaggedTensor>& vals);
// The structure of transpose(x) swapping per-sample axes a and b, of shape `out`.
StructurePtr transposed_structure(const RaggedTensor& x, const Shape& out, int a, int b);

} // namespace rag::jit
