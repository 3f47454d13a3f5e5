// Images [B, C, ~H, ~W]: conv2d (with its input, weight and bias gradients), max_pool2d,
// avg_pool2d, upsample2d, patches and their gradients. The reference kernels loop over each
// sample's pixels in double (each sample stored as H x W pixel rows of C values) and round once;
// gradients scatter in a fixed order. Geometry and type rules: image_plan.hpp.
#include "ir/ops/image_plan.hpp"
#include "ir/ops/kernel_util.hpp"

#include <cmath>
#include <limits>

namespace rag {
namespace {

// One sample of an image tensor: pixel (y, x), channel c at base + (y W + x) C + c.
struct Img {
    std::int64_t base, h, w, c;
    std::int64_t at(std::int64_t y, std::int64_t x, std::int64_t ch) const {
        return base + (y * w + x) * c + ch;
    }
    bool inside(std::int64_t y, std::int64_t x) const { return y >= 0 && y < h && x >= 0 && x < w; }
};

Img img(const Structure& st, std::int64_t i) {
    return {st.sample_begin(i), st.size(i, 1), st.size(i, 2), st.size(i, 0)};
}

// Weight [Cout, Cin/g, kh, kw] element.
struct Wt {
    std::int64_t cig, kh, kw;
    std::int64_t at(std::int64_t co, std::int64_t ci, std::int64_t ky, std::int64_t kx) const {
        return ((co * cig + ci) * kh + ky) * kw + kx;
    }
};

Wt wt(const RaggedTensor& w) {
    const Structure& s = w.structure();
    return {s.size(0, 1), s.size(0, 2), s.size(0, 3)};
}

Window2d conv_win(const RaggedTensor& w, const Attrs& at) {
    return conv_window(at, w.structure().size(0, 2), w.structure().size(0, 3));
}

// Calls fn(i, X, Y, oy, ox, ky, kx, iy, ix) for every output pixel of every sample and every
// tap that lands inside the input image, in a fixed order.
template <class Fn>
void for_each_tap(const Structure& x, const Structure& y, const Window2d& win, Fn&& fn) {
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        const Img X = img(x, i), Y = img(y, i);
        for (std::int64_t oy = 0; oy < Y.h; ++oy)
            for (std::int64_t ox = 0; ox < Y.w; ++ox)
                for (std::int64_t ky = 0; ky < win.h.k; ++ky)
                    for (std::int64_t kx = 0; kx < win.w.k; ++kx) {
                        const std::int64_t iy = win.h.in(oy, ky), ix = win.w.in(ox, kx);
                        if (X.inside(iy, ix)) fn(i, X, Y, oy, ox, ky, kx, iy, ix);
                    }
    }
}

RaggedTensor conv2d(std::span<const RaggedTensor> in, const Attrs& at) {
    const RaggedTensor &x = in[0], &w = in[1];
    const Schema bias = in.size() > 2 ? in[2].schema() : Schema{};
    const Schema out = conv2d_schema(x.schema(), w.schema(), in.size() > 2 ? &bias : nullptr, at);
    const Window2d win = conv_win(w, at);
    const std::int64_t cout = w.structure().size(0, 0);
    auto st = window_structure(out.shape, x.structure(), win, cout);
    const Wt W = wt(w);
    const std::int64_t cog = cout / win.groups;
    std::vector<double> yv(std::size_t(st->numel()), 0.0);
    const auto xv = x.to_f64(), wv = w.to_f64();
    if (in.size() > 2) {
        const auto bv = in[2].to_f64();
        for (std::int64_t p = 0; p < st->rows(); ++p)
            for (std::int64_t co = 0; co < cout; ++co)
                yv[std::size_t(p * cout + co)] = bv[std::size_t(co)];
    }
    for_each_tap(x.structure(), *st, win,
                 [&](std::int64_t, const Img& X, const Img& Y, std::int64_t oy, std::int64_t ox,
                     std::int64_t ky, std::int64_t kx, std::int64_t iy, std::int64_t ix) {
                     for (std::int64_t co = 0; co < cout; ++co) {
                         const std::int64_t g = co / cog;
                         double acc = 0;
                         for (std::int64_t ci = 0; ci < W.cig; ++ci)
                             acc += xv[std::size_t(X.at(iy, ix, g * W.cig + ci))] *
                                    wv[std::size_t(W.at(co, ci, ky, kx))];
                         yv[std::size_t(Y.at(oy, ox, co))] += acc;
                     }
                 });
    return RaggedTensor::from_f64(x.dtype(), st, yv);
}

// in: g, w, x (x supplies the structure).
RaggedTensor conv2d_input_grad(std::span<const RaggedTensor> in, const Attrs& at) {
    const RaggedTensor &g = in[0], &w = in[1], &x = in[2];
    const Window2d win = conv_win(w, at);
    const std::int64_t cout = w.structure().size(0, 0), cog = cout / win.groups;
    auto yst = window_structure(g.structure().shape(), x.structure(), win, cout);
    check_same_sizes(g.structure(), *yst, "conv2d_input_grad");
    const Wt W = wt(w);
    std::vector<double> dx(std::size_t(x.numel()), 0.0);
    const auto gv = g.to_f64(), wv = w.to_f64();
    for_each_tap(x.structure(), *yst, win,
                 [&](std::int64_t, const Img& X, const Img& Y, std::int64_t oy, std::int64_t ox,
                     std::int64_t ky, std::int64_t kx, std::int64_t iy, std::int64_t ix) {
                     for (std::int64_t co = 0; co < cout; ++co) {
                         const double d = gv[std::size_t(Y.at(oy, ox, co))];
                         const std::int64_t gr = co / cog;
                         for (std::int64_t ci = 0; ci < W.cig; ++ci)
                             dx[std::size_t(X.at(iy, ix, gr * W.cig + ci))] +=
                                 d * wv[std::size_t(W.at(co, ci, ky, kx))];
                     }
                 });
    return RaggedTensor::from_f64(x.dtype(), x.structure_ptr(), dx);
}

// in: g, x, w (w supplies the shape).
RaggedTensor conv2d_weight_grad(std::span<const RaggedTensor> in, const Attrs& at) {
    const RaggedTensor &g = in[0], &x = in[1], &w = in[2];
    const Window2d win = conv_win(w, at);
    const std::int64_t cout = w.structure().size(0, 0), cog = cout / win.groups;
    auto yst = window_structure(g.structure().shape(), x.structure(), win, cout);
    check_same_sizes(g.structure(), *yst, "conv2d_weight_grad");
    const Wt W = wt(w);
    std::vector<double> dw(std::size_t(w.numel()), 0.0);
    const auto gv = g.to_f64(), xv = x.to_f64();
    for_each_tap(x.structure(), *yst, win,
                 [&](std::int64_t, const Img& X, const Img& Y, std::int64_t oy, std::int64_t ox,
                     std::int64_t ky, std::int64_t kx, std::int64_t iy, std::int64_t ix) {
                     for (std::int64_t co = 0; co < cout; ++co) {
                         const double d = gv[std::size_t(Y.at(oy, ox, co))];
                         const std::int64_t gr = co / cog;
                         for (std::int64_t ci = 0; ci < W.cig; ++ci)
                             dw[std::size_t(W.at(co, ci, ky, kx))] +=
                                 d * xv[std::size_t(X.at(iy, ix, gr * W.cig + ci))];
                     }
                 });
    return RaggedTensor::from_f64(w.dtype(), w.structure_ptr(), dw);
}

// in: g, b (b supplies the shape): the sum of g over every pixel of every sample.
RaggedTensor conv2d_bias_grad(std::span<const RaggedTensor> in) {
    const RaggedTensor &g = in[0], &b = in[1];
    const std::int64_t c = b.numel();
    std::vector<double> db(std::size_t(c), 0.0);
    const auto gv = g.to_f64();
    for (std::int64_t p = 0; p < g.structure().rows(); ++p)
        for (std::int64_t k = 0; k < c; ++k) db[std::size_t(k)] += gv[std::size_t(p * c + k)];
    return RaggedTensor::from_f64(b.dtype(), b.structure_ptr(), db);
}

// max_pool2d: the first maximum of each window in row-major order wins; a NaN replaces the
// running maximum (PyTorch's rule: NaN propagates, its position is the last NaN); padding is
// -inf, so it never wins. Returns, per output element, the packed input position it read.
std::vector<std::int64_t> max_positions(const RaggedTensor& x, const Structure& y,
                                        const Window2d& win, const std::vector<double>& xv) {
    std::vector<std::int64_t> pos(std::size_t(y.numel()), -1);
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        const Img X = img(x.structure(), i), Y = img(y, i);
        for (std::int64_t oy = 0; oy < Y.h; ++oy)
            for (std::int64_t ox = 0; ox < Y.w; ++ox)
                for (std::int64_t c = 0; c < X.c; ++c) {
                    double best = -std::numeric_limits<double>::infinity();
                    std::int64_t at = -1;
                    for (std::int64_t ky = 0; ky < win.h.k; ++ky)
                        for (std::int64_t kx = 0; kx < win.w.k; ++kx) {
                            const std::int64_t iy = win.h.in(oy, ky), ix = win.w.in(ox, kx);
                            if (!X.inside(iy, ix)) continue;
                            const std::int64_t p = X.at(iy, ix, c);
                            const double v = xv[std::size_t(p)];
                            if (at < 0) at = p; // all -inf: the first pixel
                            if (v > best || std::isnan(v)) best = v, at = p;
                        }
                    pos[std::size_t(Y.at(oy, ox, c))] = at;
                }
    }
    return pos;
}

