// Relative-position attention, the naive reference (REFERENCE.md section 2). Per sample and
// head it materialises the N x N scores, gathering every relation term for each (i, j):
//   S_ij = scale (q_i.k_j + q_i.aq[r] + k_j.ak[r] + bias[r]) + mask_ij,  r = phi(i - j),
//   O = softmax_row(S) V.
// It is the oracle the fused tile kernels are checked against, so it stays plain loops in
// double. Its gradient is the dedicated op relpos_attention_grad (the paper's equations).
#include "ir/ops/kernel_util.hpp"
#include "ir/ops/relpos_config.hpp"
#include "runtime/relpos_map.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

namespace rag {
namespace {

constexpr const char* op_name = "relpos_attention";
constexpr const char* grad_name = "relpos_attention_grad";

constexpr const char* table_names[] = {"aq", "ak", "bias"};
using Config = RelposConfig;

RelposMap make_map(const std::string& name, const Attrs& at, std::optional<std::int64_t> R,
                   std::string_view op) {
    if (name == "identity") {
        if (!R) fail(op, ": map \"identity\" takes L from the table rows R = 2L - 1; give a table");
        if (*R % 2 == 0) fail(op, ": map \"identity\" needs R = 2L - 1 table rows, got ", *R);
    }
    std::optional<RelposMap> m;
    try {
        if (name == "identity") m = RelposMap::identity((*R + 1) / 2);
        if (name == "clip") m = RelposMap::clip(at.get_int("distance"));
        if (name == "t5_buckets")
            m = RelposMap::t5_buckets(at.get_int("num", 32), at.get_int("max_distance", 128));
        if (name == "log_buckets")
            m = RelposMap::log_buckets(at.get_int("size", 256), at.get_int("max_position", 512));
        if (name == "buckets") m = RelposMap::buckets(at.get_ints("table"), at.get_int("distance"));
    } catch (const Error& e) {
        fail(op, ": ", e.what());
    }
    if (!m)
        fail(op, ": unknown map \"", name, "\" (identity, clip, t5_buckets, log_buckets, buckets)");
    if (R && *R != m->rows())
        fail(op, ": ", m->str(), " has ", m->rows(), " rows but the tables have ", *R);
    return *m;
}

} // namespace

RelposConfig relpos_decode(std::span<const Schema> in, const Attrs& at, std::string_view op) {
    bool has[3], causal;
    std::string map_name;
    try {
        for (int t : {AQ, AK, BIAS}) has[t] = at.get_bool(table_names[t], false);
        causal = at.get_bool("causal", false);
        map_name = at.get_str("map");
    } catch (const Error& e) {
        fail(op, ": ", e.what());
    }
    std::string want = "q, k, v";
    for (int t : {AQ, AK, BIAS})
        if (has[t]) want += std::string(", ") + table_names[t];
    const std::size_t n = 3 + std::size_t(has[AQ] + has[AK] + has[BIAS]);
    if (in.size() != n)
        fail(op, ": the attrs aq, ak, bias ask for ", n, " inputs (", want, "), got ", in.size());
    kern::require_float(in[0], op, "q");
    kern::require_same_dtype(in, op);

    const Schema *q = &in[0], *k = &in[1], *v = &in[2];
    for (auto [s, name] : {std::pair{q, "q"}, {k, "k"}, {v, "v"}}) {
        if (s->shape.sample_rank() != 3)
            fail(op, ": ", name, " must be [B, ~N, H, D], got ", s->str());
        kern::require_fixed(s->shape.axes[1], op, std::string(name) + "'s head axis");
        kern::require_fixed(s->shape.axes[2], op, std::string(name) + "'s feature axis");
    }
    const auto &qa = q->shape.axes, &ka = k->shape.axes, &va = v->shape.axes;
    if (k->shape.batched != q->shape.batched || v->shape.batched != q->shape.batched ||
        ka[0] != qa[0] || va[0] != qa[0])
        fail(op, ": q, k and v must share one token axis (self-attention), got ", q->str(), ", ",
             k->str(), ", ", v->str());
    const std::int64_t H = qa[1].extent, D = qa[2].extent;
    if (ka[1].extent != H || va[1].extent != H || ka[2].extent != D)
        fail(op, ": q and k must be [.., H, D] and v [.., H, Dv] with one H, got ", q->str(), ", ",
             k->str(), ", ", v->str());
    if (D < 1) fail(op, ": the head dimension D must be positive, got ", q->str());

    int table_at[3] = {-1, -1, -1};
    std::optional<std::int64_t> R;
    std::size_t next = 3;
    for (int t : {AQ, AK, BIAS}) {
        if (!has[t]) continue;
        table_at[t] = int(next);
        const Schema& s = in[next++];
        const int rank = t == BIAS ? 2 : 3;
        const auto& a = s.shape.axes;
        bool ok = !s.shape.batched && s.shape.sample_rank() == rank;
        for (int x = 0; ok && x < rank; ++x) ok = a[std::size_t(x)].kind == AxisKind::fixed;
        if (!ok || a[1].extent != H || (rank == 3 && a[2].extent != D))
            fail(op, ": ", table_names[t], " must be an unbatched ",
                 rank == 3 ? "[R, " + std::to_string(H) + ", " + std::to_string(D) + "]"
                           : "[R, " + std::to_string(H) + "]",
                 " table, got ", s.str());
        if (R && *R != a[0].extent)
            fail(op, ": the tables must have the same rows, got ", *R, " and ", a[0].extent, " (",
                 table_names[t], ")");
        R = a[0].extent;
    }
    RelposMap map = make_map(map_name, at, R, op);
    double scale = 0;
    try {
        scale = at.get_float("scale", 1.0 / std::sqrt(double(D)));
    } catch (const Error& e) {
        fail(op, ": ", e.what());
    }
    return {std::move(map),
            {has[0], has[1], has[2]},
            {table_at[0], table_at[1], table_at[2]},
            causal,
            scale,
            n};
}

RelposConfig relpos_check(std::span<const RaggedTensor> in, const Attrs& at, std::string_view op,
                          bool with_dO) {
    std::vector<Schema> schemas;
    for (const auto& t : in.first(in.size() - with_dO)) schemas.push_back(t.schema());
    RelposConfig cfg = relpos_decode(schemas, at, op);
    const std::int64_t batch = in[0].batch();
    auto length = [&](std::int64_t s) { return in[0].structure().size(s, 0); };
    for (std::size_t t = 1; t < in.size(); ++t) {
        if (t >= 3 && t < cfg.inputs) continue; // tables
        const char* name = t == 1 ? "k" : t == 2 ? "v" : "dO";
        if (in[t].batch() != batch)
            fail(op, ": batch sizes differ: q has ", batch, " samples, ", name, " has ",
                 in[t].batch());
        for (std::int64_t s = 0; s < batch; ++s)
            if (in[t].structure().size(s, 0) != length(s))
                fail(op, ": sample ", s, ": q has N = ", length(s), " tokens but ", name, " has ",
                     in[t].structure().size(s, 0));
    }
    if (cfg.map.name() == "identity")
        for (std::int64_t s = 0; s < batch; ++s)
            if (length(s) > cfg.map.saturation() + 1)
                fail(op, ": sample ", s, " has N = ", length(s), " tokens but ", cfg.map.str(),
                     " covers N <= L = ", cfg.map.saturation() + 1);
    return cfg;
}

namespace {

Schema output_schema(std::span<const Schema> in) {
    return {in[0].dtype, in[2].shape};
}

// Storage offset of element (i, h, x) of a [n, H, c] view, or (i, h) of a [n, H] view.
std::int64_t at3(const kern::SampleView& sv, std::int64_t i, std::int64_t h, std::int64_t x) {
    return sv.base + i * sv.strides[0] + h * sv.strides[1] +
           (sv.shape.size() == 3 ? x * sv.strides[2] : 0);
}
std::int64_t width(const kern::SampleView& sv) {
    return sv.shape.size() == 3 ? sv.shape[2] : 1;
}

// Head h of a view as a dense row-major [n, c] array, and the adjoint (accumulating) write.
std::vector<double> gather(const std::vector<double>& vals, const kern::SampleView& sv,
                           std::int64_t h) {
    const std::int64_t n = sv.shape[0], c = width(sv);
    std::vector<double> out(std::size_t(n * c));
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t x = 0; x < c; ++x)
            out[std::size_t(i * c + x)] = vals[std::size_t(at3(sv, i, h, x))];
    return out;
}
void scatter_add(std::vector<double>& vals, const kern::SampleView& sv, std::int64_t h,
                 const std::vector<double>& g) {
    const std::int64_t n = sv.shape[0], c = width(sv);
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t x = 0; x < c; ++x)
            vals[std::size_t(at3(sv, i, h, x))] += g[std::size_t(i * c + x)];
}

