#include "bench/relpos/gather_baseline.hpp"

#include "ir/ops/relpos_config.hpp"
#include "runtime/parallel.hpp"

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace rag::bench {
namespace {

// C = A B (+ beta C), row-major; ta/tb transpose A/B.
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                int(m), int(n), int(k), 1.0f, a, int(lda), b, int(ldb), beta, c, int(ldc));
}
void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const double* a,
          std::int64_t lda, const double* b, std::int64_t ldb, double beta, double* c,
          std::int64_t ldc) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                int(m), int(n), int(k), 1.0, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

// The problem's extents and pointers, shared by forward and backward.
template <class T> struct Problem {
    RelposConfig cfg;
    std::int64_t B, H, D, Dv, R;
    const T *q, *k, *v, *aq = nullptr, *ak = nullptr, *bias = nullptr;
    std::span<const RaggedTensor> in;

    Problem(std::span<const RaggedTensor> inputs, const Attrs& at, bool with_dO)
        : cfg(relpos_check(inputs, at, "gather baseline", with_dO)), in(inputs) {
        B = in[0].batch();
        H = in[0].shape().axes[1].extent;
        D = in[0].shape().axes[2].extent;
        Dv = in[2].shape().axes[2].extent;
        R = cfg.map.rows();
        auto ptr = [&](std::size_t t) { return static_cast<const T*>(in[t].data()); };
        q = ptr(0), k = ptr(1), v = ptr(2);
        if (cfg.has[AQ]) aq = ptr(std::size_t(cfg.table_at[AQ]));
        if (cfg.has[AK]) ak = ptr(std::size_t(cfg.table_at[AK]));
        if (cfg.has[BIAS]) bias = ptr(std::size_t(cfg.table_at[BIAS]));
    }
    std::int64_t offset(std::int64_t s) const {
        return in[0].structure().offsets()[std::size_t(s)];
    }
    std::int64_t length(std::int64_t s) const { return in[0].structure().size(s, 0); }
    std::int64_t key_end(std::int64_t i, std::int64_t n) const { return cfg.causal ? i + 1 : n; }
};

// One head's scores with their relation terms, unnormalised: S_ij (masked entries unset).
template <class T> struct HeadScores {
    std::vector<T> s, zq, zk;
    std::vector<std::int64_t> rows; // rows[delta + n - 1] = phi(delta)
};

template <class T>
void head_scores(const Problem<T>& p, std::int64_t s, std::int64_t h, HeadScores<T>& hs) {
    const std::int64_t n = p.length(s), off = p.offset(s), HD = p.H * p.D, R = p.R;
    const T* qh = p.q + (off * p.H + h) * p.D;
    const T* kh = p.k + (off * p.H + h) * p.D;
    hs.s.assign(std::size_t(n * n), T(0));
    gemm(false, true, n, n, p.D, qh, HD, kh, HD, T(0), hs.s.data(), n);
    // Every query onto every relation row, one GEMM each (no reachable-range restriction).
    if (p.aq) {
        hs.zq.assign(std::size_t(n * R), T(0));
        gemm(false, true, n, R, p.D, qh, HD, p.aq + h * p.D, HD, T(0), hs.zq.data(), R);
    }
    if (p.ak) {
        hs.zk.assign(std::size_t(n * R), T(0));
        gemm(false, true, n, R, p.D, kh, HD, p.ak + h * p.D, HD, T(0), hs.zk.data(), R);
    }
    hs.rows.resize(std::size_t(std::max<std::int64_t>(2 * n - 1, 0)));
    for (std::int64_t d = -(n - 1); d <= n - 1; ++d)
        hs.rows[std::size_t(d + n - 1)] = p.cfg.map.row(d);
    const T tau = T(p.cfg.scale);
    parallel_for(n, 16, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) {
            T* row = &hs.s[std::size_t(i * n)];
            for (std::int64_t j = 0; j < p.key_end(i, n); ++j) {
                const std::size_t r = std::size_t(hs.rows[std::size_t(i - j + n - 1)]);
                T x = row[j];
                if (p.aq) x += hs.zq[std::size_t(i * R) + r];
                if (p.ak) x += hs.zk[std::size_t(j * R) + r];
                if (p.bias) x += p.bias[std::int64_t(r) * p.H + h];
                row[j] = tau * x;
            }
        }
    });
}

} // namespace

