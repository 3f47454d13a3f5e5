// Transposes on the GPU tier as a kernel-IR program (jit/kir.hpp): the swap of two static
// per-sample axes with only static axes from the first of them on (a weight's [C, D] -> [D, C],
// [B, ~N, 4, 16] -> [B, ~N, 16, 4]). Those axes are innermost in storage in logical order
// (runtime/structure.hpp), so the values are [outer, ea, mid, eb, inner] and become
// [outer, eb, mid, ea, inner] whatever the ragged structure in front. Without it the GPU tier
// ran them on the host: a download and an upload of the tensor a step (the weights' transposes
// of every backward). Elements are copied exactly (f32, f16, bf16); instance k writes output
// elements [k, k + 1) kTransposeChunk, one per thread at a time. LLVM-free and driver-free.
#pragma once
#include "ir/ir.hpp"
#include "jit/kir.hpp"

#include <optional>

namespace rag::jit {

inline constexpr std::int64_t kTransposeChunk = 1024;

// Parameters total, ea, mid, eb, inner; buffers x, out (both of dtype t: f32, f16 or bf16).
kir::Kernel transpose_program(DType t);
// The key gpu_kernel caches transpose_program(t) under (the GPU tier's transposes and the
// relative-position table gradients share it).
inline std::string transpose_kernel_key(DType t) {
    return "transpose/" + std::string(dtype_name(t));
}

struct TransposeJob {
    std::int64_t total = 0, ea = 1, mid = 1, eb = 1, inner = 1;
    StructurePtr out; // the result's structure
    std::int64_t grid() const { return (total + kTransposeChunk - 1) / kTransposeChunk; }
    std::vector<std::int64_t> params() const { return {total, ea, mid, eb, inner}; }
};
// The job of transpose node n on x, or nullopt where the program does not apply (another op or
// dtype, a swapped or later axis that is not static: the CPU tier's kernels run those).
std::optional<TransposeJob> transpose_job(const ir::Node& n, const RaggedTensor& x);

} // namespace rag::jit
