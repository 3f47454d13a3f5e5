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
#include "ir/ir.hpp"
#include "runtime/tensor.hpp"

#include <optional>
#include <span>
#include <vector>

namespace rag::jit {

// How the backward gets the relation projections q_i . aQ[u] (+ bias[u]) and k_j . aK[u].
// Recomputing (the default) projects each strip and tile again in both backward passes and
// keeps the extra memory O(tokens) (flat in N for clip and bucket maps). Saving makes the
// forward write every token's projections onto the rows it reaches once, and the forward and
// both backward passes read them: less arithmetic in the backward, but the forward's result
// holds f32 [tokens][H][min(N, 2 Delta + 1)] per present aq / ak table (N the longest sample,
// Delta the map's saturation), i.e. about 4 N^2 H bytes per sample and table for identity
// maps (O(N^2), like the materialised bias) and 4 N H (2 Delta + 1) bytes for clip and bucket
// maps. A bias-only map has nothing to save. Gradients are bitwise the same either way.
// On the 2-core AVX-512 CPU the projections are cheap tile products, and writing and
// gathering the saved ones costs more than recomputing them: rag_bench_relpos's
// "rag fused saved" was slower in forward and backward for Shaw and DeBERTa at N = 128 and
// 1024. Measure before choosing it.
struct RelposOptions {
    bool save_projections = false;
    // For tests: the tile programs are lowered as for the GPU and run by the device emulator
    // (jit/kir_emulator.hpp), so the GPU lowering of every pass is checked without a GPU.
    // Slow: every block is 128 host threads.
    bool emulate_gpu = false;
    // For tests: the backward runs its two passes (query, then key) even where the host runs
    // it in one (relpos_one_pass_backward), to compare the two.
    bool two_pass_backward = false;
    // For tests: the instances (parts x heads) the two-pass backward aims for when it splits
    // samples into parts (relpos_split_backward), instead of the tier's; 1 keeps whole samples.
    std::int64_t backward_pieces = 0;
};

struct RelposForward {
    RaggedTensor out; // O, in v's layout and q's dtype
    Buffer lse;       // f32 row log-sum-exp of the scores, [token][head], for the backward
    // With RelposOptions::save_projections (and aq or ak present): the saved projections
    // (relpos_project_program's zqs, zks); empty otherwise.
    bool saved = false;
    Buffer zqs, zks;
};

RelposForward relpos_forward(std::span<const RaggedTensor> in, const Attrs& at,
                             const RelposOptions& opt = {});

// The gradient of every input (q, k, v, then the present tables, in input order) given the
// output cotangent dO (v's layout). `fwd` is the forward's result on the same inputs; when
// null the forward runs again (with `opt`) to recover it; when given, the backward reads its
// saved projections if it has them and recomputes them otherwise.
// One application on the CPU, for jit/relpos_step.hpp: the forward keeps its log-sum-exp for
// the backward.
class RelposOnCpu {
  public:
    RelposOnCpu(std::span<const RaggedTensor> in, const Attrs& at, RelposOptions opt = {})
        : in_(in.begin(), in.end()), at_(at), opt_(opt) {}
    RaggedTensor forward();
    std::vector<RaggedTensor> backward(const RaggedTensor& dO);

  private:
    std::vector<RaggedTensor> in_;
    Attrs at_;
    RelposOptions opt_;
    std::optional<RelposForward> fwd_;
};

std::vector<RaggedTensor> relpos_backward(std::span<const RaggedTensor> in, const RaggedTensor& dO,
                                          const Attrs& at, const RelposForward* fwd = nullptr,
                                          const RelposOptions& opt = {});

// Starts compiling, each on a thread of its own, the tile programs the relpos nodes of `f` will
// run on the CPU, so that LLVM builds them while the caller compiles the rest of `f`: a first
// call then waits for the longest compile, not for the sum. The programs depend on the
// schemas and attrs only, not on lengths. Best effort: a node with a symbolic extent or inputs
// the op rejects is left to its first run, which reports the error.
void relpos_precompile(const ir::Function& f);

// For tests: how many tile programs a run had to start compiling itself because no
// relpos_precompile had started them (process-wide).
std::size_t relpos_programs_started_by_runs();

} // namespace rag::jit
