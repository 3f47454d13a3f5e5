#include "jit/blas.hpp"

#include "runtime/parallel.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <dlfcn.h>
#include <string>
#include <type_traits>

namespace rag::jit {

namespace {

// OpenBLAS with DYNAMIC_ARCH picks its kernels from the CPU it recognises. Debian 12's 0.3.21
// does not know recent Xeons and falls back to its generic Prescott (SSE3) kernels: on this
// project's machine an f32 GEMM ran 5x slower than with its SkylakeX kernels (12800 x 128 x
// 512 on one thread: 0.43 s against 0.08 s). Where OpenBLAS chose such a generic core and the
// CPU has what a better kernel set needs, its own core selection runs again with
// OPENBLAS_CORETYPE (a user's setting wins). Once, at load time, before any thread calls BLAS.
const char* better_blas_core() {
    if (std::getenv("OPENBLAS_CORETYPE")) return nullptr;
    auto corename = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
    if (!corename) return nullptr;
    const std::string core = corename();
    const bool generic = core == "Prescott" || core == "Core2" || core == "Penryn" ||
                         core == "Dunnington" || core == "Nehalem" || core == "Sandybridge";
    if (!generic) return nullptr;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return nullptr;
}

const bool blas_kernels_chosen = [] {
    using Fn = void (*)();
    auto quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
    auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
    const char* core = quit && init ? better_blas_core() : nullptr;
    if (!core) return false;
    setenv("OPENBLAS_CORETYPE", core, 0); // child processes make the same choice
    quit();
    init();
    return true;
}();

} // namespace

const char* blas_core() {
    (void)blas_kernels_chosen;
    auto corename = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
    return corename ? corename() : "unknown";
}

void own_blas_threads() {
    // OpenBLAS splits a GEMM over its own threads in ways that change the summation order
    // (OPENBLAS_NUM_THREADS changed 80% of a weight gradient's bits); rag's pool does it instead.
    static const bool pinned = (openblas_set_num_threads(1), true);
    (void)pinned;
}

namespace {

// Output rows (or columns) per block: a multiple of every BLAS micro-kernel's tile height.
constexpr std::int64_t block = 32;
// Every BLAS call packs the whole of the other operand's panel, so a call over few output rows
// spends its time packing: on a 2048^3 GEMM, 32-row calls ran at half the rate of 256-row calls
// (one thread, OpenBLAS SkylakeX). Blocks are therefore at least `least_rows` long (or half the
// dimension, so that two threads still get work), and a large dimension is cut into about
// `pieces` blocks, enough for that many threads to balance.
constexpr std::int64_t least_rows = 128, pieces = 8;
// Multiply-adds below which a GEMM is not worth a second thread.
constexpr std::int64_t min_work = 1 << 18;

} // namespace

std::int64_t gemm_block_rows(std::int64_t len) {
    auto round_up = [](std::int64_t x) { return (x + block - 1) / block * block; };
    const std::int64_t rows = std::max(least_rows, round_up((len + pieces - 1) / pieces));
    return std::min(rows, round_up((len + 1) / 2));
}

namespace {

template <class T>
void blas(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, T alpha,
          const T* a, int lda, const T* b, int ldb, T* c, int ldc) {
    if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc);
    else
        cblas_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, 0.0, c, ldc);
}

template <class T>
void split(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, T alpha,
           const T* a, int lda, const T* b, int ldb, T* c, int ldc) {
    own_blas_threads();
    if (m == 0 || n == 0 || k == 0) return;
    const bool row_major = order == CblasRowMajor;
    // Split the longer output dimension; where a block starts in each operand follows from the
    // storage order and transposition (row i of op(A) is row i of A unless transposed, etc.).
    const bool rows = m >= n;
    const std::int64_t len = rows ? m : n;
    const std::int64_t step = std::int64_t(m) * n * k < min_work ? len : gemm_block_rows(len);
    parallel_for((len + step - 1) / step, 1, [&](std::int64_t b0, std::int64_t b1) {
        const std::int64_t lo = b0 * step, hi = std::min(b1 * step, len);
        const int part = int(hi - lo);
        if (rows) {
            const bool a_lead = row_major == (ta == CblasNoTrans); // A's rows are its slow axis
            blas(order, ta, tb, part, n, k, alpha, a + (a_lead ? lo * lda : lo), lda, b, ldb,
                 c + (row_major ? lo * ldc : lo), ldc);
        } else {
            const bool b_lead = row_major != (tb == CblasNoTrans); // B's columns: slow axis
            blas(order, ta, tb, m, part, k, alpha, a, lda, b + (b_lead ? lo * ldb : lo), ldb,
                 c + (row_major ? lo : lo * ldc), ldc);
        }
    });
}

} // namespace

void gemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
          float alpha, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
    split(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}
void gemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
          double alpha, const double* a, int lda, const double* b, int ldb, double* c, int ldc) {
    split(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc);
}

} // namespace rag::jit
