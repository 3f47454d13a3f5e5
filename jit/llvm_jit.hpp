// The process-wide LLVM ORC JIT shared by the CPU tier's kernels (internal to jit/).
#pragma once
#include <llvm/ExecutionEngine/Orc/Core.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <memory>
#include <string>
#include <vector>

namespace rag::jit {

// A module with the host's data layout and triple.
std::unique_ptr<llvm::Module> new_module(const std::string& name, llvm::LLVMContext& ctx);

// Verifies `m` (invalid IR is an internal rag::Error naming the module), optimises it (O3 for
// the host, libmvec as the vector library) and adds it to the JIT.
// Returns the addresses of the functions prefix0 .. prefix{count-1}; optionally the optimised
// IR text and the tracker that removes the module again. LLVM failures become rag::Error.
std::vector<void*> add_module(std::unique_ptr<llvm::Module> m,
                              std::unique_ptr<llvm::LLVMContext> ctx, std::size_t count,
                              const std::string& prefix, std::string* ir = nullptr,
                              llvm::orc::ResourceTrackerSP* tracker = nullptr);
void remove_module(llvm::orc::ResourceTrackerSP& tracker);

} // namespace rag::jit
