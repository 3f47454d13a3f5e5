// Helpers shared by the reference kernels: per-sample dense views of packed storage, index
// iteration, axis normalisation and common type-rule checks. The reference tier computes every
// op in double and rounds the result to the output dtype.
#pragma once
#include "ir/op_table.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace rag::kern {

// Calls fn(idx) for every index of a dense shape in row-major order.
template <class Fn> void for_each_index(std::span<const std::int64_t> shape, Fn&& fn) {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    std::vector<std::int64_t> idx(shape.size(), 0);
    for (std::int64_t flat = 0; flat < n; ++flat) {
        fn(idx);
        for (int a = int(shape.size()) - 1; a >= 0; --a) {
            if (++idx[a] < shape[a]) break;
            idx[a] = 0;
        }
    }
}

// Sample i of a packed tensor as a dense strided array (storage positions, in elements).
struct SampleView {
    std::int64_t base = 0;
    std::vector<std::int64_t> shape, strides;

    std::int64_t at(std::span<const std::int64_t> idx) const {
        std::int64_t off = base;
        for (std::size_t a = 0; a < idx.size(); ++a) off += idx[a] * strides[a];
        return off;
    }
    std::int64_t numel() const {
        std::int64_t n = 1;
        for (auto e : shape) n *= e;
        return n;
    }
};

SampleView sample_view(const Structure& st, std::int64_t i);

// Builds a structure from a per-sample shape function (unbatched: batch 1).
StructurePtr make_structure(const Shape& shape, std::int64_t batch,
                            const std::function<std::vector<std::int64_t>(std::int64_t)>& sample);

// Logical axis (batch axis counted, negative from the end) -> per-sample axis index.
// Throws naming the op when it is out of range or is the batch axis.
int sample_axis(const Shape& s, std::int64_t axis, std::string_view op);

void require_float(const Schema& s, std::string_view op, std::string_view what = "argument");
void require_same_dtype(std::span<const Schema> in, std::string_view op);
void require_fixed(const Axis& a, std::string_view op, std::string_view what);

// A tensor with the same structure whose values are fn(value) (double in, double out).
RaggedTensor map_values(const RaggedTensor& t, DType out, const std::function<double(double)>& fn);

} // namespace rag::kern
