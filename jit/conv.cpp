// conv2d on packed images as an implicit GEMM. Each sample is H x W pixel rows of C values.
// The forward pass cuts each sample's output pixels into blocks; a block builds its panel
// (one row per output pixel: the kh kw taps times Cin/groups channels, read from its own image,
// zero outside it) and multiplies it by the weight, repacked once per call to
// [Cout][kh][kw][Cin/g], with one single-threaded GEMM per group. The input gradient is the same
// program read the other way: a block of *input* pixels gathers, per tap, the output pixel that
// read it (none where the stride skips it), so every input pixel has one owner and no sums cross
// threads. The weight gradient is panel^T dY per block, added in double into 16 partial sums, each
// owning a fixed run of blocks, then added in order. 1 x 1 convolutions (stride 1, no padding)
// are plain GEMMs over the packed pixels. In f32 with destination channels a multiple of the
// vector width, the panels become tables of source-row pointers read by the direct kernel of
// conv_kernels.hpp (no copy, no BLAS packing).
#include "jit/conv.hpp"

#include "ir/ops/image_plan.hpp"
#include "jit/blas.hpp"
#include "jit/conv_kernels.hpp"
#include "jit/placement.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace rag::jit {
namespace {

struct Img {
    std::int64_t base, h, w, c; // base in elements
};

Img img(const Structure& st, std::int64_t i) {
    return {st.sample_begin(i), st.size(i, 1), st.size(i, 2), st.size(i, 0)};
}

// A block of pixels of one sample.
struct Block {
    std::int64_t sample, begin, count;
};

// Each sample's pixels (of structure st) in blocks of at most `rows`: a function of sizes only.
std::vector<Block> blocks(const Structure& st, std::int64_t rows) {
    std::vector<Block> out;
    for (std::int64_t i = 0; i < st.batch(); ++i) {
        const std::int64_t n = st.size(i, 1) * st.size(i, 2);
        for (std::int64_t b = 0; b < n; b += rows) out.push_back({i, b, std::min(rows, n - b)});
    }
    return out;
}

// Panel rows of about 256 KiB.
std::int64_t block_rows(std::int64_t k, std::size_t elem) {
    return std::clamp<std::int64_t>(std::int64_t(262144 / (std::size_t(k) * elem)), 16, 1024);
}

// Pixels per block of the direct kernels: their pointer table and a weight gradient's part
// stay small; 32 to 1024 ran within noise of each other (FCN widths, 2 threads).
constexpr std::int64_t direct_rows = 128;

struct Geometry {
    Window2d win;
    std::int64_t cout, cin, cig, cog, kh, kw;
    bool pointwise() const {
        const Window &h = win.h, &w = win.w;
        return kh == 1 && kw == 1 && h.s == 1 && w.s == 1 && h.lo + h.hi + w.lo + w.hi == 0 &&
               win.groups == 1;
    }
};

Geometry geometry(const ir::Node& n, const RaggedTensor& w) {
    const Structure& s = w.structure();
    Geometry g;
    g.win = conv_window(n.attrs, s.size(0, 2), s.size(0, 3));
    g.cout = s.size(0, 0), g.cig = s.size(0, 1), g.kh = s.size(0, 2), g.kw = s.size(0, 3);
    g.cin = g.cig * g.win.groups, g.cog = g.cout / g.win.groups;
    return g;
}

// The weight as, per group, [rows][kh kw cols] with element (r, tap, c) =
// w[g cog + (fwd ? r : c)][fwd ? c : r][ky][kx]: forward rows are output channels, columns input
// channels; backward the other way round. k_major: per group [kh kw cols][rows] instead, the
// direct kernel's layout (a vector of outputs per tap and channel).
template <class T>
std::vector<T> pack_weight(const Geometry& G, const T* w, bool fwd, bool k_major = false) {
    const std::int64_t rows = fwd ? G.cog : G.cig, cols = fwd ? G.cig : G.cog;
    const std::int64_t taps = G.kh * G.kw, k = taps * cols;
    std::vector<T> out(std::size_t(G.win.groups * rows * k));
    for (std::int64_t g = 0; g < G.win.groups; ++g)
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t t = 0; t < taps; ++t)
                for (std::int64_t c = 0; c < cols; ++c) {
                    const std::int64_t co = g * G.cog + (fwd ? r : c), ci = fwd ? c : r;
                    const std::int64_t at =
                        k_major ? (t * cols + c) * rows + r : r * k + t * cols + c;
                    out[std::size_t(g * rows * k + at)] = w[((co * G.cig + ci) * G.kh) * G.kw + t];
                }
    return out;
}

