// What the attrs and schemas of a relpos_attention application fix (its type rule), shared
// by the naive reference kernels (ir/ops/relpos_attention.cpp) and the fused tile kernels
// (jit/relpos.cpp), so both accept and reject exactly the same inputs.
#pragma once
#include "ir/attrs.hpp"
#include "runtime/relpos_map.hpp"
#include "runtime/tensor.hpp"

#include <span>
#include <string_view>

namespace rag {

// The optional relation tables, in input order after q, k, v.
enum RelposTable { AQ, AK, BIAS };

struct RelposConfig {
    RelposMap map;
    bool has[3];
    int table_at[3]; // input index of each present table, -1 when absent
    bool causal;
    double scale;
    std::size_t inputs; // q, k, v and the present tables
};

// The type rule over the forward inputs' schemas; `op` names the op in messages.
RelposConfig relpos_decode(std::span<const Schema> in, const Attrs& at, std::string_view op);

// relpos_decode plus the runtime checks: one batch, one length per sample across q, k, v (and
// a trailing dO when `with_dO`), and identity tables long enough for every sample.
RelposConfig relpos_check(std::span<const RaggedTensor> in, const Attrs& at, std::string_view op,
                          bool with_dO);

} // namespace rag
