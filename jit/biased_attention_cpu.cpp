#include "jit/biased_attention_cpu.hpp"

#include "ir/interpreter.hpp"
#include "jit/blas.hpp"
#include "jit/placement.hpp"
#include "jit/segmented.hpp"
#include "runtime/parallel.hpp"

#include <cmath>
#include <type_traits>

namespace rag::jit {
namespace {

void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c,
          std::int64_t ldc) {
    if (m == 0 || n == 0) return;
    jit::gemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), float(alpha), a, int(lda), b, int(ldb), c, int(ldc));
}
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double* c,
          std::int64_t ldc) {
    if (m == 0 || n == 0) return;
    jit::gemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), c, int(ldc));
}

struct Dims {
    int axis;
    std::int64_t H, D, Dv;
    bool causal;
    double scale;
};

// Where one (sample, row)'s [L, H, width] block of a q/k/v/dO-like tensor starts, and L.
struct Rows {
    const RaggedTensor* t;
    int axis;
    std::int64_t len(std::int64_t i) const { return t->structure().size(i, axis - 1); }
    std::int64_t rows(std::int64_t i) const { return axis == 2 ? t->structure().size(i, 0) : 1; }
    // Element offset of row r of sample i; `width`: the last axis.
    std::int64_t at(std::int64_t i, std::int64_t r, std::int64_t H, std::int64_t width) const {
        return t->structure().sample_begin(i) + r * len(i) * H * width;
    }
};

template <class T> struct Run {
    const std::vector<const RaggedTensor*>& in;
    const Dims& d;
    bool forward;
    const bool* want;               // q, k, v, bias
    std::vector<RaggedTensor>& out; // forward: [0]; backward: by wrt

    const T* data(std::size_t k) const { return static_cast<const T*>(in[k]->data()); }
    T* dst(std::size_t k) { return static_cast<T*>(out[k].mutable_data()); }

    // s[N, M] = scale q k^T + bias[:, :, h], then p = softmax of its rows.
    void probabilities(const T* Q, const T* K, const T* bias, std::int64_t N, std::int64_t M, T* s,
                       T* p) const {
        const std::int64_t ld = d.H * d.D;
        gemm(false, true, N, M, d.D, d.scale, Q, ld, K, ld, s, M);
        for (std::int64_t e = 0; e < N * M; ++e) s[e] += bias[e * d.H];
        softmax_rows(std::is_same_v<T, float> ? DType::f32 : DType::f64, s, p, N, M, d.causal);
    }

    // One (sample, head): its rows in order, so the bias gradient sums them in a fixed order.
    void unit(std::int64_t i, std::int64_t h, std::vector<T>& s, std::vector<T>& p,
              std::vector<T>& dp, std::vector<T>& db) {
        const Rows q{in[0], d.axis}, k{in[1], d.axis}, v{in[2], d.axis};
        const std::int64_t N = q.len(i), M = k.len(i), R = q.rows(i);
        const std::int64_t ld = d.H * d.D, ldv = d.H * d.Dv;
        const T* bias = data(3) + in[3]->structure().sample_begin(i) + h;
        s.resize(std::size_t(N * M));
        p.resize(s.size());
        if (want[3]) db.assign(s.size(), T(0));
        for (std::int64_t r = 0; r < R; ++r) {
            const T* Q = data(0) + q.at(i, r, d.H, d.D) + h * d.D;
            const T* K = data(1) + k.at(i, r, d.H, d.D) + h * d.D;
            const T* V = data(2) + v.at(i, r, d.H, d.Dv) + h * d.Dv;
            probabilities(Q, K, bias, N, M, s.data(), p.data());
            if (forward) { // O = P V
                gemm(false, false, N, d.Dv, M, 1.0, p.data(), M, V, ldv,
                     dst(0) + Rows{&out[0], d.axis}.at(i, r, d.H, d.Dv) + h * d.Dv, ldv);
                continue;
            }
            const T* dO = data(4) + Rows{in[4], d.axis}.at(i, r, d.H, d.Dv) + h * d.Dv;
            if (want[2]) // dV = P^T dO
                gemm(true, false, M, d.Dv, N, 1.0, p.data(), M, dO, ldv,
                     dst(2) + v.at(i, r, d.H, d.Dv) + h * d.Dv, ldv);
            if (!want[0] && !want[1] && !want[3]) continue;
            // dP = dO V^T, dS = P o (dP - rowsum(dP o P)), summed in double per row.
            dp.resize(s.size());
            gemm(false, true, N, M, d.Dv, 1.0, dO, ldv, V, ldv, dp.data(), M);
            for (std::int64_t n = 0; n < N; ++n) {
                T* row = dp.data() + n * M;
                const T* pr = p.data() + n * M;
                double rowsum = 0;
                for (std::int64_t m = 0; m < M; ++m) rowsum += double(row[m]) * double(pr[m]);
                for (std::int64_t m = 0; m < M; ++m) row[m] = pr[m] * (row[m] - T(rowsum));
            }
            if (want[3])
                for (std::size_t e = 0; e < db.size(); ++e) db[e] += dp[e];
            if (want[0]) // dQ = scale dS K
                gemm(false, false, N, d.D, M, d.scale, dp.data(), M, K, ld,
                     dst(0) + q.at(i, r, d.H, d.D) + h * d.D, ld);
            if (want[1]) // dK = scale dS^T Q
                gemm(true, false, M, d.D, N, d.scale, dp.data(), M, Q, ld,
                     dst(1) + k.at(i, r, d.H, d.D) + h * d.D, ld);
        }
        if (want[3]) {
            T* g = dst(3) + in[3]->structure().sample_begin(i) + h;
            for (std::size_t e = 0; e < db.size(); ++e) g[std::int64_t(e) * d.H] = db[e];
        }
    }

    void operator()() {
        const std::int64_t B = in[0]->batch();
        parallel_for(B * d.H, 1, [&](std::int64_t u0, std::int64_t u1) {
            std::vector<T> s, p, dp, db;
            for (std::int64_t u = u0; u < u1; ++u) unit(u / d.H, u % d.H, s, p, dp, db);
        });
    }
};