RaggedTensor pool2d(const RaggedTensor& x, const Attrs& at, bool max) {
    const Schema out = pool2d_schema(x.schema(), at, max ? "max_pool2d" : "avg_pool2d");
    const Window2d win = pool_window(at);
    auto st = window_structure(out.shape, x.structure(), win, x.structure().size(0, 0));
    const auto xv = x.to_f64();
    std::vector<double> yv(std::size_t(st->numel()), 0.0);
    if (max) {
        const auto pos = max_positions(x, *st, win, xv);
        for (std::size_t k = 0; k < yv.size(); ++k) yv[k] = xv[std::size_t(pos[k])];
    } else {
        const double n = double(win.h.k * win.w.k);
        for_each_tap(x.structure(), *st, win,
                     [&](std::int64_t, const Img& X, const Img& Y, std::int64_t oy, std::int64_t ox,
                         std::int64_t, std::int64_t, std::int64_t iy, std::int64_t ix) {
                         for (std::int64_t c = 0; c < X.c; ++c)
                             yv[std::size_t(Y.at(oy, ox, c))] +=
                                 xv[std::size_t(X.at(iy, ix, c))] / n;
                     });
    }
    return RaggedTensor::from_f64(x.dtype(), st, yv);
}

// in: g, x.
RaggedTensor pool2d_grad(std::span<const RaggedTensor> in, const Attrs& at, bool max) {
    const RaggedTensor &g = in[0], &x = in[1];
    const std::string op = max ? "max_pool2d_grad" : "avg_pool2d_grad";
    const Window2d win = pool_window(at);
    auto yst =
        window_structure(g.structure().shape(), x.structure(), win, x.structure().size(0, 0));
    check_same_sizes(g.structure(), *yst, op);
    const auto gv = g.to_f64(), xv = x.to_f64();
    std::vector<double> dx(std::size_t(x.numel()), 0.0);
    if (max) {
        const auto pos = max_positions(x, *yst, win, xv);
        for (std::size_t k = 0; k < gv.size(); ++k) dx[std::size_t(pos[k])] += gv[k];
    } else {
        const double n = double(win.h.k * win.w.k);
        for_each_tap(x.structure(), *yst, win,
                     [&](std::int64_t, const Img& X, const Img& Y, std::int64_t oy, std::int64_t ox,
                         std::int64_t, std::int64_t, std::int64_t iy, std::int64_t ix) {
                         for (std::int64_t c = 0; c < X.c; ++c)
                             dx[std::size_t(X.at(iy, ix, c))] +=
                                 gv[std::size_t(Y.at(oy, ox, c))] / n;
                     });
    }
    return RaggedTensor::from_f64(x.dtype(), x.structure_ptr(), dx);
}

