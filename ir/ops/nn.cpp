// Neural-network ops: normalisation over the static feature axis (layernorm, rmsnorm),
// counter-based dropout, the losses (mse, cross_entropy) and the ragged <-> dense bridge (pad,
// mask, lengths). Gradients that are awkward to compose from ops have dedicated backward ops
// here (layernorm_grad, rmsnorm_grad, mse_grad, cross_entropy_grad, unpad).
#include "ir/ops/nn.hpp"

#include "ir/ops/kernel_util.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace rag {
namespace {

// "(3, 4)", "(3,)", "()": a per-sample shape in messages, as Structure prints it.
std::string dims(std::span<const std::int64_t> s) {
    std::string out = "(";
    for (std::size_t a = 0; a < s.size(); ++a) out += (a ? ", " : "") + std::to_string(s[a]);
    return out + (s.size() == 1 ? ",)" : ")");
}

// Runtime check that two values of equal schema also have equal per-sample extents.
void require_same_structure(std::string_view op, const RaggedTensor& a, std::string_view an,
                            const RaggedTensor& b, std::string_view bn) {
    if (a.batch() != b.batch())
        fail(op, ": ", an, " has ", a.batch(), " samples but ", bn, " has ", b.batch());
    for (std::int64_t i = 0; i < a.batch(); ++i) {
        auto sa = a.structure().sample_shape(i), sb = b.structure().sample_shape(i);
        if (!std::equal(sa.begin(), sa.end(), sb.begin(), sb.end()))
            fail(op, ": sample ", i, " has shape ", dims(sa), " in ", an, " but ", dims(sb), " in ",
                 bn);
    }
}

Shape scalar_shape() {
    return Shape{false, {}};
}

RaggedTensor scalar(DType t, double v) {
    return RaggedTensor::from_f64(t, Structure::make(scalar_shape(), 1, {}), {v});
}

std::int64_t wrt_attr(const Attrs& at, std::string_view op, std::int64_t max) {
    std::int64_t w = at.get_int("wrt");
    if (w < 0 || w > max) fail(op, ": wrt must be in [0, ", max, "], got ", w);
    return w;
}

// ---- layernorm / rmsnorm -------------------------------------------------------------------

// x: [..., C] with a static last axis; in[1..nparams]: unbatched [C]; the rest (dy) equal x.
// Every operand has x's dtype. Returns x's schema.
Schema norm_rule(std::span<const Schema> in, std::size_t nparams, std::string_view op) {
    kern::require_float(in[0], op, "x");
    kern::require_same_dtype(in, op);
    const Shape& s = in[0].shape;
    if (s.axes.empty()) fail(op, ": x needs a last (feature) axis, got ", in[0].str());
    kern::require_fixed(s.axes.back(), op, "the last axis of x");
    const Shape param{false, {s.axes.back()}};
    for (std::size_t k = 1; k <= nparams; ++k)
        if (in[k].shape != param)
            fail(op, ": parameter ", k, " must be ", dtype_name(in[0].dtype), shape_str(param),
                 " to match x ", in[0].str(), ", got ", in[k].str());
    for (std::size_t k = nparams + 1; k < in.size(); ++k)
        if (in[k] != in[0])
            fail(op, ": dy must have x's schema ", in[0].str(), ", got ", in[k].str());
    return in[0];
}

// The static last axis is the innermost storage axis (storage keeps the non-ragged axes in
// logical order after the ragged ones), so the packed values are rows of C contiguous features.
std::size_t rows_of(const std::vector<double>& v, std::size_t C) {
    return C ? v.size() / C : 0;
}

struct Moments {
    double mean, rstd;
};

Moments layernorm_moments(const double* x, std::size_t C, double eps) {
    double mean = 0, var = 0;
    for (std::size_t j = 0; j < C; ++j) mean += x[j];
    mean /= double(C);
    for (std::size_t j = 0; j < C; ++j) var += (x[j] - mean) * (x[j] - mean);
    return {mean, 1.0 / std::sqrt(var / double(C) + eps)};
}

double rms_rstd(const double* x, std::size_t C, double eps) {
    double ms = 0;
    for (std::size_t j = 0; j < C; ++j) ms += x[j] * x[j];
    return 1.0 / std::sqrt(ms / double(C) + eps);
}

RaggedTensor layernorm(std::span<const RaggedTensor> in, double eps) {
    auto x = in[0].to_f64(), g = in[1].to_f64(), b = in[2].to_f64();
    const std::size_t C = g.size();
    for (std::size_t r = 0; r < rows_of(x, C); ++r) {
        double* row = x.data() + r * C;
        auto [mean, rstd] = layernorm_moments(row, C, eps);
        for (std::size_t j = 0; j < C; ++j) row[j] = (row[j] - mean) * rstd * g[j] + b[j];
    }
    return RaggedTensor::from_f64(in[0].dtype(), in[0].structure_ptr(), x);
}

// With xh = (x - mean) * rstd and dxh = dy * g:
// dx = rstd * (dxh - mean(dxh) - xh * mean(dxh * xh)), dg = sum dy * xh, db = sum dy.
RaggedTensor layernorm_grad(std::span<const RaggedTensor> in, double eps, std::int64_t wrt) {
    require_same_structure("layernorm_grad", in[0], "x", in[3], "dy");
    auto x = in[0].to_f64(), g = in[1].to_f64(), dy = in[3].to_f64();
    const std::size_t C = g.size();
    std::vector<double> dx(x.size()), dg(C, 0.0), db(C, 0.0), xh(C), dxh(C);
    for (std::size_t r = 0; r < rows_of(x, C); ++r) {
        const double *xr = x.data() + r * C, *dyr = dy.data() + r * C;
        auto [mean, rstd] = layernorm_moments(xr, C, eps);
        double m1 = 0, m2 = 0;
        for (std::size_t j = 0; j < C; ++j) {
            xh[j] = (xr[j] - mean) * rstd;
            dxh[j] = dyr[j] * g[j];
            m1 += dxh[j];
            m2 += dxh[j] * xh[j];
            dg[j] += dyr[j] * xh[j];
            db[j] += dyr[j];
        }
        m1 /= double(C);
        m2 /= double(C);
        for (std::size_t j = 0; j < C; ++j) dx[r * C + j] = rstd * (dxh[j] - m1 - xh[j] * m2);
    }
    const RaggedTensor& like = in[std::size_t(wrt)];
    return RaggedTensor::from_f64(like.dtype(), like.structure_ptr(),
                                  wrt == 0   ? dx
                                  : wrt == 1 ? dg
                                             : db);
}

RaggedTensor rmsnorm(std::span<const RaggedTensor> in, double eps) {
    auto x = in[0].to_f64(), g = in[1].to_f64();
    const std::size_t C = g.size();
    for (std::size_t r = 0; r < rows_of(x, C); ++r) {
        double* row = x.data() + r * C;
        double rstd = rms_rstd(row, C, eps);
        for (std::size_t j = 0; j < C; ++j) row[j] *= rstd * g[j];
    }
    return RaggedTensor::from_f64(in[0].dtype(), in[0].structure_ptr(), x);
}

// With r = 1 / sqrt(mean(x^2) + eps): dx = r * dy * g - x * r^3 * mean(dy * g * x),
// dg = sum dy * x * r.
RaggedTensor rmsnorm_grad(std::span<const RaggedTensor> in, double eps, std::int64_t wrt) {
    require_same_structure("rmsnorm_grad", in[0], "x", in[2], "dy");
    auto x = in[0].to_f64(), g = in[1].to_f64(), dy = in[2].to_f64();
    const std::size_t C = g.size();
    std::vector<double> dx(x.size()), dg(C, 0.0);
    for (std::size_t r = 0; r < rows_of(x, C); ++r) {
        const double *xr = x.data() + r * C, *dyr = dy.data() + r * C;
        double rstd = rms_rstd(xr, C, eps), m = 0;
        for (std::size_t j = 0; j < C; ++j) {
            m += dyr[j] * g[j] * xr[j];
            dg[j] += dyr[j] * xr[j] * rstd;
        }
        m /= double(C);
        for (std::size_t j = 0; j < C; ++j)
            dx[r * C + j] = rstd * dyr[j] * g[j] - xr[j] * rstd * rstd * rstd * m;
    }
    const RaggedTensor& like = in[std::size_t(wrt)];
    return RaggedTensor::from_f64(like.dtype(), like.structure_ptr(), wrt == 0 ? dx : dg);
}

void add_norms(OpTable& t) {
    t.add({"layernorm", 3, 3,
           "layernorm(x, g, b, eps=1e-5): (x - mean) / sqrt(var + eps) * g + b over the static "
           "last axis C (biased variance); g, b: [C]; keeps x's structure; C = 0 gives x",
           [](auto in, auto&) { return norm_rule(in, 2, "layernorm"); },
           [](auto in, auto& at) { return layernorm(in, at.get_float("eps", 1e-5)); },
           [](Emitter& e, auto in, Val, Val g, auto& at) -> std::vector<std::optional<Val>> {
               std::vector<std::optional<Val>> out;
               for (std::int64_t k = 0; k < 3; ++k)
                   out.push_back(e.emit("layernorm_grad", {in[0], in[1], in[2], g},
                                        {{"eps", at.get_float("eps", 1e-5)}, {"wrt", k}}));
               return out;
           }});
    t.add({"layernorm_grad",
           4,
           4,
           "layernorm_grad(x, g, b, dy, eps, wrt=0|1|2): the cotangent of x, g or b of layernorm; "
           "dg, db sum over every row of the batch",
           [](auto in, auto& at) {
               norm_rule(in, 2, "layernorm_grad");
               return in[std::size_t(wrt_attr(at, "layernorm_grad", 2))];
           },
           [](auto in, auto& at) {
               return layernorm_grad(in, at.get_float("eps", 1e-5), at.get_int("wrt"));
           },
           {}});
    t.add({"rmsnorm", 2, 2,
           "rmsnorm(x, g, eps=1e-6): x / sqrt(mean(x^2) + eps) * g over the static last axis C; "
           "g: [C]; keeps x's structure",
           [](auto in, auto&) { return norm_rule(in, 1, "rmsnorm"); },
           [](auto in, auto& at) { return rmsnorm(in, at.get_float("eps", 1e-6)); },
           [](Emitter& e, auto in, Val, Val g, auto& at) -> std::vector<std::optional<Val>> {
               std::vector<std::optional<Val>> out;
               for (std::int64_t k = 0; k < 2; ++k)
                   out.push_back(e.emit("rmsnorm_grad", {in[0], in[1], g},
                                        {{"eps", at.get_float("eps", 1e-6)}, {"wrt", k}}));
               return out;
           }});
    t.add({"rmsnorm_grad",
           3,
           3,
           "rmsnorm_grad(x, g, dy, eps, wrt=0|1): the cotangent of x or g of rmsnorm; dg sums "
           "over every row of the batch",
           [](auto in, auto& at) {
               norm_rule(in, 1, "rmsnorm_grad");
               return in[std::size_t(wrt_attr(at, "rmsnorm_grad", 1))];
           },
           [](auto in, auto& at) {
               return rmsnorm_grad(in, at.get_float("eps", 1e-6), at.get_int("wrt"));
           },
           {}});
}

} // namespace

