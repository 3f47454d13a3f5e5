// Reductions (sum, mean, max, min), softmax and logsumexp, and their dedicated backward ops.
//
// A reduction consumes one logical axis: the batch axis (axis=0 of a batched value reduces each
// sample completely and stacks the results to [B]), or one per-sample axis (static, symbolic or
// ragged), which disappears from the type while the other axes keep their kinds and names.
// Without `axis` the reduction is global over every stored entry, each weighted equally, and
// gives an unbatched scalar. Every kernel here walks x once through `visit`, which pairs each
// input element with the result element it reduces into, so forward and backward agree on the
// grouping and on the order ("first position" of a max is first in that walk).
#include "ir/ops/kernel_util.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rag {
namespace {

enum class Mode { global, sample, axis };

struct Plan {
    Mode mode = Mode::global;
    int axis = -1; // per-sample axis, Mode::axis only
    Shape out;     // the result's shape
};

// The reduction a value of shape x undergoes under `axis=` (absent: global).
Plan plan_reduction(const Shape& x, const Attrs& at, std::string_view op) {
    if (!at.has("axis")) return {Mode::global, -1, Shape{false, {}}};
    const std::int64_t axis = at.get_int("axis");
    const std::int64_t a = axis < 0 ? axis + x.logical_rank() : axis;
    if (x.batched && a == 0) return {Mode::sample, -1, Shape{true, {}}};
    Plan p{Mode::axis, kern::sample_axis(x, axis, op), x};
    p.out.axes.erase(p.out.axes.begin() + p.axis);
    return p;
}

// softmax and logsumexp: one per-sample axis, required.
Plan plan_axis(const Shape& x, const Attrs& at, std::string_view op) {
    if (!at.has("axis")) fail(op, ": axis= is required");
    Plan p{Mode::axis, kern::sample_axis(x, at.get_int("axis"), op), x};
    p.out.axes.erase(p.out.axes.begin() + p.axis);
    return p;
}

StructurePtr out_structure(const Structure& x, const Plan& p) {
    if (p.mode == Mode::global)
        return kern::make_structure(p.out, 1,
                                    [](std::int64_t) { return std::vector<std::int64_t>{}; });
    return kern::make_structure(p.out, x.batch(), [&](std::int64_t i) {
        std::vector<std::int64_t> s;
        if (p.mode == Mode::axis) {
            auto xs = x.sample_shape(i);
            s.assign(xs.begin(), xs.end());
            s.erase(s.begin() + p.axis);
        }
        return s;
    });
}

// Calls fn(in, out) for every element of x (storage positions in x and in the result y), each
// sample in logical row-major order, samples in batch order.
template <class Fn> void visit(const Structure& x, const Structure& y, const Plan& p, Fn&& fn) {
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        kern::SampleView xv = kern::sample_view(x, i);
        // Strides of y per axis of x; 0 along the reduced axes.
        std::vector<std::int64_t> ystr(xv.shape.size(), 0);
        std::int64_t base = 0;
        if (p.mode != Mode::global) {
            kern::SampleView yv = kern::sample_view(y, i);
            base = yv.base;
            if (p.mode == Mode::axis)
                for (std::size_t a = 0, b = 0; a < ystr.size(); ++a)
                    if (int(a) != p.axis) ystr[a] = yv.strides[b++];
        }
        kern::for_each_index(xv.shape, [&](const std::vector<std::int64_t>& idx) {
            std::int64_t out = base;
            for (std::size_t a = 0; a < idx.size(); ++a) out += idx[a] * ystr[a];
            fn(xv.at(idx), out);
        });
    }
}

std::string sample_str(std::span<const std::int64_t> s) {
    std::string out = "(";
    for (std::size_t a = 0; a < s.size(); ++a) out += (a ? ", " : "") + std::to_string(s[a]);
    return out + (s.size() == 1 ? ",)" : ")");
}

// Backward ops get y and g from the forward; a direct call with other lengths is a runtime error.
void require_structure(const RaggedTensor& t, const Structure& want, std::string_view op,
                       std::string_view what) {
    const Structure& s = t.structure();
    if (s.batch() != want.batch())
        fail(op, ": ", what, " has batch size ", s.batch(), ", expected ", want.batch());
    for (std::int64_t i = 0; i < s.batch(); ++i) {
        auto got = s.sample_shape(i), exp = want.sample_shape(i);
        if (!std::equal(got.begin(), got.end(), exp.begin(), exp.end()))
            fail(op, ": sample ", i, ": ", what, " has shape ", sample_str(got), ", expected ",
                 sample_str(exp));
    }
}

