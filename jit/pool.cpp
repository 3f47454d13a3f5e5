// max_pool2d, avg_pool2d, upsample2d, patches and their gradients on packed images (f32, f64).
// Forward passes own output pixel rows; gradients own input pixel rows and gather what reaches
// them (upsample2d_grad, patches_grad), or own whole samples and scatter in a fixed order inside
// each (the pooling gradients, whose windows overlap), so no sum crosses threads.
#include "ir/ops/image_plan.hpp"
#include "jit/conv.hpp"
#include "jit/placement.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace rag::jit {
namespace {

struct Img {
    std::int64_t base, h, w, c;
    std::int64_t at(std::int64_t y, std::int64_t x) const { return base + (y * w + x) * c; }
};

Img img(const Structure& st, std::int64_t i) {
    return {st.sample_begin(i), st.size(i, 1), st.size(i, 2), st.size(i, 0)};
}

// Runs fn(sample, row) over every pixel row (axis H) of every sample of st, in parallel.
template <class F> void for_rows(const Structure& st, F&& fn) {
    std::vector<std::int64_t> first(std::size_t(st.batch() + 1), 0);
    for (std::int64_t i = 0; i < st.batch(); ++i)
        first[std::size_t(i + 1)] = first[std::size_t(i)] + st.size(i, 1);
    parallel_for(first.back(), 8, [&](std::int64_t r0, std::int64_t r1) {
        std::int64_t i =
            std::int64_t(std::upper_bound(first.begin(), first.end(), r0) - first.begin()) - 1;
        for (std::int64_t r = r0; r < r1; ++r) {
            while (r >= first[std::size_t(i + 1)]) ++i;
            fn(i, r - first[std::size_t(i)]);
        }
    });
}

template <class T> RaggedTensor pool(const ir::Node& n, const RaggedTensor& x, bool max) {
    const Window2d win = pool_window(n.attrs);
    const std::int64_t c = x.structure().size(0, 0);
    RaggedTensor y =
        uninitialized(x.dtype(), window_structure(n.type.shape, x.structure(), win, c));
    const T* xv = static_cast<const T*>(x.data());
    T* yv = static_cast<T*>(y.mutable_data());
    const T inv = T(1) / T(win.h.k * win.w.k);
    for_rows(y.structure(), [&](std::int64_t i, std::int64_t oy) {
        const Img X = img(x.structure(), i), Y = img(y.structure(), i);
        std::vector<T> acc(static_cast<std::size_t>(c));
        for (std::int64_t ox = 0; ox < Y.w; ++ox) {
            T* out = yv + Y.at(oy, ox);
            std::fill(acc.begin(), acc.end(), max ? -std::numeric_limits<T>::infinity() : T(0));
            for (std::int64_t ky = 0; ky < win.h.k; ++ky) {
                const std::int64_t iy = win.h.in(oy, ky);
                if (iy < 0 || iy >= X.h) continue;
                for (std::int64_t kx = 0; kx < win.w.k; ++kx) {
                    const std::int64_t ix = win.w.in(ox, kx);
                    if (ix < 0 || ix >= X.w) continue;
                    const T* p = xv + X.at(iy, ix);
                    if (max) {
                        for (std::int64_t k = 0; k < c; ++k)
                            if (p[k] > acc[std::size_t(k)] || std::isnan(p[k]))
                                acc[std::size_t(k)] = p[k];
                    } else {
                        for (std::int64_t k = 0; k < c; ++k) acc[std::size_t(k)] += p[k];
                    }
                }
            }
            for (std::int64_t k = 0; k < c; ++k)
                out[k] = max ? acc[std::size_t(k)] : acc[std::size_t(k)] * inv;
        }
    });
    return y;
}

// Scatters g back through the windows, one sample per task, output pixels in order.
template <class T>
RaggedTensor pool_grad(const ir::Node& n, const RaggedTensor& g, const RaggedTensor& x, bool max) {
    const Window2d win = pool_window(n.attrs);
    const std::int64_t c = x.structure().size(0, 0);
    RaggedTensor dx = RaggedTensor::zeros(x.dtype(), x.structure_ptr());
    const T *xv = static_cast<const T*>(x.data()), *gv = static_cast<const T*>(g.data());
    T* out = static_cast<T*>(dx.mutable_data());
    const T inv = T(1) / T(win.h.k * win.w.k);
    parallel_for(x.batch(), 1, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<T> best(static_cast<std::size_t>(c));
        std::vector<std::int64_t> at(static_cast<std::size_t>(c));
        for (std::int64_t i = i0; i < i1; ++i) {
            const Img X = img(x.structure(), i), Y = img(g.structure(), i);
            for (std::int64_t oy = 0; oy < Y.h; ++oy)
                for (std::int64_t ox = 0; ox < Y.w; ++ox) {
                    const T* gp = gv + Y.at(oy, ox);
                    std::fill(best.begin(), best.end(), -std::numeric_limits<T>::infinity());
                    std::fill(at.begin(), at.end(), -1);
                    for (std::int64_t ky = 0; ky < win.h.k; ++ky) {
                        const std::int64_t iy = win.h.in(oy, ky);
                        if (iy < 0 || iy >= X.h) continue;
                        for (std::int64_t kx = 0; kx < win.w.k; ++kx) {
                            const std::int64_t ix = win.w.in(ox, kx);
                            if (ix < 0 || ix >= X.w) continue;
                            const std::int64_t p = X.at(iy, ix);
                            if (!max) {
                                for (std::int64_t k = 0; k < c; ++k) out[p + k] += gp[k] * inv;
                                continue;
                            }
                            for (std::int64_t k = 0; k < c; ++k) {
                                const T v = xv[p + k];
                                if (at[std::size_t(k)] < 0) at[std::size_t(k)] = p + k;
                                if (v > best[std::size_t(k)] || std::isnan(v))
                                    best[std::size_t(k)] = v, at[std::size_t(k)] = p + k;
                            }
                        }
                    }
                    if (max)
                        for (std::int64_t k = 0; k < c; ++k)
                            if (at[std::size_t(k)] >= 0) out[at[std::size_t(k)]] += gp[k];
                }
        }
    });
    return dx;
}