RaggedTensor upsample2d(const RaggedTensor& x, const Attrs& at) {
    const Schema out = upsample2d_schema(x.schema(), at);
    const std::int64_t m = at.get_int("scale", 2);
    auto st = upsample2d_structure(out.shape, x.structure(), m);
    const auto xv = x.to_f64();
    std::vector<double> yv(std::size_t(st->numel()));
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        const Img X = img(x.structure(), i), Y = img(*st, i);
        for (std::int64_t oy = 0; oy < Y.h; ++oy)
            for (std::int64_t ox = 0; ox < Y.w; ++ox)
                for (std::int64_t c = 0; c < X.c; ++c)
                    yv[std::size_t(Y.at(oy, ox, c))] = xv[std::size_t(X.at(oy / m, ox / m, c))];
    }
    return RaggedTensor::from_f64(x.dtype(), st, yv);
}

RaggedTensor upsample2d_grad(std::span<const RaggedTensor> in, const Attrs& at) {
    const RaggedTensor &g = in[0], &x = in[1];
    const std::int64_t m = at.get_int("scale", 2);
    auto yst = upsample2d_structure(g.structure().shape(), x.structure(), m);
    check_same_sizes(g.structure(), *yst, "upsample2d_grad");
    const auto gv = g.to_f64();
    std::vector<double> dx(std::size_t(x.numel()), 0.0);
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        const Img X = img(x.structure(), i), Y = img(*yst, i);
        for (std::int64_t oy = 0; oy < Y.h; ++oy)
            for (std::int64_t ox = 0; ox < Y.w; ++ox)
                for (std::int64_t c = 0; c < X.c; ++c)
                    dx[std::size_t(X.at(oy / m, ox / m, c))] += gv[std::size_t(Y.at(oy, ox, c))];
    }
    return RaggedTensor::from_f64(x.dtype(), x.structure_ptr(), dx);
}

