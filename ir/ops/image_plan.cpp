#include "ir/ops/image_plan.hpp"

#include "ir/ops/derived_names.hpp"
#include "runtime/error.hpp"

namespace rag {
namespace {

std::vector<std::int64_t> ints(const Attrs& at, std::string_view k, std::size_t n,
                               std::int64_t dflt) {
    if (!at.has(k)) return std::vector<std::int64_t>(n, dflt);
    auto v = at.get_ints(k);
    if (v.size() != n) fail("image op: attribute ", k, " needs ", n, " values, got ", v.size());
    return v;
}

void check_window(const Window& w, std::string_view op, std::string_view axis) {
    if (w.k < 1) fail(op, ": the kernel extent along ", axis, " must be >= 1, got ", w.k);
    if (w.s < 1) fail(op, ": the stride along ", axis, " must be >= 1, got ", w.s);
    if (w.d < 1) fail(op, ": the dilation along ", axis, " must be >= 1, got ", w.d);
    if (w.lo < 0 || w.hi < 0) fail(op, ": padding must be >= 0, got ", w.lo, " and ", w.hi);
}

Axis window_axis(const Axis& a, const Window& w) {
    return Axis::ragged_of(window_axis_name(a.name, w.k, w.s, w.lo, w.hi, w.d));
}

} // namespace

std::int64_t Window::out(std::int64_t n) const {
    const std::int64_t span = n + lo + hi - d * (k - 1); // positions a window can start at
    return span <= 0 ? 0 : (span - 1) / s + 1;
}

Window2d conv_window(const Attrs& at, std::int64_t kh, std::int64_t kw) {
    auto s = ints(at, "stride", 2, 1), p = ints(at, "padding", 4, 0),
         d = ints(at, "dilation", 2, 1);
    return {{kh, s[0], p[0], p[1], d[0]}, {kw, s[1], p[2], p[3], d[1]}, at.get_int("groups", 1)};
}

Window2d pool_window(const Attrs& at) {
    auto k = ints(at, "kernel", 2, 1);
    auto s = at.has("stride") ? ints(at, "stride", 2, 1) : k;
    auto p = ints(at, "padding", 4, 0);
    return {{k[0], s[0], p[0], p[1], 1}, {k[1], s[1], p[2], p[3], 1}, 1};
}

std::int64_t image_channels(const Schema& x, std::string_view op) {
    const auto& a = x.shape.axes;
    if (!x.shape.batched || a.size() != 3 || a[0].kind != AxisKind::fixed || !a[1].is_ragged() ||
        !a[2].is_ragged())
        fail(op,
             ": the input must be an image batch T[B, C, ~H, ~W] (static channels, two "
             "ragged spatial axes), got ",
             x.str());
    if (!is_floating(x.dtype)) fail(op, ": the input must be floating point, got ", x.str());
    return a[0].extent;
}

Schema conv2d_schema(const Schema& x, const Schema& w, const Schema* bias, const Attrs& at) {
    const std::int64_t cin = image_channels(x, "conv2d");
    const auto& wa = w.shape.axes;
    if (w.shape.batched || wa.size() != 4)
        fail("conv2d: the weight must be a dense [Cout, Cin/groups, kh, kw] array, got ", w.str());
    for (const Axis& a : wa)
        if (a.kind != AxisKind::fixed)
            fail("conv2d: the weight's extents must be static, got ", w.str());
    if (w.dtype != x.dtype)
        fail("conv2d: the input and the weight have different dtypes, ", x.str(), " and ", w.str());
    const Window2d win = conv_window(at, wa[2].extent, wa[3].extent);
    check_window(win.h, "conv2d", "H");
    check_window(win.w, "conv2d", "W");
    const std::int64_t g = win.groups, cout = wa[0].extent;
    if (g < 1) fail("conv2d: groups must be >= 1, got ", g);
    if (cin % g != 0 || cout % g != 0)
        fail("conv2d: groups = ", g, " must divide the input channels (", cin,
             ") and the output channels (", cout, ")");
    if (wa[1].extent != cin / g)
        fail("conv2d: the weight ", w.str(), " needs Cin/groups = ", cin / g,
             " in its second axis for ", x.str(), " and groups = ", g);
    if (bias) {
        if (bias->shape.batched || bias->shape.axes.size() != 1 ||
            !(bias->shape.axes[0] == Axis::fixed_of(cout)) || bias->dtype != x.dtype)
            fail("conv2d: the bias must be ", dtype_name(x.dtype), "[", cout, "], got ",
                 bias->str());
    }
    const auto& xa = x.shape.axes;
    return {
        x.dtype,
        Shape{true, {Axis::fixed_of(cout), window_axis(xa[1], win.h), window_axis(xa[2], win.w)}}};
}

Schema pool2d_schema(const Schema& x, const Attrs& at, std::string_view op) {
    image_channels(x, op);
    const Window2d win = pool_window(at);
    check_window(win.h, op, "H");
    check_window(win.w, op, "W");
    // PyTorch's rule: every window holds at least one pixel of the image.
    if (2 * std::max(win.h.lo, win.h.hi) > win.h.k || 2 * std::max(win.w.lo, win.w.hi) > win.w.k)
        fail(op, ": padding must be at most half the kernel size");
    const auto& xa = x.shape.axes;
    return {x.dtype, Shape{true, {xa[0], window_axis(xa[1], win.h), window_axis(xa[2], win.w)}}};
}

Schema upsample2d_schema(const Schema& x, const Attrs& at) {
    image_channels(x, "upsample2d");
    const std::int64_t m = at.get_int("scale", 2);
    if (m < 1) fail("upsample2d: scale must be a positive integer, got ", m);
    const auto& xa = x.shape.axes;
    return {x.dtype, Shape{true,
                           {xa[0], Axis::ragged_of(scale_axis_name(xa[1].name, m)),
                            Axis::ragged_of(scale_axis_name(xa[2].name, m))}}};
}

Schema patches_schema(const Schema& x, const Attrs& at) {
    const std::int64_t c = image_channels(x, "patches");
    const std::int64_t p = at.get_int("size");
    if (p < 1) fail("patches: the patch size must be >= 1, got ", p);
    const auto& xa = x.shape.axes;
    // floor(H / p) is H[p-1::p]; the patch axis is the product of both, row-major.
    const std::string name = product_axis_name(slice_axis_name(xa[1].name, p - 1, p),
                                               slice_axis_name(xa[2].name, p - 1, p));
    return {x.dtype, Shape{true, {Axis::ragged_of(name), Axis::fixed_of(c * p * p)}}};
}

StructurePtr window_structure(const Shape& out, const Structure& x, const Window2d& win,
                              std::int64_t channels) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < x.batch(); ++i)
        sizes.insert(sizes.end(), {channels, win.h.out(x.size(i, 1)), win.w.out(x.size(i, 2))});
    return Structure::make(out, x.batch(), std::move(sizes));
}

StructurePtr upsample2d_structure(const Shape& out, const Structure& x, std::int64_t scale) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < x.batch(); ++i)
        sizes.insert(sizes.end(), {x.size(i, 0), x.size(i, 1) * scale, x.size(i, 2) * scale});
    return Structure::make(out, x.batch(), std::move(sizes));
}

StructurePtr patches_structure(const Shape& out, const Structure& x, std::int64_t p) {
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < x.batch(); ++i)
        sizes.insert(sizes.end(), {(x.size(i, 1) / p) * (x.size(i, 2) / p), x.size(i, 0) * p * p});
    return Structure::make(out, x.batch(), std::move(sizes));
}

void check_same_sizes(const Structure& g, const Structure& want, std::string_view op) {
    if (g.batch() != want.batch())
        fail(op, ": batch sizes differ, ", g.batch(), " and ", want.batch());
    for (std::int64_t i = 0; i < g.batch(); ++i) {
        auto a = g.sample_shape(i), b = want.sample_shape(i);
        if (!std::equal(a.begin(), a.end(), b.begin(), b.end()))
            fail(op, ": sample ", i, ": the gradient does not have the result's shape");
    }
}

} // namespace rag
