#include "jit/gemm_programs.hpp"

#include "runtime/error.hpp"

#include <algorithm>

namespace rag::jit {

using kir::Expr;
using kir::Loop;

kir::Kernel gemm_program(DType t, bool partial) {
    kir::Elem e = kir::Elem::f32;
    kir::Precision p = kir::Precision::f32;
    if (t == DType::f16) {
        e = kir::Elem::f16;
        p = kir::Precision::f16;
    } else if (t == DType::bf16) {
        e = kir::Elem::bf16;
        p = kir::Precision::bf16;
    } else if (t != DType::f32) {
        fail("internal: gemm_program takes f32, f16 or bf16, not ", dtype_name(t));
    }
    kir::Builder b(std::string(partial ? "gemm_partial_" : "gemm_").append(dtype_name(t)));
    Expr M = b.param("M"), N = b.param("N"), K = b.param("K");
    Expr a_row = b.param("a_row"), a_col = b.param("a_col");
    Expr b_row = b.param("b_row"), b_col = b.param("b_col");
    Expr Kc = b.param("Kc");
    const int a = b.buffer("a", e), bb = b.buffer("b", e);
    const int c = b.buffer("c", partial ? kir::Elem::f32 : e);
    const int As = b.shared("As", kTileM * kTileK); // [i][l]
    const int Bs = b.shared("Bs", kTileK * kTileN); // [l][j]
    const int Cs = b.shared("Cs", kTileM * kTileN); // [i][j]
    Expr tiles_n = b.let(kir::ceil_div(N, kTileN), "tiles_n");
    Expr tiles = b.let(kir::ceil_div(M, kTileM) * tiles_n, "tiles");
    Expr split = b.let(b.pid() / tiles, "split"), tile = b.let(b.pid() % tiles, "tile");
    Expr i0 = b.let(tile / tiles_n * kTileM, "i0");
    Expr j0 = b.let(tile % tiles_n * kTileN, "j0");
    Expr k0 = b.let(split * Kc, "k0"), k1 = b.let(min(K, k0 + Kc), "k1");
    b.loop(
        0, kTileM * kTileN, [&](Expr x) { b.store(Cs, x, 0.0); }, Loop::threads);
    // One slice of an operand into shared memory: element x of a rows x cols slice is
    // (x / cols, x % cols), read from global (r0 + r, c0 + c) when that lies inside.
    auto stage = [&](int dst, int src, std::int64_t rows, std::int64_t cols, Expr r0, Expr c0,
                     Expr r_end, Expr c_end, Expr r_stride, Expr c_stride) {
        b.loop(
            0, rows * cols,
            [&](Expr x) {
                Expr r = b.let(r0 + x / cols, "r"), col = b.let(c0 + x % cols, "col");
                b.when(
                    r < r_end && col < c_end,
                    [&] { b.store(dst, x, b.load(src, r * r_stride + col * c_stride)); },
                    [&] { b.store(dst, x, 0.0); });
            },
            Loop::threads);
    };
    b.loop(0, kir::ceil_div(max(k1 - k0, Expr(0)), kTileK), [&](Expr slice) {
        Expr l0 = b.let(k0 + slice * kTileK, "l0");
        stage(As, a, kTileM, kTileK, i0, l0, M, k1, a_row, a_col);
        stage(Bs, bb, kTileK, kTileN, l0, j0, k1, N, b_row, b_col);
        b.mma({Cs, 0, kTileN, 1}, {As, 0, kTileK, 1}, {Bs, 0, kTileN, 1}, kTileM, kTileN, kTileK,
              p);
    });
    b.loop(
        0, kTileM * kTileN,
        [&](Expr x) {
            Expr i = b.let(i0 + x / kTileN, "i"), j = b.let(j0 + x % kTileN, "j");
            Expr at = partial ? split * M * N + i * N + j : i * N + j;
            b.when(i < M && j < N, [&] { b.store(c, at, b.load(Cs, x)); });
        },
        Loop::threads);
    return b.finish();
}

std::vector<std::int64_t> GemmJob::params() const {
    // A(i, l): x[l][i] of the [K, M] packed rows when transposed, else x[i][l] of [M, K].
    const std::int64_t a_row = a_transposed ? 1 : K, a_col = a_transposed ? M : 1;
    return {M, N, K, a_row, a_col, N, 1, Kc()};
}

std::int64_t GemmJob::tiles() const {
    return (M + kTileM - 1) / kTileM * ((N + kTileN - 1) / kTileN);
}

std::int64_t GemmJob::Kc() const {
    const std::int64_t per = (K + splits - 1) / std::max<std::int64_t>(splits, 1);
    return std::max<std::int64_t>((per + kTileK - 1) / kTileK * kTileK, kTileK);
}

void GemmJob::split_for(int multiprocessors) {
    // Enough instances for two per multiprocessor, each summing at least 8 slices of K.
    const std::int64_t want = (2 * std::int64_t(multiprocessors) + tiles() - 1) / tiles();
    splits = std::clamp<std::int64_t>(std::min(want, K / (8 * kTileK)), 1, 64);
}

std::optional<GemmJob> gemm_job(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    const bool weight_grad = n.op == "matmul_weight_grad";
    if (!weight_grad && n.op != "matmul") return std::nullopt;
    const RaggedTensor& a = vals[std::size_t(n.args[0])];
    const RaggedTensor& b = vals[std::size_t(n.args[1])];
    if (!weight_grad && b.shape().batched) return std::nullopt;
    GemmJob job;
    job.dtype = n.type.dtype;
    job.a_transposed = weight_grad;
    // out[rows, D] = a[rows, C] b[C, D], or out[C, D] = a[rows, C]^T b[rows, D].
    const std::int64_t C = weight_grad ? n.type.shape.axes[0].extent : b.shape().axes[0].extent;
    const std::int64_t D = weight_grad ? n.type.shape.axes[1].extent : b.shape().axes[1].extent;
    const std::int64_t rows = C ? a.numel() / C : 0;
    if (weight_grad) {
        job.out = Structure::make(n.type.shape, 1, {C, D});
    } else {
        std::vector<std::int64_t> sizes = a.structure().sizes();
        const int d = a.structure().rank();
        for (std::int64_t i = 0; i < a.batch(); ++i) sizes[std::size_t(i * d + d - 1)] = D;
        job.out = Structure::make(n.type.shape, a.batch(), sizes);
    }
    job.M = weight_grad ? C : rows;
    job.N = D;
    job.K = weight_grad ? rows : C;
    // Operands of other sizes (a weight gradient whose g has other rows than x) are left to
    // the reference kernel, which names the sample.
    if (a.numel() != rows * C || b.numel() != (weight_grad ? rows : C) * D) return std::nullopt;
    return job;
}

} // namespace rag::jit
