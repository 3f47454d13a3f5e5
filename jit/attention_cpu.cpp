#include "jit/attention_cpu.hpp"

#include "jit/blas.hpp"
#include "jit/placement.hpp"
#include "jit/segmented.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace rag::jit {
namespace {

// C[m, n] = alpha op(A) op(B) (beta = 0), row-major with leading dimensions; nothing when a
// dimension is 0 (the caller's output is already zero).
void gemm(bool ta, bool tb, int m, int n, int k, double alpha, const float* a, int lda,
          const float* b, int ldb, float* c, int ldc) {
    jit::gemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, float(alpha), a, lda, b, ldb, c, ldc);
}
void gemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda,
          const double* b, int ldb, double* c, int ldc) {
    jit::gemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, c, ldc);
}

// sum_j a[j] b[j], accumulated in double.
double dot(int n, const float* a, const float* b) {
    own_blas_threads();
    return cblas_dsdot(n, a, 1, b, 1);
}
double dot(int n, const double* a, const double* b) {
    own_blas_threads();
    return cblas_ddot(n, a, 1, b, 1);
}

struct Dims {
    std::int64_t H, D, Dv;
    bool causal;
    double scale;
};

// p[N, M] = softmax(scale q k^T) of one sample and head, top-left causal mask applied; masked
// entries are 0 and a row without visible keys is all 0. `s` is scratch of p's size.
template <class T>
void probabilities(const T* q, const T* k, std::int64_t N, std::int64_t M, const Dims& d, T* s,
                   T* p) {
    gemm(false, true, int(N), int(M), int(d.D), d.scale, q, int(d.H * d.D), k, int(d.H * d.D), s,
         int(M));
    softmax_rows(std::is_same_v<T, float> ? DType::f32 : DType::f64, s, p, N, M, d.causal);
}

template <class T>
void run_typed(const std::vector<const RaggedTensor*>& in, const Dims& d, bool forward,
               const bool want[3], std::vector<RaggedTensor>& out) {
    const RaggedTensor &q = *in[0], &k = *in[1], &v = *in[2];
    const std::int64_t B = q.batch(), H = d.H;
    const T *qp = static_cast<const T*>(q.data()), *kp = static_cast<const T*>(k.data()),
            *vp = static_cast<const T*>(v.data());
    const T* dop = forward ? nullptr : static_cast<const T*>(in[3]->data());
    T* o[3] = {};
    for (int w = 0; w < 3; ++w)
        if (out[std::size_t(w)].structure_ptr())
            o[w] = static_cast<T*>(out[std::size_t(w)].mutable_data());
    const int ld = int(H * d.D), ldv = int(H * d.Dv);
    parallel_for(B * H, 1, [&](std::int64_t u0, std::int64_t u1) {
        std::vector<T> s, p, dp;
        for (std::int64_t u = u0; u < u1; ++u) {
            const std::int64_t i = u / H, h = u % H;
            const std::int64_t N = q.structure().size(i, 0), M = k.structure().size(i, 0);
            const T* Q = qp + q.structure().sample_begin(i) + h * d.D;
            const T* K = kp + k.structure().sample_begin(i) + h * d.D;
            const T* V = vp + v.structure().sample_begin(i) + h * d.Dv;
            s.assign(std::size_t(N * M), T(0));
            p.resize(s.size());
            probabilities(Q, K, N, M, d, s.data(), p.data());
            if (forward) { // O = P V
                gemm(false, false, int(N), int(d.Dv), int(M), 1.0, p.data(), int(M), V, ldv,
                     o[0] + out[0].structure().sample_begin(i) + h * d.Dv, ldv);
                continue;
            }
            const T* dO = dop + in[3]->structure().sample_begin(i) + h * d.Dv;
            if (want[2]) // dV = P^T dO
                gemm(true, false, int(M), int(d.Dv), int(N), 1.0, p.data(), int(M), dO, ldv,
                     o[2] + out[2].structure().sample_begin(i) + h * d.Dv, ldv);
            if (!want[0] && !want[1]) continue;
            // dP = dO V^T, dS = P o (dP - rowsum(dP o P)).
            dp.assign(std::size_t(N * M), T(0));
            gemm(false, true, int(N), int(M), int(d.Dv), 1.0, dO, ldv, V, ldv, dp.data(), int(M));
            for (std::int64_t n = 0; n < N; ++n) {
                T* row = dp.data() + n * M;
                const T* pr = p.data() + n * M;
                const T rowsum = T(dot(int(M), row, pr));
                for (std::int64_t j = 0; j < M; ++j) row[j] = pr[j] * (row[j] - rowsum);
            }
            if (want[0]) // dQ = scale dS K
                gemm(false, false, int(N), int(d.D), int(M), d.scale, dp.data(), int(M), K, ld,
                     o[0] + out[0].structure().sample_begin(i) + h * d.D, ld);
            if (want[1]) // dK = scale dS^T Q
                gemm(true, false, int(M), int(d.D), int(N), d.scale, dp.data(), int(M), Q, ld,
                     o[1] + out[1].structure().sample_begin(i) + h * d.D, ld);
        }
    });
}

