// Structure: the ragged layout of a batch (NestedTensor paper, section 3.1), shared between
// tensors that have it (feature-wise ops keep it, so they share the pointer).
//
// A batch of B samples with per-sample axes a_1..a_d, of which q are ragged. Storage puts the
// ragged axes first (in logical order), then the others (in logical order): sample i is a
// dense row-major block of p_i rows (p_i = product of its ragged extents) by `row_width`
// columns (the product of the non-ragged extents), and its rows are [offsets[i], offsets[i+1]).
// `dim_order[a]` is the storage position of logical axis a. `row_splits[k]` partitions the rows
// by the first k+1 ragged axes: level 0 is the samples (equal to offsets), level 1 of a
// rectangular pair (N_i, M_i) has 1 + sum_i N_i entries, each segment holding M_i rows.
// Exact `sizes` keep zero-volume samples such as (0, 3) and (0, 7) distinct.
#pragma once
#include "runtime/schema.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace rag {

class Structure;
using StructurePtr = std::shared_ptr<const Structure>;

class Structure {
  public:
    // Validates and builds. `sizes` is [B, d] row-major; unbatched shapes take batch = 1.
    // Throws rag::Error naming the sample and axis when sizes break the shape's rules.
    static StructurePtr make(Shape shape, std::int64_t batch, std::vector<std::int64_t> sizes);

    const Shape& shape() const { return shape_; }
    std::int64_t batch() const { return batch_; }
    int rank() const { return shape_.sample_rank(); }
    std::int64_t size(std::int64_t sample, int axis) const {
        return sizes_[sample * rank() + axis];
    }
    std::span<const std::int64_t> sample_shape(std::int64_t sample) const {
        return {sizes_.data() + sample * rank(), std::size_t(rank())};
    }
    const std::vector<std::int64_t>& sizes() const { return sizes_; }
    const std::vector<std::int64_t>& offsets() const { return offsets_; }
    const std::vector<std::vector<std::int64_t>>& row_splits() const { return row_splits_; }
    const std::vector<int>& dim_order() const { return dim_order_; }
    std::int64_t row_width() const { return row_width_; }
    std::int64_t rows() const { return offsets_.back(); }
    std::int64_t numel() const { return rows() * row_width_; }
    std::int64_t sample_begin(std::int64_t i) const { return offsets_[i] * row_width_; }
    std::int64_t sample_numel(std::int64_t i) const {
        return (offsets_[i + 1] - offsets_[i]) * row_width_;
    }
    // Element strides of sample i's logical axes inside its storage block.
    std::vector<std::int64_t> sample_strides(std::int64_t i) const;
    // Extent of a per-sample axis for every sample.
    std::vector<std::int64_t> lengths(int axis) const;
    // Largest extent of each per-sample axis over the batch (the padded envelope).
    std::vector<std::int64_t> envelope() const;

    // Re-checks every invariant (o_0 = 0, o_{i+1} - o_i = p_i, splits consistent, ...).
    void validate() const;
    bool same_as(const Structure& o) const { return shape_ == o.shape_ && sizes_ == o.sizes_; }

  private:
    Shape shape_;
    std::int64_t batch_ = 1;
    std::vector<std::int64_t> sizes_, offsets_;
    std::vector<std::vector<std::int64_t>> row_splits_;
    std::vector<int> dim_order_;
    std::int64_t row_width_ = 1;
};

// "~N, ~N, 128" -> per-sample axes; `~name` ragged, integer fixed, other names symbolic.
std::vector<Axis> parse_axes(std::string_view spec);

} // namespace rag
