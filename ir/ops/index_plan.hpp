// How `index(x, spec)` reads x: the parsed spec, the result shape (with the derived names of
// sliced ragged and symbolic axes) and, per sample, where each result element comes from.
// Shared by the reference kernels (ir/ops/shape.cpp) and the CPU tier's row copies
// (jit/layout.cpp), so both tiers resolve slices with one set of rules.
#pragma once
#include "runtime/structure.hpp"

#include <optional>
#include <string_view>
#include <vector>

namespace rag {

// One item of the spec on an axis of x: a slice lo:hi:step (Python bounds, step >= 1) or an
// integer selecting one position (static axes only; the axis disappears).
struct AxisSelect {
    bool slice = true;
    std::optional<std::int64_t> lo, hi; // slice bounds as written (nullopt: omitted)
    std::int64_t step = 1;
    std::int64_t index = 0; // selection, already made non-negative

    bool keeps_all() const { return slice && step == 1 && !hi && lo.value_or(0) == 0; }
    // The first position read and the result extent on an axis of extent n (Python's rules:
    // negative bounds count from the end, then clamp to [0, n]).
    std::pair<std::int64_t, std::int64_t> resolve(std::int64_t n) const;
};

// The canonical name of a slice of the axis named `base`: slices with the same length
// function get the same name (`N[1:]` for both `1:` and `:-1`; `N[2:]` for `1:-1`).
std::string derived_axis_name(const std::string& base, const AxisSelect& s);

struct IndexPlan {
    Shape out;
    std::vector<int> out_src;    // x axis behind result axis o; -1: inserted by `new`
    std::vector<int> x_out;      // result axis of x axis s; -1: selected away
    std::vector<AxisSelect> sel; // per x axis

    // Per sample: the first x position and the step along every x axis, and the result shape.
    struct Sample {
        std::vector<std::int64_t> start, step, shape;
    };
    Sample sample(const Structure& x, std::int64_t i) const;
    std::vector<std::int64_t> sample_shape(const Structure& x, std::int64_t i) const {
        return sample(x, i).shape;
    }
    // The x index read by result index oi.
    void map(const Sample& s, const std::vector<std::int64_t>& oi,
             std::vector<std::int64_t>& xi) const {
        for (std::size_t a = 0; a < s.start.size(); ++a)
            xi[a] = s.start[a] + (x_out[a] >= 0 ? s.step[a] * oi[std::size_t(x_out[a])] : 0);
    }
    // Every non-ragged axis of x kept whole (only ':' and 'new' on them): each result row is
    // a whole row of x.
    bool whole_rows(const Shape& x) const;
};

// Parses and type-checks a spec against x's shape (rag::Error naming the item otherwise).
IndexPlan plan_index(const Shape& x, std::string_view spec);

} // namespace rag
