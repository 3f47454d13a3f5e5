// Matrix products. `x @ W` with a dense weight W [C, D] acts on x's last axis: x's storage is
// rows of its static tail whose innermost axis is that last axis, so it is one GEMM over all
// packed rows of the batch. `a @ b` of two batched operands is a per-sample product over their
// last two axes, which is how attention scores create a pair axis ([B, ~N, D] @ [B, D, ~M] ->
// [B, ~N, ~M]) and how P @ V contracts it again.
#include "ir/ops/kernel_util.hpp"

#include <algorithm>
#include <string>

namespace rag {
namespace {

using Idx = std::vector<std::int64_t>;

std::string axis_str(const Axis& a) {
    if (a.kind == AxisKind::fixed) return std::to_string(a.extent);
    return (a.is_ragged() ? "~" : "") + a.name;
}

bool is_weight(const Shape& s) {
    return !s.batched && s.sample_rank() == 2 && s.axes[0].kind == AxisKind::fixed &&
           s.axes[1].kind == AxisKind::fixed;
}

Shape weight_result(const Shape& x, const Shape& w) {
    if (x.sample_rank() == 0)
        fail("matmul: x ", shape_str(x), " has no axis to multiply by W ", shape_str(w));
    const Axis& last = x.axes.back();
    kern::require_fixed(last, "matmul", "the last axis of x");
    if (last.extent != w.axes[0].extent)
        fail("matmul: x has last axis ", last.extent, " but W has ", w.axes[0].extent, " rows");
    Shape out = x;
    out.axes.back() = w.axes[1];
    return out;
}

Shape batched_result(const Shape& a, const Shape& b) {
    const int r = a.sample_rank();
    if (r != b.sample_rank() || !std::equal(a.axes.begin(), a.axes.end() - 2, b.axes.begin()))
        fail("matmul: a ", shape_str(a), " and b ", shape_str(b),
             " differ before their last two axes");
    if (a.axes[std::size_t(r - 1)] != b.axes[std::size_t(r - 2)])
        fail("matmul: a has last axis ", axis_str(a.axes[std::size_t(r - 1)]),
             " but b has second-to-last axis ", axis_str(b.axes[std::size_t(r - 2)]));
    Shape out = a;
    out.axes.back() = b.axes.back();
    return out;
}

Schema matmul_rule(std::span<const Schema> in, const Attrs&) {
    const Shape &a = in[0].shape, &b = in[1].shape;
    kern::require_same_dtype(in, "matmul");
    kern::require_float(in[0], "matmul");
    if (is_weight(b)) return {in[0].dtype, weight_result(a, b)};
    if (a.batched && b.batched && a.sample_rank() >= 2 && b.sample_rank() >= 2)
        return {in[0].dtype, batched_result(a, b)};
    fail("matmul: expects x @ W with W an unbatched static matrix [C, D], or two batched "
         "operands with at least two per-sample axes each; got ",
         in[0].str(), " @ ", in[1].str());
}

// Rows of x @ W: the index tuples of every axis but the last, over all samples.
std::int64_t packed_rows(const Structure& s) {
    std::int64_t rows = 0;
    for (std::int64_t i = 0; i < s.batch(); ++i) {
        auto shape = s.sample_shape(i);
        std::int64_t n = 1;
        for (std::size_t a = 0; a + 1 < shape.size(); ++a) n *= shape[a];
        rows += n;
    }
    return rows;
}

// x's structure re-typed as `shape`, whose last axis has extent n in every sample.
StructurePtr replace_last(const Structure& x, const Shape& shape, std::int64_t n) {
    return kern::make_structure(shape, x.batch(), [&](std::int64_t i) {
        auto s = x.sample_shape(i);
        Idx out(s.begin(), s.end());
        out.back() = n;
        return out;
    });
}

RaggedTensor weight_matmul(const RaggedTensor& x, const RaggedTensor& w) {
    const std::int64_t C = w.shape().axes[0].extent, D = w.shape().axes[1].extent;
    const std::int64_t rows = packed_rows(x.structure());
    auto st = replace_last(x.structure(), weight_result(x.shape(), w.shape()), D);
    auto xv = x.to_f64(), wv = w.to_f64();
    std::vector<double> y(std::size_t(rows * D));
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t d = 0; d < D; ++d) {
            double s = 0;
            for (std::int64_t c = 0; c < C; ++c) s += xv[r * C + c] * wv[c * D + d];
            y[r * D + d] = s;
        }
    return RaggedTensor::from_f64(x.dtype(), st, y);
}

// Axes of a and b that share a ragged or symbolic name (the contracted axis among them) must
// have equal extents in every sample.
void check_shared_names(const Structure& a, const Structure& b) {
    if (a.batch() != b.batch()) fail("matmul: batch sizes differ, ", a.batch(), " and ", b.batch());
    const auto &ax = a.shape().axes, &bx = b.shape().axes;
    for (std::int64_t i = 0; i < a.batch(); ++i)
        for (int ja = 0; ja < a.rank(); ++ja)
            for (int jb = 0; jb < b.rank(); ++jb) {
                const Axis &x = ax[std::size_t(ja)], &y = bx[std::size_t(jb)];
                if (x.kind == AxisKind::fixed || x.kind != y.kind || x.name != y.name) continue;
                if (a.size(i, ja) != b.size(i, jb))
                    fail("matmul: sample ", i, ": axis ", axis_str(x), " is ", a.size(i, ja),
                         " in a but ", b.size(i, jb), " in b");
            }
}

RaggedTensor batched_matmul(const RaggedTensor& a, const RaggedTensor& b) {
    const Structure &as = a.structure(), &bs = b.structure();
    check_shared_names(as, bs);
    const int r = as.rank();
    auto st =
        kern::make_structure(batched_result(a.shape(), b.shape()), as.batch(), [&](std::int64_t i) {
            auto s = as.sample_shape(i);
            Idx out(s.begin(), s.end());
            out.back() = bs.size(i, r - 1);
            return out;
        });
    auto av = a.to_f64(), bv = b.to_f64();
    std::vector<double> y(std::size_t(st->numel()));
    for (std::int64_t i = 0; i < as.batch(); ++i) {
        auto va = kern::sample_view(as, i), vb = kern::sample_view(bs, i);
        auto vy = kern::sample_view(*st, i);
        const std::size_t p_ax = std::size_t(r - 2), q_ax = std::size_t(r - 1);
        const std::int64_t P = va.shape[p_ax], K = va.shape[q_ax], Q = vb.shape[q_ax];
        Idx lead(va.shape.begin(), va.shape.end() - 2);
        kern::for_each_index(lead, [&](const Idx& li) {
            Idx at = li;
            at.resize(std::size_t(r), 0);
            const std::int64_t a0 = va.at(at), b0 = vb.at(at), y0 = vy.at(at);
            for (std::int64_t p = 0; p < P; ++p)
                for (std::int64_t q = 0; q < Q; ++q) {
                    double s = 0;
                    for (std::int64_t k = 0; k < K; ++k)
                        s += av[a0 + p * va.strides[p_ax] + k * va.strides[q_ax]] *
                             bv[b0 + k * vb.strides[p_ax] + q * vb.strides[q_ax]];
                    y[y0 + p * vy.strides[p_ax] + q * vy.strides[q_ax]] = s;
                }
        });
    }
    return RaggedTensor::from_f64(a.dtype(), st, y);
}

// ---- matmul_weight_grad(x, g) = sum over packed rows r of x_r^T g_r ----

Schema weight_grad_rule(std::span<const Schema> in, const Attrs&) {
    kern::require_same_dtype(in, "matmul_weight_grad");
    kern::require_float(in[0], "matmul_weight_grad");
    const Shape &x = in[0].shape, &g = in[1].shape;
    const int r = x.sample_rank();
    bool ok = r >= 1 && g.batched == x.batched && g.sample_rank() == r &&
              std::equal(x.axes.begin(), x.axes.end() - 1, g.axes.begin()) &&
              g.axes.back().kind == AxisKind::fixed;
    if (!ok)
        fail("matmul_weight_grad: the gradient ", in[1].str(), " is not x ", in[0].str(),
             " with a static last axis in place of its own");
    kern::require_fixed(x.axes.back(), "matmul_weight_grad", "the last axis of x");
    return {in[0].dtype, Shape{false, {x.axes.back(), g.axes.back()}}};
}

RaggedTensor weight_grad(const RaggedTensor& x, const RaggedTensor& g) {
    const Structure &xs = x.structure(), &gs = g.structure();
    if (xs.batch() != gs.batch())
        fail("matmul_weight_grad: batch sizes differ, ", xs.batch(), " and ", gs.batch());
    for (std::int64_t i = 0; i < xs.batch(); ++i)
        for (int a = 0; a + 1 < xs.rank(); ++a)
            if (xs.size(i, a) != gs.size(i, a))
                fail("matmul_weight_grad: sample ", i, ": axis ", a + (x.shape().batched ? 1 : 0),
                     " is ", xs.size(i, a), " in x but ", gs.size(i, a), " in the gradient");
    const std::int64_t C = x.shape().axes.back().extent, D = g.shape().axes.back().extent;
    const std::int64_t rows = packed_rows(xs);
    auto xv = x.to_f64(), gv = g.to_f64();
    std::vector<double> dw(std::size_t(C * D), 0.0);
    for (std::int64_t c = 0; c < C; ++c)
        for (std::int64_t d = 0; d < D; ++d) {
            double s = 0;
            for (std::int64_t r = 0; r < rows; ++r) s += xv[r * C + c] * gv[r * D + d];
            dw[c * D + d] = s;
        }
    auto st = Structure::make(Shape{false, {Axis::fixed_of(C), Axis::fixed_of(D)}}, 1, {C, D});
    return RaggedTensor::from_f64(x.dtype(), st, dw);
}

} // namespace

