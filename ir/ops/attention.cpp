// Exact packed softmax attention and its backward op. Each sample attends only to its own keys:
// the kernels walk the packed rows of one sample at a time, so no padding exists to be masked
// and nothing of another sample can leak in. Everything is computed in double.
#include "ir/ops/kernel_util.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rag {
namespace {

const char* const arg_names[] = {"q", "k", "v", "dO"};

// attention's attributes, read once with messages that name the op.
struct Options {
    bool causal = false;
    double scale = 1.0;
};

Options read_options(const Attrs& at, std::int64_t D, std::string_view op) {
    try {
        return {at.get_bool("causal", false), at.get_float("scale", 1.0 / std::sqrt(double(D)))};
    } catch (const Error& e) {
        fail(op, ": ", e.what());
    }
}

// Checks one of q, k, v, dO: a batch of [~L, H, width] with static H and width.
void check_operand(const Schema& s, int k, std::string_view op) {
    const Shape& sh = s.shape;
    if (!sh.batched || sh.sample_rank() != 3 || !sh.axes[0].is_ragged())
        fail(op, ": ", arg_names[k], " must be [B, ~L, H, D] (a batch, axis 1 ragged), got ",
             s.str());
    kern::require_fixed(sh.axes[1], op, std::string(arg_names[k]) + "'s head axis 2");
    kern::require_fixed(sh.axes[2], op, std::string(arg_names[k]) + "'s feature axis 3");
}

void require_equal_axis(std::span<const Schema> in, int a, int b, int axis, const char* what,
                        std::string_view op) {
    std::int64_t x = in[a].shape.axes[axis - 1].extent, y = in[b].shape.axes[axis - 1].extent;
    if (x != y)
        fail(op, ": ", what, " axis ", axis, " differs: ", arg_names[a], " ", in[a].str(), " has ",
             x, ", ", arg_names[b], " ", in[b].str(), " has ", y);
}

// The type rule shared by attention and attention_grad: the output schema of attention.
Schema attention_schema(std::span<const Schema> in, const Attrs& at, std::string_view op) {
    kern::require_float(in[0], op, "q");
    kern::require_same_dtype(in, op);
    for (int k = 0; k < 3; ++k) check_operand(in[k], k, op);
    require_equal_axis(in, 0, 1, 2, "head", op);
    require_equal_axis(in, 0, 2, 2, "head", op);
    require_equal_axis(in, 0, 1, 3, "feature", op);
    const Axis &kn = in[1].shape.axes[0], &vn = in[2].shape.axes[0];
    if (kn != vn)
        fail(op, ": k and v must share their ragged axis 1, got k ~", kn.name, " and v ~", vn.name);
    read_options(at, in[0].shape.axes[2].extent, op);
    const auto& q = in[0].shape.axes;
    return {in[0].dtype, Shape{true, {q[0], q[1], in[2].shape.axes[2]}}};
}

// One sample's [L, H, width] block inside packed f64 values.
struct Block {
    const std::vector<double>* values;
    kern::SampleView view;

    std::int64_t len() const { return view.shape[0]; }
    std::int64_t width() const { return view.shape[2]; }
    std::int64_t at(std::int64_t n, std::int64_t h, std::int64_t c) const {
        return view.base + n * view.strides[0] + h * view.strides[1] + c * view.strides[2];
    }
    double operator()(std::int64_t n, std::int64_t h, std::int64_t c) const {
        return (*values)[std::size_t(at(n, h, c))];
    }
};

// The operands of one call, their lengths checked against each other.
struct Operands {
    std::vector<RaggedTensor> tensors;
    std::vector<std::vector<double>> values;
    Options opt;