double dot(const double* a, const double* b, std::int64_t d) {
    double s = 0;
    for (std::int64_t x = 0; x < d; ++x) s += a[x] * b[x];
    return s;
}

// One sample and head: q, k [n, d], v [n, dv], and the head's table slices aq, ak [R, d] and
// b [R] (zeros for an absent table, which then adds nothing).
struct Head {
    std::int64_t n = 0, d = 0, dv = 0;
    std::vector<double> q, k, v, aq, ak, b;
};

// The inputs of one application, decoded and checked against the runtime lengths. The grad
// op's inputs end with one more, dO, which must have v's lengths too.
class Problem {
  public:
    Problem(std::span<const RaggedTensor> in, const Attrs& at, std::string_view op, bool with_dO)
        : in_(in), cfg_(relpos_check(in, at, op, with_dO)) {
        for (const auto& t : in) vals_.push_back(t.to_f64());
    }

    const Config& config() const { return cfg_; }
    std::int64_t batch() const { return in_[0].batch(); }
    std::int64_t heads() const { return in_[0].shape().axes[1].extent; }
    std::int64_t length(std::int64_t s) const { return in_[0].structure().size(s, 0); }
    kern::SampleView view(std::size_t input, std::int64_t s) const {
        return kern::sample_view(in_[input].structure(), s);
    }
    const std::vector<double>& values(std::size_t input) const { return vals_[input]; }

