// What the host prepares before launching the relative-position tile programs
// (jit/relpos_programs.hpp), whichever device runs them: the checked config, the program
// shape and parameters, the strip and sample lists, the head-major expanded tables, and the
// fold of expanded-row table gradients back into the map's rows. The GPU host driver
// (jit/relpos_gpu.cpp) uses it; it is written so that the CPU one (jit/relpos.cpp, which has
// its own copy of this code) can use it too. LLVM-free and driver-free.
#pragma once
#include "ir/attrs.hpp"
#include "ir/ops/relpos_config.hpp"
#include "jit/relpos_programs.hpp"
#include "runtime/tensor.hpp"

#include <span>
#include <vector>

namespace rag::jit {

struct RelposSetup {
    explicit RelposSetup(RelposConfig c) : cfg(std::move(c)) {}
    RelposConfig cfg;
    RelposShape shape{};
    std::int64_t H = 0, Delta = 0, U = 0, G = 0, W = 0, WP = 0, WS = 0, tokens = 0;
    std::vector<std::int64_t> rows_of; // expanded row u -> map row
    std::vector<std::int64_t> tiles;   // (offset, length, start) per strip of G tokens
    // The backward's parts: (offset, length, first, end) per run [first, end) of whole strips of
    // one sample; whole samples until relpos_split_backward splits them.
    std::vector<std::int64_t> parts;
    // Head-major expansions [H][U][width] of the present tables (width D, D, 1); empty when
    // the table is absent.
    std::vector<float> eq, ek, eb;
    // eq and ek rounded to the data's half type (16-bit patterns), which the tensor-core
    // programs read instead (relpos_use_tensor_cores); empty otherwise.
    std::vector<std::uint16_t> eq_half, ek_half;
    bool emulated = false; // the CPU tier's programs run through the GPU emulator (tests)

    std::int64_t strips() const { return std::int64_t(tiles.size() / 3); }
    std::int64_t part_count() const { return std::int64_t(parts.size() / 4); }
    // The programs' parameters, in RelposParam order.
    std::vector<std::int64_t> params() const { return {H, Delta, U, G, W, WP, WS}; }
};

// Checks the inputs (relpos_check, op name `op`) and prepares everything above. `in` holds
// q, k, v, the present tables, and a trailing dO when `with_dO`. `expand_tables` false leaves
// eq, ek and eb empty (the GPU expands identity maps' tables on the device).
RelposSetup relpos_setup(std::span<const RaggedTensor> in, const Attrs& at, const char* op,
                         bool with_dO, bool expand_tables = true);
// Fills s.eq, s.ek and s.eb from the tables in `in` (relpos_setup's order).
void relpos_expand_tables(RelposSetup& s, std::span<const RaggedTensor> in);

// Runs s's programs on tensor cores (RelposShape::tensor_cores; f16 and bf16 data): sets the
// shape's flag and rounds eq and ek to the data's type, as those programs read them.
void relpos_use_tensor_cores(RelposSetup& s);

// How many backward instances (parts x heads) relpos_split_backward aims for: on the host a
// fixed number, not the thread count, so the table gradients' summation order (one partial per
// part) is the same bits at every RAG_NUM_THREADS; on a device enough blocks to fill every
// multiprocessor of the largest parts (132 on an H100) several times over.
inline constexpr std::int64_t kHostBackwardPieces = 32, kDeviceBackwardPieces = 1024;

// Splits the backward's parts (whole samples) into runs of whole strips, halving the strips per
// part while there are fewer than `pieces` instances and the table partials (one WP-row partial
// per part, head and table) stay within the larger of what whole samples take and `budget`
// bytes; WP becomes the most rows a part reaches. dq, dk and dv are the same bits at every
// split (each strip's rows are summed as before); the table gradients add the same terms
// grouped by part. Only for the two-pass backward: the one-pass program accumulates dK and dV
// in place across a sample's strips and needs whole samples.
void relpos_split_backward(RelposSetup& s, std::int64_t pieces, double budget);
// The budgets: on the host the size of dq in f32 (the partials never outgrow one more
// gradient: host memory is the user's), on a device 1 GiB. At the paper's N = 8K (B = 2,
// H = 12) the identity maps' unbounded tables then split into 16 parts a sample, 192 blocks
// for an H200's 132 SMs, in 913 MB of partials, under a third of the f16 bias B H N^2 they
// replace; 256 MiB left them 24 blocks (design.md).
double relpos_host_partial_budget(const RelposSetup& s);
inline constexpr double kDevicePartialBudget = 1024.0 * 1024 * 1024;

// The [R, H, width] gradient of a table (as f64, in its storage order) from the gradient of
// its expansion [H][U][width]: each map row sums its expanded rows in a fixed order.
std::vector<double> relpos_fold_table_grad(const float* expanded, const RelposSetup& s,
                                           std::int64_t width);

} // namespace rag::jit