    Operands(std::span<const RaggedTensor> in, const Attrs& at, std::string_view op)
        : tensors(in.begin(), in.end()) {
        for (const auto& t : in) values.push_back(t.to_f64());
        opt = read_options(at, in[0].shape().axes[2].extent, op);
        const std::int64_t B = in[0].batch();
        for (std::size_t k = 1; k < in.size(); ++k)
            if (in[k].batch() != B)
                fail(op, ": batch sizes differ, q has ", B, " samples and ", arg_names[k], " has ",
                     in[k].batch());
        // Equal ragged names promise equal lengths: k and v always, q and k in self-attention,
        // q and dO (attention_grad) always.
        auto check = [&](std::size_t a, std::size_t b, const char* what) {
            for (std::int64_t i = 0; i < B; ++i) {
                std::int64_t x = in[a].structure().size(i, 0), y = in[b].structure().size(i, 0);
                if (x != y)
                    fail(op, ": sample ", i, ": ", arg_names[a], " has ", x, " ", what, " but ",
                         arg_names[b], " has ", y, " (shared ragged axis ~",
                         in[a].shape().axes[0].name, ")");
            }
        };
        check(1, 2, "keys");
        if (in[0].shape().axes[0] == in[1].shape().axes[0]) check(0, 1, "rows");
        if (in.size() > 3) check(0, 3, "rows");
    }

    std::int64_t batch() const { return tensors[0].batch(); }
    std::int64_t heads() const { return tensors[0].shape().axes[1].extent; }
    Block block(std::size_t k, std::int64_t i) const {
        return {&values[k], kern::sample_view(tensors[k].structure(), i)};
    }
};

// Row-major [N, M] probabilities of one sample and head. Masked entries are exactly 0, and a
// query row with no visible key (M = 0) is all zeros, so its output and gradients are 0.
std::vector<double> probabilities(const Block& q, const Block& k, std::int64_t h,
                                  const Options& opt) {
    const std::int64_t N = q.len(), M = k.len();
    std::vector<double> p(std::size_t(N * M), 0.0);
    for (std::int64_t i = 0; i < N; ++i) {
        // Top-left aligned causal mask: key j is visible to query i iff j <= i.
        const std::int64_t visible = opt.causal ? std::min(M, i + 1) : M;
        double* row = p.data() + i * M;
        double top = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < visible; ++j) {
            double s = 0;
            for (std::int64_t d = 0; d < q.width(); ++d) s += q(i, h, d) * k(j, h, d);
            row[j] = opt.scale * s;
            top = std::max(top, row[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < visible; ++j) sum += row[j] = std::exp(row[j] - top);
        for (std::int64_t j = 0; j < visible; ++j) row[j] /= sum;
    }
    return p;
}

RaggedTensor forward(std::span<const RaggedTensor> in, const Attrs& at) {
    Operands x(in, at, "attention");
    const std::int64_t H = x.heads(), Dv = in[2].shape().axes[2].extent;
    const Shape shape{true, {in[0].shape().axes[0], Axis::fixed_of(H), Axis::fixed_of(Dv)}};
    auto st = kern::make_structure(shape, x.batch(), [&](std::int64_t i) {
        return std::vector<std::int64_t>{in[0].structure().size(i, 0), H, Dv};
    });
    std::vector<double> out(std::size_t(st->numel()), 0.0);
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        Block q = x.block(0, i), k = x.block(1, i), v = x.block(2, i);
        Block o{&out, kern::sample_view(*st, i)};
        const std::int64_t N = q.len(), M = k.len();
        for (std::int64_t h = 0; h < H; ++h) {
            auto p = probabilities(q, k, h, x.opt);
            for (std::int64_t n = 0; n < N; ++n)
                for (std::int64_t c = 0; c < Dv; ++c) {
                    double s = 0;
                    for (std::int64_t j = 0; j < M; ++j)
                        s += p[std::size_t(n * M + j)] * v(j, h, c);
                    out[std::size_t(o.at(n, h, c))] = s;
                }
        }
    }
    return RaggedTensor::from_f64(in[0].dtype(), st, out);
}

// dV = P^T dO, dP = dO V^T, dS = P o (dP - rowsum(dP o P)), dQ = scale dS K, dK = scale dS^T Q.
RaggedTensor backward(std::span<const RaggedTensor> in, const Attrs& at) {
    Operands x(in, at, "attention_grad");
    const std::int64_t wrt = at.get_int("wrt");
    const RaggedTensor& target = in[std::size_t(wrt)];
    std::vector<double> grad(std::size_t(target.numel()), 0.0);
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        Block q = x.block(0, i), k = x.block(1, i), v = x.block(2, i), dout = x.block(3, i);
        Block g{&grad, kern::sample_view(target.structure(), i)};
        auto acc = [&](std::int64_t n, std::int64_t h, std::int64_t c) -> double& {
            return grad[std::size_t(g.at(n, h, c))];
        };
        const std::int64_t N = q.len(), M = k.len();
        for (std::int64_t h = 0; h < x.heads(); ++h) {
            auto p = probabilities(q, k, h, x.opt);
            auto P = [&](std::int64_t n, std::int64_t j) { return p[std::size_t(n * M + j)]; };
            if (wrt == 2) {
                for (std::int64_t n = 0; n < N; ++n)
                    for (std::int64_t j = 0; j < M; ++j)
                        for (std::int64_t c = 0; c < v.width(); ++c)
                            acc(j, h, c) += P(n, j) * dout(n, h, c);
                continue;
            }
            std::vector<double> ds(p.size(), 0.0);
            for (std::int64_t n = 0; n < N; ++n) {
                double* row = ds.data() + n * M;
                double rowsum = 0;
                for (std::int64_t j = 0; j < M; ++j) {
                    for (std::int64_t c = 0; c < v.width(); ++c)
                        row[j] += dout(n, h, c) * v(j, h, c);
                    rowsum += row[j] * P(n, j);
                }
                for (std::int64_t j = 0; j < M; ++j) row[j] = P(n, j) * (row[j] - rowsum);
            }
            for (std::int64_t n = 0; n < N; ++n)
                for (std::int64_t j = 0; j < M; ++j) {
                    const double s = x.opt.scale * ds[std::size_t(n * M + j)];
                    for (std::int64_t d = 0; d < q.width(); ++d) {
                        if (wrt == 0)
                            acc(n, h, d) += s * k(j, h, d);
                        else
                            acc(j, h, d) += s * q(n, h, d);
                    }
                }
        }
    }
    return RaggedTensor::from_f64(target.dtype(), target.structure_ptr(), grad);
}

} // namespace

