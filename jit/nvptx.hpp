// LLVM modules -> PTX text for NVIDIA GPUs (internal to jit/). Kernels are ordinary LLVM
// functions with the ptx_kernel calling convention; math comes from libdevice, linked in with
// only the functions a module calls. Everything happens in memory: no files, no nvcc.
#pragma once
#include <llvm/IR/Function.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <memory>
#include <string>

namespace rag::jit {

struct PtxOptions {
    std::string arch = "sm_90"; // sm_80 or sm_90 (LLVM 16 emits PTX ISA 7.8 for both)
    // Flush f32 denormals to zero (faster, but differs from the CPU tier on tiny values).
    bool ftz = false;
};

// Checks the arch name; throws rag::Error naming the supported ones.
void check_arch(const std::string& arch);

// An empty module with the NVPTX triple and the TargetMachine's data layout for `arch`.
std::unique_ptr<llvm::Module> new_nvptx_module(const std::string& name, llvm::LLVMContext& ctx,
                                               const std::string& arch);

// Marks `f` as a kernel entry; `max_threads` > 0 also emits `.maxntid` (a launch bound), and
// `min_blocks` > 0 `.minnctapersm` (the blocks per SM the kernel is compiled to fit; CUDA's
// __launch_bounds__(max_threads, min_blocks)).
void mark_kernel(llvm::Function& f, int max_threads = 0, int min_blocks = 0);

// Links libdevice (only the __nv_* functions `m` calls), sets the FTZ reflect flag, runs the O3
// pipeline with the NVPTX callbacks (nvvm-reflect among them) and returns the PTX text.
// A module that still references an undefined symbol, fails the verifier or fails codegen is
// a rag::Error, never an abort. `m` is consumed (optimised in place).
std::string compile_ptx(llvm::Module& m, const PtxOptions& opt);

// Where libdevice is: $RAG_LIBDEVICE, else $CUDA_HOME/nvvm/libdevice/libdevice.10.bc, else
// /usr/local/cuda/nvvm/libdevice/libdevice.10.bc.
std::string libdevice_path();

} // namespace rag::jit