// ---- dropout -------------------------------------------------------------------------------

namespace {
// One step of Vigna's splitmix64: the state z advanced by the golden gamma, then mixed.
std::uint64_t splitmix64_step(std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
} // namespace

// The counter-based uniform of packed element k: every tier (and the backward pass) regenerates
// the same mask from (seed, k) alone. Arithmetic is mod 2^64; the top 53 bits give [0, 1).
// k counts over the whole batch, so a sample's mask also depends on where it sits in the batch.
double dropout_uniform(std::int64_t seed, std::int64_t k) {
    std::uint64_t h =
        splitmix64_step(std::uint64_t(seed) * 0x9E3779B97F4A7C15ull + std::uint64_t(k));
    return double(h >> 11) * 0x1.0p-53;
}

double dropout_p(const Attrs& at) {
    double p = at.get_float("p");
    if (!(p >= 0 && p < 1)) fail("dropout: p must be in [0, 1), got ", p);
    return p;
}

// The counter of each packed element: its packed index; with shared_axis, its logical
// position (sample i, then every per-sample index, the shared axis's taken as 0) in 20-bit
// digits, k = (((i << 20) + j_0) << 20) + j_1 ... mod 2^64: one mask along the axis, and the
// same mask for a sample's valid entries wherever it is stored (padded execution too).
std::vector<std::int64_t> dropout_counters(const RaggedTensor& x, const Attrs& at) {
    std::vector<std::int64_t> k(std::size_t(x.numel()));
    if (!at.has("shared_axis")) {
        for (std::size_t e = 0; e < k.size(); ++e) k[e] = std::int64_t(e);
        return k;
    }
    const int a = dropout_shared_axis(x, at);
    for (const DropoutRun& r : dropout_runs(x.structure(), std::int64_t(1) << 62))
        for_each_dropout_counter(x.structure(), a, r, [&](std::int64_t off, std::int64_t c) {
            k[std::size_t(off)] = c;
        });
    return k;
}

int dropout_shared_axis(const RaggedTensor& x, const Attrs& at) {
    return kern::sample_axis(x.shape(), at.get_int("shared_axis"), "dropout");
}

std::vector<DropoutRun> dropout_runs(const Structure& st, std::int64_t len) {
    std::vector<DropoutRun> runs;
    for (std::int64_t i = 0; i < st.batch(); ++i) {
        std::int64_t n = 1;
        for (std::int64_t e : st.sample_shape(i)) n *= e;
        for (std::int64_t n0 = 0; n0 < n; n0 += len) runs.push_back({i, n0, std::min(n, n0 + len)});
    }
    return runs;
}

namespace {

void add_dropout(OpTable& t) {
    t.add({"dropout", 1, 1,
           "dropout(x, p, seed, shared_axis=): y = u >= p ? x / (1 - p) : 0 for the element at "
           "packed index k (with shared_axis: k = (((i << 20) + j_0) << 20) + j_1 ... of sample i "
           "and "
           "per-sample indices j with j_shared = 0, one mask shared along the axis), "
           "u = (splitmix64(seed * 0x9E3779B97F4A7C15 + k) >> 11) * 2^-53 (mod 2^64; splitmix64(z) "
           "adds 0x9E3779B97F4A7C15 then xor-shift-multiplies by 0xBF58476D1CE4E5B9 (>>30), "
           "0x94D049BB133111EB (>>27), xor >>31); p in [0, 1)",
           [](auto in, auto& at) {
               kern::require_float(in[0], "dropout", "x");
               dropout_p(at);
               at.get_int("seed");
               if (at.has("shared_axis"))
                   kern::sample_axis(in[0].shape, at.get_int("shared_axis"), "dropout");
               return in[0];
           },
           [](auto in, auto& at) {
               const double p = dropout_p(at);
               const std::int64_t seed = at.get_int("seed");
               auto v = in[0].to_f64();
               const auto k = dropout_counters(in[0], at);
               for (std::size_t e = 0; e < v.size(); ++e)
                   v[e] = dropout_uniform(seed, k[e]) >= p ? v[e] / (1 - p) : 0.0;
               return RaggedTensor::from_f64(in[0].dtype(), in[0].structure_ptr(), v);
           },
           // Linear in x with a mask fixed by (seed, k): the cotangent has x's structure, so
           // dropout of it with the same attributes applies the same mask and scale.
           [](Emitter& e, auto, Val, Val g, auto& at) -> std::vector<std::optional<Val>> {
               return {e.emit("dropout", {g}, at)};
           }});
}

// ---- losses --------------------------------------------------------------------------------

Schema mse_rule(std::span<const Schema> in, std::string_view op) {
    kern::require_float(in[0], op, "a");
    if (in[0] != in[1])
        fail(op, ": a and b must have the same schema, got ", in[0].str(), " and ", in[1].str());
    return {in[0].dtype, scalar_shape()};
}

void require_scalar_grad(const Schema& g, const Schema& want, std::string_view op) {
    if (g != want) fail(op, ": g must be the scalar ", want.str(), ", got ", g.str());
}

// logits [..., K] (K static), labels i32/i64 of logits' shape without the class axis.
Schema cross_entropy_rule(std::span<const Schema> in, std::string_view op) {
    const Schema &z = in[0], &y = in[1];
    kern::require_float(z, op, "logits");
    if (z.shape.axes.empty()) fail(op, ": logits need a class axis (the last), got ", z.str());
    kern::require_fixed(z.shape.axes.back(), op, "the class axis (last) of logits");
    if (y.dtype != DType::i32 && y.dtype != DType::i64)
        fail(op, ": labels must be i32 or i64, got ", y.str());
    Shape want = z.shape;
    want.axes.pop_back();
    if (y.shape != want)
        fail(op, ": labels must have shape ", shape_str(want), " (logits ", z.str(),
             " without the class axis), got ", y.str());
    return {z.dtype, scalar_shape()};
}

} // namespace

std::vector<std::int64_t> checked_labels(std::string_view op, const RaggedTensor& logits,
                                         const RaggedTensor& labels) {
    const Structure &zs = logits.structure(), &ys = labels.structure();
    if (zs.batch() != ys.batch())
        fail(op, ": logits have ", zs.batch(), " samples but labels have ", ys.batch());
    const std::int64_t K = logits.shape().axes.back().extent;
    std::vector<std::int64_t> y(std::size_t(labels.numel()));
    if (labels.dtype() == DType::i64)
        std::copy_n(static_cast<const std::int64_t*>(labels.data()), y.size(), y.begin());
    else
        std::copy_n(static_cast<const std::int32_t*>(labels.data()), y.size(), y.begin());
    for (std::int64_t i = 0; i < ys.batch(); ++i) {
        auto sz = zs.sample_shape(i), sy = ys.sample_shape(i);
        if (!std::equal(sy.begin(), sy.end(), sz.begin(), sz.end() - 1))
            fail(op, ": sample ", i, " has logits of shape ", dims(sz), " but labels of shape ",
                 dims(sy));
        // The class axis is innermost in storage and the other axes keep their storage order,
        // so packed label k owns the K logits starting at packed index k * K.
        for (std::int64_t k = ys.sample_begin(i); k < ys.sample_begin(i) + ys.sample_numel(i);
             ++k) {
            const std::int64_t label = y[std::size_t(k)];
            if (label >= 0 && label < K) continue;
            if (labels.shape().batched)
                fail(op, ": sample ", i, " has label ", label, " outside [0, ", K, ")");
            fail(op, ": label ", label, " is outside [0, ", K, ")");
        }
    }
    return y;
}

namespace {

// Calls fn(row, label) for every label position, after checked_labels: `row` points at its K
// logits.
template <class Fn>
void for_each_label(std::string_view op, const RaggedTensor& logits, const RaggedTensor& labels,
                    const std::vector<double>& z, Fn&& fn) {
    const std::int64_t K = logits.shape().axes.back().extent;
    const std::vector<std::int64_t> y = checked_labels(op, logits, labels);
    for (std::size_t k = 0; k < y.size(); ++k) fn(z.data() + std::int64_t(k) * K, y[k]);
}

// log(sum_j exp(row_j)) computed stably; -inf for K = 0 is never reached (no valid label).
double logsumexp(const double* row, std::int64_t K) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < K; ++j) m = std::max(m, row[j]);
    double s = 0;
    for (std::int64_t j = 0; j < K; ++j) s += std::exp(row[j] - m);
    return m + std::log(s);
}

