// GEMMs as a kernel-IR tile program (jit/kir.hpp), written once and lowered for the CPU
// (where the tests run it) and the GPU (where the GPU tier runs its GEMM steps): shared-memory
// staging and, for half-precision data, tensor cores through the kernel IR's mma statement.
//
// C[M, N] (row-major) = A(M, K) B(K, N), each operand read through strides, so a transposed
// operand is only a stride swap. One program instance owns a kTileM x kTileN tile of C: it
// zeroes an accumulator tile in shared memory, then for each kTileK slice of K stages the A
// and B slices into shared memory (zeros past the edges) and accumulates their product, and
// finally writes the tile's in-range elements, rounded to C's dtype. Every element is one sum
// in a fixed order, so two runs give the same bits. LLVM-free and driver-free.
#pragma once
#include "ir/ir.hpp"
#include "jit/kir.hpp"

#include <optional>

namespace rag::jit {

inline constexpr std::int64_t kTileM = 64, kTileN = 64, kTileK = 32;

// The program for operands of dtype `t` (f32, f16 or bf16; C has it too): f32 products for
// f32, operands rounded to t (a no-op: they are t already) on tensor cores for f16 and bf16.
// Buffers a, b, c; parameters M, N, K, then the strides a_row, a_col, b_row, b_col of
// A(i, l) = a[i a_row + l a_col] and B(l, j) = b[l b_row + j b_col], then Kc: instance
// split * tiles + tile sums l in [split Kc, (split + 1) Kc) for its tile. `partial`: c is f32
// [splits][M][N], one partial product per split (summed in split order by
// column_sums_program, jit/norm_programs.hpp: split-K without atomics); else c is C and
// there is one split (Kc >= K).
kir::Kernel gemm_program(DType t, bool partial = false);

// A GEMM step of a function (`x @ W` over packed rows, W unbatched, or the weight gradient
// x^T g over packed rows) with what a launch of gemm_program needs.
struct GemmJob {
    DType dtype;
    StructurePtr out;                         // the result's structure
    std::int64_t M = 0, N = 0, K = 0;         // C[M, N] = A(M, K) B(K, N)
    bool a_transposed = false;                // A is x^T (the weight gradient)
    std::int64_t splits = 1;                  // of K (split-K: gemm_program's partial form)
    std::vector<std::int64_t> params() const; // gemm_program's, in order
    std::int64_t tiles() const;               // of C
    std::int64_t grid() const { return tiles() * splits; }
    std::int64_t Kc() const; // K per split, a multiple of kTileK
    // Splits K when C has too few tiles to fill `multiprocessors` twice (weight gradients:
    // a small [C, D] summed over every row), keeping at least 8 slices per split.
    void split_for(int multiprocessors);
};

// The job of node n given the values of its arguments, or nullopt when n is no such step or its
// operands' sizes disagree (the reference kernel then reports the sample and extents). The
// dtype is not checked here: callers choose which they run (the CPU tier's BLAS takes f32 and
// f64, gemm_program f32, f16 and bf16).
std::optional<GemmJob> gemm_job(const ir::Node& n, const std::vector<RaggedTensor>& vals);

} // namespace rag::jit
