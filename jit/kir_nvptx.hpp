// Kernel-IR kernels (jit/kir.hpp) as PTX: the GPU lowering of the tile programs. This header
// knows nothing of LLVM or of the driver.
//
// One program instance runs as one thread block: instances pid = blockIdx.x, blockIdx.x +
// gridDim.x, ... < grid (so a launch may use fewer blocks than instances, and scratch is sized
// by blocks, not instances). A `threads` loop is spread over the block's threads (iteration
// threadIdx.x, stride blockDim.x) with a barrier before it (scratch written by serial code is
// published, and no thread overwrites what others still read) and after it; a threads loop
// nested in another one runs serially in its thread. Serial code runs redundantly in every
// thread, on the same values, so its control flow is uniform and barriers are legal in it; a
// store in serial code is made by thread 0 alone, between barriers. Fragments are registers:
// an `each` runs its body, unrolled, once per element the thread holds (warp w, lane 4g + t:
// rows 16w + g and 16w + g + 8 in the mma accumulator's layout), like a threads loop (stores in
// it are the owner's); `row_reduce` and fragment mmas are warp-wide (shfl.sync, mma.sync), in
// uniform serial code. Half-typed shared operands load their mma fragments with ldmatrix.
//
// Entry parameters, in order: i64 grid, one i64 per kernel parameter, one pointer per global
// buffer (declaration order), then one pointer to scratch: kir_scratch_bytes(k, params) bytes
// per block of the launch.
#pragma once
#include "jit/kir.hpp"

#include <span>
#include <string>

namespace rag::jit {

inline constexpr int kKirBlock = 128; // threads per block, the kernels' launch bound

// PTX for `k` on `arch` (sm_80 or sm_90), its entry named k.name. Throws rag::Error.
std::string kir_ptx(const kir::Kernel& k, const std::string& arch);

// Checks what a launch of k's entry is given: as many buffers and parameters as k declares,
// every buffer 16-byte aligned (copy16's vector accesses rely on it; whole device allocations
// are 256-byte aligned), every parameter and, where `bytes` gives the buffers' sizes, every
// buffer's element count below 2^31: the lowering computes the kernel IR's integers in 32 bits
// (its indices are affine in the parameters, within the buffers they index). Throws rag::Error
// naming the kernel and `where` (the emulator's "(emulated GPU)").
void check_kir_launch(const kir::Kernel& k, std::span<const std::uint64_t> buffers,
                      std::span<const std::int64_t> params, const std::string& where,
                      std::span<const std::size_t> bytes = {});

// The dynamic shared memory a launch of k asks for: all of its shared arrays when they pass
// the GPU's static limit (kir::kStaticSharedBytes), else 0 (they are static arrays).
std::int64_t kir_dynamic_shared_bytes(const kir::Kernel& k);

// Scratch bytes one block needs: every scratch array, 64-byte aligned, as on the CPU.
std::int64_t kir_scratch_bytes(const kir::Kernel& k, std::span<const std::int64_t> params);

} // namespace rag::jit