void require_schema(const Schema& got, const Schema& want, std::string_view op,
                    std::string_view what) {
    if (got != want) fail(op, ": ", what, " has schema ", got.str(), ", expected ", want.str());
}

enum class Kind { sum, mean, max, min };

Kind parse_kind(std::string_view k) {
    if (k == "sum") return Kind::sum;
    if (k == "mean") return Kind::mean;
    if (k == "max") return Kind::max;
    if (k == "min") return Kind::min;
    fail("reduce_grad: unknown kind '", k, "' (expected sum, mean, max or min)");
}

// The result of an empty max (min): -inf (+inf), or the dtype's lowest (highest) value for
// integers, which have no infinities.
double empty_extreme(DType t, Kind k) {
    const bool max = k == Kind::max;
    if (is_floating(t))
        return max ? -std::numeric_limits<double>::infinity()
                   : std::numeric_limits<double>::infinity();
    if (t == DType::i32)
        return max ? std::numeric_limits<std::int32_t>::lowest()
                   : std::numeric_limits<std::int32_t>::max();
    // i64: 2^63 - 1 is not a double; take the largest double below it.
    const double top = std::ldexp(1.0, 63);
    return max ? -top : std::nextafter(top, 0.0);
}

// v replaces the running extremum cur: strictly better (so the first extremal position wins),
// or the first NaN (so NaN propagates).
bool better(Kind k, double v, double cur) {
    if (std::isnan(cur)) return false;
    return std::isnan(v) || (k == Kind::max ? v > cur : v < cur);
}

RaggedTensor reduce(const RaggedTensor& x, const Attrs& at, Kind k, std::string_view op) {
    const Plan p = plan_reduction(x.shape(), at, op);
    StructurePtr st = out_structure(x.structure(), p);
    const bool extreme = k == Kind::max || k == Kind::min;
    std::vector<double> xv = x.to_f64();
    std::vector<double> acc(std::size_t(st->numel()), extreme ? empty_extreme(x.dtype(), k) : 0.0);
    std::vector<std::int64_t> count(acc.size(), 0);
    visit(x.structure(), *st, p, [&](std::int64_t in, std::int64_t out) {
        ++count[out];
        if (!extreme)
            acc[out] += xv[in];
        else if (better(k, xv[in], acc[out]))
            acc[out] = xv[in];
    });
    if (k == Kind::mean)
        for (std::size_t o = 0; o < acc.size(); ++o)
            if (count[o] > 0) acc[o] /= double(count[o]);
    return RaggedTensor::from_f64(x.dtype(), st, acc);
}

Schema reduce_rule(std::span<const Schema> in, const Attrs& at, Kind k, std::string_view op) {
    if (k == Kind::mean) kern::require_float(in[0], op);
    if (in[0].dtype == DType::boolean) fail(op, ": argument must be numeric, got ", in[0].str());
    return {in[0].dtype, plan_reduction(in[0].shape, at, op).out};
}

RaggedTensor reduce_grad(std::span<const RaggedTensor> in, const Attrs& at) {
    const RaggedTensor &x = in[0], &y = in[1], &g = in[2];
    const Kind k = parse_kind(at.get_str("kind"));
    const Plan p = plan_reduction(x.shape(), at, "reduce_grad");
    StructurePtr st = out_structure(x.structure(), p);
    require_structure(y, *st, "reduce_grad", "y");
    require_structure(g, *st, "reduce_grad", "g");
    std::vector<double> xv = x.to_f64(), yv = y.to_f64(), gv = g.to_f64();
    std::vector<double> dx(xv.size(), 0.0);
    std::vector<std::int64_t> count(yv.size(), 0);
    if (k == Kind::mean)
        visit(x.structure(), *st, p, [&](std::int64_t, std::int64_t o) { ++count[o]; });
    std::vector<bool> taken(yv.size(), false); // max/min: the extremum's gradient is given out
    visit(x.structure(), *st, p, [&](std::int64_t i, std::int64_t o) {
        switch (k) {
        case Kind::sum:
            dx[i] = gv[o];
            break;
        case Kind::mean:
            dx[i] = gv[o] / double(count[o]);
            break;
        case Kind::max:
        case Kind::min:
            if (!taken[o] && (xv[i] == yv[o] || (std::isnan(xv[i]) && std::isnan(yv[o])))) {
                dx[i] = gv[o];
                taken[o] = true;
            }
            break;
        }
    });
    return RaggedTensor::from_f64(x.dtype(), x.structure_ptr(), dx);
}