void add_losses(OpTable& t) {
    t.add(
        {"mse", 2, 2,
         "mse(a, b): mean over every stored element of (a - b)^2 -> scalar []; a, b of one schema "
         "and structure; 0 elements give 0",
         [](auto in, auto&) { return mse_rule(in, "mse"); },
         [](auto in, auto&) {
             require_same_structure("mse", in[0], "a", in[1], "b");
             auto a = in[0].to_f64(), b = in[1].to_f64();
             double s = 0;
             for (std::size_t k = 0; k < a.size(); ++k) s += (a[k] - b[k]) * (a[k] - b[k]);
             return scalar(in[0].dtype(), a.empty() ? 0.0 : s / double(a.size()));
         },
         [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
             Val da = e.emit("mse_grad", {in[0], in[1], g});
             return {da, e.emit("neg", {da})};
         }});
    t.add({"mse_grad",
           3,
           3,
           "mse_grad(a, b, g): the cotangent of a of mse, 2 g (a - b) / numel",
           [](auto in, auto&) {
               Schema s = mse_rule(in, "mse_grad");
               require_scalar_grad(in[2], s, "mse_grad");
               return in[0];
           },
           [](auto in, auto&) {
               require_same_structure("mse_grad", in[0], "a", in[1], "b");
               auto a = in[0].to_f64(), b = in[1].to_f64();
               const double c = a.empty() ? 0.0 : 2 * in[2].item() / double(a.size());
               for (std::size_t k = 0; k < a.size(); ++k) a[k] = c * (a[k] - b[k]);
               return RaggedTensor::from_f64(in[0].dtype(), in[0].structure_ptr(), a);
           },
           {}});
    t.add(
        {"cross_entropy",
         2,
         2,
         "cross_entropy(logits, labels): mean over label positions of -log_softmax(logits)[label] "
         "-> scalar []; class axis last and static; labels i32/i64 in [0, K); 0 positions give 0",
         [](auto in, auto&) { return cross_entropy_rule(in, "cross_entropy"); },
         [](auto in, auto&) {
             const std::int64_t K = in[0].shape().axes.back().extent;
             auto z = in[0].to_f64();
             double s = 0, n = 0;
             for_each_label("cross_entropy", in[0], in[1], z,
                            [&](const double* row, std::int64_t y) {
                                s += logsumexp(row, K) - row[y];
                                n += 1;
                            });
             return scalar(in[0].dtype(), n ? s / n : 0.0);
         },
         [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
             return {e.emit("cross_entropy_grad", {in[0], in[1], g}), std::nullopt};
         },
         {1}});
    t.add({"cross_entropy_grad",
           3,
           3,
           "cross_entropy_grad(logits, labels, g): the cotangent of logits, g (softmax - onehot) / "
           "positions",
           [](auto in, auto&) {
               Schema s = cross_entropy_rule(in, "cross_entropy_grad");
               require_scalar_grad(in[2], s, "cross_entropy_grad");
               return in[0];
           },
           [](auto in, auto&) {
               const std::int64_t K = in[0].shape().axes.back().extent;
               auto z = in[0].to_f64();
               std::vector<double> dz(z.size(), 0.0);
               const double n = double(in[1].numel());
               const double c = n ? in[2].item() / n : 0.0;
               for_each_label("cross_entropy_grad", in[0], in[1], z,
                              [&](const double* row, std::int64_t y) {
                                  double* d = dz.data() + (row - z.data());
                                  const double lse = logsumexp(row, K);
                                  for (std::int64_t j = 0; j < K; ++j)
                                      d[j] = c * (std::exp(row[j] - lse) - (j == y ? 1.0 : 0.0));
                              });
               return RaggedTensor::from_f64(in[0].dtype(), in[0].structure_ptr(), dz);
           },
           {}});
}

