// Process-wide host kernel families (row-wise, segmented, line kernels): each kernel is its own
// LLVM module, compiled the first time a plan step uses it. Compiling a whole family at its
// first use cost a cold first call about 1.6 s of CPU (the 14 line kernels alone 0.95 s) when a
// training step uses four or five of the 30 kernels. No LLVM headers here: dsl/ reads
// host_kernels_compiled() for `rag run --stats`.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace llvm {
class Module;
}

namespace rag::jit {

class HostKernels {
  public:
    // Emits kernel k as the function `name` into the module.
    using Emit = std::function<void(llvm::Module&, const std::string& name, std::size_t k)>;

    // `names[k]` names kernel k in host_kernels_compiled() ("layernorm.f32").
    HostKernels(std::string family, std::vector<std::string> names, Emit emit);
    ~HostKernels();
    HostKernels(const HostKernels&) = delete;
    HostKernels& operator=(const HostKernels&) = delete;

    // Kernel k's address, compiled on first use (once, whichever thread asks first); `ir` gets
    // its optimised module's text.
    void* get(std::size_t k, const std::string** ir = nullptr);

  private:
    struct Slot;
    std::string family_;
    std::vector<std::string> names_;
    Emit emit_;
    std::unique_ptr<Slot[]> slots_;
};

// "family/name" of every host kernel compiled so far in this process, in compile order.
std::vector<std::string> host_kernels_compiled();

} // namespace rag::jit
