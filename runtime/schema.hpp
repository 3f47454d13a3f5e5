// Schema: what compiled code is specialised on. dtype, whether the value has a batch axis,
// and per per-sample axis its kind: static (extent is part of the schema), symbolic (one
// runtime extent shared by every sample; only the name is in the schema) or ragged (one
// extent per sample; the name says which ragged axes must agree). Runtime lengths are never
// part of a schema, so two batches with different lengths have equal schemas.
#pragma once
#include "runtime/dtype.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace rag {

enum class AxisKind : std::uint8_t { fixed, symbolic, ragged };

struct Axis {
    AxisKind kind = AxisKind::fixed;
    std::int64_t extent = 0; // fixed axes only
    std::string name;        // symbolic and ragged axes only

    static Axis fixed_of(std::int64_t n) { return {AxisKind::fixed, n, {}}; }
    static Axis symbolic_of(std::string n) { return {AxisKind::symbolic, 0, std::move(n)}; }
    static Axis ragged_of(std::string n) { return {AxisKind::ragged, 0, std::move(n)}; }
    bool is_ragged() const { return kind == AxisKind::ragged; }
    bool operator==(const Axis&) const = default;
};

// The per-sample axes of a value, without the dtype: what its structure is specialised on.
struct Shape {
    bool batched = false;   // true: a leading batch axis B, samples are independent
    std::vector<Axis> axes; // per-sample axes (the batch axis is not listed)

    int sample_rank() const { return int(axes.size()); }
    int logical_rank() const { return sample_rank() + (batched ? 1 : 0); }
    int ragged_count() const;
    bool operator==(const Shape&) const = default;
};

struct Schema {
    DType dtype = DType::f32;
    Shape shape;

    bool operator==(const Schema&) const = default;
    std::string str() const; // "f32[B, ~N, 384]", "f32[384, 128]", "f32[]"
    std::size_t hash() const;
};

std::string shape_str(const Shape& s); // "[B, ~N, 384]"

} // namespace rag