// Calls fn(packed patch element, packed pixel element) for every value a patch holds.
template <class Fn>
void for_each_patch_value(const Structure& x, const Structure& y, std::int64_t p, Fn&& fn) {
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        const Img X = img(x, i);
        const std::int64_t pw = X.w / p, d = X.c * p * p, base = y.sample_begin(i);
        for (std::int64_t k = 0; k < y.size(i, 0); ++k)
            for (std::int64_t c = 0; c < X.c; ++c)
                for (std::int64_t r = 0; r < p; ++r)
                    for (std::int64_t q = 0; q < p; ++q)
                        fn(base + k * d + (c * p + r) * p + q,
                           X.at((k / pw) * p + r, (k % pw) * p + q, c));
    }
}

RaggedTensor patches(const RaggedTensor& x, const Attrs& at) {
    const Schema out = patches_schema(x.schema(), at);
    const std::int64_t p = at.get_int("size");
    auto st = patches_structure(out.shape, x.structure(), p);
    const auto xv = x.to_f64();
    std::vector<double> yv(std::size_t(st->numel()));
    for_each_patch_value(x.structure(), *st, p, [&](std::int64_t o, std::int64_t s) {
        yv[std::size_t(o)] = xv[std::size_t(s)];
    });
    return RaggedTensor::from_f64(x.dtype(), st, yv);
}

RaggedTensor patches_grad(std::span<const RaggedTensor> in, const Attrs& at) {
    const RaggedTensor &g = in[0], &x = in[1];
    const std::int64_t p = at.get_int("size");
    auto yst = patches_structure(g.structure().shape(), x.structure(), p);
    check_same_sizes(g.structure(), *yst, "patches_grad");
    const auto gv = g.to_f64();
    std::vector<double> dx(std::size_t(x.numel()), 0.0);
    for_each_patch_value(x.structure(), *yst, p, [&](std::int64_t o, std::int64_t s) {
        dx[std::size_t(s)] += gv[std::size_t(o)];
    });
    return RaggedTensor::from_f64(x.dtype(), x.structure_ptr(), dx);
}

using Grads = std::vector<std::optional<Val>>;

// The type rule of a gradient op whose result has the schema of argument `like`, checking that
// g has the forward result's schema.
template <class Fwd> auto grad_rule(std::string_view op, int like, Fwd fwd) {
    return [op = std::string(op), like, fwd](std::span<const Schema> in, const Attrs& at) {
        const Schema want = fwd(in, at);
        if (in[0] != want)
            fail(op, ": the gradient ", in[0].str(), " does not match the result ", want.str());
        return in[std::size_t(like)];
    };
}

} // namespace

