#include "ir/ops/broadcast.hpp"

#include <algorithm>

namespace rag::kern {
namespace {

std::string axis_str(const Axis& a) {
    switch (a.kind) {
    case AxisKind::fixed:
        return std::to_string(a.extent);
    case AxisKind::symbolic:
        return a.name;
    case AxisKind::ragged:
        return "~" + a.name;
    }
    return "?";
}

bool is_one(const Axis& a) {
    return a.kind == AxisKind::fixed && a.extent == 1;
}

// For each per-sample axis of `in`, the per-sample axis of `out` it aligns with; -1 when it
// aligns with out's batch axis (only an unbatched extent-1 axis may).
std::vector<int> align(const Shape& in, const Shape& out) {
    const int shift = out.logical_rank() - in.logical_rank();
    std::vector<int> map(in.axes.size());
    for (int p = 0; p < in.sample_rank(); ++p)
        map[p] = p + (in.batched ? 1 : 0) + shift - (out.batched ? 1 : 0);
    return map;
}

std::string sample_str(std::span<const std::int64_t> s) {
    std::string out = "(";
    for (std::size_t a = 0; a < s.size(); ++a) out += (a ? ", " : "") + std::to_string(s[a]);
    return out + (s.size() == 1 ? ",)" : ")");
}

} // namespace

Shape broadcast_shapes(std::span<const Shape> in, std::string_view op) {
    Shape out;
    int R = 0;
    for (const Shape& s : in) {
        R = std::max(R, s.logical_rank());
        out.batched |= s.batched;
    }
    for (std::size_t k = 0; k < in.size(); ++k)
        if (in[k].batched && in[k].logical_rank() != R)
            fail(op, ": operand ", k, " ", shape_str(in[k]), " has rank ", in[k].logical_rank(),
                 " but the result has rank ", R,
                 "; batch axes must align (insert axes with new, e.g. x[:, new])");
    out.axes.assign(std::size_t(R - (out.batched ? 1 : 0)), Axis::fixed_of(1));
    for (std::size_t k = 0; k < in.size(); ++k) {
        auto map = align(in[k], out);
        for (int p = 0; p < in[k].sample_rank(); ++p) {
            const Axis& x = in[k].axes[p];
            if (map[p] < 0) {
                if (!is_one(x))
                    fail(op, ": operand ", k, " ", shape_str(in[k]), " aligns axis ", p,
                         " of extent ", axis_str(x), " with the batch axis; it must be 1");
                continue;
            }
            Axis& o = out.axes[map[p]];
            if (is_one(x) || o == x) continue;
            if (is_one(o)) {
                o = x;
                continue;
            }
            fail(op, ": cannot broadcast axis ", map[p] + (out.batched ? 1 : 0), ": ", axis_str(o),
                 " against ", axis_str(x), " (operand ", k, " is ", shape_str(in[k]), ")");
        }
    }
    return out;
}

namespace {

struct Plan {
    StructurePtr out;
    // Per input: per output axis, does the input index it (else stride 0)?
    std::vector<std::vector<int>> in_axis; // input per-sample axis per output axis, or -1
};

Plan plan(std::span<const RaggedTensor> in, const Shape& out_shape, std::string_view op) {
    std::int64_t B = 1;
    bool have_batch = false;
    for (std::size_t k = 0; k < in.size(); ++k) {
        if (!in[k].shape().batched) continue;
        if (have_batch && in[k].batch() != B)
            fail(op, ": batch sizes differ, ", B, " and ", in[k].batch(), " (operand ", k, ")");
        B = in[k].batch();
        have_batch = true;
    }
    Plan p;
    const int d = out_shape.sample_rank();
    for (const auto& t : in) {
        std::vector<int> ax(std::size_t(d), -1);
        auto map = align(t.shape(), out_shape);
        for (int q = 0; q < t.structure().rank(); ++q)
            if (map[q] >= 0 && !(is_one(t.shape().axes[q]) && !is_one(out_shape.axes[map[q]])))
                ax[map[q]] = q;
        p.in_axis.push_back(std::move(ax));
    }
    p.out = make_structure(out_shape, B, [&](std::int64_t i) {
        std::vector<std::int64_t> s(std::size_t(d), 1);
        std::vector<int> from(std::size_t(d), -1);
        for (std::size_t k = 0; k < in.size(); ++k) {
            std::int64_t ik = in[k].shape().batched ? i : 0;
            for (int a = 0; a < d; ++a) {
                int q = p.in_axis[k][a];
                if (q < 0) continue;
                std::int64_t n = in[k].structure().size(ik, q);
                if (from[a] < 0) {
                    s[a] = n;
                    from[a] = int(k);
                } else if (s[a] != n) {
                    std::int64_t j = in[from[a]].shape().batched ? i : 0;
                    fail(op, ": sample ", i, ": shapes ",
                         sample_str(in[from[a]].structure().sample_shape(j)), " and ",
                         sample_str(in[k].structure().sample_shape(ik)), " do not match on axis ",
                         a + (out_shape.batched ? 1 : 0), " (", s[a], " vs ", n, ")");
                }
            }
        }
        return s;
    });
    return p;
}

} // namespace

RaggedTensor broadcast_apply(std::span<const RaggedTensor> in, DType out_dtype, std::string_view op,
                             const std::function<double(const double*)>& fn) {
    std::vector<Shape> shapes;
    for (const auto& t : in) shapes.push_back(t.shape());
    Shape out_shape = broadcast_shapes(shapes, op);
    std::vector<std::vector<double>> vals;
    for (const auto& t : in) vals.push_back(t.to_f64());
    std::vector<double> args(in.size());
    // Fast path: every operand already has the result's structure.
    bool same = std::all_of(in.begin(), in.end(), [&](const RaggedTensor& t) {
        return t.shape() == out_shape && t.structure().same_as(in[0].structure());
    });
    if (same) {
        std::vector<double> out(vals[0].size());
        for (std::size_t e = 0; e < out.size(); ++e) {
            for (std::size_t k = 0; k < in.size(); ++k) args[k] = vals[k][e];
            out[e] = fn(args.data());
        }
        return RaggedTensor::from_f64(out_dtype, in[0].structure_ptr(), out);
    }
    Plan p = plan(in, out_shape, op);
    std::vector<double> out(static_cast<std::size_t>(p.out->numel()));
    for (std::int64_t i = 0; i < p.out->batch(); ++i) {
        SampleView ov = sample_view(*p.out, i);
        std::vector<SampleView> iv;
        for (std::size_t k = 0; k < in.size(); ++k) {
            SampleView v = sample_view(in[k].structure(), in[k].shape().batched ? i : 0);
            SampleView w{v.base, ov.shape, std::vector<std::int64_t>(ov.shape.size(), 0)};
            for (std::size_t a = 0; a < ov.shape.size(); ++a)
                if (p.in_axis[k][a] >= 0) w.strides[a] = v.strides[p.in_axis[k][a]];
            iv.push_back(std::move(w));
        }
        for_each_index(ov.shape, [&](const std::vector<std::int64_t>& idx) {
            for (std::size_t k = 0; k < in.size(); ++k) args[k] = vals[k][iv[k].at(idx)];
            out[ov.at(idx)] = fn(args.data());
        });
    }
    return RaggedTensor::from_f64(out_dtype, p.out, out);
}

RaggedTensor sum_to(const RaggedTensor& g, const RaggedTensor& like) {
    if (g.shape() == like.shape() && g.structure().same_as(like.structure()))
        return g.dtype() == like.dtype() ? g : g.astype(like.dtype());
    const Shape& gs = g.shape();
    auto map = align(like.shape(), gs);
    if (like.shape().batched && like.batch() != g.batch())
        fail("sum_to: the gradient has ", g.batch(), " samples but the operand has ", like.batch());
    std::vector<double> gv = g.to_f64(), out(std::size_t(like.numel()), 0.0);
    for (std::int64_t i = 0; i < g.batch(); ++i) {
        SampleView v = sample_view(g.structure(), i);
        SampleView t = sample_view(like.structure(), like.shape().batched ? i : 0);
        // Strides of `like` per axis of g: 0 where like was broadcast or has no such axis.
        std::vector<std::int64_t> st(v.shape.size(), 0);
        for (int q = 0; q < like.structure().rank(); ++q) {
            if (map[q] < 0 || is_one(like.shape().axes[q])) continue;
            if (t.shape[std::size_t(q)] != v.shape[std::size_t(map[q])])
                fail("sum_to: sample ", i, ": axis ", q, " of the operand has extent ",
                     t.shape[std::size_t(q)], " but the gradient has ",
                     v.shape[std::size_t(map[q])]);
            st[map[q]] = t.strides[q];
        }
        for_each_index(v.shape, [&](const std::vector<std::int64_t>& idx) {
            std::int64_t at = t.base;
            for (std::size_t a = 0; a < idx.size(); ++a) at += idx[a] * st[a];
            out[at] += gv[v.at(idx)];
        });
    }
    return RaggedTensor::from_f64(like.dtype(), like.structure_ptr(), out);
}

} // namespace rag::kern