    Head head(std::int64_t s, std::int64_t h) const {
        Head a;
        a.n = length(s);
        a.d = in_[0].shape().axes[2].extent;
        a.dv = in_[2].shape().axes[2].extent;
        a.q = gather(vals_[0], view(0, s), h);
        a.k = gather(vals_[1], view(1, s), h);
        a.v = gather(vals_[2], view(2, s), h);
        const std::size_t R = std::size_t(cfg_.map.rows());
        a.aq = table(AQ, h, R * std::size_t(a.d));
        a.ak = table(AK, h, R * std::size_t(a.d));
        a.b = table(BIAS, h, R);
        return a;
    }

  private:
    std::vector<double> table(int t, std::int64_t h, std::size_t zeros) const {
        if (!cfg_.has[t]) return std::vector<double>(zeros, 0.0);
        return gather(vals_[std::size_t(cfg_.table_at[t])], view(std::size_t(cfg_.table_at[t]), 0),
                      h);
    }

    std::span<const RaggedTensor> in_;
    Config cfg_;
    std::vector<std::vector<double>> vals_;
};

// Keys visible to query i: all of them, or j <= i when causal (never empty for i < n).
std::int64_t key_end(const Config& c, const Head& a, std::int64_t i) {
    return c.causal ? i + 1 : a.n;
}

