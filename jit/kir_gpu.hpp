// Kernel-IR kernels (jit/kir.hpp) launched on the CUDA device: the GPU twin of jit/kir_cpu.hpp.
// A kernel is lowered to PTX for the device's arch (jit/kir_nvptx.hpp) and loaded once per
// process; a launch runs the program instances [0, grid) as thread blocks of kKirBlock threads,
// each block looping over instances blockIdx.x, blockIdx.x + gridDim.x, ... with its own
// scratch region from the caching allocator. Everything is queued on rag's stream, so buffers
// freed after a launch may be reused by later work without a synchronisation. This header
// knows nothing of LLVM or of the driver API (runtime/cuda.hpp wraps it).
#pragma once
#include "jit/kir.hpp"
#include "runtime/cuda.hpp"
#include "runtime/tensor.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rag::jit {

class GpuKernel {
  public:
    virtual ~GpuKernel() = default;
    // `buffers` holds the kernel's global buffers in declaration order, each 16-byte aligned
    // (whole allocations are; the lowering's 16-byte staging relies on it) and of fewer than
    // 2^31 elements, as every parameter must be below 2^31 (the kernels compute their integers
    // in 32 bits): a launch checks both (check_kir_launch). Returns once the launch is queued.
    virtual void launch(std::int64_t grid, std::span<const cuda::Buffer* const> buffers,
                        std::span<const std::int64_t> params) const = 0;
    virtual const std::string& ptx() const = 0;
    virtual const kir::Kernel& kernel() const = 0;
};

// Blocks a launch of `grid` instances uses when each block needs `scratch_bytes` of scratch:
// enough to fill the device (`multiprocessors` x 8 blocks of 128 threads) but no more scratch
// than kScratchBudget in all, and never more blocks than instances (at least one).
inline constexpr std::int64_t kScratchBudget = std::int64_t(256) << 20;
std::int64_t kir_gpu_blocks(std::int64_t grid, std::int64_t scratch_bytes, int multiprocessors);

// The kernel `make()` builds, compiled for the current device and loaded, cached for the life
// of the process under `key` (make runs on the first use of a key only). Thread-safe. Throws
// "CUDA unavailable: ..." without a device.
const GpuKernel& gpu_kernel(const std::string& key, const std::function<kir::Kernel()>& make);

// Every kernel gpu_kernel has built in this process, (key, program), in order of first use:
// what `rag ptx` lists after running a call on the emulated device.
std::vector<std::pair<std::string, const kir::Kernel*>> gpu_kernels_loaded();

// Launch buffers. Never empty (at least 8 bytes): a buffer a program does not touch (an
// absent table) still gets a real pointer, so a stray read stays in bounds.
cuda::Buffer device_buffer(std::size_t bytes);
cuda::Buffer device_zeros(std::size_t bytes);
cuda::Buffer to_device(const void* host, std::size_t bytes);
cuda::Buffer to_device(const RaggedTensor& t); // its packed values
template <class T> cuda::Buffer to_device(const std::vector<T>& v) {
    return to_device(v.data(), v.size() * sizeof(T));
}
// A tensor of dtype t and structure st holding the first bytes of `b`.
RaggedTensor from_device(const cuda::Buffer& b, DType t, const StructurePtr& st);
// The same, but the values stay in `b` until the host reads them (runtime/tensor.hpp's
// Residency): a GPU-tier result, which a later call reads without an upload.
RaggedTensor resident(cuda::Buffer b, DType t, const StructurePtr& st);
RaggedTensor resident(std::shared_ptr<const cuda::Buffer> b, DType t, const StructurePtr& st);
// t's values in device memory: its current device copy, else uploaded.
std::shared_ptr<const cuda::Buffer> on_device(const RaggedTensor& t);
// A copy of t whose values are in device memory and on the host (Python's Tensor.to("cuda")).
RaggedTensor to_resident(const RaggedTensor& t);

} // namespace rag::jit