// Per input row: its first output row expanded pixel by pixel, the other m - 1 copied whole.
template <class T> RaggedTensor upsample(const ir::Node& n, const RaggedTensor& x) {
    const std::int64_t m = n.attrs.get_int("scale", 2), c = x.structure().size(0, 0);
    RaggedTensor y = uninitialized(x.dtype(), upsample2d_structure(n.type.shape, x.structure(), m));
    const T* xv = static_cast<const T*>(x.data());
    T* yv = static_cast<T*>(y.mutable_data());
    for_rows(x.structure(), [&](std::int64_t i, std::int64_t iy) {
        const Img X = img(x.structure(), i), Y = img(y.structure(), i);
        T* first = yv + Y.at(iy * m, 0);
        for (std::int64_t ix = 0; ix < X.w; ++ix) {
            const T* p = xv + X.at(iy, ix);
            for (std::int64_t b = 0; b < m; ++b) std::copy_n(p, c, first + (ix * m + b) * c);
        }
        for (std::int64_t a = 1; a < m; ++a) std::copy_n(first, Y.w * c, yv + Y.at(iy * m + a, 0));
    });
    return y;
}

// Per input row: the m output rows above it summed into it, in the order (a, b) of each
// window, as the reference sums.
template <class T>
RaggedTensor upsample_grad(const ir::Node& n, const RaggedTensor& g, const RaggedTensor& x) {
    const std::int64_t m = n.attrs.get_int("scale", 2), c = x.structure().size(0, 0);
    RaggedTensor dx = uninitialized(x.dtype(), x.structure_ptr());
    const T* gv = static_cast<const T*>(g.data());
    T* out = static_cast<T*>(dx.mutable_data());
    for_rows(x.structure(), [&](std::int64_t i, std::int64_t iy) {
        const Img X = img(x.structure(), i), Y = img(g.structure(), i);
        T* o = out + X.at(iy, 0);
        std::fill(o, o + X.w * c, T(0));
        for (std::int64_t a = 0; a < m; ++a) {
            const T* row = gv + Y.at(iy * m + a, 0);
            for (std::int64_t ix = 0; ix < X.w; ++ix)
                for (std::int64_t b = 0; b < m; ++b)
                    for (std::int64_t k = 0; k < c; ++k) o[ix * c + k] += row[(ix * m + b) * c + k];
        }
    });
    return dx;
}

