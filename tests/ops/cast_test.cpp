// cast between every pair of dtypes against a per-element reference of the documented rules:
// float to integer truncates toward zero with NaN to 0 and saturation (infinities included),
// integers and bool to float exact, to bool is x != 0; i64 survives casts to i64 exactly.
// Gradients flow only between float dtypes.
#include "tests/support/testing.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace rag {
namespace {

using namespace rag::testing;

Attrs to(DType t) {
    return {{"dtype", std::string(dtype_name(t))}};
}

// The rule for one value, in double (every source value here is exact in double).
double cast_rule(double v, DType t) {
    switch (t) {
    case DType::boolean:
        return v != 0.0 ? 1.0 : 0.0; // NaN != 0
    case DType::i32:
    case DType::i64: {
        if (std::isnan(v)) return 0.0;
        const double lo = t == DType::i32 ? -2147483648.0 : -9223372036854775808.0;
        const double hi = t == DType::i32 ? 2147483647.0 : 9223372036854775807.0;
        return v <= lo ? lo : v >= hi ? hi : std::trunc(v);
    }
    case DType::f32:
        return double(float(v));
    case DType::f16:
        return double(half_to_float(float_to_half(float(v))));
    case DType::bf16:
        return double(bf16_to_float(float_to_bf16(float(v))));
    case DType::f64:
        return v;
    }
    return v;
}

const double inf = std::numeric_limits<double>::infinity();
const double nan_ = std::numeric_limits<double>::quiet_NaN();

// Source values that the source dtype holds exactly.
std::vector<double> values_for(DType from) {
    switch (from) {
    case DType::boolean:
        return {0, 1, 1, 0};
    case DType::i32:
        return {0, 1, -1, 7, -7, 2147483647, -2147483648.0, 65504, 65505};
    case DType::i64:
        return {0, 1, -1, 7, -7, 4294967296.0, -4294967296.0, 16777217};
    default:
        return {0.0,  -0.0,  1.5, -1.5, 2.75, -2.75, 0.999, -0.999, 3e9,   -3e9,
                1e19, -1e19, inf, -inf, nan_, 100.0, 65504, 1e-3,   -7.25, 1e5};
    }
}

TEST(Cast, EveryDtypePairFollowsTheRules) {
    for (DType from : all_dtypes)
        for (DType t : all_dtypes) {
            SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(t)));
            // Store the values in the source dtype first (rounding them into it), then cast.
            auto vals = values_for(from);
            auto x = RaggedTensor::from_list(
                {DenseArray::from_f64(from, {std::int64_t(vals.size())}, vals)}, "~N");
            auto y = evaluate("cast", {x}, to(t));
            EXPECT_EQ(y.schema().str(), std::string(dtype_name(t)) + "[B, ~N]");
            auto src = x.to_f64(), got = y.to_f64();
            for (std::size_t k = 0; k < src.size(); ++k) {
                const double want = cast_rule(src[k], t);
                if (std::isnan(want))
                    EXPECT_TRUE(std::isnan(got[k])) << src[k];
                else
                    EXPECT_EQ(got[k], want) << src[k];
            }
        }
}

TEST(Cast, TruncatesTowardZeroAndKeepsLargeI64Exact) {
    auto x = RaggedTensor::dense(DenseArray::from_f64(DType::f32, {4}, {2.9, -2.9, nan_, -inf}));
    EXPECT_EQ(evaluate("cast", {x}, to(DType::i32)).to_f64(),
              (std::vector<double>{2, -2, 0, -2147483648.0}));
    // 2^53 + 1 is not a double: a cast through double would lose it.
    DenseArray big = DenseArray::zeros(DType::i64, {2});
    const std::int64_t v[2] = {(std::int64_t(1) << 53) + 1,
                               std::numeric_limits<std::int64_t>::max()};
    std::memcpy(big.bytes.data(), v, sizeof v);
    auto b = RaggedTensor::dense(big);
    auto same = evaluate("cast", {b}, to(DType::i64));
    EXPECT_EQ(std::memcmp(same.data(), v, sizeof v), 0);
    auto narrow = evaluate("cast", {b}, to(DType::i32));
    EXPECT_EQ(static_cast<const std::int32_t*>(narrow.data())[0], 2147483647);
    auto f = evaluate("cast", {b}, to(DType::f32));
    EXPECT_EQ(static_cast<const float*>(f.data())[0], float(v[0])); // rounded once
}

TEST(Cast, GradientsFlowOnlyBetweenFloats) {
    auto x = random_batch(DType::f64, "~N, 2", {{3, 2}, {0, 2}, {1, 2}});
    check_vjp("cast", {x}, to(DType::f64));
    // f64 -> f32: central differences see f32 rounding, so check the rule itself: g cast back.
    auto down = evaluate("cast", {x}, to(DType::f32));
    auto gd = evaluate_vjp("cast", std::vector{x}, to(DType::f32), down);
    ASSERT_TRUE(gd[0].has_value());
    EXPECT_EQ(gd[0]->schema().str(), "f64[B, ~N, 2]");
    EXPECT_EQ(gd[0]->to_f64(), down.to_f64());
    auto xf = random_batch(DType::f32, "~N", {{3}, {1}});
    auto y = evaluate("cast", {xf}, to(DType::f64));
    auto g = evaluate_vjp("cast", std::vector{xf}, to(DType::f64), y);
    ASSERT_TRUE(g[0].has_value());
    EXPECT_EQ(g[0]->schema().str(), "f32[B, ~N]");
    EXPECT_EQ(g[0]->to_f64(), xf.to_f64());
    // An integer result: no gradient reaches the float input.
    auto yi = evaluate("cast", {xf}, to(DType::i32));
    EXPECT_FALSE(evaluate_vjp("cast", std::vector{xf}, to(DType::i32), yi)[0].has_value());
    // An integer input gets none either.
    auto i = random_batch(DType::i64, "~N", {{2}}, 0, 5);
    auto yf = evaluate("cast", {i}, to(DType::f32));
    EXPECT_FALSE(evaluate_vjp("cast", std::vector{i}, to(DType::f32), yf)[0].has_value());
    EXPECT_EQ(error_of([&] {
                  evaluate("cast", {xf}, {{"dtype", std::string("f8")}});
              }),
              "cast: unknown dtype 'f8'");
}

} // namespace
} // namespace rag