// For every pixel p of block b (of destination image D) and tap t, in order: table[p taps + t]
// = the `cols` source channels from g cols on that the pixel reads at that tap, or `none`. fwd:
// the source is the input an output pixel reads (none outside the image: zero padding); else
// the output pixel that read an input pixel, for stride 1 only (strided_input_grad handles
// strides). Source rows and columns are y m + offset(tap), so no division per tap.
template <class T>
void tap_table(const Geometry& G, bool fwd, const T* src, const Img& S, const Img& D,
               const Block& b, std::int64_t g, const T* none, const T** table) {
    const Window &wh = G.win.h, &ww = G.win.w;
    if (!fwd && (wh.s != 1 || ww.s != 1)) fail("internal: conv2d tap table of a strided gradient");
    const std::int64_t mh = fwd ? wh.s : 1, mw = fwd ? ww.s : 1;
    std::vector<std::int64_t> oy(std::size_t(G.kh)), ox(std::size_t(G.kw));
    for (std::int64_t k = 0; k < G.kh; ++k)
        oy[std::size_t(k)] = fwd ? k * wh.d - wh.lo : wh.lo - k * wh.d;
    for (std::int64_t k = 0; k < G.kw; ++k)
        ox[std::size_t(k)] = fwd ? k * ww.d - ww.lo : ww.lo - k * ww.d;
    const T* base = src + S.base + g * (fwd ? G.cig : G.cog);
    // ceil(a / m) for m > 0 and any a.
    auto ceil_div = [](std::int64_t a, std::int64_t m) {
        return a >= 0 ? (a + m - 1) / m : -(-a / m);
    };
    const std::int64_t taps = G.kh * G.kw;
    std::int64_t y = b.begin / D.w, x = b.begin % D.w;
    // Runs of pixels along one destination row: per tap, the columns whose source column is
    // inside the image form one interval, so the inner loops only step a pointer.
    for (std::int64_t p = 0; p < b.count; x = 0, ++y) {
        const std::int64_t run = std::min(b.count - p, D.w - x);
        for (std::int64_t ky = 0; ky < G.kh; ++ky) {
            const std::int64_t sy = y * mh + oy[std::size_t(ky)];
            const bool row = sy >= 0 && sy < S.h;
            for (std::int64_t kx = 0; kx < G.kw; ++kx) {
                const std::int64_t o = ox[std::size_t(kx)];
                const T** dst = table + p * taps + ky * G.kw + kx;
                // Columns x with 0 <= x mw + o < S.w, clipped to the run [x, x + run).
                const std::int64_t lo = row ? std::clamp(ceil_div(-o, mw), x, x + run) : x + run;
                const std::int64_t hi =
                    row ? std::clamp(ceil_div(S.w - o, mw), lo, x + run) : x + run;
                std::int64_t j = x;
                for (; j < lo; ++j, dst += taps) *dst = none;
                if (j < hi)
                    for (const T* from = base + (sy * S.w + j * mw + o) * S.c; j < hi;
                         ++j, dst += taps, from += mw * S.c)
                        *dst = from;
                for (; j < x + run; ++j, dst += taps) *dst = none;
            }
        }
        p += run;
    }
}

