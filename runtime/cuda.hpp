// The CUDA device through the Driver API, opened at run time with dlopen("libcuda.so.1") (then
// "libcuda.so"); rag never links libcuda, so every build runs on machines without a GPU.
// When no driver or no device is present, available() is false and says why; anything that
// needs the device throws rag::Error("CUDA unavailable: ..."). No LLVM here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rag::cuda {

// Whether the driver loaded, initialised and found a device (or the device is emulated).
// Never throws; probed once.
bool available();
// RAG_GPU_EMULATE=1 (read once): an emulated device for tests without a GPU. Device memory
// is host memory and copies are memcpy; PTX modules do not load: the GPU tier and the
// kernel-IR launcher run their kernels through the device emulator (jit/kir_emulator.hpp)
// instead.
bool emulated();
std::string unavailable_reason(); // empty when available

// Probes a specific driver library (for tests: a stub or a missing file); does not touch the
// process-wide state. Returns the reason it is unusable, or "" when it has a device.
std::string probe_library(const std::string& path);

struct DeviceInfo {
    std::string name;
    int major = 0, minor = 0; // compute capability
    int multiprocessors = 0;
    std::size_t total_memory = 0;
    int driver_version = 0; // 13000 for CUDA 13.0
    std::string arch() const { return "sm_" + std::to_string(major * 10 + minor); }
};

// Device 0 (its primary context is made current on the calling thread). Throws when
// unavailable.
const DeviceInfo& device();

// Device memory from the caching allocator: freed blocks are kept by size class and reused,
// so steady-state calls make no cuMemAlloc. Move-only; returns its block on destruction.
class Buffer {
  public:
    Buffer() = default;
    explicit Buffer(std::size_t bytes);
    // Device memory rag does not own (a DLPack import): never returned to the allocator; its
    // owner keeps it alive for as long as the Buffer lives.
    static Buffer borrow(std::uint64_t ptr, std::size_t bytes);
    Buffer(Buffer&& o) noexcept;
    Buffer& operator=(Buffer&& o) noexcept;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer();

    std::uint64_t ptr() const { return ptr_; } // a CUdeviceptr
    std::size_t bytes() const { return bytes_; }

  private:
    std::uint64_t ptr_ = 0;
    std::size_t bytes_ = 0;
    std::size_t block_ = 0; // the size class it takes from the allocator (or would)
    bool owned_ = true;     // false: borrowed, never returned to the allocator
};

// Copies on rag's stream; download() waits for everything queued before it.
void upload(const Buffer& dst, const void* src, std::size_t bytes);
void download(void* dst, const Buffer& src, std::size_t bytes);
// Bytes copied host -> device and device -> host by upload() and download() since the process
// started (the emulated device counts its copies too): what a call moved is the difference.
struct Transfers {
    std::uint64_t uploaded = 0, downloaded = 0;
};
Transfers transfers();
// Device to device on rag's stream, after the work queued before it.
void copy(const Buffer& dst, const Buffer& src, std::size_t bytes);
void zero(const Buffer& dst);
void synchronize();

// Streams as the DLPack protocol names them (`__dlpack__(stream=...)`): a CUstream as an
// integer, 1 and 2 being CUDA's legacy and per-thread default streams, -1 asking for no
// synchronisation. `dlpack_stream()` is rag's own stream, which rag hands a producer so that
// its work is ordered before rag reads the memory (-1 on the emulated device, whose work is
// synchronous); `order_before(s)` makes stream s wait for everything queued on rag's stream
// so far, before a consumer reads an exported tensor on s (a no-op when emulated).
std::int64_t dlpack_stream();
void order_before(std::int64_t stream);

struct MemoryStats {
    std::size_t in_use = 0; // bytes of live Buffers (their size classes)
    std::size_t peak = 0;   // most in_use since reset_peak()
    std::size_t cached = 0; // freed blocks kept for reuse
};
MemoryStats memory_stats();
void reset_peak();
void release_cached(); // returns every cached block to the driver

class Kernel;

// A PTX module loaded on the device. Load failures show the driver's JIT error log.
class Module {
  public:
    explicit Module(const std::string& ptx);
    ~Module();
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;
    Kernel kernel(const std::string& name) const;

  private:
    void* mod_ = nullptr; // CUmodule
};

class Kernel {
  public:
    // params: one pointer per kernel parameter, pointing at its value (cuLaunchKernel's rule).
    void launch(unsigned grid, unsigned block, const std::vector<void*>& params,
                unsigned shared_bytes = 0) const;
    void launch3(const unsigned grid[3], const unsigned block[3], const std::vector<void*>& params,
                 unsigned shared_bytes = 0) const;
    // Lets launches ask for `bytes` of dynamic shared memory (the driver refuses more than 48 KiB
    // unless told).
    void allow_dynamic_shared(unsigned bytes) const;

  private:
    friend class Module;
    void* fn_ = nullptr; // CUfunction
    std::string name_;
};

// Milliseconds of device time spent in f (events around it on rag's stream).
double time_ms(const std::function<void()>& f);

} // namespace rag::cuda