void register_linalg_ops(OpTable& t) {
    t.add({"matmul", 2, 2,
           "matmul(a, b), a @ b: with b an unbatched static [C, D], acts on a's static last axis "
           "C (any axes before it, batched or not); with both batched, a per-sample product "
           "over the last two axes (equal leading axes, a's last axis = b's second-to-last, "
           "checked per sample); a contracted extent of 0 gives zeros",
           matmul_rule,
           [](auto in, auto&) {
               return is_weight(in[1].shape()) ? weight_matmul(in[0], in[1])
                                               : batched_matmul(in[0], in[1]);
           },
           [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
               auto T = [&](Val v, std::int64_t a, std::int64_t b) {
                   return e.emit("transpose", {v}, {{"a", a}, {"b", b}});
               };
               if (is_weight(e.schema(in[1]).shape))
                   return {e.emit("matmul", {g, T(in[1], 0, 1)}),
                           e.emit("matmul_weight_grad", {in[0], g})};
               return {e.emit("matmul", {g, T(in[1], -1, -2)}),
                       e.emit("matmul", {T(in[0], -1, -2), g})};
           }});

    t.add({"matmul_weight_grad",
           2,
           2,
           "matmul_weight_grad(x, g): the gradient of W in x @ W, sum over the packed rows of "
           "x_r^T g_r as an unbatched [C, D] (zeros when there are no rows)",
           weight_grad_rule,
           [](auto in, auto&) { return weight_grad(in[0], in[1]); },
           {}});
}

} // namespace rag