template <class T> GatherForward gather_forward(std::span<const RaggedTensor> in, const Attrs& at) {
    const Problem<T> p(in, at, false);
    GatherForward f;
    f.out = RaggedTensor::zeros(in[0].dtype(), in[2].structure_ptr());
    f.lse.assign(std::size_t(in[0].structure().rows() * p.H), 0.0);
    T* out = static_cast<T*>(f.out.mutable_data());
    HeadScores<T> hs;
    for (std::int64_t s = 0; s < p.B; ++s)
        for (std::int64_t h = 0; h < p.H; ++h) {
            const std::int64_t n = p.length(s), off = p.offset(s);
            if (n == 0) continue;
            head_scores(p, s, h, hs);
            parallel_for(n, 16, [&](std::int64_t i0, std::int64_t i1) {
                for (std::int64_t i = i0; i < i1; ++i) {
                    T* row = &hs.s[std::size_t(i * n)];
                    const std::int64_t e = p.key_end(i, n);
                    T top = -std::numeric_limits<T>::infinity(), z = 0;
                    for (std::int64_t j = 0; j < e; ++j) top = std::max(top, row[j]);
                    for (std::int64_t j = 0; j < e; ++j) z += row[j] = std::exp(row[j] - top);
                    for (std::int64_t j = 0; j < e; ++j) row[j] /= z;
                    for (std::int64_t j = e; j < n; ++j) row[j] = 0;
                    f.lse[std::size_t((off + i) * p.H + h)] = double(top) + std::log(double(z));
                }
            });
            gemm(false, false, n, p.Dv, n, hs.s.data(), n, p.v + (off * p.H + h) * p.Dv, p.H * p.Dv,
                 T(0), out + (off * p.H + h) * p.Dv, p.H * p.Dv);
        }
    return f;
}

