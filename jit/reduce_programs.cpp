#include "jit/reduce_programs.hpp"

#include <algorithm>
#include <cmath>

namespace rag::jit {
namespace {

using kir::Builder;
using kir::Expr;
using kir::Loop;
using kir::Type;

const char* name_of(SegOp op) {
    switch (op) {
    case SegOp::sum:
        return "segment_sum";
    case SegOp::mean:
        return "segment_mean";
    case SegOp::expand_sum:
        return "segment_expand_sum";
    case SegOp::expand_mean:
        return "segment_expand_mean";
    case SegOp::softmax:
        return "segment_softmax";
    case SegOp::softmax_grad:
        return "segment_softmax_grad";
    }
    return "";
}

} // namespace

kir::Kernel segment_program(SegOp op) {
    Builder b(name_of(op));
    const int seg = b.buffer("seg", kir::Elem::i64);
    const int a = b.buffer(op == SegOp::softmax_grad ? "y" : "x", kir::Elem::f32);
    const int g = op == SegOp::softmax_grad ? b.buffer("g", kir::Elem::f32) : -1;
    const int out = b.buffer("out", kir::Elem::f32);
    Expr e = b.pid() * 5;
    Expr in_base = b.let(b.load(seg, e), "in_base"),
         out_base = b.let(b.load(seg, e + 1), "out_base");
    Expr outer = b.let(b.load(seg, e + 2), "outer"), n = b.let(b.load(seg, e + 3), "n");
    Expr inner = b.let(b.load(seg, e + 4), "inner");
    const bool expand = op == SegOp::expand_sum || op == SegOp::expand_mean;
    if (expand) {
        // One thread per element of the big side, so that neighbouring threads write neighbours.
        b.loop(
            0, outer * n * inner,
            [&](Expr k) {
                Expr o = b.let(k / (n * inner), "o"), j = b.let(k % inner, "j");
                Expr v = b.load(a, out_base + o * inner + j);
                if (op == SegOp::expand_mean) v = v / to_f32(n);
                b.store(out, in_base + k, v);
            },
            Loop::threads);
        return b.finish();
    }
    // One thread per line (o, j); neighbouring threads read neighbouring j.
    b.loop(
        0, outer * inner,
        [&](Expr k) {
            Expr o = b.let(k / inner, "o"), j = b.let(k % inner, "j");
            Expr base = b.let(in_base + o * n * inner + j, "base");
            auto at = [&](Expr r) { return base + r * inner; };
            switch (op) {
            case SegOp::sum:
            case SegOp::mean: {
                int acc = b.var(Type::f32, 0.0);
                b.loop(0, n, [&](Expr r) { b.set(acc, b.get(acc) + b.load(a, at(r))); });
                Expr v = b.get(acc);
                if (op == SegOp::mean) v = select(n > 0, v / to_f32(max(n, Expr(1))), Expr(0.0));
                b.store(out, out_base + k, v);
                break;
            }
            case SegOp::softmax: {
                int top = b.var(Type::f32, Expr(-INFINITY));
                b.loop(0, n, [&](Expr r) { b.set(top, max(b.get(top), b.load(a, at(r)))); });
                Expr m = b.let(b.get(top), "m");
                Expr shift =
                    b.let(select(m > Expr(-INFINITY) && m < Expr(INFINITY), m, Expr(0.0)), "shift");
                int sum = b.var(Type::f32, 0.0);
                b.loop(0, n,
                       [&](Expr r) { b.set(sum, b.get(sum) + exp(b.load(a, at(r)) - shift)); });
                Expr inv = b.let(Expr(1.0) / b.get(sum), "inv");
                b.loop(0, n,
                       [&](Expr r) { b.store(out, at(r), exp(b.load(a, at(r)) - shift) * inv); });
                break;
            }
            case SegOp::softmax_grad: {
                int dot = b.var(Type::f32, 0.0);
                b.loop(0, n, [&](Expr r) {
                    b.set(dot, b.get(dot) + b.load(g, at(r)) * b.load(a, at(r)));
                });
                Expr d = b.let(b.get(dot), "dot");
                b.loop(0, n, [&](Expr r) {
                    b.store(out, at(r), b.load(a, at(r)) * (b.load(g, at(r)) - d));
                });
                break;
            }
            default:
                break;
            }
        },
        Loop::threads);
    return b.finish();
}

std::vector<std::int64_t> segment_entries(const Structure& big, const Structure& small, int axis) {
    std::vector<std::int64_t> seg;
    const int d = big.rank();
    for (std::int64_t i = 0; i < big.batch(); ++i) {
        std::int64_t outer = 1, n = big.sample_numel(i), inner = 1;
        if (axis >= 0) {
            const int q = big.dim_order()[std::size_t(axis)];
            n = big.size(i, axis);
            for (int x = 0; x < d; ++x) {
                const int pos = big.dim_order()[std::size_t(x)];
                if (pos < q) outer *= big.size(i, x);
                if (pos > q) inner *= big.size(i, x);
            }
        }
        if (outer * inner == 0) continue; // nothing to write for this sample
        const std::int64_t step = std::max<std::int64_t>(1, kSegmentLines / inner);
        for (std::int64_t o = 0; o < outer; o += step)
            seg.insert(seg.end(),
                       {big.sample_begin(i) + o * n * inner, small.sample_begin(i) + o * inner,
                        std::min(step, outer - o), n, inner});
    }
    return seg;
}

std::optional<SegmentJob> segment_job(const ir::Node& n, std::span<const RaggedTensor> args) {
    if (n.type.dtype != DType::f32 || args.empty() || !n.attrs.has("axis")) return std::nullopt;
    const RaggedTensor& x = args[0];
    if (x.dtype() != DType::f32) return std::nullopt;
    std::int64_t a = n.attrs.get_int("axis");
    if (a < 0) a += x.shape().logical_rank();
    if (a < 0 || a >= x.shape().logical_rank()) return std::nullopt;
    // The sample's axis: -1 for each whole sample (axis 0 of a batched value); an unbatched
    // value is one sample of its own axes (a relation table's sums on the GPU tier).
    const int axis = x.shape().batched ? int(a) - 1 : int(a);
    auto same = [](const RaggedTensor& t, const Structure& s) {
        return t.dtype() == DType::f32 && t.structure().same_as(s);
    };
    SegmentJob job{SegOp::sum, {}, {}, nullptr};
    if (n.op == "sum" || n.op == "mean") {
        job.op = n.op == "sum" ? SegOp::sum : SegOp::mean;
        std::vector<std::int64_t> sizes;
        for (std::int64_t i = 0; i < x.batch() && axis >= 0; ++i) {
            auto s = x.structure().sample_shape(i);
            for (int k = 0; k < int(s.size()); ++k)
                if (k != axis) sizes.push_back(s[std::size_t(k)]);
        }
        job.out = Structure::make(n.type.shape, x.batch(), sizes);
        job.seg = segment_entries(x.structure(), *job.out, axis);
        job.inputs = {x};
        return job;
    }
    if (n.op == "reduce_grad" && args.size() == 3) {
        const std::string kind = n.attrs.get_str("kind");
        if (kind != "sum" && kind != "mean") return std::nullopt;
        const RaggedTensor &y = args[1], &g = args[2];
        if (!same(g, y.structure()) || y.batch() != x.batch()) return std::nullopt;
        // y's structure must be x's with the axis removed (else the reference reports).
        for (std::int64_t i = 0; i < x.batch(); ++i) {
            auto xs = x.structure().sample_shape(i);
            auto ys = y.structure().sample_shape(i);
            std::vector<std::int64_t> want;
            for (int k = 0; k < int(xs.size()) && axis >= 0; ++k)
                if (k != axis) want.push_back(xs[std::size_t(k)]);
            if (!std::equal(ys.begin(), ys.end(), want.begin(), want.end())) return std::nullopt;
        }
        job.op = kind == "sum" ? SegOp::expand_sum : SegOp::expand_mean;
        job.out = x.structure_ptr();
        job.seg = segment_entries(x.structure(), g.structure(), axis);
        job.inputs = {g};
        return job;
    }
    if (axis < 0) return std::nullopt; // softmax over the batch axis: the reference reports
    if (n.op == "softmax") {
        job.op = SegOp::softmax;
        job.out = x.structure_ptr();
        job.seg = segment_entries(x.structure(), x.structure(), axis);
        job.inputs = {x};
        return job;
    }
    if (n.op == "softmax_grad" && args.size() == 2 && same(args[1], x.structure())) {
        job.op = SegOp::softmax_grad;
        job.out = x.structure_ptr();
        job.seg = segment_entries(x.structure(), x.structure(), axis);
        job.inputs = {x, args[1]};
        return job;
    }
    return std::nullopt;
}

} // namespace rag::jit
