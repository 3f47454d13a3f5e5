// Element types. Half types are stored as 16-bit patterns and computed in wider floats.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace rag {

enum class DType : std::uint8_t { f16, bf16, f32, f64, i32, i64, boolean };

inline constexpr DType all_dtypes[] = {DType::f16, DType::bf16, DType::f32,    DType::f64,
                                       DType::i32, DType::i64,  DType::boolean};

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);
bool is_floating(DType t);

float half_to_float(std::uint16_t bits);
std::uint16_t float_to_half(float x); // round to nearest even, saturating to inf
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float x); // round to nearest even, NaN kept

// Reads/writes element `i` of a buffer of type `t` as double (exact for every dtype except
// i64 beyond 2^53). Rounding on store follows the dtype: half types round through f32;
// integers truncate toward zero and saturate at their limits (NaN stores 0).
double load_as_f64(const void* data, DType t, std::size_t i);
void store_from_f64(void* data, DType t, std::size_t i, double v);

} // namespace rag
