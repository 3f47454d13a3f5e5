// Attention with a bias (the `biased_attention` op: `attention(q, k, v, bias=b)` on singles,
// triangle attention `axis=2` on pair states) as kernel-IR tile programs (jit/kir.hpp), with
// FlashAttention's structure: a program instance owns a tile of kBiasedRows queries (or
// kBiasedKeys keys) of one row block and head, walks the other side in tiles with an online
// softmax, and never holds more than a tile of scores. Written once, lowered by LLVM for the
// CPU (jit/kir_cpu.hpp) and to PTX for the GPU (jit/kir_gpu.hpp).
//
// Three programs, no atomics, every sum in a fixed order:
//   forward     per (query tile, head): O and the row log-sum-exp;
//   key_grad    per (key tile, head): dK and dV of its keys, over the row block's query tiles;
//   query_grad  per (sample, query tile, head): dQ of each row block of the sample in turn, and
//               dbias of its queries, which the sample's rows share: summed over the rows in
//               order by the one instance that owns them.
// The backward reads the forward's O and log-sum-exp (rowsum(dO o O) stands for rowsum(dP o P)).
// f32 storage only: the GPU tier runs the other dtypes as counted host steps.
#pragma once
#include "ir/attrs.hpp"
#include "jit/kir.hpp"
#include "runtime/tensor.hpp"

#include <span>
#include <vector>

namespace rag::jit {

// What a program is specialised on: widths, the mask and the score scale.
struct BiasedShape {
    std::int64_t D = 0, Dv = 0;
    bool causal = false;
    double scale = 1.0;
};

inline constexpr std::int64_t kBiasedRows = 16; // queries per tile
inline constexpr std::int64_t kBiasedKeys = 64; // keys per tile

// A work entry, kBiasedEntry i64 per tile: element offsets of the row block's first query
// (q), key (k, v), output row (o) and of the sample's bias; the block's N queries and M keys;
// the tile's first query (forward, query_grad) or key (key_grad); the token index of the
// block's first query (for the log-sum-exp, [token][H]); and R, the sample's row blocks
// (query_grad: block r starts r N (or M) tokens after block 0; 1 elsewhere).
inline constexpr std::int64_t kBiasedEntry = 10;

kir::Kernel biased_forward_program(const BiasedShape& s);
kir::Kernel biased_key_grad_program(const BiasedShape& s);
kir::Kernel biased_query_grad_program(const BiasedShape& s);

// The work lists of one application: inputs q, k, v, bias as the op takes them (f32), and
// attrs axis, causal, scale. Lengths are checked by the caller (as the CPU step does).
struct BiasedWork {
    BiasedShape shape;
    std::int64_t H = 0, tokens = 0; // heads; query tokens (rows of the [token][H] lse)
    StructurePtr out;               // the result's: q's sizes with v's width
    std::vector<std::int64_t> forward, keys, queries;
    std::int64_t grid(const std::vector<std::int64_t>& list) const {
        return std::int64_t(list.size()) / kBiasedEntry * H;
    }
};
BiasedWork biased_work(std::span<const RaggedTensor> in, const Attrs& at);

// The programs run on the CPU, as the GPU tier launches them (tests): the forward's O, or with
// dO the gradients of q, k, v and bias.
std::vector<RaggedTensor> biased_attention_programs_cpu(std::span<const RaggedTensor> in,
                                                        const Attrs& at, const RaggedTensor* dO);

} // namespace rag::jit
