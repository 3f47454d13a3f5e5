// Softmax attention with an additive per-sample bias, on singles and along pair axes (the
// float64 oracle of jit/biased_attention_cpu.cpp):
//   axis=1: q [B, ~N, H, D], k, v [B, ~M, H, D|Dv], bias [B, ~N, ~M, H]:
//           o[n, h] = sum_m softmax_m(scale q[n, h] . k[m, h] + bias[n, m, h]) v[m, h];
//   axis=2: q, k, v [B, ~R, ~N, H, D] (pair states; triangle attention around the starting
//           node): every row r attends on its own, o[r, n, h] from q[r, n, h] over k[r, m, h]
//           with the bias bias[n, m, h] shared by all rows.
// The bias gradient is the sum over rows r of the logits' gradient, added in row order.
#include "ir/ops/kernel_util.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rag {
namespace {

const char* const arg_names[] = {"q", "k", "v", "bias", "dO"};

std::string axis_str(const Axis& a) {
    return shape_str(Shape{false, {a}});
}

struct Options {
    int axis = 1; // 1: singles; 2: along axis 2 of pair states
    bool causal = false;
    double scale = 1.0;
};

Options read_options(const Attrs& at, std::int64_t D, std::string_view op) {
    try {
        Options o{int(at.get_int("axis", 1)), at.get_bool("causal", false),
                  at.get_float("scale", 1.0 / std::sqrt(double(D)))};
        if (o.axis != 1 && o.axis != 2) fail("axis must be 1 or 2, got ", o.axis);
        return o;
    } catch (const Error& e) {
        fail(op, ": ", e.what());
    }
}

// The type rule shared by biased_attention and its gradient: the output schema.
Schema rule(std::span<const Schema> in, const Attrs& at, std::string_view op) {
    kern::require_float(in[0], op, "q");
    kern::require_same_dtype(in, op);
    const Options o = read_options(at, 1, op);
    const int rank = o.axis + 2; // per-sample axes of q, k, v
    for (int k = 0; k < 3; ++k) {
        const Shape& s = in[std::size_t(k)].shape;
        if (!s.batched || s.sample_rank() != rank)
            fail(op, ": with axis=", o.axis, " ", arg_names[k], " must be ",
                 o.axis == 1 ? "[B, ~N, H, D]" : "[B, ~N, ~N, H, D] (a pair state)", ", got ",
                 in[std::size_t(k)].str());
        kern::require_fixed(s.axes[std::size_t(rank - 2)], op,
                            std::string(arg_names[k]) + "'s head axis");
        kern::require_fixed(s.axes[std::size_t(rank - 1)], op,
                            std::string(arg_names[k]) + "'s feature axis");
    }
    const auto &q = in[0].shape.axes, &k = in[1].shape.axes, &v = in[2].shape.axes;
    const std::size_t n = std::size_t(rank - 3); // the attended axis
    auto differ = [&](const char* what, const std::string& a, const std::string& b) {
        fail(op, ": ", what, " differ: ", a, " and ", b, " (q ", in[0].str(), ", k ", in[1].str(),
             ", v ", in[2].str(), ")");
    };
    if (q[n + 1] != k[n + 1] || q[n + 1] != v[n + 1])
        differ("the head axes", axis_str(q[n + 1]), axis_str(k[n + 1]));
    if (q[n + 2] != k[n + 2])
        differ("q's and k's feature axes", axis_str(q[n + 2]), axis_str(k[n + 2]));
    if (k[n] != v[n]) differ("k's and v's key axes", axis_str(k[n]), axis_str(v[n]));
    if (o.axis == 2 && (q[0] != k[0] || q[0] != v[0]))
        differ("the row axes (axis 1)", axis_str(q[0]), axis_str(k[0]));
    const Shape& b = in[3].shape;
    const Shape want{true, {q[n], k[n], q[n + 1]}};
    if (b != want)
        fail(op, ": bias must be ", shape_str(want), " (query axis, key axis, heads), got ",
             in[3].str());
    Shape out = in[0].shape;
    out.axes.back() = v.back();
    return {in[0].dtype, out};
}

// One (sample, row) block [L, H, width] of q, k, v or dO inside packed f64 values.
struct Block {
    const std::vector<double>* values;
    std::int64_t base, len, sn, sh, sc; // offset, rows, strides
    std::int64_t at(std::int64_t n, std::int64_t h, std::int64_t c) const {
        return base + n * sn + h * sh + c * sc;
    }
    double operator()(std::int64_t n, std::int64_t h, std::int64_t c) const {
        return (*values)[std::size_t(at(n, h, c))];
    }
};

Block block(const std::vector<double>& vals, const Structure& st, std::int64_t i, std::int64_t r,
            int axis) {
    const kern::SampleView v = kern::sample_view(st, i);
    const std::size_t o = std::size_t(axis - 1);
    return {&vals,
            v.base + (axis == 2 ? r * v.strides[0] : 0),
            v.shape[o],
            v.strides[o],
            v.strides[o + 1],
            v.strides[o + 2]};
}

struct Operands {
    std::vector<RaggedTensor> t;
    std::vector<std::vector<double>> vals;
    Options opt;

