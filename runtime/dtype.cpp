#include "runtime/dtype.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace rag {

std::size_t dtype_size(DType t) {
    switch (t) {
    case DType::f16:
    case DType::bf16:
        return 2;
    case DType::f32:
    case DType::i32:
        return 4;
    case DType::f64:
    case DType::i64:
        return 8;
    case DType::boolean:
        return 1;
    }
    return 0;
}

std::string_view dtype_name(DType t) {
    switch (t) {
    case DType::f16:
        return "f16";
    case DType::bf16:
        return "bf16";
    case DType::f32:
        return "f32";
    case DType::f64:
        return "f64";
    case DType::i32:
        return "i32";
    case DType::i64:
        return "i64";
    case DType::boolean:
        return "bool";
    }
    return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
    for (DType t : all_dtypes)
        if (dtype_name(t) == name) return t;
    return std::nullopt;
}

bool is_floating(DType t) {
    return t == DType::f16 || t == DType::bf16 || t == DType::f32 || t == DType::f64;
}

float half_to_float(std::uint16_t h) {
    std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { // subnormal: value = man * 2^-24
            float f = std::ldexp(float(man), -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

std::uint16_t float_to_half(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    std::uint16_t sign = std::uint16_t((x >> 16) & 0x8000u);
    std::uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) // inf or nan
        return std::uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    if (absx >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u); // rounds past 65504
    if (absx < 0x38800000u) { // below the smallest normal half: subnormal or zero
        float a;
        std::memcpy(&a, &absx, 4);
        float scaled = a * 16777216.0f; // value in units of 2^-24, rounded to nearest even
        return std::uint16_t(sign | std::uint16_t(std::nearbyint(scaled)));
    }
    std::uint32_t mant_odd = (absx >> 13) & 1u;
    absx += 0xc8000fffu + mant_odd; // rebias exponent (-112 << 23) and round to nearest even
    return std::uint16_t(sign | (absx >> 13));
}

float bf16_to_float(std::uint16_t h) {
    std::uint32_t bits = std::uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

std::uint16_t float_to_bf16(float f) {
    std::uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return std::uint16_t(x >> 16);
}

namespace {

// Float to integer without undefined behaviour: truncates toward zero, saturates at the type's
// limits, and maps NaN to 0.
template <class I> I saturate(double v) {
    if (std::isnan(v)) return 0;
    if (v <= double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
    if (v >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
    return I(v);
}

} // namespace

double load_as_f64(const void* data, DType t, std::size_t i) {
    switch (t) {
    case DType::f16:
        return half_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::bf16:
        return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::f32:
        return static_cast<const float*>(data)[i];
    case DType::f64:
        return static_cast<const double*>(data)[i];
    case DType::i32:
        return static_cast<const std::int32_t*>(data)[i];
    case DType::i64:
        return double(static_cast<const std::int64_t*>(data)[i]);
    case DType::boolean:
        return static_cast<const std::uint8_t*>(data)[i] ? 1.0 : 0.0;
    }
    return 0;
}

void store_from_f64(void* data, DType t, std::size_t i, double v) {
    switch (t) {
    case DType::f16:
        static_cast<std::uint16_t*>(data)[i] = float_to_half(float(v));
        break;
    case DType::bf16:
        static_cast<std::uint16_t*>(data)[i] = float_to_bf16(float(v));
        break;
    case DType::f32:
        static_cast<float*>(data)[i] = float(v);
        break;
    case DType::f64:
        static_cast<double*>(data)[i] = v;
        break;
    case DType::i32:
        static_cast<std::int32_t*>(data)[i] = saturate<std::int32_t>(v);
        break;
    case DType::i64:
        static_cast<std::int64_t*>(data)[i] = saturate<std::int64_t>(v);
        break;
    case DType::boolean:
        static_cast<std::uint8_t*>(data)[i] = v != 0.0;
        break;
    }
}

} // namespace rag