// Builds the panel of a block of destination pixels for group g: row p, tap t holds the `cols`
// channels tap_table finds, or zeros where it finds none.
template <class T>
void build_panel(const Geometry& G, bool fwd, const T* src, const Img& S, const Img& D,
                 const Block& b, std::int64_t g, T* panel) {
    const std::int64_t cols = fwd ? G.cig : G.cog, taps = G.kh * G.kw;
    std::vector<const T*> table(std::size_t(b.count * taps));
    tap_table<T>(G, fwd, src, S, D, b, g, nullptr, table.data());
    for (std::size_t j = 0; j < table.size(); ++j) {
        T* dst = panel + std::int64_t(j) * cols;
        if (table[j])
            std::memcpy(dst, table[j], std::size_t(cols) * sizeof(T));
        else
            std::fill(dst, dst + cols, T(0));
    }
}

// Forward (fwd) or input gradient: dest[pixel, g rows + r] = panel x packed weight^T. In f32
// with a multiple of the vector width of destination channels, the direct kernel reads the
// source pixels through a table of row pointers (a zero row where a tap reads none) instead of
// copying them into a panel for a BLAS GEMM, whose packing dominated at these narrow widths.
template <class T>
void implicit_gemm(const Geometry& G, bool fwd, const T* src, const Structure& ss, const T* w,
                   T* dst, const Structure& ds) {
    const std::int64_t cols = fwd ? G.cig : G.cog, rows = fwd ? G.cog : G.cig;
    const std::int64_t taps = G.kh * G.kw, k = taps * cols, dc = fwd ? G.cout : G.cin;
    if constexpr (std::is_same_v<T, float>) {
        if (rows % conv_lanes() == 0) {
            const std::vector<Block> bl = blocks(ds, direct_rows);
            const ConvRows kernel = conv_rows_kernel();
            const std::vector<T> wp = pack_weight(G, w, fwd, true);
            const std::vector<T> zeros(std::size_t(cols), T(0));
            parallel_for(std::int64_t(bl.size()), 1, [&](std::int64_t b0, std::int64_t b1) {
                std::vector<const T*> table;
                for (std::int64_t bi = b0; bi < b1; ++bi) {
                    const Block& b = bl[std::size_t(bi)];
                    const Img S = img(ss, b.sample), D = img(ds, b.sample);
                    table.resize(std::size_t(b.count * taps));
                    for (std::int64_t g = 0; g < G.win.groups; ++g) {
                        tap_table(G, fwd, src, S, D, b, g, zeros.data(), table.data());
                        kernel(b.count, taps, cols, rows, table.data(), wp.data() + g * rows * k,
                               dst + D.base + b.begin * dc + g * rows, dc);
                    }
                }
            });
            return;
        }
    }
    const std::vector<T> wp = pack_weight(G, w, fwd);
    const std::vector<Block> bl = blocks(ds, block_rows(k, sizeof(T)));
    parallel_for(std::int64_t(bl.size()), 1, [&](std::int64_t b0, std::int64_t b1) {
        std::vector<T> panel;
        for (std::int64_t bi = b0; bi < b1; ++bi) {
            const Block& b = bl[std::size_t(bi)];
            const Img S = img(ss, b.sample), D = img(ds, b.sample);
            panel.resize(std::size_t(b.count * k));
            for (std::int64_t g = 0; g < G.win.groups; ++g) {
                build_panel(G, fwd, src, S, D, b, g, panel.data());
                gemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(b.count), int(rows), int(k), T(1),
                     panel.data(), int(k), wp.data() + g * rows * k, int(k),
                     dst + D.base + b.begin * dc + g * rows, int(dc));
            }
        }
    });
}

template <class T>
RaggedTensor forward(const ir::Node& n, const RaggedTensor& x, const RaggedTensor& w,
                     const RaggedTensor* bias) {
    const Geometry G = geometry(n, w);
    RaggedTensor y =
        uninitialized(x.dtype(), window_structure(n.type.shape, x.structure(), G.win, G.cout));
    T* out = static_cast<T*>(y.mutable_data());
    const T* in = static_cast<const T*>(x.data());
    if (G.pointwise())
        gemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(x.structure().rows()), int(G.cout),
             int(G.cin), T(1), in, int(G.cin), static_cast<const T*>(w.data()), int(G.cin), out,
             int(G.cout));
    else
        implicit_gemm(G, true, in, x.structure(), static_cast<const T*>(w.data()), out,
                      y.structure());
    if (bias) {
        const T* bv = static_cast<const T*>(bias->data());
        const std::int64_t c = G.cout;
        parallel_for(y.structure().rows(), std::max<std::int64_t>(1, 16384 / c),
                     [&](std::int64_t r0, std::int64_t r1) {
                         for (std::int64_t r = r0; r < r1; ++r)
                             for (std::int64_t k = 0; k < c; ++k) out[r * c + k] += bv[k];
                     });
    }
    return y;
}