// Per result element of an axis plan: the max of its group if finite, else 0, so exp(x - shift)
// never sees inf - inf for finite entries.
std::vector<double> shifts(const std::vector<double>& xv, const Structure& x, const Structure& y,
                           const Plan& p) {
    std::vector<double> m(std::size_t(y.numel()), -std::numeric_limits<double>::infinity());
    visit(x, y, p, [&](std::int64_t i, std::int64_t o) { m[o] = std::max(m[o], xv[i]); });
    for (double& v : m)
        if (!std::isfinite(v)) v = 0.0;
    return m;
}

// Softmax and logsumexp share the stable pass: shift by the group max, sum the exponentials.
struct ExpSums {
    StructurePtr st;
    std::vector<double> x, shift, sum;
};

ExpSums exp_sums(const RaggedTensor& x, const Plan& p) {
    ExpSums r{out_structure(x.structure(), p), x.to_f64(), {}, {}};
    r.shift = shifts(r.x, x.structure(), *r.st, p);
    r.sum.assign(r.shift.size(), 0.0);
    visit(x.structure(), *r.st, p,
          [&](std::int64_t i, std::int64_t o) { r.sum[o] += std::exp(r.x[i] - r.shift[o]); });
    return r;
}

void add_reduction(OpTable& t, const char* name, Kind k, const std::string& doc) {
    std::string n = name;
    t.add({n, 1, 1, doc, [n, k](auto in, auto& at) { return reduce_rule(in, at, k, n); },
           [n, k](auto in, auto& at) { return reduce(in[0], at, k, n); },
           [n](Emitter& e, auto in, Val out, Val g, auto& at) -> std::vector<std::optional<Val>> {
               if (!is_floating(e.schema(in[0]).dtype)) return {std::nullopt};
               Attrs a = at;
               a.set("kind", n);
               return {e.emit("reduce_grad", {in[0], out, g}, a)};
           }});
}

} // namespace

