#include "jit/biased_attention_cpu.hpp"

#include "ir/interpreter.hpp"
#include "jit/blas.hpp"
#include "jit/placement.hpp"
#include "jit/segmented.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
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

// Elements of a scores block one thread may hold (RAG_ATTENTION_SCRATCH; default 4M, 16 MiB
// of f32): a row block of N queries whose N x M scores fit runs whole (one GEMM per product),
// a larger one in key tiles with an online softmax.
std::int64_t scratch_elements() {
    const char* env = std::getenv("RAG_ATTENTION_SCRATCH");
    const long long n = env ? std::atoll(env) : 0;
    return n > 0 ? n : std::int64_t(1) << 22;
}

// Keys per tile for N queries over M keys: M when N x M fits the scratch, else the most keys,
// a multiple of 16 and at least 16, whose N x tile block fits. A function of N and M alone,
// so the sums (and the bits) do not depend on the thread count.
std::int64_t key_tile(std::int64_t N, std::int64_t M) {
    const std::int64_t budget = scratch_elements();
    if (N * M <= budget) return M;
    return std::max<std::int64_t>(16, budget / std::max<std::int64_t>(N, 1) / 16 * 16);
}

template <class T> struct Run {
    // Per-thread scratch of the whole-row path (s, p, dp, db: N x M) and of the key tiles
    // (s, dp: N x tile; the rest N x width).
    struct Scratch {
        std::vector<T> s, p, dp, db, acc, pv, o, dq;
        std::vector<double> m, l, lse, delta;
    };

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
    void unit(std::int64_t i, std::int64_t h, Scratch& w) {
        const Rows q{in[0], d.axis}, k{in[1], d.axis}, v{in[2], d.axis};
        const std::int64_t N = q.len(i), M = k.len(i), R = q.rows(i);
        const std::int64_t ld = d.H * d.D, ldv = d.H * d.Dv;
        const T* bias = data(3) + in[3]->structure().sample_begin(i) + h;
        const std::int64_t tile = key_tile(N, M);
        if (tile < M) { // key tiles with an online softmax: scratch N x tile, not N x M
            for (std::int64_t r = 0; r < R; ++r) {
                const RowBlock b{data(0) + q.at(i, r, d.H, d.D) + h * d.D,
                                 data(1) + k.at(i, r, d.H, d.D) + h * d.D,
                                 data(2) + v.at(i, r, d.H, d.Dv) + h * d.Dv,
                                 bias,
                                 N,
                                 M};
                if (forward)
                    online(b, tile, w,
                           dst(0) + Rows{&out[0], d.axis}.at(i, r, d.H, d.Dv) + h * d.Dv,
                           d.H * d.Dv, nullptr);
                else
                    tiled_backward(
                        b, tile, w, data(4) + Rows{in[4], d.axis}.at(i, r, d.H, d.Dv) + h * d.Dv,
                        Grads{want[0] ? dst(0) + q.at(i, r, d.H, d.D) + h * d.D : nullptr,
                              want[1] ? dst(1) + k.at(i, r, d.H, d.D) + h * d.D : nullptr,
                              want[2] ? dst(2) + v.at(i, r, d.H, d.Dv) + h * d.Dv : nullptr,
                              want[3] ? dst(3) + in[3]->structure().sample_begin(i) + h : nullptr});
            }
            return;
        }
        std::vector<T>&s = w.s, &p = w.p, &dp = w.dp, &db = w.db;
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

    // ---- key tiles ----------------------------------------------------------------------
    // One row's attention, N queries over M keys, at the head's offsets (q, k: stride H * D;
    // v, O: stride H * Dv; bias: [N, M] with stride H).
    struct RowBlock {
        const T *Q, *K, *V, *bias;
        std::int64_t N, M;
    };
    // Where a row's gradients go (null: not wanted). dbias accumulates over a sample's rows.
    struct Grads {
        T *dQ, *dK, *dV, *dbias;
    };

    // s[N, t] = scale Q K[k0 : k0 + t]^T + bias[:, k0 : k0 + t] (-inf past the diagonal when
    // causal).
    void tile_scores(const RowBlock& b, std::int64_t k0, std::int64_t t, T* s) const {
        const std::int64_t ld = d.H * d.D;
        gemm(false, true, b.N, t, d.D, d.scale, b.Q, ld, b.K + k0 * ld, ld, s, t);
        for (std::int64_t n = 0; n < b.N; ++n)
            for (std::int64_t j = 0; j < t; ++j) {
                T& x = s[n * t + j];
                x = d.causal && k0 + j > n ? -std::numeric_limits<T>::infinity()
                                           : x + b.bias[(n * b.M + k0 + j) * d.H];
            }
    }

    // The online softmax over key tiles: m, l (row max and sum of exp(s - m)) and
    // acc = sum of exp(s - m) V, rescaled as m grows; O = acc / l (0 for a row without keys).
    // Also the row log-sum-exp (-inf without keys) when `lse` is given.
    void online(const RowBlock& b, std::int64_t tile, Scratch& w, T* O, std::int64_t ldo,
                double* lse) const {
        const std::int64_t ldv = d.H * d.Dv, N = b.N;
        w.s.resize(std::size_t(N * tile));
        w.acc.assign(std::size_t(N * d.Dv), T(0));
        w.pv.resize(w.acc.size());
        w.m.assign(std::size_t(N), -std::numeric_limits<double>::infinity());
        w.l.assign(std::size_t(N), 0.0);
        for (std::int64_t k0 = 0; k0 < b.M; k0 += tile) {
            const std::int64_t t = std::min(tile, b.M - k0);
            T* s = w.s.data();
            tile_scores(b, k0, t, s);
            for (std::int64_t n = 0; n < N; ++n) {
                T* row = s + n * t;
                double top = w.m[std::size_t(n)];
                for (std::int64_t j = 0; j < t; ++j) top = std::max(top, double(row[j]));
                if (top == -std::numeric_limits<double>::infinity()) { // no key yet
                    std::fill(row, row + t, T(0));
                    continue;
                }
                const double keep = std::exp(w.m[std::size_t(n)] - top); // 0 from -inf
                double sum = 0;
                for (std::int64_t j = 0; j < t; ++j) {
                    row[j] = T(std::exp(double(row[j]) - top));
                    sum += double(row[j]);
                }
                w.l[std::size_t(n)] = w.l[std::size_t(n)] * keep + sum;
                w.m[std::size_t(n)] = top;
                for (std::int64_t e = 0; e < d.Dv; ++e) w.acc[std::size_t(n * d.Dv + e)] *= T(keep);
            }
            gemm(false, false, N, d.Dv, t, 1.0, s, t, b.V + k0 * ldv, ldv, w.pv.data(), d.Dv);
            for (std::size_t e = 0; e < w.acc.size(); ++e) w.acc[e] += w.pv[e];
        }
        for (std::int64_t n = 0; n < N; ++n) {
            const double l = w.l[std::size_t(n)];
            for (std::int64_t e = 0; e < d.Dv; ++e)
                O[n * ldo + e] = l > 0 ? T(double(w.acc[std::size_t(n * d.Dv + e)]) / l) : T(0);
            if (lse) lse[n] = l > 0 ? w.m[std::size_t(n)] + std::log(l) : w.m[std::size_t(n)];
        }
    }

    // The forward again for O and the log-sum-exp, then per key tile: P = exp(s - lse),
    // dV and dK of the tile's keys (complete within it), dS = P o (dO V^T - rowsum(dO o O)),
    // dQ summed over the tiles in order, dbias added in place.
    void tiled_backward(const RowBlock& b, std::int64_t tile, Scratch& w, const T* dO,
                        const Grads& g) const {
        const std::int64_t N = b.N, ld = d.H * d.D, ldv = d.H * d.Dv;
        w.o.resize(std::size_t(N * d.Dv));
        w.lse.resize(std::size_t(N));
        online(b, tile, w, w.o.data(), d.Dv, w.lse.data());
        w.delta.resize(std::size_t(N));
        for (std::int64_t n = 0; n < N; ++n) {
            double sum = 0;
            for (std::int64_t e = 0; e < d.Dv; ++e)
                sum += double(dO[n * ldv + e]) * double(w.o[std::size_t(n * d.Dv + e)]);
            w.delta[std::size_t(n)] = sum;
        }
        w.dp.resize(std::size_t(N * tile));
        w.dq.resize(std::size_t(N * d.D));
        for (std::int64_t k0 = 0; k0 < b.M; k0 += tile) {
            const std::int64_t t = std::min(tile, b.M - k0);
            T *s = w.s.data(), *dp = w.dp.data();
            tile_scores(b, k0, t, s);
            for (std::int64_t n = 0; n < N; ++n) // P, in place of the scores
                for (std::int64_t j = 0; j < t; ++j) {
                    const double lse = w.lse[std::size_t(n)];
                    T& x = s[n * t + j];
                    x = lse == -std::numeric_limits<double>::infinity()
                            ? T(0)
                            : T(std::exp(double(x) - lse));
                }
            if (g.dV) // dV[k0 : k0 + t] = P^T dO
                gemm(true, false, t, d.Dv, N, 1.0, s, t, dO, ldv, g.dV + k0 * ldv, ldv);
            if (!g.dQ && !g.dK && !g.dbias) continue;
            gemm(false, true, N, t, d.Dv, 1.0, dO, ldv, b.V + k0 * ldv, ldv, dp, t);
            for (std::int64_t n = 0; n < N; ++n)
                for (std::int64_t j = 0; j < t; ++j) {
                    T& x = dp[n * t + j];
                    x = s[n * t + j] * T(double(x) - w.delta[std::size_t(n)]);
                }
            if (g.dbias)
                for (std::int64_t n = 0; n < N; ++n)
                    for (std::int64_t j = 0; j < t; ++j)
                        g.dbias[(n * b.M + k0 + j) * d.H] += dp[n * t + j];
            if (g.dK) // dK[k0 : k0 + t] = scale dS^T Q
                gemm(true, false, t, d.D, N, d.scale, dp, t, b.Q, ld, g.dK + k0 * ld, ld);
            if (g.dQ) { // dQ += scale dS K[k0 : k0 + t], tile by tile
                gemm(false, false, N, d.D, t, d.scale, dp, t, b.K + k0 * ld, ld, w.dq.data(), d.D);
                for (std::int64_t n = 0; n < N; ++n)
                    for (std::int64_t e = 0; e < d.D; ++e)
                        g.dQ[n * ld + e] += w.dq[std::size_t(n * d.D + e)];
            }
        }
    }

    void operator()() {
        const std::int64_t B = in[0]->batch();
        parallel_for(B * d.H, 1, [&](std::int64_t u0, std::int64_t u1) {
            Scratch w;
            for (std::int64_t u = u0; u < u1; ++u) unit(u / d.H, u % d.H, w);
        });
    }
};

} // namespace

bool biased_lengths_agree(const std::vector<const RaggedTensor*>& in, int axis) {
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

StructurePtr biased_out_structure(const RaggedTensor& q, const Shape& shape, std::int64_t Dv) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t s = 0; s < q.batch(); ++s) {
        auto sh = q.structure().sample_shape(s);
        sizes.insert(sizes.end(), sh.begin(), sh.end());
        sizes.back() = Dv;
    }
    return Structure::make(shape, q.batch(), std::move(sizes));
}

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
    if (!biased_lengths_agree(in, axis)) {
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
            RaggedTensor::zeros(n.type.dtype, biased_out_structure(*in[0], n.type.shape, d.Dv));
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
