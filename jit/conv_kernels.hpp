// The direct-convolution micro-kernel behind conv.cpp's f32 steps (an LLVM host kernel, so it
// uses this CPU's widest vectors). No LLVM headers here.
#pragma once
#include <cstdint>

namespace rag::jit {

// out[p ldo + c] = sum over t < taps, then i < cols, of rows[p taps + t][i] w[(t cols + i) nout +
// c], for p < count and c < nout (a multiple of conv_lanes()). Each output is one chain of
// fused multiply-adds in that order, so a result depends on nothing but its own inputs.
using ConvRows = void (*)(std::int64_t count, std::int64_t taps, std::int64_t cols,
                          std::int64_t nout, const float* const* rows, const float* w, float* out,
                          std::int64_t ldo);

// part[(t cols + i) nout + c] = sum over p < count, in order, of rows[p taps + t][i]
// dy[p ldy + c]: a weight gradient's contribution from one block of pixels.
using ConvWeightRows = void (*)(std::int64_t count, std::int64_t taps, std::int64_t cols,
                                std::int64_t nout, const float* const* rows, const float* dy,
                                float* part, std::int64_t ldy);

// The kernels' vector width in floats: 16 with AVX-512, else 8.
std::int64_t conv_lanes();
ConvRows conv_rows_kernel();
ConvWeightRows conv_weight_rows_kernel();

} // namespace rag::jit