void register_reduction_ops(OpTable& t) {
    const std::string axes = "(x, axis=): over one logical axis, which disappears (axis=0 of a "
                             "batched x reduces each sample completely, giving [B]), or over "
                             "every stored entry, equally weighted, without axis (a scalar); ";
    add_reduction(t, "sum", Kind::sum, "sum" + axes + "an empty sum is 0");
    add_reduction(t, "mean", Kind::mean,
                  "mean" + axes +
                      "floats only; an empty mean is 0, not NaN, so an empty sample cannot "
                      "poison a loss");
    add_reduction(t, "max", Kind::max,
                  "max" + axes +
                      "an empty max is -inf (integers: the dtype's lowest value); NaN "
                      "propagates; the gradient goes to the first maximal position in logical "
                      "row-major order");
    add_reduction(t, "min", Kind::min,
                  "min" + axes +
                      "an empty min is +inf (integers: the dtype's highest value); NaN "
                      "propagates; the gradient goes to the first minimal position in logical "
                      "row-major order");

    t.add({"reduce_grad",
           3,
           3,
           "reduce_grad(x, y, g, kind=sum|mean|max|min, axis=): dx of y = kind(x, axis) given "
           "dy = g; mean divides by the group's count (an empty group gets nothing); max/min "
           "give g to the first extremal position",
           [](auto in, auto& at) {
               parse_kind(at.get_str("kind"));
               kern::require_float(in[0], "reduce_grad", "x");
               const Schema y{in[0].dtype, plan_reduction(in[0].shape, at, "reduce_grad").out};
               require_schema(in[1], y, "reduce_grad", "y");
               require_schema(in[2], y, "reduce_grad", "g");
               return in[0];
           },
           [](auto in, auto& at) { return reduce_grad(in, at); },
           {}});

    t.add({"softmax", 1, 1,
           "softmax(x, axis=): exp(x) / sum(exp(x)) along one per-sample axis (static or "
           "ragged; not the batch axis), computed stably by subtracting the max; a group whose "
           "max is not finite gives NaN",
           [](auto in, auto& at) {
               kern::require_float(in[0], "softmax");
               plan_axis(in[0].shape, at, "softmax");
               return in[0];
           },
           [](auto in, auto& at) {
               const Plan p = plan_axis(in[0].shape(), at, "softmax");
               ExpSums r = exp_sums(in[0], p);
               std::vector<double> y(r.x.size());
               visit(in[0].structure(), *r.st, p, [&](std::int64_t i, std::int64_t o) {
                   y[i] = std::exp(r.x[i] - r.shift[o]) / r.sum[o];
               });
               return RaggedTensor::from_f64(in[0].dtype(), in[0].structure_ptr(), y);
           },
           [](Emitter& e, auto, Val out, Val g, auto& at) -> std::vector<std::optional<Val>> {
               return {e.emit("softmax_grad", {out, g}, at)};
           }});

    t.add({"softmax_grad",
           2,
           2,
           "softmax_grad(y, g, axis=): y * (g - sum(g * y, axis))",
           [](auto in, auto& at) {
               kern::require_float(in[0], "softmax_grad", "y");
               plan_axis(in[0].shape, at, "softmax_grad");
               require_schema(in[1], in[0], "softmax_grad", "g");
               return in[0];
           },
           [](auto in, auto& at) {
               const RaggedTensor &y = in[0], &g = in[1];
               require_structure(g, y.structure(), "softmax_grad", "g");
               const Plan p = plan_axis(y.shape(), at, "softmax_grad");
               StructurePtr st = out_structure(y.structure(), p);
               std::vector<double> yv = y.to_f64(), gv = g.to_f64();
               std::vector<double> dot(std::size_t(st->numel()), 0.0);
               visit(y.structure(), *st, p,
                     [&](std::int64_t i, std::int64_t o) { dot[o] += gv[i] * yv[i]; });
               visit(y.structure(), *st, p,
                     [&](std::int64_t i, std::int64_t o) { gv[i] = yv[i] * (gv[i] - dot[o]); });
               return RaggedTensor::from_f64(y.dtype(), y.structure_ptr(), gv);
           },
           {}});

    t.add({"logsumexp", 1, 1,
           "logsumexp(x, axis=): log(sum(exp(x))) along one per-sample axis (static or ragged; "
           "not the batch axis), which disappears; computed stably by subtracting the max; an "
           "empty axis gives -inf",
           [](auto in, auto& at) {
               kern::require_float(in[0], "logsumexp");
               return Schema{in[0].dtype, plan_axis(in[0].shape, at, "logsumexp").out};
           },
           [](auto in, auto& at) {
               ExpSums r = exp_sums(in[0], plan_axis(in[0].shape(), at, "logsumexp"));
               for (std::size_t o = 0; o < r.sum.size(); ++o)
                   r.sum[o] = r.shift[o] + std::log(r.sum[o]);
               return RaggedTensor::from_f64(in[0].dtype(), r.st, r.sum);
           },
           [](Emitter& e, auto in, Val out, Val g, auto& at) -> std::vector<std::optional<Val>> {
               return {e.emit("logsumexp_grad", {in[0], out, g}, at)};
           }});

    t.add({"logsumexp_grad",
           3,
           3,
           "logsumexp_grad(x, y, g, axis=): g * exp(x - y) (0 where y = -inf)",
           [](auto in, auto& at) {
               kern::require_float(in[0], "logsumexp_grad", "x");
               const Schema y{in[0].dtype, plan_axis(in[0].shape, at, "logsumexp_grad").out};
               require_schema(in[1], y, "logsumexp_grad", "y");
               require_schema(in[2], y, "logsumexp_grad", "g");
               return in[0];
           },
           [](auto in, auto& at) {
               const RaggedTensor &x = in[0], &y = in[1], &g = in[2];
               const Plan p = plan_axis(x.shape(), at, "logsumexp_grad");
               StructurePtr st = out_structure(x.structure(), p);
               require_structure(y, *st, "logsumexp_grad", "y");
               require_structure(g, *st, "logsumexp_grad", "g");
               std::vector<double> xv = x.to_f64(), yv = y.to_f64(), gv = g.to_f64();
               std::vector<double> dx(xv.size(), 0.0);
               visit(x.structure(), *st, p, [&](std::int64_t i, std::int64_t o) {
                   if (yv[o] != -std::numeric_limits<double>::infinity())
                       dx[i] = gv[o] * std::exp(xv[i] - yv[o]);
               });
               return RaggedTensor::from_f64(x.dtype(), x.structure_ptr(), dx);
           },
           {}});
}

} // namespace rag
