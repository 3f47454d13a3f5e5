// Kernel plans: how a function runs on the CPU tier. Runs of consecutive elementwise nodes of
// one shape and float dtype become one fused loop over the packed storage (compiled by LLVM);
// `x @ W` over packed rows and its weight gradient (x^T g summed over all rows) become one BLAS
// GEMM each; `sum`/`mean` (over one axis or globally), `max`/`min`/`softmax`/`logsumexp` over
// one axis, their gradients and `sum_to` run as segmented loops (jit/segmented.hpp);
// layernorm/rmsnorm and their gradients as row loops (jit/rowwise.hpp); attention and its gradients
// as per-(sample, head) GEMMs (jit/attention_cpu.hpp); index/index_grad/transpose/reshape that move
// no data or whole rows as views or row copies (jit/layout.hpp); gather, gather_grad and positions
// as row-copy and row-sum loops (jit/gather.hpp); conv2d, pooling, upsample2d, patches and their
// gradients as implicit GEMMs and pixel loops (jit/conv.hpp); cross_entropy, its gradient and
// dropout as row and element loops (jit/nn_steps.hpp); relpos_attention and its gradients as
// fused tile programs (jit/relpos.hpp; f64 runs the reference, as the programs compute in f32);
// every other op runs its reference kernel. This header knows nothing of LLVM.
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

// How a fused loop reads an operand at packed element i.
enum class Access {
    full,   // the operand has the loop's structure: element i
    row,    // an unbatched array equal to the loop's static tail: element i % its size
    scalar, // an unbatched scalar: element 0
    // A batched operand broadcast to the loop's shape along extent-1 axes (the pair-creating
    // `[B, ~N, 1, C] + [B, 1, ~N, C]`): row r of the loop reads the operand's row map[r], an
    // index map built at run time from sizes and offsets (jit/index_map.hpp).
    gather,       // the operand's rows have the loop's row elements: element map[r] + j
    gather_bcast, // the operand is broadcast inside rows too (one element per row): map[r]
};

struct FusedInput {
    int value;
    Access access;
};

struct FusedGroup {
    std::vector<int> nodes; // consecutive IR nodes, in order
    std::vector<FusedInput> inputs;
    std::vector<int> outputs; // member values used after the group or returned
    DType dtype;              // f32 or f64
};

struct Step {
    enum class Kind {
        fused,
        gemm,
        segmented,
        rowwise,
        attention,
        layout,
        gather,
        image,
        nn,
        relpos,
        reference
    } kind;
    int index;             // the group (fused) or the IR node (the others)
    std::vector<int> also; // rowwise, attention: sibling gradient nodes the same pass computes
};

struct Plan {
    std::vector<FusedGroup> groups;
    std::vector<Step> steps;
};

// Ops a fused loop can compute (unary math, broadcasting arithmetic, scale).
bool is_fusable_op(std::string_view op);
// relpos_attention(_grad) nodes the tile programs compute: not f64, as the programs keep their
// scores, tables and log-sum-exp in f32 (f64 runs the f64 reference kernel instead).
bool is_relpos_step(const ir::Function& f, const ir::Node& n);
Plan make_plan(const ir::Function& f);
std::string print(const Plan& p, const ir::Function& f); // for dumps and tests

} // namespace rag::jit
