// Element types: names, sizes and the half-precision conversions.
#include "tests/support/testing.hpp"

#include <cmath>
#include <limits>

namespace rag {
namespace {

TEST(DType, NamesRoundTrip) {
    for (DType t : all_dtypes) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_FALSE(parse_dtype("f8").has_value());
    EXPECT_EQ(dtype_size(DType::bf16), 2u);
    EXPECT_EQ(dtype_size(DType::boolean), 1u);
    EXPECT_TRUE(is_floating(DType::f16));
    EXPECT_FALSE(is_floating(DType::i64));
}

TEST(DType, HalfConversionIsExactOnRepresentableValues) {
    // Every finite f16 bit pattern survives f16 -> f32 -> f16.
    for (std::uint32_t b = 0; b < 0x10000; ++b) {
        auto h = std::uint16_t(b);
        float f = half_to_float(h);
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
            continue;
        }
        ASSERT_EQ(float_to_half(f), h) << std::hex << b;
    }
    EXPECT_EQ(half_to_float(0x3c00), 1.0f);
    EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
    EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
}

TEST(DType, HalfRoundsToNearestEvenAndSaturates) {
    EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00); // tie -> even
    EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
    EXPECT_EQ(float_to_half(70000.0f), 0x7c00);
    EXPECT_EQ(float_to_half(-70000.0f), 0xfc00);
    EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000); // below half the smallest subnormal
}

TEST(DType, Bfloat16) {
    for (std::uint32_t b = 0; b < 0x10000; b += 7) {
        float f = bf16_to_float(std::uint16_t(b));
        if (!std::isnan(f)) {
            ASSERT_EQ(float_to_bf16(f), b);
        }
    }
    EXPECT_EQ(bf16_to_float(float_to_bf16(1.00390625f)), 1.0f); // tie -> even
    EXPECT_EQ(bf16_to_float(float_to_bf16(3.0f)), 3.0f);
    EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, IntegerStoresSaturate) {
    std::vector<std::byte> buf(8);
    store_from_f64(buf.data(), DType::i32, 0, 1e30);
    EXPECT_EQ(load_as_f64(buf.data(), DType::i32, 0), 2147483647.0);
    store_from_f64(buf.data(), DType::i32, 0, -1e30);
    EXPECT_EQ(load_as_f64(buf.data(), DType::i32, 0), -2147483648.0);
    store_from_f64(buf.data(), DType::i64, 0, std::nan(""));
    EXPECT_EQ(load_as_f64(buf.data(), DType::i64, 0), 0.0);
    store_from_f64(buf.data(), DType::i32, 0, -2.7);
    EXPECT_EQ(load_as_f64(buf.data(), DType::i32, 0), -2.0);
}

TEST(DType, LoadStoreEveryType) {
    for (DType t : all_dtypes) {
        std::vector<std::byte> buf(8 * 4);
        store_from_f64(buf.data(), t, 2, 3.0);
        EXPECT_EQ(load_as_f64(buf.data(), t, 2), t == DType::boolean ? 1.0 : 3.0) << dtype_name(t);
    }
}

} // namespace
} // namespace rag