    Operands(std::span<const RaggedTensor> in, const Attrs& at, std::string_view op)
        : t(in.begin(), in.end()) {
        for (const auto& x : in) vals.push_back(x.to_f64());
        opt = read_options(at, in[0].shape().axes.back().extent, op);
        const std::int64_t B = in[0].batch();
        for (std::size_t k = 1; k < in.size(); ++k)
            if (in[k].batch() != B)
                fail(op, ": batch sizes differ, q has ", B, " samples and ", arg_names[k], " has ",
                     in[k].batch());
        const int n = opt.axis - 1;
        auto size = [&](std::size_t k, int a, std::int64_t i) {
            return in[k].structure().size(i, a);
        };
        auto same = [&](std::size_t a, int ax, std::size_t b, int bx, std::int64_t i) {
            if (size(a, ax, i) != size(b, bx, i))
                fail(op, ": sample ", i, ": ", arg_names[a], " axis ", ax + 1, " has ",
                     size(a, ax, i), " but ", arg_names[b], " axis ", bx + 1, " has ",
                     size(b, bx, i));
        };
        for (std::int64_t i = 0; i < B; ++i) {
            if (opt.axis == 2) {
                same(0, 0, 1, 0, i);
                same(0, 0, 2, 0, i);
            }
            same(1, n, 2, n, i);
            same(3, 0, 0, n, i);
            same(3, 1, 1, n, i);
            if (in.size() > 4) {
                same(4, n, 0, n, i);
                if (opt.axis == 2) same(4, 0, 0, 0, i);
            }
        }
    }

