#include "jit/blas.hpp"

#include "runtime/parallel.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace rag::jit {

void own_blas_threads() {
    // OpenBLAS splits a GEMM over its own threads in ways that change the summation order
    // (OPENBLAS_NUM_THREADS changed 80% of a weight gradient's bits); rag's pool does it instead.
    static const bool pinned = (openblas_set_num_threads(1), true);
    (void)pinned;
}

namespace {

// Output rows (or columns) per block: a multiple of every BLAS micro-kernel's tile height.
constexpr std::int64_t block = 32;
// Multiply-adds below which a block is not worth a thread.
constexpr std::int64_t min_work = 1 << 18;

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
    const std::int64_t len = rows ? m : n, other = rows ? n : m;
    const std::int64_t blocks = (len + block - 1) / block;
    const std::int64_t grain =
        std::max<std::int64_t>(1, min_work / std::max<std::int64_t>(block * other * k, 1));
    parallel_for(blocks, grain, [&](std::int64_t b0, std::int64_t b1) {
        const std::int64_t lo = b0 * block, hi = std::min(b1 * block, len);
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
