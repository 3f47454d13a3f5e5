// Every BLAS GEMM of the CPU tier goes through here. rag owns the threads: OpenBLAS is pinned to
// one thread and a large GEMM is split over rag's pool into blocks of output rows (or columns),
// never along the inner dimension, at places that depend on the matrix sizes alone. Each output
// element's sum is then computed by one single-threaded BLAS call whatever RAG_NUM_THREADS or
// OPENBLAS_NUM_THREADS say, so results are bitwise the same under any thread count.
#pragma once
#include <cblas.h>
#include <cstdint>

namespace rag::jit {

// C = alpha op(A) op(B) (beta = 0) in `order`, as cblas_sgemm/cblas_dgemm take them; nothing
// when a dimension is 0. Called from inside a parallel_for chunk it runs the same blocks on that
// thread.
void gemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
          float alpha, const float* a, int lda, const float* b, int ldb, float* c, int ldc);
void gemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
          double alpha, const double* a, int lda, const double* b, int ldb, double* c, int ldc);

// The rows (or columns) of the output that one single-threaded BLAS call computes when gemm()
// splits a dimension of `len`: a multiple of 32, a function of the sizes alone (so each output
// element comes from the same call under any thread count), long enough that packing the
// other operand once per call does not dominate.
std::int64_t gemm_block_rows(std::int64_t len);

// The kernel set OpenBLAS runs ("SkylakeX", "Haswell", ...): on a CPU its detection does not
// know, rag selects the best set the CPU supports at load time (jit/blas.cpp).
const char* blas_core();

// Pins OpenBLAS to one thread (once per process); for BLAS calls made outside gemm().
void own_blas_threads();

} // namespace rag::jit
