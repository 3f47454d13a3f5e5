// Layernorm, rmsnorm and their gradients as kernel-IR programs (jit/kir.hpp): run by the GPU
// tier on the device, and here on the CPU (and the device emulator) by the tests. The values
// are rows of C contiguous features whatever the ragged structure (the normalised axis is the
// static last one, innermost in storage). One program instance owns kNormRows rows, one thread
// per row, each row summed in feature order in f32. Parameter gradients (sums over every row)
// are per-instance partials [instance][C] summed by column_sums in instance order, so the bits
// do not depend on the device. eps is baked into the program. LLVM-free and driver-free.
#pragma once
#include "ir/ir.hpp"
#include "jit/kir.hpp"

#include <optional>

namespace rag::jit {

inline constexpr std::int64_t kNormRows = 32;

enum class NormOp : std::uint8_t {
    layernorm,      // buffers x, g, b, y
    rmsnorm,        // buffers x, g, y
    layernorm_grad, // buffers x, g, dy, dx, dg_part, db_part
    rmsnorm_grad,   // buffers x, g, dy, dx, dg_part
};

// The program of `op` for data of dtype t (f32, f16, bf16); parameters R (rows), C.
kir::Kernel norm_program(NormOp op, DType t, double eps);
// out[c] = sum over p < P of part[p * C + c], in p order (f32); parameters P, C; buffers
// part, out (out of dtype t). Instance k sums columns [k, k + 1) kSumColumns, one per thread.
inline constexpr std::int64_t kSumColumns = 128;
kir::Kernel column_sums_program(DType t);
inline std::int64_t column_sums_grid(std::int64_t C) {
    return (C + kSumColumns - 1) / kSumColumns;
}
// The first stage of a sum of R rows of C elements (sum_to to a bias, on the GPU tier):
// part[k * C + c] = the sum of x[r * C + c] over instance k's rows [k, k + 1) kSumRows, in row
// order, f32; parameters R, C; buffers x (of dtype t), part. column_sums then adds the
// partials in instance order, so the bits do not depend on the device.
inline constexpr std::int64_t kSumRows = 64;
kir::Kernel row_sums_program(DType t);
inline std::int64_t row_sums_grid(std::int64_t R) {
    return (R + kSumRows - 1) / kSumRows;
}

// A normalisation step: node i of f and its sibling gradient nodes (`also`), with what a launch
// needs. nullopt when the data is not f32, f16 or bf16 or the operands' structures disagree
// (the reference kernel then names the sample).
struct NormJob {
    NormOp op;
    DType dtype;
    double eps;
    std::int64_t rows, C;
    std::vector<RaggedTensor> inputs; // the program's input buffers, in order
    // Gradients: which of dx, dg, db each node (i, then also) takes (its wrt).
    std::vector<std::pair<int, std::int64_t>> wants;
    std::int64_t grid() const { return (rows + kNormRows - 1) / kNormRows; }
};
std::optional<NormJob> norm_job(const ir::Function& f, int i, const std::vector<int>& also,
                                const std::vector<RaggedTensor>& vals);

} // namespace rag::jit
