// Kernel-IR kernels compiled for the host CPU through the ORC JIT (jit/kir_llvm.hpp). A launch
// runs the program instances [0, grid) on every core, each worker taking the next instance
// and owning one scratch region; instances are independent, so the bits do not depend on the
// thread count. This header knows nothing of LLVM.
#pragma once
#include "jit/kir.hpp"

#include <memory>

namespace rag::jit {

class CpuKernel {
  public:
    virtual ~CpuKernel() = default;
    // `buffers` holds the kernel's global buffers in declaration order; scratch is allocated
    // here (and counted by rag::memory).
    virtual void launch(std::int64_t grid, std::span<void* const> buffers,
                        std::span<const std::int64_t> params) const = 0;
    virtual const std::string& llvm_ir() const = 0; // the optimised module
};

std::unique_ptr<CpuKernel> compile_kernel_cpu(const kir::Kernel& k);

} // namespace rag::jit