template <class T>
std::vector<RaggedTensor> gather_backward(std::span<const RaggedTensor> in, const RaggedTensor& dO,
                                          const Attrs& at, const GatherForward& fwd) {
    std::vector<RaggedTensor> args(in.begin(), in.end());
    args.push_back(dO);
    const Problem<T> p(args, at, true);
    const std::int64_t HD = p.H * p.D, HDv = p.H * p.Dv, R = p.R;
    std::vector<RaggedTensor> g;
    for (const auto& t : in) g.push_back(RaggedTensor::zeros(t.dtype(), t.structure_ptr()));
    auto gptr = [&](std::size_t t) { return static_cast<T*>(g[t].mutable_data()); };
    T *dq = gptr(0), *dk = gptr(1), *dv = gptr(2);
    T* daq = p.aq ? gptr(std::size_t(p.cfg.table_at[AQ])) : nullptr;
    T* dak = p.ak ? gptr(std::size_t(p.cfg.table_at[AK])) : nullptr;
    T* dbias = p.bias ? gptr(std::size_t(p.cfg.table_at[BIAS])) : nullptr;
    const T* go = static_cast<const T*>(dO.data());
    const T* o = static_cast<const T*>(fwd.out.data());
    const T tau = T(p.cfg.scale);
    const bool zq = p.aq || p.bias; // dZ^Q also yields db
    HeadScores<T> hs;
    std::vector<T> dp, dzq, dzk;
    for (std::int64_t s = 0; s < p.B; ++s)
        for (std::int64_t h = 0; h < p.H; ++h) {
            const std::int64_t n = p.length(s), off = p.offset(s);
            if (n == 0) continue;
            const T *qh = p.q + (off * p.H + h) * p.D, *kh = p.k + (off * p.H + h) * p.D;
            const T* vh = p.v + (off * p.H + h) * p.Dv;
            const T* goh = go + (off * p.H + h) * p.Dv;
            head_scores(p, s, h, hs); // recomputed: nothing N x N outlives a head
            dp.assign(std::size_t(n * n), T(0));
            gemm(false, true, n, n, p.Dv, goh, HDv, vh, HDv, T(0), dp.data(), n);
            if (zq) dzq.assign(std::size_t(n * R), T(0));
            if (p.ak) dzk.assign(std::size_t(n * R), T(0));
            // P from the saved lse; G = tau P o (dP - D_i) in dp; dZ^Q by rows (one writer).
            parallel_for(n, 16, [&](std::int64_t i0, std::int64_t i1) {
                for (std::int64_t i = i0; i < i1; ++i) {
                    T* prow = &hs.s[std::size_t(i * n)];
                    T* grow = &dp[std::size_t(i * n)];
                    const T lse = T(fwd.lse[std::size_t((off + i) * p.H + h)]);
                    T di = 0;
                    for (std::int64_t x = 0; x < p.Dv; ++x)
                        di += goh[i * HDv + x] * o[(off + i) * HDv + h * p.Dv + x];
                    const std::int64_t e = p.key_end(i, n);
                    for (std::int64_t j = 0; j < e; ++j) {
                        prow[j] = std::exp(prow[j] - lse);
                        grow[j] = tau * prow[j] * (grow[j] - di);
                        if (zq)
                            dzq[std::size_t(i * R + hs.rows[std::size_t(i - j + n - 1)])] +=
                                grow[j];
                    }
                    for (std::int64_t j = e; j < n; ++j) prow[j] = grow[j] = 0;
                }
            });
            // dZ^K by columns (one writer per key).
            if (p.ak)
                parallel_for(n, 16, [&](std::int64_t j0, std::int64_t j1) {
                    for (std::int64_t j = j0; j < j1; ++j)
                        for (std::int64_t i = p.cfg.causal ? j : 0; i < n; ++i)
                            dzk[std::size_t(j * R + hs.rows[std::size_t(i - j + n - 1)])] +=
                                dp[std::size_t(i * n + j)];
                });
            T* dqh = dq + (off * p.H + h) * p.D;
            T* dkh = dk + (off * p.H + h) * p.D;
            gemm(true, false, n, p.Dv, n, hs.s.data(), n, goh, HDv, T(0),
                 dv + (off * p.H + h) * p.Dv, HDv);
            gemm(false, false, n, p.D, n, dp.data(), n, kh, HD, T(0), dqh, HD);
            gemm(true, false, n, p.D, n, dp.data(), n, qh, HD, T(0), dkh, HD);
            if (p.aq) {
                gemm(false, false, n, p.D, R, dzq.data(), R, p.aq + h * p.D, HD, T(1), dqh, HD);
                gemm(true, false, R, p.D, n, dzq.data(), R, qh, HD, T(1), daq + h * p.D, HD);
            }
            if (p.ak) {
                gemm(false, false, n, p.D, R, dzk.data(), R, p.ak + h * p.D, HD, T(1), dkh, HD);
                gemm(true, false, R, p.D, n, dzk.data(), R, kh, HD, T(1), dak + h * p.D, HD);
            }
            if (p.bias)
                for (std::int64_t i = 0; i < n; ++i)
                    for (std::int64_t r = 0; r < R; ++r)
                        dbias[r * p.H + h] += dzq[std::size_t(i * R + r)];
        }
    return g;
}

template GatherForward gather_forward<float>(std::span<const RaggedTensor>, const Attrs&);
template GatherForward gather_forward<double>(std::span<const RaggedTensor>, const Attrs&);
template std::vector<RaggedTensor> gather_backward<float>(std::span<const RaggedTensor>,
                                                          const RaggedTensor&, const Attrs&,
                                                          const GatherForward&);
template std::vector<RaggedTensor> gather_backward<double>(std::span<const RaggedTensor>,
                                                           const RaggedTensor&, const Attrs&,
                                                           const GatherForward&);

} // namespace rag::bench