    std::int64_t batch() const { return t[0].batch(); }
    std::int64_t heads() const { return t[0].shape().axes[std::size_t(opt.axis)].extent; }
    std::int64_t rows(std::int64_t i) const {
        return opt.axis == 2 ? t[0].structure().size(i, 0) : 1;
    }
    Block get(std::size_t k, std::int64_t i, std::int64_t r) const {
        return block(vals[k], t[k].structure(), i, r, opt.axis);
    }
    double bias(std::int64_t i, std::int64_t n, std::int64_t m, std::int64_t h) const {
        const kern::SampleView v = kern::sample_view(t[3].structure(), i);
        return vals[3]
                   [std::size_t(v.base + n * v.strides[0] + m * v.strides[1] + h * v.strides[2])];
    }
};

// Row-major [N, M] probabilities of one (sample, row, head); masked entries are 0 and a row
// without visible keys is all 0.
std::vector<double> probabilities(const Operands& x, std::int64_t i, const Block& q, const Block& k,
                                  std::int64_t h) {
    const std::int64_t N = q.len, M = k.len, D = x.t[0].shape().axes.back().extent;
    std::vector<double> p(std::size_t(N * M), 0.0);
    for (std::int64_t n = 0; n < N; ++n) {
        const std::int64_t visible = x.opt.causal ? std::min(M, n + 1) : M;
        double* row = p.data() + n * M;
        double top = -std::numeric_limits<double>::infinity();
        for (std::int64_t m = 0; m < visible; ++m) {
            double s = 0;
            for (std::int64_t d = 0; d < D; ++d) s += q(n, h, d) * k(m, h, d);
            row[m] = x.opt.scale * s + x.bias(i, n, m, h);
            top = std::max(top, row[m]);
        }
        double sum = 0;
        for (std::int64_t m = 0; m < visible; ++m) sum += row[m] = std::exp(row[m] - top);
        for (std::int64_t m = 0; m < visible; ++m) row[m] /= sum;
    }
    return p;
}

RaggedTensor forward(std::span<const RaggedTensor> in, const Attrs& at) {
    Operands x(in, at, "biased_attention");
    const std::int64_t H = x.heads(), Dv = in[2].shape().axes.back().extent;
    Shape shape = in[0].shape();
    shape.axes.back() = Axis::fixed_of(Dv);
    auto st = kern::make_structure(shape, x.batch(), [&](std::int64_t i) {
        auto s = in[0].structure().sample_shape(i);
        std::vector<std::int64_t> out(s.begin(), s.end());
        out.back() = Dv;
        return out;
    });
    std::vector<double> out(std::size_t(st->numel()), 0.0);
    for (std::int64_t i = 0; i < x.batch(); ++i)
        for (std::int64_t r = 0; r < x.rows(i); ++r) {
            Block q = x.get(0, i, r), k = x.get(1, i, r), v = x.get(2, i, r);
            Block o = block(out, *st, i, r, x.opt.axis);
            for (std::int64_t h = 0; h < H; ++h) {
                auto p = probabilities(x, i, q, k, h);
                for (std::int64_t n = 0; n < q.len; ++n)
                    for (std::int64_t c = 0; c < Dv; ++c) {
                        double s = 0;
                        for (std::int64_t m = 0; m < k.len; ++m)
                            s += p[std::size_t(n * k.len + m)] * v(m, h, c);
                        out[std::size_t(o.at(n, h, c))] = s;
                    }
            }
        }
    return RaggedTensor::from_f64(in[0].dtype(), st, out);
}

// dV = P^T dO, dP = dO V^T, dS = P o (dP - rowsum(dP o P)), dQ = scale dS K, dK = scale dS^T Q,
// dbias = sum over rows of dS.
RaggedTensor backward(std::span<const RaggedTensor> in, const Attrs& at) {
    Operands x(in, at, "biased_attention_grad");
    const std::int64_t wrt = at.get_int("wrt");
    const RaggedTensor& target = in[std::size_t(wrt)];
    std::vector<double> grad(std::size_t(target.numel()), 0.0);
    const std::int64_t D = in[0].shape().axes.back().extent, Dv = in[2].shape().axes.back().extent;
    for (std::int64_t i = 0; i < x.batch(); ++i)
        for (std::int64_t r = 0; r < x.rows(i); ++r) {
            Block q = x.get(0, i, r), k = x.get(1, i, r), v = x.get(2, i, r), dO = x.get(4, i, r);
            const std::int64_t N = q.len, M = k.len;
            for (std::int64_t h = 0; h < x.heads(); ++h) {
                auto p = probabilities(x, i, q, k, h);
                auto P = [&](std::int64_t n, std::int64_t m) { return p[std::size_t(n * M + m)]; };
                if (wrt == 2) {
                    Block g = block(grad, target.structure(), i, r, x.opt.axis);
                    for (std::int64_t n = 0; n < N; ++n)
                        for (std::int64_t m = 0; m < M; ++m)
                            for (std::int64_t c = 0; c < Dv; ++c)
                                grad[std::size_t(g.at(m, h, c))] += P(n, m) * dO(n, h, c);
                    continue;
                }
                std::vector<double> ds(p.size(), 0.0);
                for (std::int64_t n = 0; n < N; ++n) {
                    double* row = ds.data() + n * M;
                    double rowsum = 0;
                    for (std::int64_t m = 0; m < M; ++m) {
                        for (std::int64_t c = 0; c < Dv; ++c) row[m] += dO(n, h, c) * v(m, h, c);
                        rowsum += row[m] * P(n, m);
                    }
                    for (std::int64_t m = 0; m < M; ++m) row[m] = P(n, m) * (row[m] - rowsum);
                }
                if (wrt == 3) {
                    const kern::SampleView b = kern::sample_view(target.structure(), i);
                    for (std::int64_t n = 0; n < N; ++n)
                        for (std::int64_t m = 0; m < M; ++m)
                            grad[std::size_t(b.base + n * b.strides[0] + m * b.strides[1] +
                                             h * b.strides[2])] += ds[std::size_t(n * M + m)];
                    continue;
                }
                Block g = block(grad, target.structure(), i, r, x.opt.axis);
                for (std::int64_t n = 0; n < N; ++n)
                    for (std::int64_t m = 0; m < M; ++m) {
                        const double s = x.opt.scale * ds[std::size_t(n * M + m)];
                        for (std::int64_t d = 0; d < D; ++d) {
                            if (wrt == 0)
                                grad[std::size_t(g.at(n, h, d))] += s * k(m, h, d);
                            else
                                grad[std::size_t(g.at(m, h, d))] += s * q(n, h, d);
                        }
                    }
            }
        }
    return RaggedTensor::from_f64(target.dtype(), target.structure_ptr(), grad);
}

} // namespace