// ---- pad / mask / lengths ------------------------------------------------------------------

// The dense envelope of a batched value: each ragged ~N becomes the symbolic N_max.
Shape padded_shape(const Schema& x, std::string_view op) {
    if (!x.shape.batched) fail(op, ": x must be batched, got ", x.str());
    Shape out{true, {}};
    for (const Axis& a : x.shape.axes)
        out.axes.push_back(a.is_ragged() ? Axis::symbolic_of(a.name + "_max") : a);
    return out;
}

StructurePtr padded_structure(const RaggedTensor& x) {
    auto env = x.structure().envelope();
    return kern::make_structure(padded_shape(x.schema(), "pad"), x.batch(),
                                [&](std::int64_t) { return env; });
}

// Copies the valid entries of the padded g back into x's packed layout.
RaggedTensor unpad(const RaggedTensor& g, const RaggedTensor& x) {
    const Structure &gs = g.structure(), &xs = x.structure();
    if (gs.batch() != xs.batch())
        fail("unpad: g has ", gs.batch(), " samples but x has ", xs.batch());
    auto env = xs.envelope();
    if (gs.batch() > 0 && !std::ranges::equal(gs.sample_shape(0), env))
        fail("unpad: g has per-sample shape ", dims(gs.sample_shape(0)),
             " but the envelope of x is ", dims(env));
    // g has no ragged axis: sample i is the row-major block [i * row_width, (i + 1) * row_width).
    std::vector<std::int64_t> pstride(env.size(), 1);
    for (std::size_t a = env.size(); a-- > 1;) pstride[a - 1] = pstride[a] * env[a];
    auto gv = g.to_f64();
    std::vector<double> out(std::size_t(x.numel()));
    for (std::int64_t i = 0; i < xs.batch(); ++i) {
        auto view = kern::sample_view(xs, i);
        kern::for_each_index(view.shape, [&](const std::vector<std::int64_t>& idx) {
            std::int64_t src = i * gs.row_width();
            for (std::size_t a = 0; a < idx.size(); ++a) src += idx[a] * pstride[a];
            out[std::size_t(view.at(idx))] = gv[std::size_t(src)];
        });
    }
    return RaggedTensor::from_f64(x.dtype(), x.structure_ptr(), out);
}

