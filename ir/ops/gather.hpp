// gather(table, ids): the rows of a dense table at integer ids (embeddings), its table
// gradient gather_grad, and positions(x, axis). The type rule and the out-of-range message are
// shared with the CPU tier's kernels (jit/gather.cpp) so both tiers say the same thing.
#pragma once
#include "runtime/tensor.hpp"

#include <string_view>
#include <vector>

namespace rag {

// gather's result schema: ids' shape with table's trailing axes appended, table's dtype.
Schema gather_schema(const Schema& table, const Schema& ids, std::string_view op = "gather");
// The schema of positions(x, axis=...): i64 with x's axes up to and including `axis`; `p` gets
// the per-sample axis.
Schema positions_schema(const Schema& x, std::int64_t axis, int* p = nullptr);

// Where gather finds its rows: an unbatched table T[V, ...] has V rows for every sample; a
// batched T[B, ~N, ...] gives sample b its own N_b rows, from packed row first(b).
class GatherRows {
  public:
    GatherRows(const Structure& table, const Structure& ids);
    bool batched() const { return batched_; }
    std::int64_t count(std::int64_t sample) const {
        return batched_ ? first_[std::size_t(sample + 1)] - first_[std::size_t(sample)] : rows_;
    }
    std::int64_t first(std::int64_t sample) const {
        return batched_ ? first_[std::size_t(sample)] : 0;
    }

  private:
    bool batched_;
    std::int64_t rows_;
    std::vector<std::int64_t> first_;
};

// Per packed id, the packed table row it names (GatherRows), each checked against its
// sample's rows: gather_id_error for the first id, in packed order, outside them.
std::vector<std::int64_t> gather_rows(std::string_view op, const RaggedTensor& table,
                                      const RaggedTensor& ids);

// The error for ids element `packed` (its place in packed storage, in sample `sample`)
// holding `id`, outside [0, rows.count(sample)): names the sample, the position in it and the
// id.
[[noreturn]] void gather_id_error(std::string_view op, const Structure& ids, std::int64_t packed,
                                  std::int64_t id, const GatherRows& rows, std::int64_t sample);

} // namespace rag