// Runtime lengths the reference kernel would reject: it runs instead and names the sample.
bool lengths_agree(const std::vector<const RaggedTensor*>& in, int axis) {
    const std::int64_t B = in[0]->batch();
    for (const RaggedTensor* t : in)
        if (t->batch() != B) return false;
    const int n = axis - 1;
    auto size = [&](std::size_t k, int a, std::int64_t i) { return in[k]->structure().size(i, a); };
    for (std::int64_t i = 0; i < B; ++i) {
        if (axis == 2 && (size(0, 0, i) != size(1, 0, i) || size(0, 0, i) != size(2, 0, i)))
            return false;
        if (size(1, n, i) != size(2, n, i) || size(3, 0, i) != size(0, n, i) ||
            size(3, 1, i) != size(1, n, i))
            return false;
        if (in.size() > 4 &&
            (size(4, n, i) != size(0, n, i) || (axis == 2 && size(4, 0, i) != size(0, 0, i))))
            return false;
    }
    return true;
}

} // namespace

bool is_biased_attention(const ir::Node& n) {
    return (n.op == "biased_attention" || n.op == "biased_attention_grad") &&
           (n.type.dtype == DType::f32 || n.type.dtype == DType::f64);
}

void run_biased_attention(const ir::Function& f, int i, const std::vector<int>& also,
                          std::vector<RaggedTensor>& vals) {
    const ir::Node& n = f.nodes[std::size_t(i)];
    std::vector<const RaggedTensor*> in;
    std::vector<RaggedTensor> args;
    for (int a : n.args) {
        in.push_back(&vals[std::size_t(a)]);
        args.push_back(vals[std::size_t(a)]);
    }
    const int axis = int(n.attrs.get_int("axis", 1));
    if (!lengths_agree(in, axis)) {
        vals[std::size_t(i)] = reference_kernel(n.op, args, n.attrs); // throws, naming the sample
        return;
    }
    const bool forward = n.op == "biased_attention";
    const auto& qa = in[0]->shape().axes;
    const std::int64_t D = qa.back().extent;
    const Dims d{axis,
                 qa[qa.size() - 2].extent,
                 D,
                 in[2]->shape().axes.back().extent,
                 n.attrs.get_bool("causal", false),
                 n.attrs.get_float("scale", 1.0 / std::sqrt(double(D)))};
    std::vector<int> nodes = {i};
    nodes.insert(nodes.end(), also.begin(), also.end());
    bool want[4] = {false, false, false, false};
    std::vector<RaggedTensor> out(4);
    if (forward) {
        out[0] =
            RaggedTensor::zeros(n.type.dtype, Structure::make(n.type.shape, in[0]->batch(), [&] {
                                    std::vector<std::int64_t> sizes;
                                    for (std::int64_t s = 0; s < in[0]->batch(); ++s) {
                                        auto sh = in[0]->structure().sample_shape(s);
                                        sizes.insert(sizes.end(), sh.begin(), sh.end());
                                        sizes.back() = d.Dv;
                                    }
                                    return sizes;
                                }()));
    } else {
        for (int v : nodes) {
            const std::int64_t w = f.nodes[std::size_t(v)].attrs.get_int("wrt");
            want[w] = true;
            out[std::size_t(w)] =
                RaggedTensor::zeros(n.type.dtype, in[std::size_t(w)]->structure_ptr());
        }
    }
    if (n.type.dtype == DType::f32)
        Run<float>{in, d, forward, want, out}();
    else
        Run<double>{in, d, forward, want, out}();
    if (forward) {
        vals[std::size_t(i)] = out[0];
        return;
    }
    for (int v : nodes)
        vals[std::size_t(v)] = out[std::size_t(f.nodes[std::size_t(v)].attrs.get_int("wrt"))];
}

} // namespace rag::jit