// P = softmax_row(S) [n, n], zero where masked.
std::vector<double> probabilities(const Config& c, const Head& a) {
    const std::int64_t n = a.n, d = a.d;
    std::vector<double> p(std::size_t(n * n), 0.0);
    for (std::int64_t i = 0; i < n; ++i) {
        double* row = &p[std::size_t(i * n)];
        const double* qi = &a.q[std::size_t(i * d)];
        double top = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < key_end(c, a, i); ++j) {
            const std::size_t r = std::size_t(c.map.row(i - j));
            const double* kj = &a.k[std::size_t(j * d)];
            row[j] = c.scale * (dot(qi, kj, d) + dot(qi, &a.aq[r * std::size_t(d)], d) +
                                dot(kj, &a.ak[r * std::size_t(d)], d) + a.b[r]);
            top = std::max(top, row[j]);
        }
        double z = 0;
        for (std::int64_t j = 0; j < key_end(c, a, i); ++j) z += row[j] = std::exp(row[j] - top);
        for (std::int64_t j = 0; j < key_end(c, a, i); ++j) row[j] /= z;
    }
    return p;
}

RaggedTensor forward(std::span<const RaggedTensor> in, const Attrs& at) {
    Problem pb(in, at, op_name, false);
    // The output has v's schema and lengths: reuse its structure.
    std::vector<double> out(std::size_t(in[2].numel()), 0.0);
    for (std::int64_t s = 0; s < pb.batch(); ++s)
        for (std::int64_t h = 0; h < pb.heads(); ++h) {
            Head a = pb.head(s, h);
            auto p = probabilities(pb.config(), a);
            std::vector<double> o(std::size_t(a.n * a.dv), 0.0);
            for (std::int64_t i = 0; i < a.n; ++i)
                for (std::int64_t j = 0; j < a.n; ++j)
                    for (std::int64_t x = 0; x < a.dv; ++x)
                        o[std::size_t(i * a.dv + x)] +=
                            p[std::size_t(i * a.n + j)] * a.v[std::size_t(j * a.dv + x)];
            scatter_add(out, pb.view(2, s), h, o);
        }
    return RaggedTensor::from_f64(in[0].dtype(), in[2].structure_ptr(), out);
}

// Every input's gradient, in that input's packed layout (REFERENCE.md's equations):
// dS = P o (dP - D 1^T) with D_i = <dO_i, O_i> = sum_j P_ij dP_ij; each pair's g = scale dS_ij
// goes to its relation row r = phi(i - j), which expands dZQ_ir = sum_{j: phi = r} g, dZK_jr,
// db_r = sum dZQ_ir, dQ = scale dS K + dZQ aQ, dK = scale dS^T Q + dZK aK, daQ = dZQ^T Q,
// daK = dZK^T K pair by pair; dV = P^T dO.
std::vector<std::vector<double>> gradients(const Problem& pb) {
    const Config& c = pb.config();
    const std::size_t n_in = c.inputs, dO = n_in;
    std::vector<std::vector<double>> g(n_in);
    for (std::size_t t = 0; t < n_in; ++t) g[t].assign(pb.values(t).size(), 0.0);
    for (std::int64_t s = 0; s < pb.batch(); ++s)
        for (std::int64_t h = 0; h < pb.heads(); ++h) {
            const Head a = pb.head(s, h);
            const std::int64_t n = a.n, d = a.d, dv = a.dv;
            const auto p = probabilities(c, a);
            const auto go = gather(pb.values(dO), pb.view(dO, s), h);
            auto zeros = [](const std::vector<double>& x) {
                return std::vector<double>(x.size(), 0.0);
            };
            Head da{n,          d,           dv,          zeros(a.q), zeros(a.k),
                    zeros(a.v), zeros(a.aq), zeros(a.ak), zeros(a.b)};
            for (std::int64_t i = 0; i < n; ++i) {
                const double* goi = &go[std::size_t(i * dv)];
                std::vector<double> dp(std::size_t(n), 0.0);
                double Di = 0;
                for (std::int64_t j = 0; j < key_end(c, a, i); ++j) {
                    dp[std::size_t(j)] = dot(goi, &a.v[std::size_t(j * dv)], dv);
                    Di += p[std::size_t(i * n + j)] * dp[std::size_t(j)];
                }
                for (std::int64_t j = 0; j < key_end(c, a, i); ++j) {
                    const double pij = p[std::size_t(i * n + j)];
                    const double gs = c.scale * pij * (dp[std::size_t(j)] - Di);
                    const std::size_t r = std::size_t(c.map.row(i - j));
                    for (std::int64_t x = 0; x < d; ++x) {
                        const std::size_t ix = std::size_t(i * d + x), jx = std::size_t(j * d + x),
                                          rx = r * std::size_t(d) + std::size_t(x);
                        da.q[ix] += gs * (a.k[jx] + a.aq[rx]);
                        da.k[jx] += gs * (a.q[ix] + a.ak[rx]);
                        da.aq[rx] += gs * a.q[ix];
                        da.ak[rx] += gs * a.k[jx];
                    }
                    da.b[r] += gs;
                    for (std::int64_t x = 0; x < dv; ++x)
                        da.v[std::size_t(j * dv + x)] += pij * goi[x];
                }
            }
            scatter_add(g[0], pb.view(0, s), h, da.q);
            scatter_add(g[1], pb.view(1, s), h, da.k);
            scatter_add(g[2], pb.view(2, s), h, da.v);
            const std::vector<double>* dt[] = {&da.aq, &da.ak, &da.b};
            for (int t : {AQ, AK, BIAS})
                if (c.has[t]) {
                    const std::size_t k = std::size_t(c.table_at[t]);
                    scatter_add(g[k], pb.view(k, 0), h, *dt[t]);
                }
        }
    return g;
}

