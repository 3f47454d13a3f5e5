// The GPU tier (first cut): a function's plan with every fused elementwise group running as a
// CUDA kernel (jit/ptx.hpp), relpos_attention and its gradients, and self-attention
// (attention whose keys are as long as its queries) as the fused tile programs
// (jit/relpos_gpu.hpp), f32 sum/mean over one axis, their gradients, softmax and its gradient
// as segment programs (jit/reduce_programs.hpp), x @ W and weight gradients in f32, f16 and
// bf16 as the GEMM tile program (jit/gemm_programs.hpp, tensor cores for the half types),
// layernorm, rmsnorm and their gradients as the norm programs (jit/norm_programs.hpp);
// every other step (f64 and batched GEMMs, cross-attention, f64 norms, the rest) runs on the host
// through the CPU tier's or the reference kernels. Device results stay on the device, within a
// call and across calls: a result is downloaded only when the host reads it (a host step, the
// caller), and a result passed into a later call (parameters after an optimiser step) is read
// where it is, so a training loop uploads its batch and little else (runtime/tensor.hpp's
// Residency). Any other value is uploaded at most once per call. Relpos applications still
// upload their own inputs and download their results. The bytes each call moves are counted
// (Placement::uploaded, downloaded). This header knows nothing of LLVM or of the driver.
#pragma once
#include "jit/placement.hpp"
#include "jit/ptx.hpp"

#include <memory>

namespace rag::jit {

class GpuFunction {
  public:
    virtual ~GpuFunction() = default;
    // `where`, when given, receives where each plan step of this call ran (device kernels,
    // host fallbacks through the CPU tier's kernels, reference kernels).
    virtual std::vector<RaggedTensor> run(const std::vector<RaggedTensor>& inputs,
                                          Placement* where) const = 0;
    std::vector<RaggedTensor> run(const std::vector<RaggedTensor>& inputs) const {
        return run(inputs, nullptr);
    }
    virtual const PtxProgram& ptx() const = 0;
};

// The PTX target for the current device: sm_90 for compute capability 9.x and later, sm_80 for
// 8.x; older devices are a rag::Error. Throws "CUDA unavailable: ..." without a device.
std::string device_arch();

// Compiles f's kernels for the device and loads them. Throws "CUDA unavailable: ..." without
// a device.
std::unique_ptr<GpuFunction> compile_gpu(const ir::Function& f);

} // namespace rag::jit
