#include "runtime/cuda.hpp"

#include "runtime/cuda_driver.hpp"
#include "runtime/error.hpp"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

namespace rag::cuda {
namespace {

using namespace driver;

template <class F> using Fn = F*;

struct Api {
#define RAG_CUDA_MEMBER(name, symbol, type) Fn<type> name = nullptr;
    RAG_CUDA_DRIVER_FUNCTIONS(RAG_CUDA_MEMBER)
#undef RAG_CUDA_MEMBER
};

std::string error_text(const Api& api, CUresult r) {
    const char* name = nullptr;
    const char* text = nullptr;
    if (api.cuGetErrorName) api.cuGetErrorName(r, &name);
    if (api.cuGetErrorString) api.cuGetErrorString(r, &text);
    return std::string(name ? name : "CUDA error " + std::to_string(r)) +
           (text ? std::string(" (") + text + ")" : "");
}

// Opens the driver library, resolves every entry point and initialises it. Returns why the
// driver is unusable, or "" when it has at least one device. Never throws.
std::string open_driver(const std::vector<std::string>& paths, Api& api) {
    void* h = nullptr;
    std::string tried;
    for (const auto& p : paths) {
        h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h) break;
        const char* e = dlerror();
        tried += (tried.empty() ? "" : "; ") + (e ? std::string(e) : p);
    }
    if (!h) return "no CUDA driver (" + tried + ")";
#define RAG_CUDA_RESOLVE(name, symbol, type)                                                       \
    api.name = reinterpret_cast<Fn<type>>(dlsym(h, symbol));                                       \
    if (!api.name) return std::string("the CUDA driver lacks ") + symbol + " (too old?)";
    RAG_CUDA_DRIVER_FUNCTIONS(RAG_CUDA_RESOLVE)
#undef RAG_CUDA_RESOLVE
    if (CUresult r = api.cuInit(0); r != CUDA_SUCCESS)
        return r == CUDA_ERROR_STUB_LIBRARY
                   ? "the CUDA driver library is the toolkit's stub, not a driver"
                   : "cuInit failed: " + error_text(api, r);
    int count = 0;
    if (CUresult r = api.cuDeviceGetCount(&count); r != CUDA_SUCCESS)
        return "cuDeviceGetCount failed: " + error_text(api, r);
    if (count == 0) return "the CUDA driver found no device";
    return "";
}

struct State {
    Api api;
    std::string reason; // why CUDA is unavailable; empty when it is
    DeviceInfo info;
    CUcontext ctx = nullptr;
    CUstream stream = nullptr;
    std::mutex mu; // guards the allocator
    std::map<std::size_t, std::vector<CUdeviceptr>> cached;
    MemoryStats stats;
};

void check(const State& s, CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) fail("CUDA: ", what, " failed: ", error_text(s.api, r));
}