void register_attention_ops(OpTable& t) {
    t.add({"attention", 3, 3,
           "attention(q: [B, ~N, H, D], k: [B, ~M, H, D], v: [B, ~M, H, Dv], causal=false, "
           "scale=1/sqrt(D)) -> [B, ~N, H, Dv]: per sample and head softmax(scale q k^T) v over "
           "that sample's keys only, in f64; causal: key j is visible to query i iff j <= i "
           "(top-left aligned, also for cross attention); a query with no visible key (M = 0) "
           "outputs 0",
           [](auto in, auto& at) { return attention_schema(in, at, "attention"); }, forward,
           [](Emitter& e, auto in, Val, Val g, auto& at) -> std::vector<std::optional<Val>> {
               std::vector<std::optional<Val>> grads;
               for (std::int64_t wrt = 0; wrt < 3; ++wrt) {
                   Attrs a = at;
                   grads.push_back(
                       e.emit("attention_grad", {in[0], in[1], in[2], g}, a.set("wrt", wrt)));
               }
               return grads;
           }});

    t.add({"attention_grad",
           4,
           4,
           "attention_grad(q, k, v, dO, causal=false, scale=1/sqrt(D), wrt=0|1|2): the cotangent "
           "of attention's q, k or v given dO, recomputing the probabilities; 0 where no key is "
           "visible",
           [](auto in, auto& at) {
               const char* op = "attention_grad";
               Schema out = attention_schema(in, at, op);
               if (in[3] != out) fail(op, ": dO must be ", out.str(), ", got ", in[3].str());
               std::int64_t wrt = -1;
               try {
                   wrt = at.get_int("wrt");
               } catch (const Error& e) {
                   fail(op, ": ", e.what());
               }
               if (wrt < 0 || wrt > 2) fail(op, ": wrt must be 0 (q), 1 (k) or 2 (v), got ", wrt);
               return in[std::size_t(wrt)];
           },
           backward,
           {}});
}

} // namespace rag