void register_biased_attention_ops(OpTable& t) {
    t.add({"biased_attention", 4, 4,
           "biased_attention(q, k, v, bias, axis=1|2, causal=false, scale=1/sqrt(D)): axis=1: q "
           "[B, ~N, H, D], k, v [B, ~M, H, D|Dv], bias [B, ~N, ~M, H], per sample and head "
           "softmax(scale q k^T + bias) v; axis=2 (pair states): q, k, v [B, ~R, ~N, H, D], each "
           "row r attends from q[r, n] over k[r, m] with bias[n, m] shared by every row; f64; "
           "causal: key m visible to query n iff m <= n",
           [](auto in, auto& at) { return rule(in, at, "biased_attention"); }, forward,
           [](Emitter& e, auto in, Val, Val g, auto& at) -> std::vector<std::optional<Val>> {
               std::vector<std::optional<Val>> grads;
               for (std::int64_t wrt = 0; wrt < 4; ++wrt) {
                   Attrs a = at;
                   grads.push_back(e.emit("biased_attention_grad", {in[0], in[1], in[2], in[3], g},
                                          a.set("wrt", wrt)));
               }
               return grads;
           }});

    t.add({"biased_attention_grad",
           5,
           5,
           "biased_attention_grad(q, k, v, bias, dO, axis, causal, scale, wrt=0|1|2|3): the "
           "cotangent of biased_attention's q, k, v or bias given dO, recomputing the "
           "probabilities; the bias's sums the logits' cotangent over rows in row order",
           [](auto in, auto& at) {
               const char* op = "biased_attention_grad";
               Schema out = rule(in.first(4), at, op);
               if (in[4] != out) fail(op, ": dO must be ", out.str(), ", got ", in[4].str());
               std::int64_t wrt = -1;
               try {
                   wrt = at.get_int("wrt");
               } catch (const Error& e) {
                   fail(op, ": ", e.what());
               }
               if (wrt < 0 || wrt > 3)
                   fail(op, ": wrt must be 0 (q), 1 (k), 2 (v) or 3 (bias), got ", wrt);
               return in[std::size_t(wrt)];
           },
           backward,
           {}});
}

} // namespace rag
