// Fused relative-position attention on the CUDA device: the same four tile programs as the
// CPU tier (jit/relpos_programs.hpp), launched through jit/kir_gpu.hpp on buffers prepared as
// jit/relpos.cpp prepares them (jit/relpos_setup.hpp). Nothing of size N x N is allocated.
//
// RelposOnDevice uploads its inputs once (q, k, v and dO already on the device, GPU-tier results,
// are read in place); forward() and backward() only queue kernels, so a benchmark can time them
// alone; out() and the dq, dk, dv of gradients() stay on the device until the host reads them
// (runtime/tensor.hpp's Residency); so do the table gradients of maps whose expanded rows are
// their rows (identity), folded there; other maps' are downloaded and folded on the host.
// Errors are those of the CPU tier (rag::Error naming relpos_attention, the sample and the
// extents), plus "CUDA unavailable: ..." without a device. This header knows nothing of LLVM
// or of the driver.
#pragma once
#include "jit/relpos_setup.hpp"
#include "runtime/cuda.hpp"

#include <memory>

namespace rag::jit {

class RelposOnDevice {
  public:
    // `in`: the forward inputs of relpos_attention in op order (q, k, v, the present tables).
    // Checks them and uploads q, k, v, the expanded tables and the strip lists.
    RelposOnDevice(std::span<const RaggedTensor> in, const Attrs& at);

    // Checks dO (v's layout, q's dtype, one length per sample with q) and uploads it.
    void set_dO(const RaggedTensor& dO);

    void forward();  // queues the forward: O and the row log-sum-exp on the device
    void backward(); // queues the backward (and the forward first when it has not run)

    RaggedTensor out() const;                    // O (after forward())
    std::vector<RaggedTensor> gradients() const; // q, k, v, then the present tables
    const RelposSetup& setup() const { return s_; }

  private:
    std::vector<RaggedTensor> in_;
    Attrs at_;
    RelposSetup s_;
    using Shared = std::shared_ptr<const cuda::Buffer>; // shared with the tensors read or made
    Shared q_, k_, v_, dO_;
    cuda::Buffer eq_, ek_, eb_, tiles_;
    Shared out_;             // forward results: O,
    cuda::Buffer lse_;       // and the row log-sum-exp
    Shared dq_, dk_, dv_;    // backward results
    cuda::Buffer tables_[3]; // expanded table gradients
    bool has_dO_ = false, forward_done_ = false, backward_done_ = false;
};

// The functional forms the GPU tier's relpos steps use (host tensors in and out).
RaggedTensor relpos_forward_gpu(std::span<const RaggedTensor> in, const Attrs& at);
std::vector<RaggedTensor> relpos_backward_gpu(std::span<const RaggedTensor> in,
                                              const RaggedTensor& dO, const Attrs& at);

} // namespace rag::jit