// Device 0 with its primary context and one non-blocking stream. Lives until exit: buffers
// and modules may be released during static destruction, when the driver must still be there.
// Emulated: host memory, no driver.
State& state() {
    static State* s = [] {
        auto* st = new State;
        if (emulated()) {
            // 8 multiprocessors: enough that launch sizing (split-K) is exercised.
            st->info = {"emulated GPU (host CPU)", 9, 0, 8, 0, 0};
            return st;
        }
        st->reason = open_driver({"libcuda.so.1", "libcuda.so"}, st->api);
        if (!st->reason.empty()) return st;
        try {
            Api& a = st->api;
            CUdevice dev = 0;
            check(*st, a.cuDeviceGet(&dev, 0), "cuDeviceGet");
            char name[256] = {};
            check(*st, a.cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
            st->info.name = name;
            check(*st,
                  a.cuDeviceGetAttribute(&st->info.major,
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                  "cuDeviceGetAttribute");
            check(*st,
                  a.cuDeviceGetAttribute(&st->info.minor,
                                         CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                  "cuDeviceGetAttribute");
            check(*st,
                  a.cuDeviceGetAttribute(&st->info.multiprocessors,
                                         CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                  "cuDeviceGetAttribute");
            check(*st, a.cuDeviceTotalMem(&st->info.total_memory, dev), "cuDeviceTotalMem");
            check(*st, a.cuDriverGetVersion(&st->info.driver_version), "cuDriverGetVersion");
            check(*st, a.cuDevicePrimaryCtxRetain(&st->ctx, dev), "cuDevicePrimaryCtxRetain");
            check(*st, a.cuCtxSetCurrent(st->ctx), "cuCtxSetCurrent");
            check(*st, a.cuStreamCreate(&st->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        } catch (const Error& e) {
            st->reason = e.what();
        }
        return st;
    }();
    return *s;
}

// The state, with the primary context current on this thread; throws when unavailable.
State& ready() {
    State& s = state();
    if (!s.reason.empty())
        fail("CUDA unavailable: ", s.reason, ". Run on the CPU (the default device) instead.");
    thread_local bool current = emulated();
    if (!current) {
        check(s, s.api.cuCtxSetCurrent(s.ctx), "cuCtxSetCurrent");
        current = true;
    }
    return s;
}

// Size classes: 512-byte steps below 1 MiB, 1 MiB steps above, so that a block freed by one
// call serves the next call of similar lengths.
std::size_t size_class(std::size_t bytes) {
    const std::size_t step = bytes < (std::size_t(1) << 20) ? 512 : std::size_t(1) << 20;
    return (bytes + step - 1) / step * step;
}

// Emulated device memory: host blocks, aligned like the driver's.
constexpr std::align_val_t kDeviceAlign{256};
CUdeviceptr host_alloc(std::size_t bytes) {
    return CUdeviceptr(reinterpret_cast<std::uintptr_t>(::operator new(bytes, kDeviceAlign)));
}
void* host_ptr(CUdeviceptr p) {
    return reinterpret_cast<void*>(std::uintptr_t(p));
}

void release_cached_locked(State& s) {
    for (auto& [size, blocks] : s.cached)
        for (CUdeviceptr p : blocks) {
            if (emulated())
                ::operator delete(host_ptr(p), kDeviceAlign);
            else
                s.api.cuMemFree(p); // nothing useful to do on failure while releasing
            s.stats.cached -= size;
        }
    s.cached.clear();
}

} // namespace

bool emulated() {
    static const bool on = [] {
        const char* e = std::getenv("RAG_GPU_EMULATE");
        return e && *e && std::string(e) != "0";
    }();
    return on;
}

bool available() {
    return state().reason.empty();
}
std::string unavailable_reason() {
    return state().reason;
}

std::string probe_library(const std::string& path) {
    Api api;
    return open_driver({path}, api);
}

const DeviceInfo& device() {
    return ready().info;
}

Buffer::Buffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    State& s = ready();
    block_ = size_class(bytes);
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.cached.find(block_);
    if (it != s.cached.end() && !it->second.empty()) {
        ptr_ = it->second.back();
        it->second.pop_back();
        s.stats.cached -= block_;
    } else if (emulated()) {
        ptr_ = host_alloc(block_);
    } else {
        CUdeviceptr p = 0;
        CUresult r = s.api.cuMemAlloc(&p, block_);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) { // the cache may hold enough: give it back, retry
            release_cached_locked(s);
            r = s.api.cuMemAlloc(&p, block_);
        }
        if (r != CUDA_SUCCESS)
            fail("CUDA: cannot allocate ", bytes, " bytes of device memory (", s.stats.in_use,
                 " in use): ", error_text(s.api, r));
        ptr_ = p;
    }
    s.stats.in_use += block_;
    s.stats.peak = std::max(s.stats.peak, s.stats.in_use);
}

Buffer Buffer::borrow(std::uint64_t ptr, std::size_t bytes) {
    Buffer b;
    b.ptr_ = ptr;
    b.bytes_ = bytes;
    b.block_ = size_class(bytes);
    b.owned_ = false;
    return b;
}

Buffer::Buffer(Buffer&& o) noexcept
    : ptr_(o.ptr_), bytes_(o.bytes_), block_(o.block_), owned_(o.owned_) {
    o.ptr_ = 0;
    o.bytes_ = o.block_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
    if (this != &o) {
        Buffer old(std::move(*this));
        ptr_ = o.ptr_;
        bytes_ = o.bytes_;
        block_ = o.block_;
        owned_ = o.owned_;
        o.ptr_ = 0;
        o.bytes_ = o.block_ = 0;
    }
    return *this;
}

Buffer::~Buffer() {
    if (!ptr_ || !owned_) return;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.cached[block_].push_back(ptr_);
    s.stats.in_use -= block_;
    s.stats.cached += block_;
}

namespace {
std::atomic<std::uint64_t> uploaded{0}, downloaded{0};
}

Transfers transfers() {
    return {uploaded.load(), downloaded.load()};
}

void upload(const Buffer& dst, const void* src, std::size_t bytes) {
    if (bytes > dst.bytes()) fail("CUDA: upload of ", bytes, " bytes into ", dst.bytes());
    if (bytes == 0) return;
    State& s = ready();
    uploaded += bytes;
    if (emulated()) {
        std::memcpy(host_ptr(dst.ptr()), src, bytes);
        return;
    }
    check(s, s.api.cuMemcpyHtoDAsync(dst.ptr(), src, bytes, s.stream), "cuMemcpyHtoDAsync");
    // The source may be freed as soon as we return (pageable memory is staged by the driver,
    // but not necessarily before the call returns).
    check(s, s.api.cuStreamSynchronize(s.stream), "cuStreamSynchronize");
}

void download(void* dst, const Buffer& src, std::size_t bytes) {
    if (bytes > src.bytes()) fail("CUDA: download of ", bytes, " bytes from ", src.bytes());
    if (bytes == 0) return;
    State& s = ready();
    downloaded += bytes;
    if (emulated()) {
        std::memcpy(dst, host_ptr(src.ptr()), bytes);
        return;
    }
    check(s, s.api.cuMemcpyDtoHAsync(dst, src.ptr(), bytes, s.stream), "cuMemcpyDtoHAsync");
    check(s, s.api.cuStreamSynchronize(s.stream), "cuStreamSynchronize");
}

void copy(const Buffer& dst, const Buffer& src, std::size_t bytes) {
    if (bytes > dst.bytes() || bytes > src.bytes())
        fail("CUDA: copy of ", bytes, " bytes between buffers of ", src.bytes(), " and ",
             dst.bytes());
    if (bytes == 0) return;
    State& s = ready();
    if (emulated()) {
        std::memcpy(host_ptr(dst.ptr()), host_ptr(src.ptr()), bytes);
        return;
    }
    check(s, s.api.cuMemcpyDtoDAsync(dst.ptr(), src.ptr(), bytes, s.stream), "cuMemcpyDtoDAsync");
}

void zero(const Buffer& dst) {
    if (dst.bytes() == 0) return;
    State& s = ready();
    if (emulated()) {
        std::memset(host_ptr(dst.ptr()), 0, dst.bytes());
        return;
    }
    check(s, s.api.cuMemsetD8Async(dst.ptr(), 0, dst.bytes(), s.stream), "cuMemsetD8Async");
}

void synchronize() {
    State& s = ready();
    if (emulated()) return;
    check(s, s.api.cuStreamSynchronize(s.stream), "cuStreamSynchronize");
}

std::int64_t dlpack_stream() {
    State& s = ready();
    return emulated() ? -1 : std::int64_t(reinterpret_cast<std::uintptr_t>(s.stream));
}

void order_before(std::int64_t stream) {
    State& s = ready();
    if (stream == 0 || stream < -1)
        fail("CUDA: ", stream,
             " is not a DLPack stream (1: the legacy default, 2: per-thread, a "
             "handle, or -1 for none)");
    if (stream == -1 || emulated()) return;
    CUevent done = nullptr;
    check(s, s.api.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    check(s, s.api.cuEventRecord(done, s.stream), "cuEventRecord");
    const CUresult r =
        s.api.cuStreamWaitEvent(reinterpret_cast<CUstream>(std::uintptr_t(stream)), done, 0);
    s.api.cuEventDestroy(done); // released once it completes
    check(s, r, "cuStreamWaitEvent");
}

MemoryStats memory_stats() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.stats;
}

void reset_peak() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.stats.peak = s.stats.in_use;
}

void release_cached() {
    State& s = state();
    if (!s.reason.empty()) return;
    std::lock_guard<std::mutex> lock(s.mu);
    release_cached_locked(s);
}

Module::Module(const std::string& ptx) {
    State& s = ready();
    if (emulated()) fail("CUDA (emulated device): PTX does not run on the emulated device");
    std::string log(std::size_t(1) << 20, '\0'); // the driver's JIT error log, 1 MiB
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* vals[] = {log.data(), reinterpret_cast<void*>(log.size())};
    CUmodule m = nullptr;
    CUresult r = s.api.cuModuleLoadDataEx(&m, ptx.c_str(), 2, opts, vals);
    if (r != CUDA_SUCCESS) {
        log.resize(log.find('\0'));
        fail("CUDA: loading PTX for ", device().arch(), " failed: ", error_text(s.api, r),
             log.empty() ? "" : "\n" + log);
    }
    mod_ = m;
}

Module::~Module() {
    if (mod_) state().api.cuModuleUnload(static_cast<CUmodule>(mod_));
}

Kernel Module::kernel(const std::string& name) const {
    State& s = ready();
    Kernel k;
    CUfunction f = nullptr;
    CUresult r = s.api.cuModuleGetFunction(&f, static_cast<CUmodule>(mod_), name.c_str());
    if (r != CUDA_SUCCESS)
        fail("CUDA: the module has no kernel ", name, ": ", error_text(s.api, r));
    k.fn_ = f;
    k.name_ = name;
    return k;
}

void Kernel::launch(unsigned grid, unsigned block, const std::vector<void*>& params,
                    unsigned shared_bytes) const {
    const unsigned g[3] = {grid, 1, 1}, b[3] = {block, 1, 1};
    launch3(g, b, params, shared_bytes);
}

void Kernel::launch3(const unsigned grid[3], const unsigned block[3],
                     const std::vector<void*>& params, unsigned shared_bytes) const {
    State& s = ready();
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return; // nothing to do
    CUresult r = s.api.cuLaunchKernel(static_cast<CUfunction>(fn_), grid[0], grid[1], grid[2],
                                      block[0], block[1], block[2], shared_bytes, s.stream,
                                      const_cast<void**>(params.data()), nullptr);
    if (r != CUDA_SUCCESS) fail("CUDA: launching ", name_, " failed: ", error_text(s.api, r));
}

void Kernel::allow_dynamic_shared(unsigned bytes) const {
    State& s = ready();
    CUresult r = s.api.cuFuncSetAttribute(
        static_cast<CUfunction>(fn_), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(bytes));
    if (r != CUDA_SUCCESS)
        fail("CUDA: ", name_, " cannot have ", bytes,
             " bytes of dynamic shared memory: ", error_text(s.api, r));
}

double time_ms(const std::function<void()>& f) {
    State& s = ready();
    if (emulated()) { // host time: the emulated kernels run synchronously
        const auto start = std::chrono::steady_clock::now();
        f();
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count();
    }
    CUevent start = nullptr, stop = nullptr;
    check(s, s.api.cuEventCreate(&start, 0), "cuEventCreate");
    check(s, s.api.cuEventCreate(&stop, 0), "cuEventCreate");
    check(s, s.api.cuEventRecord(start, s.stream), "cuEventRecord");
    f();
    check(s, s.api.cuEventRecord(stop, s.stream), "cuEventRecord");
    check(s, s.api.cuEventSynchronize(stop), "cuEventSynchronize");
    float ms = 0;
    check(s, s.api.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
    s.api.cuEventDestroy(start);
    s.api.cuEventDestroy(stop);
    return double(ms);
}

} // namespace rag::cuda
