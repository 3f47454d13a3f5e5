// The tile programs of fused relative-position attention, written once in the kernel IR
// (jit/kir.hpp) and lowered to the CPU here and to PTX by the GPU backend. The host side that
// prepares their buffers and launches them is jit/relpos.cpp.
//
// Every map is expanded to 2 Delta + 1 per-offset rows u = clamp(i - j, -Delta, Delta) + Delta
// (the paper's bucket expansion; identity maps have Delta = L - 1 and never saturate), so the
// programs see one kind of map: tables eq, ek [H][U][D] and eb [H][U] in f32 (eq and ek in the
// data's half type on tensor cores: relpos_use_tensor_cores). A forward
// instance owns a strip of G tokens of one sample and one head (tile list entry
// (offset, length, start), instance = tile * H + head), a backward instance a run of such strips
// (a part), and each loops over the other side in tiles of J. A strip's queries (keys) reach the
// contiguous rows [lo, lo + W) with W <= min(N + G - 1, U): it projects only onto those
// (reachable-range projections), and a tile pair whose offsets all lie beyond +-Delta reads one row
// (constant-range reuse). Nothing is N x N.
#pragma once
#include "jit/kir.hpp"
#include "runtime/dtype.hpp"

namespace rag::jit {

struct RelposShape {
    DType dtype;        // of q, k, v, O, dO and the input gradients
    std::int64_t D, Dv; // head dimensions (static extents of the schema)
    bool aq, ak, bias;  // which relation terms are present
    bool causal;
    double scale;
    // Saved projections: the projection program writes every token's relation projections
    // once (zqs, zks), and the forward and both backward passes read them instead of
    // projecting their strips and tiles again. See RelposOptions in jit/relpos.hpp.
    bool saved = false;
    // Tensor cores (the GPU, f16 and bf16 data): every tile product runs as kernel-IR mma
    // statements (mma.sync m16n8k16): S = Q K^T and dP = dO V^T in every pass, the forward's
    // P V, and the backward's dQ += dS K, dV += P^T dO, dK += dS^T Q. Operands are rounded to
    // the data's type: exact for the inputs, and for P and dS the rounding FlashAttention
    // makes. The strip G must be a multiple of 16 (it is J). Off for the CPU, whose FMA loops
    // are faster than emulated tiles. Every pass projects each tile pair's relation rows on
    // tensor cores too; the backward's table folds stay FMAs.
    bool tensor_cores = false;
    static constexpr std::int64_t J = 64; // the inner tile
};

// Whether the forward and the query pass take FlashAttention-2's structure (kernel-IR
// fragments: registers on the GPU): on tensor cores, with head dimensions that are whole
// k steps of the mma (multiples of 16). Other tensor-core shapes keep their tiles in scratch.
inline bool relpos_flash(const RelposShape& s) {
    return s.tensor_cores && s.D % 16 == 0 && s.Dv % 16 == 0;
}

// Whether the GPU runs the programs of data type t on tensor cores (RelposShape::tensor_cores).
inline bool relpos_tensor_cores(DType t) {
    return t == DType::f16 || t == DType::bf16;
}

// Parameters shared by the programs, in this order: heads H, Delta, rows U = 2 Delta + 1, the
// strip G, W, the most rows a strip reaches (scratch sizing), and WP, the most rows a backward
// part reaches (the stride of table partials), and WS = min(longest sample, U), the stride of the
// saved per-token projections (the most rows one token reaches).
enum RelposParam { P_H, P_DELTA, P_U, P_G, P_W, P_WP, P_WS, P_COUNT };

// Saved projections (shape.saved): buffers q, k, v, eq, ek, eb, tiles, zqs, zks. Token i of a
// sample of n tokens, head h, writes zqs[((o + i) H + h) WS + u - lo_q(i)] = q_i . eq[h][u]
// (+ eb[h][u] when the bias is present) for its reachable rows u in [lo_q(i), row(i)],
// lo_q(i) = row(causal ? 0 : i - n + 1), and zks[... + u - lo_k(j)] = k_j . ek[h][u] for
// u in [lo_k(j), row(n - 1 - j)], lo_k(j) = row(causal ? 0 : -j). In saved shapes the other
// programs take zqs and zks after their own buffers.
kir::Kernel relpos_project_program(const RelposShape& s);

// Forward: buffers q, k, v, eq, ek, eb, tiles, out, lse; writes O and the row log-sum-exp.
// In FlashAttention-2's structure where relpos_flash: the scores, the output accumulator and
// the row statistics are kernel-IR fragments (registers on the GPU, each warp 16 of the
// strip's rows), the products mma statements into them.
kir::Kernel relpos_forward_program(const RelposShape& s);
// The same forward for the CPU: score tiles key-major (S^T = K Q^T), so the strip's queries
// are staged transposed once per strip and key and value tiles are read in place (the GPU's
// program stages, and transposes, every key tile for every strip); the online softmax runs
// across the strip's queries, vectorised without horizontal reductions. Same buffers.
kir::Kernel relpos_host_forward_program(const RelposShape& s);
// Query pass of the backward, one instance per part and head, looping over the part's strips
// (a part: rows [first, end) of one sample, whole strips; relpos_split_backward): buffers q, k,
// v, eq, ek, eb, parts (entries (offset, length, first, end)), dO, out, lse, dq, delta
// (D_i = dO_i . O_i, written for the key pass), zq_part (per part and head: dZQ^T Q over the
// part's reachable rows, WP x D), zb_part (column sums of dZQ, WP), range (per part: first
// row, rows).
kir::Kernel relpos_query_grad_program(const RelposShape& s);
// Key pass, likewise per part (of keys) and head: buffers q, k, v, eq, ek, eb, parts, dO, lse,
// delta, dk, dv, zk_part (dZK^T K), range.
kir::Kernel relpos_key_grad_program(const RelposShape& s);
// The backward in one pass, for the CPU: one instance per sample (a whole-sample part) and
// head, looping over the sample's query strips and, per strip, its key tiles, with five tile
// products per pair (S = Q K^T and dP = dO V^T once, then dQ += dS K, dV += P^T dO, dK += dS^T Q)
// where the two passes above take seven and project the query-side relation rows twice. dK and dV
// accumulate in place in their outputs, strip by strip, in the key pass's order. Key-side tables
// are folded per tile pair, since a later strip revisits the same keys: dS by offset over the
// pair's rows (dZK), then dK += dZK aK in place and dZK^T K into the sample's partial. Buffers q,
// k, v, eq, ek, eb, parts, dO, out, lse, dq, dk, dv, zq_part, zb_part, zk_part, range (one range:
// a whole sample's keys and queries reach the same rows). Only for f32 (relpos_one_pass_backward):
// in-place sums in f16 or bf16 outputs would round at every strip. The GPU keeps the two passes
// (and tensor cores) until one pass can be measured on a device.
kir::Kernel relpos_grad_program(const RelposShape& s);
bool relpos_one_pass_backward(const RelposShape& s);
// Fixed-order reduction of the backward's per-part partials into expanded-table gradients:
// instance h * ceil(U / R) + block owns R = relpos_reduce_rows rows of head h, one per thread,
// and adds, part by part in order, the partial rows that reach them. Buffers part, range, out
// ([H][U][width]); parameters H, U, parts, WP, width.
inline constexpr std::int64_t relpos_reduce_rows = 128;
kir::Kernel relpos_table_reduce_program();

// The floating-point operations the programs above execute in their tile products (2 per
// multiply-add: scores, dP, P V, dQ, dK, dV, the strip and tile relation projections, the
// relation folds and table partials), counted from their tile schedule for samples of the
// given lengths, H heads and saturation Delta: what the CPU actually computes, as opposed to
// the paper's credited "useful" FLOPs (issue 20); the host's programs only (no tensor cores:
// those project each tile pair instead). Padding rows the products compute count;
// exp, the softmax and the staging copies do not. The forward includes the projection program
// when s.saved.
struct RelposFlops {
    double forward = 0, backward = 0;
};
RelposFlops relpos_executed_flops(const RelposShape& s, const std::vector<std::int64_t>& lengths,
                                  std::int64_t H, std::int64_t Delta);

} // namespace rag::jit