// patches (fwd) copies pixels to patch rows; patches_grad copies back (zeros elsewhere).
template <class T>
RaggedTensor patch_copy(const ir::Node& n, const RaggedTensor& src, const RaggedTensor& x,
                        bool fwd) {
    const std::int64_t p = n.attrs.get_int("size"), c = x.structure().size(0, 0);
    StructurePtr pst =
        fwd ? patches_structure(n.type.shape, x.structure(), p) : src.structure_ptr();
    RaggedTensor out =
        fwd ? uninitialized(x.dtype(), pst) : RaggedTensor::zeros(x.dtype(), x.structure_ptr());
    const T* sv = static_cast<const T*>(src.data());
    T* ov = static_cast<T*>(out.mutable_data());
    const std::int64_t d = c * p * p;
    for_rows(x.structure(), [&](std::int64_t i, std::int64_t iy) {
        const Img X = img(x.structure(), i);
        const std::int64_t pw = X.w / p, py = iy / p, r = iy % p;
        if (py >= X.h / p) return;
        const std::int64_t base = pst->sample_begin(i);
        for (std::int64_t px = 0; px < pw; ++px)
            for (std::int64_t q = 0; q < p; ++q) {
                const std::int64_t pix = X.at(iy, px * p + q);
                const std::int64_t patch = base + (py * pw + px) * d + r * p + q;
                for (std::int64_t k = 0; k < c; ++k) {
                    if (fwd)
                        ov[patch + k * p * p] = sv[pix + k];
                    else
                        ov[pix + k] = sv[patch + k * p * p];
                }
            }
    });
    return out;
}

bool same_sizes(const Structure& a, const Structure& b) {
    return a.batch() == b.batch() && a.sizes() == b.sizes();
}

// The structure g must have: the forward result's for x.
StructurePtr result_structure(const ir::Node& n, const RaggedTensor& g, const RaggedTensor& x) {
    const Shape& s = g.structure().shape();
    if (n.op == "upsample2d_grad")
        return upsample2d_structure(s, x.structure(), n.attrs.get_int("scale", 2));
    if (n.op == "patches_grad") return patches_structure(s, x.structure(), n.attrs.get_int("size"));
    return window_structure(s, x.structure(), pool_window(n.attrs), x.structure().size(0, 0));
}

template <class T> RaggedTensor run(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    auto arg = [&](std::size_t k) -> const RaggedTensor& { return vals[std::size_t(n.args[k])]; };
    if (n.op == "max_pool2d" || n.op == "avg_pool2d")
        return pool<T>(n, arg(0), n.op == "max_pool2d");
    if (n.op == "upsample2d") return upsample<T>(n, arg(0));
    if (n.op == "patches") return patch_copy<T>(n, arg(0), arg(0), true);
    const RaggedTensor &g = arg(0), &x = arg(1);
    if (!same_sizes(g.structure(), *result_structure(n, g, x))) {
        std::vector<RaggedTensor> in;
        for (int a : n.args) in.push_back(vals[std::size_t(a)]);
        return reference_kernel(n.op, in, n.attrs);
    }
    if (n.op == "upsample2d_grad") return upsample_grad<T>(n, g, x);
    if (n.op == "patches_grad") return patch_copy<T>(n, g, x, false);
    return pool_grad<T>(n, g, x, n.op == "max_pool2d_grad");
}

} // namespace

RaggedTensor run_pool_step(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    return vals[std::size_t(n.args[0])].dtype() == DType::f64 ? run<double>(n, vals)
                                                              : run<float>(n, vals);
}

} // namespace rag::jit