// The input gradient of a strided convolution. Input pixel y receives from tap ky only when
// (y + lo - ky d) is a multiple of s, which depends on y's phase (y + lo) mod s alone; so the
// pixels of each image are grouped by (row phase, column phase), and a block of one phase
// builds a panel of only the taps that reach it (1/s^2 of them for a 3 x 3 kernel and stride 2,
// instead of a panel mostly of zeros). Each input pixel is still in exactly one block.
template <class T>
void strided_input_grad(const Geometry& G, const T* gv, const Structure& gs, const T* w, T* dx,
                        const Structure& xs) {
    const Window &wh = G.win.h, &ww = G.win.w;
    // f32 with a multiple of the vector width of input channels per group: the direct kernel on
    // a table of gradient-row pointers, the weight per group [taps Cout/g][Cin/g].
    bool direct = false;
    if constexpr (std::is_same_v<T, float>) direct = G.cig % conv_lanes() == 0;
    const std::vector<T> zeros(std::size_t(G.cog), T(0));
    struct Phase {
        std::int64_t ry, rx;
        std::vector<std::pair<std::int64_t, std::int64_t>> taps;
        std::vector<T> wp; // per group [Cin/g][taps Cout/g] (direct: [taps Cout/g][Cin/g])
    };
    std::vector<Phase> phases;
    for (std::int64_t ry = 0; ry < wh.s; ++ry)
        for (std::int64_t rx = 0; rx < ww.s; ++rx) {
            Phase ph{ry, rx, {}, {}};
            for (std::int64_t ky = 0; ky < G.kh; ++ky)
                for (std::int64_t kx = 0; kx < G.kw; ++kx)
                    if (ky * wh.d % wh.s == ry && kx * ww.d % ww.s == rx)
                        ph.taps.push_back({ky, kx});
            const std::int64_t k = std::int64_t(ph.taps.size()) * G.cog;
            ph.wp.resize(std::size_t(G.win.groups * G.cig * k));
            for (std::int64_t g = 0; g < G.win.groups; ++g)
                for (std::int64_t ci = 0; ci < G.cig; ++ci)
                    for (std::size_t t = 0; t < ph.taps.size(); ++t)
                        for (std::int64_t co = 0; co < G.cog; ++co)
                            ph.wp[std::size_t(
                                direct ? (g * k + std::int64_t(t) * G.cog + co) * G.cig + ci
                                       : (g * G.cig + ci) * k + std::int64_t(t) * G.cog + co)] =
                                w[(((g * G.cog + co) * G.cig + ci) * G.kh + ph.taps[t].first) *
                                      G.kw +
                                  ph.taps[t].second];
            phases.push_back(std::move(ph));
        }
    // The first position of phase r along an axis with padding lo: (y + lo) mod s == r.
    auto first = [](std::int64_t r, const Window& win) {
        return ((r - win.lo) % win.s + win.s) % win.s;
    };
    auto count = [](std::int64_t f, std::int64_t n, std::int64_t s) {
        return f >= n ? 0 : (n - f - 1) / s + 1;
    };
    struct Blk {
        std::int64_t sample, phase, begin, count, ny, nx;
    };
    std::vector<Blk> blocks;
    const std::int64_t maxk = G.kh * G.kw * G.cog;
    const std::int64_t rows = block_rows(maxk, sizeof(T));
    for (std::int64_t i = 0; i < xs.batch(); ++i)
        for (std::size_t c = 0; c < phases.size(); ++c) {
            const std::int64_t ny = count(first(phases[c].ry, wh), xs.size(i, 1), wh.s);
            const std::int64_t nx = count(first(phases[c].rx, ww), xs.size(i, 2), ww.s);
            for (std::int64_t b = 0; b < ny * nx; b += rows)
                blocks.push_back({i, std::int64_t(c), b, std::min(rows, ny * nx - b), ny, nx});
        }
    parallel_for(std::int64_t(blocks.size()), 1, [&](std::int64_t b0, std::int64_t b1) {
        std::vector<T> panel, out;
        std::vector<const T*> table;
        for (std::int64_t bi = b0; bi < b1; ++bi) {
            const Blk& b = blocks[std::size_t(bi)];
            const Phase& ph = phases[std::size_t(b.phase)];
            const Img X = img(xs, b.sample), Y = img(gs, b.sample);
            const std::int64_t nt = std::int64_t(ph.taps.size()), k = nt * G.cog;
            const std::int64_t y0 = first(ph.ry, wh), x0 = first(ph.rx, ww);
            table.resize(std::size_t(b.count * nt));
            out.resize(std::size_t(b.count * G.cig));
            for (std::int64_t g = 0; g < G.win.groups; ++g) {
                // The gradient row each tap of each pixel reads, or none.
                for (std::int64_t p = 0; p < b.count; ++p) {
                    const std::int64_t y = y0 + (b.begin + p) / b.nx * wh.s;
                    const std::int64_t x = x0 + (b.begin + p) % b.nx * ww.s;
                    for (std::int64_t t = 0; t < nt; ++t) {
                        const std::int64_t ny = y + wh.lo - ph.taps[std::size_t(t)].first * wh.d;
                        const std::int64_t nx = x + ww.lo - ph.taps[std::size_t(t)].second * ww.d;
                        const std::int64_t oy = ny / wh.s, ox = nx / ww.s;
                        table[std::size_t(p * nt + t)] =
                            ny >= 0 && nx >= 0 && oy < Y.h && ox < Y.w
                                ? gv + Y.base + (oy * Y.w + ox) * Y.c + g * G.cog
                                : (direct ? zeros.data() : nullptr);
                    }
                }
                if (k == 0) {
                    std::fill(out.begin(), out.end(), T(0));
                } else if (direct) {
                    if constexpr (std::is_same_v<T, float>)
                        conv_rows_kernel()(b.count, nt, G.cog, G.cig, table.data(),
                                           ph.wp.data() + g * G.cig * k, out.data(), G.cig);
                } else {
                    panel.resize(std::size_t(b.count * k));
                    for (std::size_t j = 0; j < table.size(); ++j) {
                        T* dst = panel.data() + std::int64_t(j) * G.cog;
                        if (table[j])
                            std::memcpy(dst, table[j], std::size_t(G.cog) * sizeof(T));
                        else
                            std::fill(dst, dst + G.cog, T(0));
                    }
                    gemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(b.count), int(G.cig), int(k),
                         T(1), panel.data(), int(k), ph.wp.data() + g * G.cig * k, int(k),
                         out.data(), int(G.cig));
                }
                for (std::int64_t p = 0; p < b.count; ++p) {
                    const std::int64_t y = y0 + (b.begin + p) / b.nx * wh.s;
                    const std::int64_t x = x0 + (b.begin + p) % b.nx * ww.s;
                    std::memcpy(dx + X.base + (y * X.w + x) * X.c + g * G.cig,
                                out.data() + p * G.cig, std::size_t(G.cig) * sizeof(T));
                }
            }
        }
    });
}