void register_image_ops(OpTable& t) {
    t.add({"conv2d", 2, 3,
           "conv2d(x, w, [bias], stride=[sh, sw], padding=[top, bottom, left, right], "
           "dilation=[dh, dw], groups=g): x [B, Cin, ~H, ~W], w [Cout, Cin/g, kh, kw], bias "
           "[Cout]; result [B, Cout, ~H', ~W'] with PyTorch's lengths per sample (0 when the "
           "image is smaller than the kernel), zeros outside each image",
           [](auto in, auto& at) {
               return conv2d_schema(in[0], in[1], in.size() > 2 ? &in[2] : nullptr, at);
           },
           [](auto in, auto& at) { return conv2d(in, at); },
           [](Emitter& e, auto in, Val, Val g, auto& at) -> Grads {
               Grads out{e.emit("conv2d_input_grad", {g, in[1], in[0]}, at),
                         e.emit("conv2d_weight_grad", {g, in[0], in[1]}, at)};
               if (in.size() > 2) out.push_back(e.emit("conv2d_bias_grad", {g, in[2]}));
               return out;
           }});
    auto conv_fwd = [](std::span<const Schema> in, const Attrs& at, int x, int w) {
        return conv2d_schema(in[std::size_t(x)], in[std::size_t(w)], nullptr, at);
    };
    t.add({"conv2d_input_grad",
           3,
           3,
           "conv2d_input_grad(g, w, x): conv2d's gradient with respect to x (x supplies the "
           "structure); each input pixel sums its own contributions, in a fixed order",
           grad_rule("conv2d_input_grad", 2,
                     [conv_fwd](auto in, auto& at) { return conv_fwd(in, at, 2, 1); }),
           [](auto in, auto& at) { return conv2d_input_grad(in, at); },
           {},
           {2}});
    t.add({"conv2d_weight_grad",
           3,
           3,
           "conv2d_weight_grad(g, x, w): conv2d's gradient with respect to w (w supplies the "
           "shape), summed over every pixel of every sample",
           grad_rule("conv2d_weight_grad", 2,
                     [conv_fwd](auto in, auto& at) { return conv_fwd(in, at, 1, 2); }),
           [](auto in, auto& at) { return conv2d_weight_grad(in, at); },
           {},
           {2}});
    t.add({"conv2d_bias_grad",
           2,
           2,
           "conv2d_bias_grad(g, b): the sum of g [B, C, ~H, ~W] over every pixel, shaped as b [C]",
           [](auto in, auto&) {
               const std::int64_t c = image_channels(in[0], "conv2d_bias_grad");
               if (in[1].shape.batched || in[1].shape.axes.size() != 1 ||
                   !(in[1].shape.axes[0] == Axis::fixed_of(c)) || in[1].dtype != in[0].dtype)
                   fail("conv2d_bias_grad: ", in[1].str(), " does not match ", in[0].str());
               return in[1];
           },
           [](auto in, auto&) { return conv2d_bias_grad(in); },
           {},
           {1}});
    for (bool max : {true, false}) {
        const std::string name = max ? "max_pool2d" : "avg_pool2d";
        t.add({name, 1, 1,
               name + "(x, kernel=[kh, kw], stride=[sh, sw], padding=[top, bottom, left, right])" +
                   (max ? ": windowed maximum, padding is -inf, NaN propagates (PyTorch's rule)"
                        : ": windowed mean over kh kw (zero padding counted, PyTorch's default)"),
               [name](auto in, auto& at) { return pool2d_schema(in[0], at, name); },
               [max](auto in, auto& at) { return pool2d(in[0], at, max); },
               [name](Emitter& e, auto in, Val, Val g, auto& at) -> Grads {
                   return {e.emit(name + "_grad", {g, in[0]}, at)};
               }});
        t.add({name + "_grad",
               2,
               2,
               name + "_grad(g, x): " + name + "'s gradient with respect to x" +
                   (max ? " (to the position each window read)" : ""),
               grad_rule(name + "_grad", 1,
                         [name](auto in, auto& at) { return pool2d_schema(in[1], at, name); }),
               [max](auto in, auto& at) { return pool2d_grad(in, at, max); },
               {},
               {1}});
    }
    t.add({"upsample2d", 1, 1,
           "upsample2d(x, scale=m): nearest-neighbour upsampling, [B, C, ~H, ~W] -> "
           "[B, C, ~H[*m], ~W[*m]]",
           [](auto in, auto& at) { return upsample2d_schema(in[0], at); },
           [](auto in, auto& at) { return upsample2d(in[0], at); },
           [](Emitter& e, auto in, Val, Val g, auto& at) -> Grads {
               return {e.emit("upsample2d_grad", {g, in[0]}, at)};
           }});
    t.add({"upsample2d_grad",
           2,
           2,
           "upsample2d_grad(g, x): sums each m x m block of g into its source pixel",
           grad_rule("upsample2d_grad", 1,
                     [](auto in, auto& at) { return upsample2d_schema(in[1], at); }),
           [](auto in, auto& at) { return upsample2d_grad(in, at); },
           {},
           {1}});
    t.add({"patches", 1, 1,
           "patches(x, size=p): [B, C, ~H, ~W] -> [B, ~P, C p p], the non-overlapping p x p "
           "patches of each image in row-major order, P = floor(H/p) floor(W/p), each patch's "
           "values ordered channel, row, column",
           [](auto in, auto& at) { return patches_schema(in[0], at); },
           [](auto in, auto& at) { return patches(in[0], at); },
           [](Emitter& e, auto in, Val, Val g, auto& at) -> Grads {
               return {e.emit("patches_grad", {g, in[0]}, at)};
           }});
    t.add(
        {"patches_grad",
         2,
         2,
         "patches_grad(g, x): patches' gradient, x-shaped (pixels no patch covers get 0)",
         grad_rule("patches_grad", 1, [](auto in, auto& at) { return patches_schema(in[1], at); }),
         [](auto in, auto& at) { return patches_grad(in, at); },
         {},
         {1}});
}

} // namespace rag
