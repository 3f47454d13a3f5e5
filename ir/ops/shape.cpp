// Shape ops: transpose, NumPy-style index (keep, new, integer, slice), reshape of the static
// tail, and concat along a static axis. They move data without arithmetic, so the kernels copy
// elements bytewise (exact for every dtype) between per-sample strided views.
#include "ir/ops/index_plan.hpp"
#include "ir/ops/kernel_util.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

namespace rag {
namespace {

using Idx = std::vector<std::int64_t>;

// Calls map(a_idx, b_idx) to find, for every element of every sample of `a`, the element of the
// same sample of `b` it corresponds to, then fn(a_offset, b_offset) with their storage offsets.
template <class Map, class Fn>
void for_each_pair(const Structure& a, const Structure& b, Map&& map, Fn&& fn) {
    Idx bi(std::size_t(b.rank()));
    for (std::int64_t i = 0; i < a.batch(); ++i) {
        auto va = kern::sample_view(a, i), vb = kern::sample_view(b, i);
        kern::for_each_index(va.shape, [&](const Idx& ai) {
            map(ai, bi);
            fn(va.at(ai), vb.at(bi));
        });
    }
}

void copy_element(const RaggedTensor& from, std::int64_t f, RaggedTensor& to, std::int64_t t) {
    const std::size_t es = dtype_size(from.dtype());
    std::memcpy(static_cast<std::byte*>(to.mutable_data()) + t * es,
                static_cast<const std::byte*>(from.data()) + f * es, es);
}

// ---- transpose ----

Shape transposed(const Shape& s, int a, int b) {
    Shape out = s;
    std::swap(out.axes[a], out.axes[b]);
    return out;
}

std::pair<int, int> transpose_axes(const Shape& s, const Attrs& at) {
    return {kern::sample_axis(s, at.get_int("a"), "transpose"),
            kern::sample_axis(s, at.get_int("b"), "transpose")};
}

RaggedTensor transpose_kernel(const RaggedTensor& x, const Attrs& at) {
    auto [a, b] = transpose_axes(x.shape(), at);
    const Structure& xs = x.structure();
    auto st = kern::make_structure(transposed(x.shape(), a, b), x.batch(), [&](std::int64_t i) {
        auto s = xs.sample_shape(i);
        Idx out(s.begin(), s.end());
        std::swap(out[a], out[b]);
        return out;
    });
    RaggedTensor y = RaggedTensor::zeros(x.dtype(), st);
    for_each_pair(
        *st, xs,
        [&](const Idx& yi, Idx& xi) {
            xi = yi;
            std::swap(xi[a], xi[b]);
        },
        [&](std::int64_t yo, std::int64_t xo) { copy_element(x, xo, y, yo); });
    return y;
}

// ---- index ----

// Calls fn(y_offset, x_offset) for every element y of index(x) and the element of x it reads.
template <class Fn>
void for_each_read(const IndexPlan& p, const Structure& y, const Structure& x, Fn&& fn) {
    Idx xi(std::size_t(x.rank()));
    for (std::int64_t i = 0; i < y.batch(); ++i) {
        auto vy = kern::sample_view(y, i), vx = kern::sample_view(x, i);
        const IndexPlan::Sample s = p.sample(x, i);
        kern::for_each_index(vy.shape, [&](const Idx& yi) {
            p.map(s, yi, xi);
            fn(vy.at(yi), vx.at(xi));
        });
    }
}

RaggedTensor index_kernel(const RaggedTensor& x, const Attrs& at) {
    IndexPlan p = plan_index(x.shape(), at.get_str("spec"));
    const Structure& xs = x.structure();
    auto st = kern::make_structure(p.out, x.batch(),
                                   [&](std::int64_t i) { return p.sample_shape(xs, i); });
    RaggedTensor y = RaggedTensor::zeros(x.dtype(), st);
    for_each_read(p, *st, xs,
                  [&](std::int64_t yo, std::int64_t xo) { copy_element(x, xo, y, yo); });
    return y;
}

// index_grad(g, x): zeros shaped like x with g scattered where index read x (a slice reads
// every element at most once, so this is a copy, not a sum).
RaggedTensor index_grad_kernel(const RaggedTensor& g, const RaggedTensor& x, const Attrs& at) {
    IndexPlan p = plan_index(x.shape(), at.get_str("spec"));
    if (g.batch() != x.batch())
        fail("index_grad: batch sizes differ, ", g.batch(), " and ", x.batch());
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        auto gs = g.structure().sample_shape(i);
        if (!std::equal(gs.begin(), gs.end(), p.sample_shape(x.structure(), i).begin()))
            fail("index_grad: sample ", i, ": the gradient does not have index's result shape");
    }
    RaggedTensor dx = RaggedTensor::zeros(x.dtype(), x.structure_ptr());
    for_each_read(p, g.structure(), x.structure(),
                  [&](std::int64_t go, std::int64_t xo) { copy_element(g, go, dx, xo); });
    return dx;
}

// ---- reshape ----

// The static tail: the fixed axes after the last non-fixed one.
int tail_start(const Shape& s) {
    int t = s.sample_rank();
    while (t > 0 && s.axes[std::size_t(t - 1)].kind == AxisKind::fixed) --t;
    return t;
}

Shape reshaped(const Shape& x, const Idx& extents) {
    const int t = tail_start(x);
    std::int64_t have = 1, want = 1;
    for (int a = t; a < x.sample_rank(); ++a) have *= x.axes[std::size_t(a)].extent;
    for (auto e : extents) {
        if (e < 0) fail("reshape: extents must be >= 0, got ", e);
        if (__builtin_mul_overflow(want, e, &want)) fail("reshape: the extents overflow");
    }
    if (have != want)
        fail("reshape: the static tail ",
             shape_str(Shape{false, std::vector<Axis>(x.axes.begin() + t, x.axes.end())}), " of ",
             shape_str(x), " holds ", have, " elements, not ", want);
    Shape out{x.batched, {x.axes.begin(), x.axes.begin() + t}};
    for (auto e : extents) out.axes.push_back(Axis::fixed_of(e));
    return out;
}

Idx tail_extents(const Shape& x) {
    Idx tail;
    for (int a = tail_start(x); a < x.sample_rank(); ++a)
        tail.push_back(x.axes[std::size_t(a)].extent);
    return tail;
}

// The tail is the innermost, contiguous block of storage, so only the structure changes.
RaggedTensor reshape_kernel(const RaggedTensor& x, const Attrs& at) {
    Idx extents = at.get_ints("shape");
    const int t = tail_start(x.shape());
    auto st = kern::make_structure(reshaped(x.shape(), extents), x.batch(), [&](std::int64_t i) {
        auto s = x.structure().sample_shape(i);
        Idx out(s.begin(), s.begin() + t);
        out.insert(out.end(), extents.begin(), extents.end());
        return out;
    });
    return x.with_structure(st); // a view: device-resident values stay on the device
}

// ---- concat ----

Schema concat_rule(std::span<const Schema> in, const Attrs& at) {
    kern::require_same_dtype(in, "concat");
    const Shape& s0 = in[0].shape;
    const int p = kern::sample_axis(s0, at.get_int("axis"), "concat");
    Shape out = s0;
    out.axes[std::size_t(p)].extent = 0;
    for (std::size_t k = 0; k < in.size(); ++k) {
        const Shape& s = in[k].shape;
        bool same_others = s.batched == s0.batched && s.sample_rank() == s0.sample_rank();
        for (int a = 0; same_others && a < s.sample_rank(); ++a)
            same_others = a == p || s.axes[std::size_t(a)] == s0.axes[std::size_t(a)];
        if (!same_others)
            fail("concat: input ", k, " ", in[k].str(), " and input 0 ", in[0].str(),
                 " differ outside axis ", at.get_int("axis"));
        kern::require_fixed(s.axes[std::size_t(p)], "concat", "the concatenation axis");
        out.axes[std::size_t(p)].extent += s.axes[std::size_t(p)].extent;
    }
    return {in[0].dtype, out};
}

RaggedTensor concat_kernel(std::span<const RaggedTensor> in, const Attrs& at) {
    const Structure& s0 = in[0].structure();
    const int p = kern::sample_axis(s0.shape(), at.get_int("axis"), "concat");
    for (std::size_t k = 1; k < in.size(); ++k) {
        const Structure& s = in[k].structure();
        if (s.batch() != s0.batch())
            fail("concat: batch sizes differ, ", s0.batch(), " in input 0 and ", s.batch(),
                 " in input ", k);
        for (std::int64_t i = 0; i < s.batch(); ++i)
            for (int a = 0; a < s.rank(); ++a)
                if (a != p && s.size(i, a) != s0.size(i, a))
                    fail("concat: sample ", i, ": axis ", a + (s.shape().batched ? 1 : 0), " is ",
                         s.size(i, a), " in input ", k, " but ", s0.size(i, a), " in input 0");
    }
    std::vector<Schema> schemas;
    for (const auto& x : in) schemas.push_back(x.schema());
    Shape out = concat_rule(schemas, at).shape;
    auto st = kern::make_structure(out, s0.batch(), [&](std::int64_t i) {
        auto s = s0.sample_shape(i);
        Idx shape(s.begin(), s.end());
        shape[std::size_t(p)] = out.axes[std::size_t(p)].extent;
        return shape;
    });
    RaggedTensor y = RaggedTensor::zeros(in[0].dtype(), st);
    std::int64_t offset = 0;
    for (const auto& x : in) {
        for_each_pair(
            x.structure(), *st,
            [&](const Idx& xi, Idx& yi) {
                yi = xi;
                yi[std::size_t(p)] += offset;
            },
            [&](std::int64_t xo, std::int64_t yo) { copy_element(x, xo, y, yo); });
        offset += x.shape().axes[std::size_t(p)].extent;
    }
    return y;
}

// concat's VJP: input k's cotangent is g sliced to input k's range along the axis.
std::vector<std::optional<Val>> concat_vjp(Emitter& e, std::span<const Val> in, Val g,
                                           const Attrs& at) {
    const Shape& s0 = e.schema(in[0]).shape;
    const int p = kern::sample_axis(s0, at.get_int("axis"), "concat");
    std::string keep;
    for (int a = 0; a < p + (s0.batched ? 1 : 0); ++a) keep += ":, ";
    std::vector<std::optional<Val>> grads;
    std::int64_t offset = 0;
    for (Val x : in) {
        std::int64_t n = e.schema(x).shape.axes[std::size_t(p)].extent;
        std::string spec = keep + std::to_string(offset) + ":" + std::to_string(offset + n);
        grads.push_back(e.emit("index", {g}, {{"spec", spec}}));
        offset += n;
    }
    return grads;
}

} // namespace

