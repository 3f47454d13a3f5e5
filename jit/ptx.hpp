// PTX for the GPU kernels of a function, and the calling convention the CUDA runtime launches
// them with. This header knows nothing of LLVM (dsl/ and the tests include it).
//
// Fused elementwise kernel (one per FusedGroup of the plan): a grid-stride loop over the
// packed elements of the group's structure. Parameters, in order:
//   i64 n                       packed element count of the loop's structure
//   for each input k:  ptr x_k, i64 len_k    (len_k: the operand's element count, >= 1; a
//                                              `row` operand is read at i % len_k)
//   for each output:   ptr y_j
// Any block size up to kFusedBlock threads, any grid size.
#pragma once
#include "jit/plan.hpp"

#include <string>
#include <vector>

namespace rag::jit {

inline constexpr int kFusedBlock = 256; // the kernels' launch bound (.maxntid)

struct PtxKernel {
    std::string name;
    int group = -1;          // the plan's FusedGroup it computes
    std::string description; // the ops it fuses, for dumps
};

struct PtxProgram {
    std::string arch;
    std::string ptx; // one PTX module holding every kernel
    std::vector<PtxKernel> kernels;
};

// Every fused group of `plan` as one kernel of one PTX module for `arch` (sm_80 or sm_90).
// ftz flushes f32 denormals (faster, not bitwise equal to the CPU tier). Throws rag::Error.
PtxProgram fused_ptx(const ir::Function& f, const Plan& plan, const std::string& arch,
                     bool ftz = false);

// PTX of a module in LLVM's textual IR (kernels marked ptx_kernel). For tests of the codegen's
// checks: a module calling something the GPU cannot run is a rag::Error, never an abort.
std::string ptx_from_llvm_ir(const std::string& ir, const std::string& arch, bool ftz = false);

// The text `rag ptx` and the REPL's :ptx print: a header naming the kernels and the plan steps
// that have no GPU kernel yet, then the PTX module.
std::string describe(const PtxProgram& p, const ir::Function& f, const Plan& plan);

} // namespace rag::jit