template <class T>
RaggedTensor input_grad(const ir::Node& n, const RaggedTensor& g, const RaggedTensor& w,
                        const RaggedTensor& x) {
    const Geometry G = geometry(n, w);
    RaggedTensor dx = uninitialized(x.dtype(), x.structure_ptr());
    T* out = static_cast<T*>(dx.mutable_data());
    const T* gv = static_cast<const T*>(g.data());
    if (G.pointwise())
        gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(x.structure().rows()), int(G.cin),
             int(G.cout), T(1), gv, int(G.cout), static_cast<const T*>(w.data()), int(G.cin), out,
             int(G.cin));
    else if (G.win.h.s > 1 || G.win.w.s > 1)
        strided_input_grad(G, gv, g.structure(), static_cast<const T*>(w.data()), out,
                           x.structure());
    else
        implicit_gemm(G, false, gv, g.structure(), static_cast<const T*>(w.data()), out,
                      x.structure());
    return dx;
}

// Sums f(block, acc) over blocks into `width` doubles: 16 partial sums, each owning a fixed run
// of blocks, added in order.
template <class F>
std::vector<double> fixed_order_sum(std::int64_t nblocks, std::int64_t width, F&& f) {
    const std::int64_t parts = std::min<std::int64_t>(16, std::max<std::int64_t>(nblocks, 1));
    std::vector<std::vector<double>> part(std::size_t(parts),
                                          std::vector<double>(std::size_t(width), 0.0));
    parallel_for(parts, 1, [&](std::int64_t p0, std::int64_t p1) {
        for (std::int64_t p = p0; p < p1; ++p)
            for (std::int64_t b = nblocks * p / parts; b < nblocks * (p + 1) / parts; ++b)
                f(b, part[std::size_t(p)].data());
    });
    for (std::int64_t p = 1; p < parts; ++p)
        for (std::int64_t j = 0; j < width; ++j)
            part[0][std::size_t(j)] += part[std::size_t(p)][std::size_t(j)];
    return part[0];
}

