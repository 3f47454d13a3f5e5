#include "jit/kir_gpu.hpp"

#include "jit/gpu_function.hpp"
#include "jit/kir_emulator.hpp"
#include "jit/kir_nvptx.hpp"
#include "runtime/cuda.hpp"
#include "runtime/error.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace rag::jit {
namespace {

class LoadedKernel final : public GpuKernel {
  public:
    explicit LoadedKernel(kir::Kernel k)
        : k_(std::move(k)), ptx_(kir_ptx(k_, device_arch())), module_(ptx_),
          fn_(module_.kernel(k_.name)), shared_(unsigned(kir_dynamic_shared_bytes(k_))) {
        if (shared_) fn_.allow_dynamic_shared(shared_);
    }

    const std::string& ptx() const override { return ptx_; }
    const kir::Kernel& kernel() const override { return k_; }

    void launch(std::int64_t grid, std::span<const cuda::Buffer* const> buffers,
                std::span<const std::int64_t> params) const override {
        std::vector<std::uint64_t> ptrs;
        std::vector<std::size_t> bytes;
        for (const cuda::Buffer* b : buffers) {
            ptrs.push_back(b->ptr());
            bytes.push_back(b->bytes());
        }
        check_kir_launch(k_, ptrs, params, "", bytes);
        if (grid <= 0) return;
        const std::int64_t per_block = kir_scratch_bytes(k_, params);
        const std::int64_t blocks = kir_gpu_blocks(grid, per_block, cuda::device().multiprocessors);
        // Returned to the cache when this function returns, while the kernel may still run:
        // only work queued after it on the same stream can be handed the block again.
        cuda::Buffer scratch(std::size_t(per_block * blocks));
        // The entry's parameters (jit/kir_nvptx.hpp): grid, the i64 parameters, one pointer per
        // global buffer, the scratch pointer. cuLaunchKernel takes the address of each value.
        std::vector<std::int64_t> ints{grid};
        ints.insert(ints.end(), params.begin(), params.end());
        ptrs.push_back(scratch.ptr());
        std::vector<void*> args;
        for (auto& v : ints) args.push_back(&v);
        for (auto& p : ptrs) args.push_back(&p);
        fn_.launch(unsigned(blocks), kKirBlock, args, shared_);
    }

  private:
    kir::Kernel k_;
    std::string ptx_;
    cuda::Module module_;
    cuda::Kernel fn_;
    unsigned shared_; // dynamic shared memory per block (0: static arrays only)
};

// On the emulated device (cuda::emulated()): the same lowering built for the host, device
// pointers being host addresses there.
class EmulatedGpuKernel final : public GpuKernel {
  public:
    explicit EmulatedGpuKernel(kir::Kernel k)
        : k_(std::move(k)), cpu_(compile_kernel_emulated(k_)) {}
    const std::string& ptx() const override { return ptx_; }
    const kir::Kernel& kernel() const override { return k_; }
    void launch(std::int64_t grid, std::span<const cuda::Buffer* const> buffers,
                std::span<const std::int64_t> params) const override {
        std::vector<void*> host;
        std::vector<std::uint64_t> ptrs;
        std::vector<std::size_t> bytes;
        for (const cuda::Buffer* b : buffers) {
            host.push_back(reinterpret_cast<void*>(std::uintptr_t(b->ptr())));
            ptrs.push_back(b->ptr());
            bytes.push_back(b->bytes());
        }
        check_kir_launch(k_, ptrs, params, "(emulated GPU)", bytes);
        cpu_->launch(grid, host, params);
    }

  private:
    kir::Kernel k_;
    std::unique_ptr<CpuKernel> cpu_;
    std::string ptx_; // none: nothing is lowered to PTX
};

} // namespace

std::int64_t kir_gpu_blocks(std::int64_t grid, std::int64_t scratch_bytes, int multiprocessors) {
    std::int64_t blocks =
        std::min<std::int64_t>(grid, std::int64_t(std::max(multiprocessors, 1)) * 8);
    if (scratch_bytes > 0) blocks = std::min(blocks, kScratchBudget / scratch_bytes);
    return std::max<std::int64_t>(blocks, 1);
}

cuda::Buffer device_buffer(std::size_t bytes) {
    return cuda::Buffer(std::max<std::size_t>(bytes, 8));
}

cuda::Buffer device_zeros(std::size_t bytes) {
    cuda::Buffer b = device_buffer(bytes);
    cuda::zero(b);
    return b;
}

cuda::Buffer to_device(const void* host, std::size_t bytes) {
    cuda::Buffer b = device_buffer(bytes);
    cuda::upload(b, host, bytes);
    return b;
}

cuda::Buffer to_device(const RaggedTensor& t) {
    return to_device(t.data(), std::size_t(t.numel()) * dtype_size(t.dtype()));
}

RaggedTensor from_device(const cuda::Buffer& b, DType t, const StructurePtr& st) {
    RaggedTensor out = RaggedTensor::zeros(t, st);
    cuda::download(out.mutable_data(), b, std::size_t(out.numel()) * dtype_size(t));
    return out;
}

namespace {
RaggedTensor with_residency(std::shared_ptr<const cuda::Buffer> b, DType t, const StructurePtr& st,
                            const void* host) {
    const std::size_t bytes = std::size_t(st->numel()) * dtype_size(t);
    Buffer values = Buffer::allocate_uninitialized(bytes);
    if (host && bytes) std::memcpy(values.data.get(), host, bytes);
    values.residency = std::make_shared<Residency>();
    values.residency->device = std::move(b);
    values.residency->host_current = host != nullptr;
    return RaggedTensor(t, st, std::move(values));
}
} // namespace

RaggedTensor resident(std::shared_ptr<const cuda::Buffer> b, DType t, const StructurePtr& st) {
    return with_residency(std::move(b), t, st, nullptr);
}

RaggedTensor resident(cuda::Buffer b, DType t, const StructurePtr& st) {
    return resident(std::make_shared<const cuda::Buffer>(std::move(b)), t, st);
}

RaggedTensor to_resident(const RaggedTensor& t) {
    return with_residency(std::make_shared<const cuda::Buffer>(to_device(t)), t.dtype(),
                          t.structure_ptr(), t.data());
}

std::shared_ptr<const cuda::Buffer> on_device(const RaggedTensor& t) {
    if (auto d = t.device_copy()) return d;
    return std::make_shared<const cuda::Buffer>(to_device(t));
}

namespace {
struct Loaded {
    std::mutex mu;
    std::map<std::string, std::unique_ptr<GpuKernel>> cache;
    std::vector<std::pair<std::string, const GpuKernel*>> order; // first use first
};
Loaded& loaded() {
    static Loaded l;
    return l;
}
} // namespace

const GpuKernel& gpu_kernel(const std::string& key, const std::function<kir::Kernel()>& make) {
    Loaded& l = loaded();
    std::lock_guard<std::mutex> lock(l.mu);
    auto& k = l.cache[key];
    if (k) return *k;
    if (cuda::emulated())
        k = std::make_unique<EmulatedGpuKernel>(make());
    else
        k = std::make_unique<LoadedKernel>(make());
    l.order.emplace_back(key, k.get());
    return *k;
}

std::vector<std::pair<std::string, const kir::Kernel*>> gpu_kernels_loaded() {
    Loaded& l = loaded();
    std::lock_guard<std::mutex> lock(l.mu);
    std::vector<std::pair<std::string, const kir::Kernel*>> out;
    for (const auto& [key, k] : l.order) out.emplace_back(key, &k->kernel());
    return out;
}

} // namespace rag::jit