void register_shape_ops(OpTable& t) {
    t.add({"transpose", 1, 1,
           "transpose(x, a=int, b=int): swap two per-sample axes (logical numbering, negative "
           "from the end, not the batch axis); kinds and names move with them",
           [](auto in, auto& at) {
               auto [a, b] = transpose_axes(in[0].shape, at);
               return Schema{in[0].dtype, transposed(in[0].shape, a, b)};
           },
           [](auto in, auto& at) { return transpose_kernel(in[0], at); },
           [](Emitter& e, auto, Val, Val g, auto& at) -> std::vector<std::optional<Val>> {
               return {e.emit("transpose", {g}, at)};
           }});

    t.add({"index", 1, 1,
           "index(x, spec=\"...\"): NumPy-style x[spec], one comma-separated item per logical "
           "axis from the left (missing trailing items are ':'): ':' keeps, 'new' inserts an "
           "extent-1 axis, an integer selects on a static axis (negative from the end), "
           "'a:b:s' slices any axis with Python's rules (bounds optional, negative from the end, "
           "clamped; step s >= 1). A sliced ragged (symbolic) axis stays ragged (symbolic) with a "
           "derived name by its length function: 'a:' and ':-a' give ~N[a:], 'a:-k' ~N[(a+k):], "
           "'-k:' and ':k' ~N[:k], others ~N[a:b]; a step appends ':s' (~N[1::2]). The batch "
           "axis takes only ':'",
           [](auto in, auto& at) {
               return Schema{in[0].dtype, plan_index(in[0].shape, at.get_str("spec")).out};
           },
           [](auto in, auto& at) { return index_kernel(in[0], at); },
           [](Emitter& e, auto in, Val, Val g, auto& at) -> std::vector<std::optional<Val>> {
               return {e.emit("index_grad", {g, in[0]}, at)};
           }});

    t.add({"index_grad",
           2,
           2,
           "index_grad(g, x, spec=\"...\"): zeros shaped like x with g scattered to the "
           "elements index(x, spec) read",
           [](auto in, auto& at) {
               if (in[0].dtype != in[1].dtype ||
                   in[0].shape != plan_index(in[1].shape, at.get_str("spec")).out)
                   fail("index_grad: the gradient ", in[0].str(), " does not match index(",
                        in[1].str(), ", spec=\"", at.get_str("spec"), "\")");
               return in[1];
           },
           [](auto in, auto& at) { return index_grad_kernel(in[0], in[1], at); },
           {},
           {1}});

    t.add({"reshape", 1, 1,
           "reshape(x, shape=[ints]): replace the static tail (the fixed axes after the last "
           "ragged or symbolic axis; every axis of an all-static value) by the given extents, "
           "whose product must match; storage is shared",
           [](auto in, auto& at) {
               return Schema{in[0].dtype, reshaped(in[0].shape, at.get_ints("shape"))};
           },
           [](auto in, auto& at) { return reshape_kernel(in[0], at); },
           [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
               return {e.emit("reshape", {g}, {{"shape", tail_extents(e.schema(in[0]).shape)}})};
           }});

    t.add({"concat", 1, -1,
           "concat(x1, x2, ..., axis=int): join along one static per-sample axis; every other "
           "axis must be the same in all inputs (per sample too)",
           concat_rule, concat_kernel,
           [](Emitter& e, auto in, Val, Val g, auto& at) { return concat_vjp(e, in, g, at); }});
}

} // namespace rag
