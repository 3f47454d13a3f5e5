// Test support: random ragged batches, a plain dense n-d array for per-sample references,
// closeness checks, and the float64 central-difference check every VJP must pass.
#pragma once
#include "ir/op_table.hpp"
#include "runtime/error.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string_view>
#include <vector>

namespace rag::testing {

using Shape_ = std::vector<std::int64_t>;

#ifdef RAG_SOURCE_DIR
// The source tree: where the build was configured, or $RAG_SOURCE_DIR (a build carried to a
// GPU machine runs from another checkout).
inline std::filesystem::path source_root() {
    const char* e = std::getenv("RAG_SOURCE_DIR");
    return e ? e : RAG_SOURCE_DIR;
}
#endif

// A dense n-d array of doubles: the independent per-sample reference representation.
struct Nd {
    Shape_ shape;
    std::vector<double> v;

    Nd() = default;
    explicit Nd(Shape_ s, double fill = 0.0);
    static Nd of(const DenseArray& a) { return {a.shape, a.to_f64()}; }
    Nd(Shape_ s, std::vector<double> values) : shape(std::move(s)), v(std::move(values)) {}
    std::int64_t numel() const { return std::int64_t(v.size()); }
    std::int64_t flat(std::initializer_list<std::int64_t> idx) const;
    double& operator()(std::initializer_list<std::int64_t> idx) {
        return v[std::size_t(flat(idx))];
    }
    double operator()(std::initializer_list<std::int64_t> idx) const {
        return v[std::size_t(flat(idx))];
    }
};

std::mt19937& rng(); // one seeded generator per test binary
double uniform(double lo = -1.0, double hi = 1.0);
std::int64_t randint(std::int64_t lo, std::int64_t hi); // inclusive

// A batch whose sample i has shape sample_shapes[i]; values uniform in [lo, hi].
RaggedTensor random_batch(DType t, std::string_view axes, const std::vector<Shape_>& sample_shapes,
                          double lo = -1.0, double hi = 1.0);
// Sample shapes for `axes` ("~N, ~N, 4", "3, ~H, ~W", ...) from per-sample ragged lengths:
// lengths[i][k] is sample i's extent for the k-th distinct ragged name.
std::vector<Shape_> shapes_for(std::string_view axes, const std::vector<Shape_>& lengths);
// Random lengths in [lo, hi] for B samples and `names` distinct ragged names; the first sample
// gets length lo (so 0 and 1 are covered when lo <= 1).
std::vector<Shape_> random_lengths(std::int64_t B, int names, std::int64_t lo, std::int64_t hi);
RaggedTensor random_dense(DType t, const Shape_& shape, double lo = -1.0, double hi = 1.0);
// A random value of schema s. Batched values get one sample per entry of `lengths`: the k-th
// distinct ragged name of sample i takes lengths[i] (k even) or lengths[B-1-i] (k odd).
// Integer values are labels in {0, 1}; floats are uniform in [lo, hi].
RaggedTensor random_for(const Schema& s, const std::vector<std::int64_t>& lengths, double lo = -1.0,
                        double hi = 1.0);

// |got - want| <= atol + rtol |want| elementwise (NaN equals NaN, infinities must match).
::testing::AssertionResult close(const Nd& got, const Nd& want, double atol = 1e-9,
                                 double rtol = 1e-9);
// Every sample of t equals the reference sample (shape and values).
::testing::AssertionResult samples_close(const RaggedTensor& t, const std::vector<Nd>& want,
                                         double atol = 1e-9, double rtol = 1e-9);
std::vector<Nd> samples(const RaggedTensor& t);
// |a - b| / |b| over all elements (|a - b| when b is zero; equal infinities count as equal).
double rel_l2(const RaggedTensor& a, const RaggedTensor& b);

// Checks op's VJP for every floating input against float64 central differences of
// <w, op(args)> with a random cotangent w. Inputs must be f64. Checks at most `max_probes`
// elements per input (chosen at random, plus the first and last).
void check_vjp(std::string_view op, std::vector<RaggedTensor> args, const Attrs& at = {},
               double tol = 1e-6, int max_probes = 48);

// The error message of a throwing statement, or "" if it did not throw rag::Error.
template <class Fn> std::string error_of(Fn&& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

} // namespace rag::testing