// Runtime lengths that the reference kernel would reject: it runs instead and names the sample.
bool lengths_agree(const std::vector<const RaggedTensor*>& in) {
    const std::int64_t B = in[0]->batch();
    auto len = [](const RaggedTensor* t, std::int64_t i) { return t->structure().size(i, 0); };
    for (const RaggedTensor* t : in)
        if (t->batch() != B) return false;
    const bool self = in[0]->shape().axes[0] == in[1]->shape().axes[0];
    for (std::int64_t i = 0; i < B; ++i) {
        if (len(in[1], i) != len(in[2], i)) return false;
        if (self && len(in[0], i) != len(in[1], i)) return false;
        if (in.size() > 3 && len(in[0], i) != len(in[3], i)) return false;
    }
    return true;
}

} // namespace

bool is_attention(const ir::Node& n) {
    return (n.op == "attention" || n.op == "attention_grad") &&
           (n.type.dtype == DType::f32 || n.type.dtype == DType::f64);
}

bool same_attention_grad(const ir::Node& a, const ir::Node& b) {
    if (a.op != b.op || (a.op != "attention_grad" && a.op != "biased_attention_grad") ||
        a.args != b.args)
        return false;
    Attrs x = a.attrs, y = b.attrs;
    x.set("wrt", std::int64_t(0));
    y.set("wrt", std::int64_t(0));
    return x.str() == y.str();
}

void run_attention(const ir::Function& f, int i, const std::vector<int>& also,
                   std::vector<RaggedTensor>& vals) {
    const ir::Node& n = f.nodes[std::size_t(i)];
    std::vector<const RaggedTensor*> in;
    std::vector<RaggedTensor> args;
    for (int a : n.args) {
        in.push_back(&vals[std::size_t(a)]);
        args.push_back(vals[std::size_t(a)]);
    }
    if (!lengths_agree(in)) {
        vals[std::size_t(i)] = reference_kernel(n.op, args, n.attrs); // throws, naming the sample
        return;
    }
    const bool forward = n.op == "attention";
    const std::int64_t D = in[0]->shape().axes[2].extent;
    const Dims d{in[0]->shape().axes[1].extent, D, in[2]->shape().axes[2].extent,
                 n.attrs.get_bool("causal", false),
                 n.attrs.get_float("scale", 1.0 / std::sqrt(double(D)))};
    std::vector<int> nodes = {i};
    nodes.insert(nodes.end(), also.begin(), also.end());
    bool want[3] = {forward, false, false};
    std::vector<RaggedTensor> out(3);
    if (forward) {
        std::vector<std::int64_t> sizes;
        for (std::int64_t s = 0; s < in[0]->batch(); ++s)
            sizes.insert(sizes.end(), {in[0]->structure().size(s, 0), d.H, d.Dv});
        out[0] = RaggedTensor::zeros(
            n.type.dtype, Structure::make(n.type.shape, in[0]->batch(), std::move(sizes)));
    } else {
        for (int v : nodes) {
            const std::int64_t w = f.nodes[std::size_t(v)].attrs.get_int("wrt");
            want[w] = true;
            out[std::size_t(w)] =
                RaggedTensor::zeros(n.type.dtype, in[std::size_t(w)]->structure_ptr());
        }
    }
    if (n.type.dtype == DType::f32)
        run_typed<float>(in, d, forward, want, out);
    else
        run_typed<double>(in, d, forward, want, out);
    if (forward) {
        vals[std::size_t(i)] = out[0];
        return;
    }
    for (int v : nodes)
        vals[std::size_t(v)] = out[std::size_t(f.nodes[std::size_t(v)].attrs.get_int("wrt"))];
}

} // namespace rag::jit