void add_padding(OpTable& t) {
    t.add({"pad", 1, 1,
           "pad(x, value=0.0): batched x to its dense envelope; each ragged ~N becomes N_max (the "
           "max over samples, 0 for B = 0); entries outside a sample are value",
           [](auto in, auto&) {
               return Schema{in[0].dtype, padded_shape(in[0], "pad")};
           },
           [](auto in, auto& at) {
               DenseArray d = in[0].to_padded(at.get_float("value", 0.0));
               return RaggedTensor::from_f64(in[0].dtype(), padded_structure(in[0]), d.to_f64());
           },
           [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
               return {e.emit("unpad", {g, in[0]})};
           }});
    t.add({"unpad",
           2,
           2,
           "unpad(g, x): the entries of g (shaped like pad(x)) that lie inside x's samples, in x's "
           "structure; x supplies only the structure",
           [](auto in, auto&) {
               Schema want{in[1].dtype, padded_shape(in[1], "unpad")};
               if (in[0] != want)
                   fail("unpad: g must be ", want.str(), " (pad of x ", in[1].str(), "), got ",
                        in[0].str());
               return in[1];
           },
           [](auto in, auto&) { return unpad(in[0], in[1]); },
           // unpad is linear in g and pad (with zeros) is its adjoint.
           [](Emitter& e, auto, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
               return {e.emit("pad", {g}), std::nullopt};
           },
           {1}});
    t.add({"mask",
           1,
           1,
           "mask(x): bool of pad(x)'s shape, true where the entry lies inside its sample; "
           "constant in x, so no gradient flows to x",
           [](auto in, auto&) {
               return Schema{DType::boolean, padded_shape(in[0], "mask")};
           },
           [](auto in, auto&) {
               return RaggedTensor::from_f64(DType::boolean, padded_structure(in[0]),
                                             in[0].mask().to_f64());
           },
           [](Emitter&, auto, Val, Val, auto&) -> std::vector<std::optional<Val>> {
               return {std::nullopt};
           },
           {0}});
    t.add({"lengths",
           1,
           1,
           "lengths(x, axis): i64[B], each sample's extent of the per-sample axis `axis` (logical "
           "numbering, batch axis = 0); no gradient flows to x",
           [](auto in, auto& at) {
               if (!in[0].shape.batched) fail("lengths: x must be batched, got ", in[0].str());
               kern::sample_axis(in[0].shape, at.get_int("axis"), "lengths");
               return Schema{DType::i64, Shape{true, {}}};
           },
           [](auto in, auto& at) {
               int a = kern::sample_axis(in[0].shape(), at.get_int("axis"), "lengths");
               auto l = in[0].structure().lengths(a);
               return RaggedTensor::from_f64(DType::i64,
                                             Structure::make(Shape{true, {}}, in[0].batch(), {}),
                                             std::vector<double>(l.begin(), l.end()));
           },
           [](Emitter&, auto, Val, Val, auto&) -> std::vector<std::optional<Val>> {
               return {std::nullopt};
           },
           {0}});
}

} // namespace

void register_nn_ops(OpTable& t) {
    add_norms(t);
    add_dropout(t);
    add_losses(t);
    add_padding(t);
}

} // namespace rag
