// The CPU tier: an IR function compiled through LLVM ORC into fused loops over packed storage,
// BLAS GEMMs over packed rows, and reference kernels for the remaining ops. Nothing generated
// depends on a length: sizes and offsets stay runtime data, so one compilation serves every
// batch of the same schemas. LLVM headers stay inside jit/*.cpp.
#pragma once
#include "jit/placement.hpp"
#include "jit/plan.hpp"

#include <memory>

namespace rag::jit {

class CpuFunction {
  public:
    virtual ~CpuFunction() = default;
    // `where`, when given, receives where each plan step of this call ran.
    virtual std::vector<RaggedTensor> run(const std::vector<RaggedTensor>& inputs,
                                          Placement* where) const = 0;
    std::vector<RaggedTensor> run(const std::vector<RaggedTensor>& inputs) const {
        return run(inputs, nullptr);
    }
    virtual const Plan& plan() const = 0;
    virtual const std::string& llvm_ir() const = 0; // the optimised module, for tests and dumps
};

std::unique_ptr<CpuFunction> compile_cpu(const ir::Function& f);

// Runs one host step of a plan (gemm, segmented, rowwise, attention, layout; siblings in
// s.also included) with the CPU tier's kernels into vals; false for fused and reference steps.
// The GPU tier runs the steps it has no device kernel for through this too.
bool run_host_step(const ir::Function& f, const Step& s, std::vector<RaggedTensor>& vals);

} // namespace rag::jit
