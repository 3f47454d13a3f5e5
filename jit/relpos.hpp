// Fused relative-position attention on the CPU tier (REFERENCE.md section 2; the offset-aware
// algorithm of the relative-position paper). Written once as tile programs in the kernel IR
// (jit/kir.hpp) and lowered through LLVM; nothing of size N x N is ever allocated.
//
// Inputs are those of the `relpos_attention` op, in op order: q, k [B, ~N, H, D],
// v [B, ~N, H, Dv], then the present tables aq, ak [R, H, D] and bias [R, H]; `at` holds the
// op's attrs (map and its parameters, aq/ak/bias flags, causal, scale). Errors are rag::Error
// with the op's name, the sample and the extents. Results are bitwise identical across runs
// and across thread counts (rag::set_num_threads): every sum has a fixed order, no atomics.
// This header knows nothing of LLVM.
#pragma once
#include "ir/attrs.hpp"
#include "runtime/tensor.hpp"

#include <optional>
#include <span>
#include <vector>

namespace rag::jit {

struct RelposForward {
    RaggedTensor out; // O, in v's layout and q's dtype
    Buffer lse;       // f32 row log-sum-exp of the scores, [token][head], for the backward
};

RelposForward relpos_forward(std::span<const RaggedTensor> in, const Attrs& at);

// The gradient of every input (q, k, v, then the present tables, in input order) given the
// output cotangent dO (v's layout). `fwd` is the forward's result on the same inputs; when
// null the forward runs again to recover it.
// One application on the CPU, for jit/relpos_step.hpp: the forward keeps its log-sum-exp for
// the backward.
class RelposOnCpu {
  public:
    RelposOnCpu(std::span<const RaggedTensor> in, const Attrs& at)
        : in_(in.begin(), in.end()), at_(at) {}
    RaggedTensor forward();
    std::vector<RaggedTensor> backward(const RaggedTensor& dO);

  private:
    std::vector<RaggedTensor> in_;
    Attrs at_;
    std::optional<RelposForward> fwd_;
};

std::vector<RaggedTensor> relpos_backward(std::span<const RaggedTensor> in, const RaggedTensor& dO,
                                          const Attrs& at, const RelposForward* fwd = nullptr);

} // namespace rag::jit