template <class T>
RaggedTensor weight_grad(const ir::Node& n, const RaggedTensor& g, const RaggedTensor& x,
                         const RaggedTensor& w) {
    const Geometry G = geometry(n, w);
    const T* gv = static_cast<const T*>(g.data());
    const T* xv = static_cast<const T*>(x.data());
    if (G.pointwise()) { // dW = dY^T X over every packed pixel
        RaggedTensor dw = uninitialized(w.dtype(), w.structure_ptr());
        gemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(G.cout), int(G.cin),
             int(x.structure().rows()), T(1), gv, int(G.cout), xv, int(G.cin),
             static_cast<T*>(dw.mutable_data()), int(G.cin));
        if (x.structure().rows() == 0)
            std::fill_n(static_cast<T*>(dw.mutable_data()), dw.numel(), T(0));
        return dw;
    }
    const std::int64_t taps = G.kh * G.kw, k = taps * G.cig;
    // f32 with a multiple of the vector width of output channels per group: the direct kernel
    // over a table of row pointers, sums [g][k][cog]; else a panel and a BLAS GEMM, [g][cog][k].
    bool direct = false;
    if constexpr (std::is_same_v<T, float>) direct = G.cog % conv_lanes() == 0;
    const std::vector<Block> bl =
        blocks(g.structure(), direct ? direct_rows : block_rows(k, sizeof(T)));
    const ConvWeightRows kernel = direct ? conv_weight_rows_kernel() : nullptr;
    const std::vector<T> zeros(std::size_t(G.cig), T(0));
    const std::vector<double> acc =
        fixed_order_sum(std::int64_t(bl.size()), G.cout * k, [&](std::int64_t bi, double* sum) {
            const Block& b = bl[std::size_t(bi)];
            const Img S = img(x.structure(), b.sample), D = img(g.structure(), b.sample);
            std::vector<T> part(std::size_t(G.cog * k));
            for (std::int64_t gr = 0; gr < G.win.groups; ++gr) {
                const T* dy = gv + D.base + b.begin * G.cout + gr * G.cog;
                double* s = sum + gr * G.cog * k;
                if (direct) {
                    std::vector<const T*> table(std::size_t(b.count * taps));
                    tap_table(G, true, xv, S, D, b, gr, zeros.data(), table.data());
                    if constexpr (std::is_same_v<T, float>)
                        kernel(b.count, taps, G.cig, G.cog, table.data(), dy, part.data(), G.cout);
                    for (std::size_t j = 0; j < part.size(); ++j) s[j] += double(part[j]);
                    continue;
                }
                std::vector<T> panel(std::size_t(b.count * k));
                build_panel(G, true, xv, S, D, b, gr, panel.data());
                gemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(G.cog), int(k), int(b.count),
                     T(1), dy, int(G.cout), panel.data(), int(k), part.data(), int(k));
                for (std::size_t j = 0; j < part.size(); ++j) s[j] += double(part[j]);
            }
        });
    // [co][tap][ci] -> [co][ci][ky][kx]
    RaggedTensor dw = uninitialized(w.dtype(), w.structure_ptr());
    T* out = static_cast<T*>(dw.mutable_data());
    for (std::int64_t co = 0; co < G.cout; ++co)
        for (std::int64_t t = 0; t < taps; ++t)
            for (std::int64_t ci = 0; ci < G.cig; ++ci)
                out[(co * G.cig + ci) * taps + t] = T(
                    acc[std::size_t(direct ? (co / G.cog * k + t * G.cig + ci) * G.cog + co % G.cog
                                           : co * k + t * G.cig + ci)]);
    return dw;
}

