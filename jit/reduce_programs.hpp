// Segmented reductions as kernel-IR programs (jit/kir.hpp), written once for the CPU
// (jit/kir_cpu.hpp) and the GPU (jit/kir_gpu.hpp): sum and mean over one axis and their
// gradients, softmax over one per-sample axis and its gradient, for f32 tensors.
//
// Every sample's block is row-major in storage order, so one axis of one sample is a loop over
// (outer, n, inner) extents read off the structure. The host lists *entries*
// {in_base, out_base, outer, n, inner}: a sample's outer extent cut into pieces of about one
// block's worth of lines (a line: one (outer, inner) position, reduced over n), one program
// instance per entry, its lines spread over a `threads` loop. Each line is reduced in index
// order by one thread, so the bits do not depend on the device or the thread count (they may
// differ from the CPU tier's vectorised loops in the last place). Nothing compiled depends on a
// length. LLVM-free and driver-free.
#pragma once
#include "ir/ir.hpp"
#include "jit/kir.hpp"

#include <optional>

namespace rag::jit {

enum class SegOp : std::uint8_t {
    sum,          // buffers seg, x, y:      y[o, j] = sum_r x[o, r, j]
    mean,         // buffers seg, x, y:      the sum / n (0 when n = 0)
    expand_sum,   // buffers seg, g, dx:     dx[o, r, j] = g[o, j]       (reduce_grad of sum)
    expand_mean,  // buffers seg, g, dx:     dx[o, r, j] = g[o, j] / n   (reduce_grad of mean)
    softmax,      // buffers seg, x, y:      y = exp(x - shift) / sum_r exp(x - shift), shift the
                  //                         line's max when finite, else 0 (as the reference)
    softmax_grad, // buffers seg, y, g, dx:  dx = y (g - sum_r g y)
};

// The program of `op` (no parameters; one instance per entry of `seg`).
kir::Kernel segment_program(SegOp op);

// A node of a function that runs as a segment program, with everything a launch needs.
struct SegmentJob {
    SegOp op;
    std::vector<std::int64_t> seg;    // entries, 5 per program instance
    std::vector<RaggedTensor> inputs; // the program's input buffers, in order
    StructurePtr out;                 // the result's structure (dtype f32)
    std::int64_t grid() const { return std::int64_t(seg.size() / 5); }
};

// The job for node n given its argument values, or nullopt when n is not a segment program:
// not f32, not one of the ops above, over the batch axis (softmax) or with no axis, or with
// arguments whose structures disagree (the reference kernel then reports the sample and
// extents). An unbatched value is one sample.
std::optional<SegmentJob> segment_job(const ir::Node& n, std::span<const RaggedTensor> args);

// Lines per entry: a sample's outer extent is cut so that an entry has about this many.
inline constexpr std::int64_t kSegmentLines = 128;

// The entries of reducing logical per-sample axis `axis` of `big` (-1: each whole sample) into
// `small`, whose blocks hold outer x inner elements per sample.
std::vector<std::int64_t> segment_entries(const Structure& big, const Structure& small, int axis);

} // namespace rag::jit
