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
    std::vector<std::int64_t> samples; // (offset, length, 0) per sample with tokens
    // Head-major expansions [H][U][width] of the present tables (width D, D, 1); empty when
    // the table is absent.
    std::vector<float> eq, ek, eb;
    bool emulated = false; // the CPU tier's programs run through the GPU emulator (tests)

    std::int64_t strips() const { return std::int64_t(tiles.size() / 3); }
    std::int64_t nonempty() const { return std::int64_t(samples.size() / 3); }
    // The programs' parameters, in RelposParam order.
    std::vector<std::int64_t> params() const { return {H, Delta, U, G, W, WP, WS}; }
};

// Checks the inputs (relpos_check, op name `op`) and prepares everything above. `in` holds
// q, k, v, the present tables, and a trailing dO when `with_dO`.
RelposSetup relpos_setup(std::span<const RaggedTensor> in, const Attrs& at, const char* op,
                         bool with_dO);

// The [R, H, width] gradient of a table (as f64, in its storage order) from the gradient of
// its expansion [H][U][width]: each map row sums its expanded rows in a fixed order.
std::vector<double> relpos_fold_table_grad(const float* expanded, const RelposSetup& s,
                                           std::int64_t width);

} // namespace rag::jit