template <class T> RaggedTensor bias_grad(const RaggedTensor& g, const RaggedTensor& b) {
    const std::int64_t c = b.numel(), rows = g.structure().rows(), per = 1024;
    const T* gv = static_cast<const T*>(g.data());
    const std::vector<double> acc =
        fixed_order_sum((rows + per - 1) / per, c, [&](std::int64_t blk, double* sum) {
            for (std::int64_t r = blk * per; r < std::min(rows, (blk + 1) * per); ++r)
                for (std::int64_t k = 0; k < c; ++k) sum[k] += double(gv[r * c + k]);
        });
    RaggedTensor db = uninitialized(b.dtype(), b.structure_ptr());
    T* out = static_cast<T*>(db.mutable_data());
    for (std::int64_t k = 0; k < c; ++k) out[k] = T(acc[std::size_t(k)]);
    return db;
}

bool same_sizes(const Structure& a, const Structure& b) {
    return a.batch() == b.batch() && a.sizes() == b.sizes();
}

template <class T> RaggedTensor run(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    auto arg = [&](std::size_t k) -> const RaggedTensor& { return vals[std::size_t(n.args[k])]; };
    if (n.op == "conv2d")
        return forward<T>(n, arg(0), arg(1), n.args.size() > 2 ? &arg(2) : nullptr);
    if (n.op == "conv2d_bias_grad") return bias_grad<T>(arg(0), arg(1));
    // The cotangent must have conv2d's result sizes; else the reference kernel names the sample.
    const bool input = n.op == "conv2d_input_grad";
    const RaggedTensor &g = arg(0), &x = input ? arg(2) : arg(1), &w = input ? arg(1) : arg(2);
    const Geometry G = geometry(n, w);
    if (!same_sizes(g.structure(),
                    *window_structure(g.structure().shape(), x.structure(), G.win, G.cout))) {
        std::vector<RaggedTensor> in;
        for (int a : n.args) in.push_back(vals[std::size_t(a)]);
        return reference_kernel(n.op, in, n.attrs);
    }
    return input ? input_grad<T>(n, g, w, x) : weight_grad<T>(n, g, x, w);
}

} // namespace

bool is_image_step(const ir::Function& f, const ir::Node& n) {
    static const char* ops[] = {"conv2d",           "conv2d_input_grad", "conv2d_weight_grad",
                                "conv2d_bias_grad", "max_pool2d",        "max_pool2d_grad",
                                "avg_pool2d",       "avg_pool2d_grad",   "upsample2d",
                                "upsample2d_grad",  "patches",           "patches_grad"};
    if (std::find_if(std::begin(ops), std::end(ops), [&](const char* o) { return n.op == o; }) ==
        std::end(ops))
        return false;
    const DType t = f.type(n.args[0]).dtype;
    return t == DType::f32 || t == DType::f64;
}

RaggedTensor run_image_step(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    if (n.op.rfind("conv2d", 0) != 0) return run_pool_step(n, vals);
    return vals[std::size_t(n.args[0])].dtype() == DType::f64 ? run<double>(n, vals)
                                                              : run<float>(n, vals);
}

} // namespace rag::jit
