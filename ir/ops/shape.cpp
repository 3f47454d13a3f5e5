// Shape ops: transpose, NumPy-style index (keep, new, integer, slice), reshape of the static
// tail, and concat along a static axis. They move data without arithmetic, so the kernels copy
// elements bytewise (exact for every dtype) between per-sample strided views.
#include "ir/ops/kernel_util.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>

namespace rag {
namespace {

using Idx = std::vector<std::int64_t>;

std::string axis_str(const Axis& a) {
    if (a.kind == AxisKind::fixed) return std::to_string(a.extent);
    return (a.is_ragged() ? "~" : "") + a.name;
}

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

// How index's result reads x: out_src[o] is the x axis behind result axis o (-1: inserted by
// `new`); x element = x_start[s] + (x_out[s] >= 0 ? result index along x_out[s] : 0).
struct IndexPlan {
    Shape out;
    std::vector<int> out_src;
    Idx x_start;
    std::vector<int> x_out;

    void map(const Idx& oi, Idx& xi) const {
        for (std::size_t s = 0; s < x_start.size(); ++s)
            xi[s] = x_start[s] + (x_out[s] >= 0 ? oi[std::size_t(x_out[s])] : 0);
    }
    Idx sample_shape(const Structure& x, std::int64_t i) const {
        Idx shape;
        for (std::size_t o = 0; o < out.axes.size(); ++o) {
            const Axis& ax = out.axes[o];
            shape.push_back(ax.kind == AxisKind::fixed ? ax.extent : x.size(i, out_src[o]));
        }
        return shape;
    }
};

std::string trim(std::string_view s) {
    auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string_view::npos ? "" : std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split_spec(std::string_view spec) {
    std::vector<std::string> items;
    if (trim(spec).empty()) return items;
    std::size_t start = 0;
    while (true) {
        auto comma = spec.find(',', start);
        items.push_back(trim(spec.substr(start, comma - start)));
        if (comma == std::string_view::npos) return items;
        start = comma + 1;
    }
}

// An optional integer: "" gives nullopt; anything but an integer is an error.
std::optional<std::int64_t> parse_int(const std::string& s, std::string_view spec) {
    if (s.empty()) return std::nullopt;
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size())
        fail("index: bad item '", s, "' in spec '", spec, "'");
    return v;
}

// A Python slice bound: negative counts from the end, then clamped to [0, n].
std::int64_t clamp_bound(std::int64_t b, std::int64_t n) {
    if (b < 0) b += n;
    return std::clamp<std::int64_t>(b, 0, n);
}

IndexPlan plan_index(const Shape& x, std::string_view spec) {
    const int rank = x.sample_rank();
    IndexPlan p;
    p.out.batched = x.batched;
    p.x_start.assign(std::size_t(rank), 0);
    p.x_out.assign(std::size_t(rank), -1);
    auto items = split_spec(spec);
    std::size_t k = 0;
    if (x.batched && !items.empty()) {
        if (items[0] != ":")
            fail("index: the first item must be ':' (the batch axis of ", shape_str(x), "), got '",
                 items[0], "'");
        k = 1;
    }
    auto keep = [&](int s, Axis ax, std::int64_t start) {
        p.x_out[std::size_t(s)] = p.out.sample_rank();
        p.x_start[std::size_t(s)] = start;
        p.out.axes.push_back(std::move(ax));
        p.out_src.push_back(s);
    };
    int s = 0; // next axis of x
    for (; k < items.size(); ++k) {
        const std::string& it = items[k];
        if (it.empty()) fail("index: empty item in spec '", spec, "'");
        if (it == "new") {
            p.out.axes.push_back(Axis::fixed_of(1));
            p.out_src.push_back(-1);
            continue;
        }
        if (s == rank) fail("index: too many items in '", spec, "' for ", shape_str(x));
        const Axis& ax = x.axes[std::size_t(s)];
        const int logical = s + (x.batched ? 1 : 0);
        if (it == ":") {
            keep(s++, ax, 0);
            continue;
        }
        if (ax.kind != AxisKind::fixed)
            fail("index: axis ", logical, " is ", ax.is_ragged() ? "ragged " : "symbolic ",
                 axis_str(ax), " and accepts only ':', got '", it, "'");
        const std::int64_t n = ax.extent;
        auto colon = it.find(':');
        if (colon == std::string::npos) {
            std::int64_t i = *parse_int(it, spec);
            if (i < -n || i >= n)
                fail("index: index ", i, " is out of range for axis ", logical, " of extent ", n);
            p.x_start[std::size_t(s++)] = i < 0 ? i + n : i;
            continue;
        }
        if (it.find(':', colon + 1) != std::string::npos)
            fail("index: slices take no step, got '", it, "'");
        std::int64_t lo = clamp_bound(parse_int(trim(it.substr(0, colon)), spec).value_or(0), n);
        std::int64_t hi = clamp_bound(parse_int(trim(it.substr(colon + 1)), spec).value_or(n), n);
        keep(s++, Axis::fixed_of(std::max<std::int64_t>(hi - lo, 0)), lo);
    }
    for (; s < rank; ++s) keep(s, x.axes[std::size_t(s)], 0);
    return p;
}

RaggedTensor index_kernel(const RaggedTensor& x, const Attrs& at) {
    IndexPlan p = plan_index(x.shape(), at.get_str("spec"));
    const Structure& xs = x.structure();
    auto st = kern::make_structure(p.out, x.batch(),
                                   [&](std::int64_t i) { return p.sample_shape(xs, i); });
    RaggedTensor y = RaggedTensor::zeros(x.dtype(), st);
    for_each_pair(
        *st, xs, [&](const Idx& yi, Idx& xi) { p.map(yi, xi); },
        [&](std::int64_t yo, std::int64_t xo) { copy_element(x, xo, y, yo); });
    return y;
}

// index_grad(g, x): zeros shaped like x with g scattered where index read x.
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
    for_each_pair(
        g.structure(), x.structure(), [&](const Idx& gi, Idx& xi) { p.map(gi, xi); },
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
    return RaggedTensor(x.dtype(), st, x.buffer());
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
           "extent-1 axis, an integer selects on a static axis (negative from the end), 'a:b' "
           "slices a static axis with Python clamping (empty when b <= a); ragged and symbolic "
           "axes take only ':', and the batch axis only ':'",
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
