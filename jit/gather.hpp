// gather, gather_grad and positions on the CPU tier. gather is one parallel pass over the
// packed ids copying table rows (with the range check; a batched table's rows are its
// sample's); gather_grad sorts the packed positions by table row once (a stable counting
// sort), then sums each table row over its positions in packed order, in double, rounded once:
// rows are owned by one chunk each, so the result is bitwise the reference's, whatever the
// thread count, without atomics. positions fills each sample's block in runs of equal indices.
// Internal to jit/; no LLVM.
#pragma once
#include "ir/ir.hpp"

namespace rag::jit {

bool is_gather_step(const ir::Node& n);
// Runs node n (is_gather_step); vals holds its arguments.
RaggedTensor run_gather_step(const ir::Node& n, const std::vector<RaggedTensor>& vals);

} // namespace rag::jit
