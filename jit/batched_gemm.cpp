#include "jit/batched_gemm.hpp"

#include "ir/interpreter.hpp"
#include "ir/ops/kernel_util.hpp"
#include "jit/blas.hpp"
#include "jit/placement.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>
#include <vector>

namespace rag::jit {
namespace {

// One operand matrix of a product: element (r, c) at data + r * rs + c * cs.
struct Matrix {
    std::int64_t rows, cols, rs, cs;
};

// How BLAS reads a matrix in `order`: its leading dimension and whether it is transposed; not ok
// when neither axis is contiguous. A matrix with one row
// or column is contiguous both ways.
struct Blas {
    bool ok, trans;
    int ld;
};
Blas blas_view(const Matrix& m, CBLAS_ORDER order) {
    const bool row_major = order == CblasRowMajor;
    const std::int64_t unit = row_major ? m.cs : m.rs, lead = row_major ? m.rs : m.cs;
    const std::int64_t unit_t = row_major ? m.rs : m.cs, lead_t = row_major ? m.cs : m.rs;
    const std::int64_t minor = row_major ? m.cols : m.rows, minor_t = row_major ? m.rows : m.cols;
    if (unit == 1 || minor <= 1)
        return {true, false, int(std::max({lead, minor, std::int64_t(1)}))};
    if (unit_t == 1 || minor_t <= 1)
        return {true, true, int(std::max({lead_t, minor_t, std::int64_t(1)}))};
    return {false, false, 0};
}

// A copy of m in row-major order, for an operand BLAS cannot read in place.
template <class T> const T* packed(const T* p, Matrix& m, std::vector<T>& tmp) {
    tmp.resize(std::size_t(m.rows * m.cols));
    for (std::int64_t r = 0; r < m.rows; ++r)
        for (std::int64_t c = 0; c < m.cols; ++c)
            tmp[std::size_t(r * m.cols + c)] = p[r * m.rs + c * m.cs];
    m.rs = m.cols;
    m.cs = 1;
    return tmp.data();
}

template <class T> void product(const T* a, Matrix A, const T* b, Matrix B, T* c, Matrix C) {
    if (C.rows == 0 || C.cols == 0) return;
    if (A.cols == 0) { // an empty inner dimension: zeros
        for (std::int64_t r = 0; r < C.rows; ++r)
            for (std::int64_t k = 0; k < C.cols; ++k) c[r * C.rs + k * C.cs] = T(0);
        return;
    }
    // C is written in whichever order it is contiguous, else into a row-major copy scattered
    // afterwards (ragged scores [H, ~N, ~M] keep H innermost); A and B are read in that order,
    // transposed or not, or packed when neither of their axes is contiguous.
    thread_local std::vector<T> ta, tb, tc;
    Matrix out = C;
    T* dst = c;
    if (!(C.cs == 1 || C.cols <= 1 || C.rs == 1 || C.rows <= 1)) {
        tc.resize(std::size_t(C.rows * C.cols));
        dst = tc.data();
        out = {C.rows, C.cols, C.cols, 1};
    }
    const CBLAS_ORDER order = (out.cs == 1 || out.cols <= 1) ? CblasRowMajor : CblasColMajor;
    Blas va = blas_view(A, order), vb = blas_view(B, order);
    if (!va.ok) a = packed(a, A, ta), va = blas_view(A, order);
    if (!vb.ok) b = packed(b, B, tb), vb = blas_view(B, order);
    const Blas vc = blas_view(out, order);
    const auto opa = va.trans ? CblasTrans : CblasNoTrans,
               opb = vb.trans ? CblasTrans : CblasNoTrans;
    gemm(order, opa, opb, int(C.rows), int(C.cols), int(A.cols), T(1), a, va.ld, b, vb.ld, dst,
         vc.ld);
    if (dst != c)
        for (std::int64_t r = 0; r < C.rows; ++r)
            for (std::int64_t k = 0; k < C.cols; ++k) c[r * C.rs + k * C.cs] = dst[r * C.cols + k];
}

Matrix last_two(const kern::SampleView& v) {
    const std::size_t r = v.shape.size();
    return {v.shape[r - 2], v.shape[r - 1], v.strides[r - 2], v.strides[r - 1]};
}

template <class T> void run(const RaggedTensor& a, const RaggedTensor& b, RaggedTensor& out) {
    const Structure &as = a.structure(), &bs = b.structure(), &os = out.structure();
    const T* ap = static_cast<const T*>(a.data());
    const T* bp = static_cast<const T*>(b.data());
    T* op = static_cast<T*>(out.mutable_data());
    // One task per (sample, leading index): the heads of a padded batch spread over threads.
    std::vector<std::pair<std::int64_t, std::vector<std::int64_t>>> tasks;
    std::vector<kern::SampleView> va, vb, vo;
    for (std::int64_t i = 0; i < as.batch(); ++i) {
        va.push_back(kern::sample_view(as, i));
        vb.push_back(kern::sample_view(bs, i));
        vo.push_back(kern::sample_view(os, i));
        std::vector<std::int64_t> lead(va.back().shape.begin(), va.back().shape.end() - 2);
        kern::for_each_index(lead, [&](const std::vector<std::int64_t>& li) {
            std::vector<std::int64_t> at = li;
            at.resize(va.back().shape.size(), 0);
            tasks.emplace_back(i, at);
        });
    }
    parallel_for(std::int64_t(tasks.size()), 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t t = lo; t < hi; ++t) {
            const auto& [i, at] = tasks[std::size_t(t)];
            const auto &A = va[std::size_t(i)], &B = vb[std::size_t(i)], &O = vo[std::size_t(i)];
            product(ap + A.at(at), last_two(A), bp + B.at(at), last_two(B), op + O.at(at),
                    last_two(O));
        }
    });
}

} // namespace

bool is_batched_gemm(const ir::Function& f, const ir::Node& n) {
    const DType t = n.type.dtype;
    return n.op == "matmul" && (t == DType::f32 || t == DType::f64) &&
           f.type(n.args[0]).shape.batched && f.type(n.args[1]).shape.batched;
}

RaggedTensor run_batched_gemm(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& a = vals[std::size_t(n.args[0])];
    const RaggedTensor& b = vals[std::size_t(n.args[1])];
    const Structure &as = a.structure(), &bs = b.structure();
    const int r = as.rank();
    bool shapes_agree = as.batch() == bs.batch() && bs.rank() == r;
    for (std::int64_t i = 0; shapes_agree && i < as.batch(); ++i) {
        auto sa = as.sample_shape(i), sb = bs.sample_shape(i);
        shapes_agree = std::equal(sa.begin(), sa.end() - 2, sb.begin()) &&
                       sa[std::size_t(r - 1)] == sb[std::size_t(r - 2)];
    }
    // Unequal runtime extents: the reference kernel names the sample.
    if (!shapes_agree) return reference_kernel(n.op, {a, b}, n.attrs);
    auto st = kern::make_structure(n.type.shape, as.batch(), [&](std::int64_t i) {
        auto s = as.sample_shape(i);
        std::vector<std::int64_t> out(s.begin(), s.end());
        out.back() = bs.size(i, r - 1);
        return out;
    });
    RaggedTensor out = uninitialized(n.type.dtype, st);
    if (n.type.dtype == DType::f32)
        run<float>(a, b, out);
    else
        run<double>(a, b, out);
    return out;
}

} // namespace rag::jit