const char* doc =
    "relpos_attention(q, k, v, [aq], [ak], [bias], "
    "map=identity|clip|t5_buckets|log_buckets|buckets, "
    "distance= (clip) | num=32, max_distance=128 (t5) | size=256, max_position=512 (log) | "
    "distance=D, table=[2D + 1 monotone rows] (buckets), "
    "aq=, ak=, bias= (which tables follow v), causal=false, scale=1/sqrt(D)): per sample and head "
    "softmax_j(scale (q_i.k_j + q_i.aq[r] + k_j.ak[r] + bias[r]) + mask) v, r = phi(i - j); "
    "q, k [B, ~N, H, D], v [B, ~N, H, Dv], aq, ak [R, H, D], bias [R, H] with R = the map's rows "
    "(identity: L = (R + 1) / 2 >= every N); causal keeps j <= i; a sample of 0 tokens gives 0 "
    "rows; naive O(N^2) reference";

} // namespace

void register_relpos_ops(OpTable& t) {
    t.add({op_name, 3, 6, doc,
           [](auto in, auto& at) {
               relpos_decode(in, at, op_name);
               return output_schema(in);
           },
           forward,
           [](Emitter& e, auto in, Val, Val g, auto& at) {
               std::vector<Val> args(in.begin(), in.end());
               args.push_back(g);
               std::vector<std::optional<Val>> out;
               for (std::size_t k = 0; k < in.size(); ++k)
                   out.push_back(e.emit(grad_name, args, Attrs(at).set("wrt", std::int64_t(k))));
               return out;
           }});

    t.add({grad_name,
           4,
           7,
           "relpos_attention_grad(q, k, v, [aq], [ak], [bias], dO, same attrs, wrt=index): the "
           "gradient of relpos_attention with respect to input wrt, given the output cotangent dO",
           [](auto in, auto& at) {
               Config c = relpos_decode(in.first(in.size() - 1), at, grad_name);
               Schema want = output_schema(in);
               if (in.back() != want)
                   fail(grad_name, ": dO must be ", want.str(), " like the output, got ",
                        in.back().str());
               std::int64_t wrt = -1;
               try {
                   wrt = at.get_int("wrt");
               } catch (const Error& e) {
                   fail(grad_name, ": ", e.what());
               }
               if (wrt < 0 || wrt >= std::int64_t(c.inputs))
                   fail(grad_name, ": wrt must name one of the ", c.inputs, " inputs, got ", wrt);
               return in[std::size_t(wrt)];
           },
           [](auto in, auto& at) {
               Problem pb(in, at, grad_name, true);
               const std::size_t wrt = std::size_t(at.get_int("wrt"));
               return RaggedTensor::from_f64(in[wrt].dtype(), in[wrt].structure_ptr(),
                                             gradients(pb)[wrt]);
           },
           {}});
}

} // namespace rag
