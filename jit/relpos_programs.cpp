#include "jit/relpos_programs.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <cmath>

namespace rag::jit {
namespace {

using kir::Builder;
using kir::elem_of;
using kir::Expr;
using kir::Loop;
using kir::Type;

const double minus_inf = -INFINITY;
// Running maxima per row in the forward (one vector register of f32 on AVX-512).
constexpr std::int64_t lanes = 16;
// Rows per pass of products(); the strip G (a multiple of it) and the scratch it writes are
// sized for it.
constexpr std::int64_t block = 4;
// Terms added per load and store of an accumulator in products() and blocked_rows().
constexpr std::int64_t depth = 4;

// What every program shares: parameters, the input buffers, the strip it owns, and the
// arithmetic of scores. Buffers are declared in the documented launch order.
struct Program {
    Builder b;
    const RelposShape& s;
    Expr H, Delta, U, G, W, WP, WS, WJ;
    int q, k, v, eq, ek, eb, tiles;
    int zqs = -1, zks = -1;         // saved projections (s.saved), after the program's own buffers
    Expr tile, h, o, n, start, end; // end: the backward's parts only

    Program(const char* name, const RelposShape& shape) : b(name), s(shape) {
        H = b.param("H");
        Delta = b.param("Delta");
        U = b.param("U");
        G = b.param("G");
        W = b.param("W");
        WP = b.param("WP");
        WS = b.param("WS");
        WJ = min(G + RelposShape::J - 1, U); // rows a (strip, tile) pair reaches
        const kir::Elem e = elem_of(s.dtype);
        q = b.buffer("q", e);
        k = b.buffer("k", e);
        v = b.buffer("v", e);
        // Tensor cores read the relation tables in the data's type (the rounding their mma
        // makes anyway), so their rows stage with 16-byte copies (relpos_use_tensor_cores).
        const kir::Elem te = s.tensor_cores ? e : kir::Elem::f32;
        eq = b.buffer("eq", te);
        ek = b.buffer("ek", te);
        eb = b.buffer("eb", kir::Elem::f32);
        tiles = b.buffer("tiles", kir::Elem::i64);
    }

    // After the buffers: which strip and head this instance owns.
    void own_strip() {
        tile = b.let(b.pid() / H, "tile");
        h = b.let(b.pid() % H, "h");
        o = b.let(b.load(tiles, tile * 3), "o");
        n = b.let(b.load(tiles, tile * 3 + 1), "n");
        start = b.let(b.load(tiles, tile * 3 + 2), "start");
    }
    // The backward's: which part (rows [start, end) of a sample, whole strips) and head.
    void own_part() {
        tile = b.let(b.pid() / H, "part");
        h = b.let(b.pid() % H, "h");
        o = b.let(b.load(tiles, tile * 4), "o");
        n = b.let(b.load(tiles, tile * 4 + 1), "n");
        start = b.let(b.load(tiles, tile * 4 + 2), "start");
        end = b.let(b.load(tiles, tile * 4 + 3), "end");
    }
    // body(r0, count) for each strip [r0, r0 + count) of the part, in order.
    void over_strips(const std::function<void(Expr, Expr)>& body) {
        b.loop(0, kir::ceil_div(end - start, G), [&](Expr strip) {
            Expr r0 = b.let(start + strip * G, "r0");
            body(r0, b.let(min(G, end - r0), "count"));
        });
    }

    // In saved shapes: the saved projections, declared after the program's own buffers.
    void saved_buffers() {
        if (!s.saved) return;
        zqs = b.buffer("zqs", kir::Elem::f32);
        zks = b.buffer("zks", kir::Elem::f32);
    }
    // The two-pass backward's global buffers after the common ones, in the launch order the
    // hosts pass them (jit/relpos.cpp, jit/relpos_gpu.cpp), then the saved projections: one
    // declaration for every program of a pass, whatever its structure.
    struct QueryGradGlobals {
        int dO, out, lse, dq, delta, zq_part, zb_part, range;
    };
    QueryGradGlobals query_grad_globals() {
        const kir::Elem e = elem_of(s.dtype);
        QueryGradGlobals g{};
        g.dO = b.buffer("dO", e);
        g.out = b.buffer("out", e);
        g.lse = b.buffer("lse", kir::Elem::f32);
        g.dq = b.buffer("dq", e);
        g.delta = b.buffer("delta", kir::Elem::f32);
        g.zq_part = b.buffer("zq_part", kir::Elem::f32);
        g.zb_part = b.buffer("zb_part", kir::Elem::f32);
        g.range = b.buffer("range", kir::Elem::i64);
        saved_buffers();
        return g;
    }
    struct KeyGradGlobals {
        int dO, lse, delta, dk, dv, zk_part, range;
    };
    KeyGradGlobals key_grad_globals() {
        const kir::Elem e = elem_of(s.dtype);
        KeyGradGlobals g{};
        g.dO = b.buffer("dO", e);
        g.lse = b.buffer("lse", kir::Elem::f32);
        g.delta = b.buffer("delta", kir::Elem::f32);
        g.dk = b.buffer("dk", e);
        g.dv = b.buffer("dv", e);
        g.zk_part = b.buffer("zk_part", kir::Elem::f32);
        g.range = b.buffer("range", kir::Elem::i64);
        saved_buffers();
        return g;
    }

    // Whether the strip and tile projections are computed here (not read from zqs, zks).
    bool projects_q() const { return s.aq && !s.saved; }
    bool projects_k() const { return s.ak && !s.saved; }
    // Scratch of `size` floats when `used`, else one.
    Expr sized(bool used, Expr size) const { return used ? size : Expr(1); }
    // A staged tile of rows x width elements (constants): with tensor cores in shared memory
    // while the 113 KiB of a block last (the tiles read by every product first), in the data's
    // type (staged values are the inputs' own, so nothing is rounded) and padded after every
    // row, so the fragments' ldmatrix rows meet no bank conflict; else f32 scratch.
    int staged(const char* name, std::int64_t rows, std::int64_t width) {
        if (s.tensor_cores && shared_bytes + staged_bytes(rows, width) <= kir::kSharedBytes) {
            shared_bytes += staged_bytes(rows, width);
            return b.shared(name, rows * width, elem_of(s.dtype), width % 8 == 0 ? width : 0);
        }
        return b.scratch(name, Expr(rows * width));
    }
    // The shared memory a staged tile takes (its padded rows, rounded to 64 bytes).
    std::int64_t staged_bytes(std::int64_t rows, std::int64_t width) const {
        const kir::BufferDecl tile{"", elem_of(s.dtype), kir::Space::shared, rows * width,
                                   width % 8 == 0 ? width : 0};
        return (kir::array_bytes(tile, {}) + 63) / 64 * 64;
    }
    std::int64_t shared_bytes = 0;
    // Tensor-core programs whose scores add a bias without a query-side table (T5): each tile
    // pair's reachable bias rows [bias_lo, ...) staged in `bias_rows` (stage_bias, from
    // query_tile and key_tile), which score() reads instead of eb. -1: read eb.
    // With a double-buffered loop (`copies` 2) tile t's rows are copied with the tile
    // (prefetch_bias, into half t % 2 at bias_at), and key_tile / query_tile only point
    // score() at them.
    int bias_rows = -1;
    Expr bias_lo, bias_at = Expr(std::int64_t(0));
    bool bias_prefetched = false;
    void take_bias_rows(std::int64_t copies = 1) {
        if (!s.bias || (s.aq && !tile_projections) || !s.tensor_cores) return;
        bias_rows = small("Bt", copies * 2 * RelposShape::J);
        bias_prefetched = copies == 2 && b.decl(bias_rows).space == kir::Space::shared;
    }
    // `async`: with cp.async (copy4_async) where the rows are in shared memory, landing at the
    // caller's next await_copies; `into`: where in bias_rows.
    void stage_bias(Expr lo, Expr count, bool async = false, Expr into = Expr(std::int64_t(0))) {
        if (bias_rows < 0) return;
        bias_lo = lo;
        b.loop(
            0, count,
            [&](Expr w) {
                if (async && b.decl(bias_rows).space == kir::Space::shared)
                    b.copy4_async(bias_rows, into + w, eb, h * U + lo + w);
                else
                    b.store(bias_rows, into + w, b.load(eb, h * U + lo + w));
            },
            Loop::threads);
    }
    // The expanded rows the pairs of query rows [i0, i0 + rows) and keys [j0, j0 + cols) reach:
    // the first and how many.
    std::pair<Expr, Expr> reach(Expr i0, Expr rows, Expr j0, Expr cols) {
        Expr lo = b.let(row(i0 - (j0 + cols - 1)), "lo");
        return {lo, row(i0 + rows - 1 - j0) - lo + 1};
    }
    // Tile t's bias rows, with its K and V (a stream prefetch): see bias_prefetched.
    void prefetch_bias(Expr t, Expr i0, Expr rows, Expr j0, Expr cols) {
        if (!bias_prefetched) return;
        const auto [lo, count] = reach(i0, rows, j0, cols);
        stage_bias(lo, count, true, t % 2 * Expr(2 * RelposShape::J));
    }
    // The key pass double-buffers its query tiles' rows of lse and D (`Lt`, `Dt`: two halves
    // of J in shared memory) and bias rows like their Q and dO: tile t's are copied in tile
    // t's group (prefetch_query_rows, a stream's `also`) into half t % 2, and query_tile
    // stages nothing, so the loop never waits for more than the tile it computes.
    bool query_rows_prefetched = false;
    void prefetch_query_rows(Expr t, Expr i0, Expr rows, Expr j0, Expr cols, int Lt, int Dt,
                             int lse, int delta) {
        if (!query_rows_prefetched) return;
        Expr half = b.let(t % 2 * Expr(RelposShape::J), "half");
        b.loop(
            0, rows,
            [&](Expr ii) {
                Expr at = (o + i0 + ii) * H + h;
                b.copy4_async(Lt, half + ii, lse, at);
                b.copy4_async(Dt, half + ii, delta, at);
            },
            Loop::threads);
        prefetch_bias(t, i0, rows, j0, cols);
    }
    // A row of `size` f32 values read element by element inside the key loop (the key pass's
    // lse and D, a tile pair's bias rows): shared memory with tensor cores while the block's
    // 113 KiB last, else scratch.
    int small(const char* name, std::int64_t size) {
        const std::int64_t bytes = (size * 4 + 63) / 64 * 64;
        if (s.tensor_cores && shared_bytes + bytes <= kir::kSharedBytes) {
            shared_bytes += bytes;
            return b.shared(name, size);
        }
        return b.scratch(name, Expr(size));
    }

    // Relation projections per tile pair on tensor cores (every tensor-core pass of an unsaved
    // shape; take_tile_projections): the pair's projections onto the rows it reaches, in
    // shared memory, row w = u - lo (the pair's first row) of zq (zk) `zq_stride`
    // (`zk_stride`) floats apart, and the bias read from its own staged rows. Otherwise (the
    // host's programs) w = u - qlo (klo) rows J apart, the bias in zq.
    bool tile_projections = false;
    std::int64_t zq_stride = RelposShape::J, zk_stride = RelposShape::J;
    // Rows a tile pair's projections hold: a pair reaches at most 2J - 1 rows.
    static constexpr std::int64_t tile_rows = 2 * RelposShape::J;
    // A tile of tile_rows projections, `stride` floats a row (w-major: C of the mma), in shared
    // memory while the block's last, else scratch.
    int projection_tile(const char* name, std::int64_t stride) {
        const std::int64_t bytes = (tile_rows * stride * 4 + 63) / 64 * 64;
        if (shared_bytes + bytes > kir::kSharedBytes) return b.scratch(name, tile_rows * stride);
        shared_bytes += bytes;
        return b.shared(name, tile_rows * stride);
    }
    // z[w * stride + r] = table row lo + w . row r of x (a staged [J][D] tile at x_at) for
    // w < tile_rows (one half of J rows when `saturated`: every pair reads row lo) and r < J,
    // on tensor cores, table_rows table rows at a time staged in et ([table_rows][D], the
    // data's type, 16-byte copies; rows past the table read its last). Between the score reads
    // of one tile pair and the next pair's products, the mma's barriers order them. A half's
    // two stagings are written out, so the loop over halves holds two mma loops, the shape
    // the static report's model reads (bench/gpu/static_report.py).
    void project_tile(int z, std::int64_t stride, int et, int tab, int x, Expr x_at, Expr lo,
                      Expr saturated) {
        const auto J = RelposShape::J;
        static_assert(J % table_rows == 0 && J / table_rows == 2);
        // 16-byte copies where et is a shared tile of the table's type (else element by element).
        const bool copies = b.decl(et).elem == b.decl(tab).elem;
        const std::int64_t n = copies ? 16 / kir::elem_bytes(b.decl(tab).elem) : 1;
        b.loop(0, b.let(select(saturated, Expr(1), Expr(tile_rows / J)), "halves"), [&](Expr half) {
            for (std::int64_t part = 0; part < J / table_rows; ++part) {
                Expr w0 = b.let(half * J + part * table_rows, "w0");
                b.loop(
                    0, Expr(table_rows * (s.D / n)),
                    [&](Expr v) {
                        Expr e = v * n;
                        Expr from = table(min(lo + w0 + e / Expr(s.D), U - 1), e % Expr(s.D));
                        if (copies)
                            b.copy16(et, e, tab, from);
                        else
                            b.store(et, e, b.load(tab, from));
                    },
                    Loop::threads);
                b.mma({z, w0 * stride, stride, 1}, {et, 0, s.D, 1}, {x, x_at, 1, s.D}, table_rows,
                      J, s.D, precision(), false);
            }
        });
    }
    // The table rows project_tile stages at a time: half a tile's, so that a backward pass's
    // four staged tiles, both projection tiles and these fit two blocks in an H100's shared
    // memory (113 KiB each).
    static constexpr std::int64_t table_rows = RelposShape::J / 2;

    // A tensor-core pass's tile projections (unsaved shapes with relation tables): the shared
    // tiles of the query and key projections (-1: that table is absent) and the table rows'
    // half tile. The strides are the pass's: its score reads by offset meet no bank conflict
    // in the layout of its fragments (rows queries or keys).
    struct TileProjections {
        int zq = -1, zk = -1, et = -1;
    };
    TileProjections take_tile_projections(std::int64_t query_stride, std::int64_t key_stride) {
        TileProjections t;
        tile_projections = projects_q() || projects_k();
        if (!tile_projections) return t;
        zq_stride = query_stride;
        zk_stride = key_stride;
        if (projects_q()) t.zq = projection_tile("ZQt", zq_stride);
        if (projects_k()) t.zk = projection_tile("ZKt", zk_stride);
        t.et = staged("Et", table_rows, s.D);
        return t;
    }
    // A tile pair's projections onto the rows from lo: queries of xq and keys of xk (staged
    // [J][D] tiles at xq_at, xk_at).
    void project_pair(const TileProjections& t, int xq, Expr xq_at, int xk, Expr xk_at, Expr lo,
                      Expr saturated) {
        if (t.zq >= 0) project_tile(t.zq, zq_stride, t.et, eq, xq, xq_at, lo, saturated);
        if (t.zk >= 0) project_tile(t.zk, zk_stride, t.et, ek, xk, xk_at, lo, saturated);
    }

    // The expanded row of offset delta.
    Expr row(Expr delta) { return clamp(delta, -Delta, Delta) + Delta; }
    // The row a pair reads. Under a causal mask a key after its query (delta < 0) is masked
    // whatever it reads: it reads row(0), which its strip's projections cover.
    Expr pair_row(Expr delta) { return row(s.causal ? max(delta, 0) : delta); }
    // Element x of head h of token i of a [T, H, width] buffer.
    Expr at(Expr i, Expr x, std::int64_t width) { return ((o + i) * H + h) * width + x; }
    Expr table(Expr u, Expr x) { return (h * U + u) * s.D + x; }
    // The first row query i (key j) of the sample reaches: the origin of its saved projections.
    Expr q_lo(Expr i) { return row(s.causal ? Expr(0) : i - n + 1); }
    Expr k_lo(Expr j) { return row(s.causal ? Expr(0) : -j); }
    // Saved projection of token i of the sample at row u, rows from lo.
    Expr saved_at(Expr i, Expr u, Expr lo) { return ((o + i) * H + h) * WS + u - lo; }

    // Copies rows [first, first + count) of a [T, H, width] buffer into scratch dst, and with
    // tensor cores zeros rows [count, J), which a 16-row block or a J-deep product reads.
    // With tensor cores (the GPU) the copy is spread over the tile's elements, so a warp
    // stores 32 consecutive words (no shared-memory bank conflict; by rows it was 32-way) and
    // loads from consecutive addresses of a row; the host keeps its loop by rows.
    // `into`: where in dst the tile starts (a multiple of its rows, built without lets);
    // `async`: with cp.async (copy16_async), landing at the program's next await_copies.
    void stage(int dst, int src, Expr first, Expr count, std::int64_t width,
               Expr into = Expr(std::int64_t(0)), bool async = false) {
        // A shared tile of the data's type takes 16 bytes a thread (copy16: one vector load
        // and store; indices built without lets, so multiple_of sees they are aligned).
        const std::int64_t n = 16 / kir::elem_bytes(b.decl(src).elem);
        if (s.tensor_cores && b.decl(dst).elem == b.decl(src).elem && width % n == 0)
            b.loop(
                0, count * (width / n),
                [&](Expr v) {
                    Expr e = v * n, from = at(first + e / Expr(width), e % Expr(width), width);
                    if (async)
                        b.copy16_async(dst, into + e, src, from);
                    else
                        b.copy16(dst, into + e, src, from);
                },
                Loop::threads);
        else if (async)
            fail("internal: relpos stage: an async copy needs a 16-byte tile in shared memory");
        else if (s.tensor_cores)
            b.loop(
                0, count * width,
                [&](Expr e) {
                    Expr r = b.let(e / Expr(width)), x = b.let(e % Expr(width));
                    b.store(dst, e, b.load(src, at(first + r, x, width)));
                },
                Loop::threads);
        else
            b.loop(
                0, count,
                [&](Expr r) {
                    b.loop(0, width, [&](Expr x) {
                        b.store(dst, r * width + x, b.load(src, at(first + r, x, width)));
                    });
                },
                Loop::threads);
        if (s.tensor_cores)
            b.loop(
                count * width, RelposShape::J * width, [&](Expr x) { b.store(dst, into + x, 0.0); },
                Loop::threads);
    }

    // dst[x * J + r] = element x of row first + r of a [T, H, width] buffer for r < count, and
    // zero for r in [count, J): a tile staged transposed, so products over it vectorise.
    void stage_t(int dst, int src, Expr first, Expr count, std::int64_t width) {
        const auto J = RelposShape::J;
        b.loop(
            0, count,
            [&](Expr r) {
                b.loop(0, width, [&](Expr x) {
                    b.store(dst, x * J + r, b.load(src, at(first + r, x, width)));
                });
            },
            Loop::threads);
        b.loop(
            count, Expr(J),
            [&](Expr r) { b.loop(0, width, [&](Expr x) { b.store(dst, x * J + r, 0.0); }); },
            Loop::threads);
    }

    // out[r * J + c] = init(r) + sum_x a(r, x) bt[x * J + c] for r < rows and every c < J
    // (init 0 when not given): a tile of dot products as rank-1 updates in x order, vectorised
    // over c (bt staged by stage_t), `block` rows at a time so each load of bt feeds `block`
    // rows. Each element's sum has the same order wherever it is computed, so a product means
    // the same bits in every program. Rows up to the next multiple of `block` are written too
    // (copies of the last row): out holds padded(rows) rows.
    void products(int out, Expr rows, const std::function<Expr(Expr, Expr)>& a, int bt,
                  std::int64_t width, const std::function<Expr(Expr)>& init = {}) {
        const auto J = RelposShape::J;
        b.loop(
            0, kir::ceil_div(rows, block),
            [&](Expr rb) {
                std::vector<Expr> r, ra;
                for (std::int64_t k = 0; k < block; ++k) {
                    r.push_back(b.let(rb * block + k, "r"));
                    ra.push_back(b.let(min(r.back(), rows - 1), "ra")); // the row a reads
                    Expr first = init ? b.let(init(ra.back()), "init") : Expr(0.0);
                    b.loop(0, Expr(J), [&](Expr c) { b.store(out, r.back() * J + c, first); });
                }
                // x in groups of `depth`: each element of out is loaded and stored once per
                // group, its sum still added in x order, so the loop is bound by FMAs rather
                // than by stores.
                auto group = [&](Expr x0, std::int64_t n) {
                    std::vector<std::vector<Expr>> ax(block);
                    for (std::int64_t k = 0; k < block; ++k)
                        for (std::int64_t d = 0; d < n; ++d)
                            ax[std::size_t(k)].push_back(b.let(a(ra[k], x0 + d), "ax"));
                    b.loop(0, Expr(J), [&](Expr c) {
                        std::vector<Expr> y;
                        for (std::int64_t d = 0; d < n; ++d)
                            y.push_back(b.let(b.load(bt, (x0 + d) * J + c), "y"));
                        for (std::int64_t k = 0; k < block; ++k) {
                            Expr acc = b.load(out, r[k] * J + c);
                            for (std::int64_t d = 0; d < n; ++d)
                                acc = acc + ax[std::size_t(k)][std::size_t(d)] * y[std::size_t(d)];
                            b.store(out, r[k] * J + c, acc);
                        }
                    });
                };
                const std::int64_t full = width / depth * depth;
                if (full > 0)
                    b.loop(0, Expr(full / depth),
                           [&](Expr g) { group(b.let(g * depth, "x0"), depth); });
                for (std::int64_t x = full; x < width; ++x) group(Expr(x), 1);
            },
            Loop::threads);
    }
    static Expr padded(Expr rows) { return rows + (block - 1); }
    // The same for a row-major scratch tile a [rows][width] (of at least 64 rows). With tensor
    // cores: mma statements over 16-row blocks, then the copies of the last row.
    void products(int out, Expr rows, int a, int bt, std::int64_t width) {
        const auto J = RelposShape::J;
        if (!tensor_core_products(width)) {
            products(
                out, rows, [&](Expr r, Expr x) { return b.load(a, r * width + x); }, bt, width);
            return;
        }
        // Every row zero first: a J-deep product over out (mma_rows) reads all of them.
        Expr blocks = b.let(kir::ceil_div(rows, 16), "blocks");
        b.loop(
            0, Expr(J * J), [&](Expr x) { b.store(out, x, 0.0); }, Loop::threads);
        b.loop(0, blocks, [&](Expr rb) {
            b.mma({out, rb * (16 * J), J, 1}, {a, rb * (16 * width), width, 1}, {bt, 0, J, 1}, 16,
                  J, width, precision());
        });
        Expr last = b.let((rows - 1) * J, "last");
        b.loop(
            rows * J, kir::ceil_div(rows, block) * (block * J),
            [&](Expr x) { b.store(out, x, b.load(out, last + x % J)); }, Loop::threads);
    }
    // acc[r][x] += sum over c < J of w(r, c) src[c][x] for r < rows (16-row blocks, tensor
    // cores): the J-deep form of blocked_rows, w(r, c) = w[r w_row + c w_col]. Rows of src past
    // the tile must be zero (stage() zeroes them with tensor cores) and w finite everywhere.
    void mma_rows(Expr rows, int acc, std::int64_t width, int w, Expr w_row, Expr w_col, int src) {
        const auto J = RelposShape::J;
        b.loop(0, kir::ceil_div(rows, 16), [&](Expr rb) {
            b.mma({acc, rb * (16 * width), width, 1}, {w, rb * 16 * w_row, w_row, w_col},
                  {src, 0, width, 1}, 16, width, J, precision());
        });
    }
    // The J x J tile src copied into dst (a staged tile in the data's type: the rounding the
    // mma makes of its operands anyway), so that the products read it as ldmatrix fragments;
    // src itself when dst is f32 scratch. Returns what the products read.
    int rounded(int dst, int src) {
        if (b.decl(dst).space != kir::Space::shared) return src;
        b.loop(
            0, Expr(RelposShape::J * RelposShape::J),
            [&](Expr x) { b.store(dst, x, b.load(src, x)); }, Loop::threads);
        return dst;
    }
    // The backward passes on tensor cores take a tile pair's second dimension (the query
    // pass's keys, the key pass's queries) in halves of Jh, in a loop so that one half's
    // fragments die before the next one's are made: with whole tiles the two product
    // fragments and the accumulators did not fit the registers (bench/results/gpu_static.md).
    static constexpr std::int64_t Jh = RelposShape::J / 2;
    // x = a y^T, one fragment product per half: a is the pass's own staged strip, y the other
    // side's staged tile, both [J][width] row-major; x holds the half's Jh columns.
    struct HalfProduct {
        int x, a, y;
        std::int64_t width;
        Expr y_at = Expr(std::int64_t(0)); // where y's tile starts (its buffer, streamed())
    };
    // For each half, at column c0 of the tile: zeroes and forms both products, then body(c0).
    void halves(HalfProduct first, HalfProduct second, const std::function<void(Expr)>& body) {
        b.loop(0, Expr(RelposShape::J / Jh), [&](Expr half) {
            Expr c0 = b.let(half * Jh, "c0");
            b.each(first.x, [&](Expr, Expr) {
                b.put(first.x, 0.0);
                b.put(second.x, 0.0);
            });
            for (const HalfProduct& m : {first, second})
                b.mma({m.x, 0, Jh, 1}, {m.a, 0, m.width, 1},
                      {m.y, m.y_at + c0 * m.width, 1, m.width}, RelposShape::J, Jh, m.width,
                      precision());
            body(c0);
        });
    }
    // Double buffering of the tiles a pass streams (the forward's and query pass's K and V, the
    // key pass's Q and dO), where two of each fit in shared memory with what is staged already
    // (not beside both projection tiles): tile t + 1 is copied with cp.async into buffer
    // (t + 1) % 2 while tile t is computed. The backward passes took it once 32-bit indices
    // had freed their registers (64-bit ones: 20-50 B more spills a thread; design.md).
    struct Streamed {
        int a, b;            // the two staged arrays ([copies * J][width] each)
        std::int64_t wa, wb; // their widths
        std::int64_t copies; // 2: double-buffered; 1: staged by the caller, tile by tile
        // Where tile t starts in an array of this width (built without lets, so multiple_of
        // sees ldmatrix's rows aligned).
        Expr at(Expr t, std::int64_t width) const {
            return copies == 2 ? t % 2 * Expr(RelposShape::J * width) : Expr(std::int64_t(0));
        }
    };
    Streamed streamed(const char* a, std::int64_t wa, const char* bn, std::int64_t wb) {
        const auto J = RelposShape::J;
        const bool fits =
            shared_bytes + 2 * (staged_bytes(J, wa) + staged_bytes(J, wb)) <= kir::kSharedBytes;
        const std::int64_t copies = fits ? 2 : 1;
        const int ia = staged(a, copies * J, wa), ib = staged(bn, copies * J, wb);
        return {ia, ib, wa, wb, copies};
    }
    // For t < tiles: body(t) once tile t (rows [first + t J, ..) of src_a and src_b, at most up
    // to `end`) has landed in x's buffer t % 2; without double buffering, body stages it.
    // `also(t, from, count)` issues more of tile t's async copies into the same group.
    void stream(const Streamed& x, int src_a, int src_b, Expr first, Expr end, Expr tiles,
                const std::function<void(Expr)>& body,
                const std::function<void(Expr, Expr, Expr)>& also = {}) {
        if (x.copies == 1) return b.loop(0, tiles, body);
        auto prefetch = [&](Expr t) {
            Expr from = b.let(first + t * RelposShape::J, "from");
            Expr count = b.let(min(Expr(RelposShape::J), end - from), "count");
            stage(x.a, src_a, from, count, x.wa, x.at(t, x.wa), true);
            stage(x.b, src_b, from, count, x.wb, x.at(t, x.wb), true);
            if (also) also(t, from, count);
        };
        prefetch(Expr(std::int64_t(0)));
        b.await_copies(1); // commits tile 0's group; nothing lands yet
        b.loop(0, tiles, [&](Expr t) {
            // Buffer (t + 1) % 2 was read by tile t - 1's products: stage()'s threads loop
            // starts with a barrier. An empty group on the last tile keeps the count.
            b.when(t + 1 < tiles, [&] { prefetch(t + 1); });
            b.await_copies(1); // tile t has landed, for every thread
            body(t);
        });
    }

    bool tensor_core_products(std::int64_t width) const {
        return s.tensor_cores && width % 16 == 0;
    }
    kir::Precision precision() const {
        return s.dtype == DType::bf16 ? kir::Precision::bf16 : kir::Precision::f16;
    }

    // projT[w * J + r] = row r of srcT (a tile staged by stage_t) . table row lo + w (+ bias)
    // for w < rows and every r < J: the tile's projections onto the rows it reaches.
    void project(int projT, int srcT, int tab, Expr lo, Expr rows, bool with_bias) {
        products(
            projT, rows, [&](Expr w, Expr x) { return b.load(tab, table(lo + w, x)); }, srcT, s.D,
            with_bias
                ? std::function<Expr(Expr)>([&](Expr w) { return b.load(eb, h * U + lo + w); })
                : std::function<Expr(Expr)>());
    }

    // The scaled score of query row qi of its tile (query i of the sample) and key row kj (key
    // j) at expanded row u given their content product t, the query-side projections zq (by
    // project, rows from qlo) and the key-side zk (rows from klo), or in saved shapes the
    // saved projections of i and j.
    Expr score(Expr t, Expr qi, Expr kj, Expr u, int zq, Expr qlo, int zk, Expr klo, Expr i,
               Expr j) {
        if (s.aq)
            t = t + (s.saved ? b.load(zqs, saved_at(i, u, q_lo(i)))
                             : b.load(zq, (u - qlo) * zq_stride + qi));
        if (s.bias && (!s.aq || tile_projections))
            t = t +
                (bias_rows >= 0 ? b.load(bias_rows, bias_at + u - bias_lo) : b.load(eb, h * U + u));
        if (s.ak)
            t = t + (s.saved ? b.load(zks, saved_at(j, u, k_lo(j)))
                             : b.load(zk, (u - klo) * zk_stride + kj));
        return t * s.scale;
    }

    // Pairs c < count at offsets d0 + step c (step +-1) fall into three runs: [0, a) and
    // [c1, count) clamp to one row each (r0, r1), [a, c1) read row d0 + step c + Delta, affine
    // in c. A causal mask clamps offsets below at 0 (masked pairs read row(0)).
    struct Runs {
        Expr a, c1, r0, r1;
    };
    Runs runs(Expr count, Expr d0, std::int64_t step) {
        Expr dlo = s.causal ? Expr(0) : -Delta; // offsets in [dlo, Delta] are read unclamped
        Expr a = b.let(clamp(step > 0 ? dlo - d0 : d0 - Delta, Expr(0), count), "a");
        Expr c1 = b.let(clamp(step > 0 ? Delta - d0 + 1 : d0 - dlo + 1, a, count), "c1");
        return {a, c1, step > 0 ? dlo + Delta : Expr(2) * Delta,
                step > 0 ? Expr(2) * Delta : dlo + Delta};
    }
    // Runs body(c, u) for the pairs c < count at offsets d0 + step c, u the row each reads, a
    // run at a time: inside each loop the row is constant or affine in c, so the loop needs
    // no per-pair clamp and its loads by row are contiguous or strided, not gathered by index.
    void over_offsets(Expr count, Expr d0, std::int64_t step,
                      const std::function<void(Expr, Expr)>& body) {
        Expr d = b.let(d0, "d0");
        Runs r = runs(count, d, step);
        b.loop(0, r.a, [&](Expr c) { body(c, r.r0); });
        b.loop(r.a, r.c1, [&](Expr c) { body(c, d + Delta + c * step); });
        b.loop(r.c1, count, [&](Expr c) { body(c, r.r1); });
    }
    // Runs body(jj, u) for jj in [0, count) and key j0 + jj against query i: when `constant`
    // (a saturated tile pair) with the one row u0, else with each pair's own row, by runs when
    // `by_runs` (the forward's light pair body runs faster as one loop that clamps each row).
    void over_pairs(Expr constant, Expr u0, Expr count, Expr i, Expr j0,
                    const std::function<void(Expr, Expr)>& body, bool by_runs = true) {
        b.when(
            constant, [&] { b.loop(0, count, [&](Expr jj) { body(jj, u0); }); },
            [&] {
                if (by_runs)
                    over_offsets(count, i - j0, -1, body);
                else
                    b.loop(0, count, [&](Expr jj) { body(jj, pair_row(i - j0 - jj)); });
            });
    }

    // The same with the roles swapped: query i0 + ii against key j.
    void over_queries(Expr constant, Expr u0, Expr count, Expr i0, Expr j,
                      const std::function<void(Expr, Expr)>& body) {
        b.when(
            constant, [&] { b.loop(0, count, [&](Expr ii) { body(ii, u0); }); },
            [&] { over_offsets(count, i0 - j, 1, body); });
    }

    // Score gradients by offset: dZ[at + u] += gs[from + c gstride] for c < count, where pair c
    // reads row u = pair_row(d0 + step c), step = +-1: one sum per clamped run (all its pairs
    // read one row), and a loop over the unclamped run, whose rows are distinct and affine in
    // c, so it vectorises. Apart from the pair loop so that loop vectorises.
    void by_offset(int dZ, Expr at, int gs, Expr from, std::int64_t gstride, Expr count, Expr d0,
                   std::int64_t step) {
        Runs r = runs(count, d0, step);
        auto clamped = [&](Expr lo, Expr hi, Expr row) {
            b.when(lo < hi, [&] {
                int sum = b.var(Type::f32, 0.0);
                b.loop(lo, hi,
                       [&](Expr c) { b.set(sum, b.get(sum) + b.load(gs, from + c * gstride)); });
                b.add_to(dZ, at + row, b.get(sum));
            });
        };
        clamped(0, r.a, r.r0);
        b.loop(r.a, r.c1, [&](Expr c) {
            b.add_to(dZ, at + d0 + Delta + c * step, b.load(gs, from + c * gstride));
        });
        clamped(r.c1, count, r.r1);
    }

    struct QueryTile {
        Expr i0, rows, qlo, saturated;
    };
    // The key pass's buffers for a query tile: Qt and dOt row-major, QtT transposed (when
    // queries are projected), the tile's lse and D, and its projections ZQ.
    struct QueryTileBuffers {
        int Qt, dOt, QtT, Lt, Dt, ZQ;
    };
    // The query tile from `start` against the key strip [j0, j0 + cols): stages it, reads its
    // rows' lse and D, projects its queries onto the rows the pair reaches (from qlo). With
    // query_rows_prefetched, lse, D and bias rows have landed in the tile's half `half` (t % 2).
    QueryTile query_tile(Expr start, Expr j0, Expr cols, const QueryTileBuffers& t, int dO, int lse,
                         int delta, Expr half = Expr(std::int64_t(0))) {
        Expr i0 = b.let(start, "i0");
        Expr rows = b.let(min(Expr(RelposShape::J), n - i0), "rows");
        if (t.Qt >= 0) stage(t.Qt, q, i0, rows, s.D);
        if (t.dOt >= 0) stage(t.dOt, dO, i0, rows, s.Dv);
        if (projects_q() && !tile_projections) stage_t(t.QtT, q, i0, rows, s.D);
        Expr dmin = b.let(i0 - (j0 + cols - 1)), dmax = b.let(i0 + rows - 1 - j0);
        Expr qlo = b.let(row(dmin), "qlo");
        if (query_rows_prefetched) {
            if (bias_prefetched) {
                bias_lo = qlo;
                bias_at = half * Expr(2 * RelposShape::J);
            }
            return {i0, rows, qlo, saturated(dmin, dmax)};
        }
        // The rows' lse and D (and the bias rows) with 4-byte cp.async where they are in shared
        // memory, so the key loop reads global memory only through async staging.
        const bool async =
            b.decl(t.Lt).space == kir::Space::shared && b.decl(t.Dt).space == kir::Space::shared;
        b.loop(
            0, rows,
            [&](Expr ii) {
                Expr at = (o + i0 + ii) * H + h;
                if (async) {
                    b.copy4_async(t.Lt, ii, lse, at);
                    b.copy4_async(t.Dt, ii, delta, at);
                } else {
                    b.store(t.Lt, ii, b.load(lse, at));
                    b.store(t.Dt, ii, b.load(delta, at));
                }
            },
            Loop::threads);
        if (projects_q() && !tile_projections)
            project(t.ZQ, t.QtT, eq, qlo, row(dmax) - qlo + 1, s.bias);
        stage_bias(qlo, row(dmax) - qlo + 1, async);
        if (async) b.await_copies(0);
        return {i0, rows, qlo, saturated(dmin, dmax)};
    }

    // Whether every pair of a tile pair whose offsets span [dmin, dmax] saturates (then they
    // all read one row).
    Expr saturated(Expr dmin, Expr dmax) {
        return b.let(dmin >= Delta || dmax <= -Delta, "saturated");
    }
    struct KeyTile {
        Expr j0, cols, klo, saturated;
    };
    // Key tile t (of J keys, up to kend) against the query strip [i0, i0 + rows): stages its
    // keys (Ks row-major and KsT transposed, each when given; KsT must be given when keys are
    // projected) and values (Vs row-major, when given), projects the keys onto the rows the pair
    // reaches (from klo), and says whether every pair saturates (then they all read row klo).
    KeyTile key_tile(Expr t, Expr i0, Expr rows, Expr kend, int Ks, int KsT, int Vs, int ZK) {
        const auto J = RelposShape::J;
        Expr j0 = b.let(t * J, "j0");
        Expr cols = b.let(min(Expr(J), kend - j0), "cols");
        if (Ks >= 0) stage(Ks, k, j0, cols, s.D);
        if (KsT >= 0) stage_t(KsT, k, j0, cols, s.D);
        if (Vs >= 0) stage(Vs, v, j0, cols, s.Dv);
        Expr dmin = b.let(i0 - (j0 + cols - 1)), dmax = b.let(i0 + rows - 1 - j0);
        Expr klo = b.let(row(dmin), "klo");
        if (projects_k() && !tile_projections)
            project(ZK, KsT, ek, klo, row(dmax) - klo + 1, false);
        if (bias_prefetched) { // landed with the tile's K and V
            bias_lo = klo;
            bias_at = t % 2 * Expr(2 * J);
        } else if (bias_rows >= 0 && b.decl(bias_rows).space == kir::Space::shared) {
            // With 4-byte cp.async, so the key loop reads global memory through staging alone
            // (no copies are in flight here: the tile is not streamed).
            stage_bias(klo, row(dmax) - klo + 1, true);
            b.await_copies(0);
        } else {
            stage_bias(klo, row(dmax) - klo + 1);
        }
        return {j0, cols, klo, saturated(dmin, dmax)};
    }

    // acc(r, x) += sum_c weight(r, c) src(c, x) for r < rows, c < count, x < width, summed in
    // c order: `block` rows at a time so each load of src feeds `block` accumulators held in
    // registers, then the last rows one at a time (acc is written for r < rows only).
    void blocked_rows(Expr rows, Expr count, std::int64_t width, int acc,
                      const std::function<Expr(Expr, Expr)>& acc_at,
                      const std::function<Expr(Expr, Expr)>& weight,
                      const std::function<Expr(Expr, Expr)>& src) {
        // c in groups of `depth` (then the last ones alone): each accumulator is loaded and
        // stored once per group, its sum still added in c order.
        auto pass = [&](Expr first, std::int64_t nrows) {
            auto group = [&](Expr c0, std::int64_t n) {
                std::vector<std::vector<Expr>> wc(static_cast<std::size_t>(nrows));
                for (std::int64_t k = 0; k < nrows; ++k)
                    for (std::int64_t d = 0; d < n; ++d)
                        wc[std::size_t(k)].push_back(b.let(weight(first + k, c0 + d), "wc"));
                b.loop(0, width, [&](Expr x) {
                    std::vector<Expr> y;
                    for (std::int64_t d = 0; d < n; ++d) y.push_back(b.let(src(c0 + d, x), "y"));
                    for (std::int64_t k = 0; k < nrows; ++k) {
                        Expr sum = b.load(acc, acc_at(first + k, x));
                        for (std::int64_t d = 0; d < n; ++d)
                            sum = sum + wc[std::size_t(k)][std::size_t(d)] * y[std::size_t(d)];
                        b.store(acc, acc_at(first + k, x), sum);
                    }
                });
            };
            Expr groups = b.let(count / depth, "groups");
            b.loop(0, groups, [&](Expr g) { group(b.let(g * depth, "c0"), depth); });
            b.loop(groups * depth, count, [&](Expr c) { group(c, 1); });
        };
        Expr full = b.let(rows / block * block, "full");
        b.loop(
            0, rows / block, [&](Expr rb) { pass(b.let(rb * block, "r"), block); }, Loop::threads);
        b.loop(
            full, rows, [&](Expr r) { pass(r, 1); }, Loop::threads);
    }

    // acc(r, x) += sum_w dZ[r][w] table[lo + w][x] over the reachable rows (dZ's rows `stride`
    // apart), for every row r < rows: the relation term of dQ (tables eq) or dK (ek).
    void fold_rows(int acc, const std::function<Expr(Expr, Expr)>& acc_at, Expr rows, int dZ,
                   Expr stride, Expr lo, Expr count, int tab) {
        blocked_rows(
            rows, count, s.D, acc, acc_at,
            [&](Expr r, Expr w) { return b.load(dZ, r * stride + w); },
            [&](Expr w, Expr x) { return b.load(tab, table(lo + w, x)); });
    }
    void fold_rows(int acc, Expr rows, int dZ, Expr lo, Expr count, int tab) {
        fold_rows(
            acc, [&](Expr r, Expr x) { return r * s.D + x; }, rows, dZ, W, lo, count, tab);
    }
    // A share of a table gradient, added at rows `at` + w of the sample's partial for
    // w < count: part[w] += sum_r dZ[r][from + w] src[r] (src: the staged q or k rows; dZ's
    // rows `stride` apart, W for a strip's).
    void add_partial(int part, Expr at, Expr count, int dZ, Expr rows, int src, Expr stride,
                     Expr from = Expr(0)) {
        blocked_rows(
            count, rows, s.D, part, [&](Expr w, Expr x) { return (at + w) * s.D + x; },
            [&](Expr w, Expr r) { return b.load(dZ, r * stride + from + w); },
            [&](Expr r, Expr x) { return b.load(src, r * s.D + x); });
    }
    // D_i = dO_i . O_i of strip row g (FlashAttention's row term of dS), dO staged in dOs.
    Expr row_delta(int dOs, int out, Expr i0, Expr g) {
        int d = b.var(Type::f32, 0.0);
        b.loop(0, s.Dv, [&](Expr x) {
            b.set(d, b.get(d) + b.load(dOs, g * s.Dv + x) * b.load(out, at(i0 + g, x, s.Dv)));
        });
        return b.let(b.get(d), "d");
    }
    // The rows the part's queries reach (from slo, sw of them) and its partials (part), zeroed:
    // the backward's query strips add their shares of the table gradients there.
    struct Partials {
        Expr slo, sw, part;
    };
    // With zk_part (the one-pass backward's key-side partials, whose rows are the same for a
    // whole sample) that one is zeroed too.
    Partials query_partials(int zq_part, int zb_part, int zk_part = -1) {
        Expr slo = b.let(row(s.causal ? Expr(0) : start - n + 1), "slo");
        Expr sw = b.let(row(end - 1) - slo + 1, "sw");
        Expr part = b.let(tile * H + h, "part");
        b.loop(
            0, sw,
            [&](Expr w) {
                for (int z : {s.aq ? zq_part : -1, s.ak ? zk_part : -1})
                    if (z >= 0)
                        b.loop(0, s.D, [&](Expr x) { b.store(z, (part * WP + w) * s.D + x, 0.0); });
                if (s.bias) b.store(zb_part, part * WP + w, 0.0);
            },
            Loop::threads);
        return {slo, sw, part};
    }
    // The rows the key part's keys reach and its key-side partials, zeroed (key pass).
    Partials key_partials(int zk_part) {
        Expr slo = b.let(row(s.causal ? Expr(0) : 1 - end), "slo");
        Expr sw = b.let(row(n - 1 - start) - slo + 1, "sw");
        Expr part = b.let(tile * H + h, "part");
        if (s.ak)
            b.loop(
                0, sw,
                [&](Expr w) {
                    b.loop(0, s.D,
                           [&](Expr x) { b.store(zk_part, (part * WP + w) * s.D + x, 0.0); });
                },
                Loop::threads);
        return {slo, sw, part};
    }
    // A query strip's scratch in the backward: the [key][query] tiles S and dP, the strip's
    // log-sum-exps Lg and row terms Dg, the projections ZQ and ZK (-1: none) and the score
    // gradients by offset dZ (-1: not needed).
    struct StripTiles {
        int S, dP, Lg, Dg, ZQ, ZK, dZ;
    };
    // Turns a tile pair's S and dP into the score gradients dS = P (dP - D) scale, in S, and
    // with keep_p the probabilities P, in dP; then adds dS by offset into dZ.
    void score_grads(const StripTiles& t, Expr i0, Expr rows, Expr qlo, Expr j0, Expr cols,
                     Expr klo, Expr saturated, bool keep_p) {
        const auto J = RelposShape::J;
        b.loop(
            0, cols,
            [&](Expr jj) {
                Expr j = b.let(j0 + jj, "j");
                over_queries(saturated, klo, rows, i0, j, [&](Expr g, Expr u) {
                    Expr sc = masked(
                        score(b.load(t.S, jj * J + g), g, jj, u, t.ZQ, qlo, t.ZK, klo, i0 + g, j),
                        i0 + g, j);
                    Expr pr = b.let(exp(sc - b.load(t.Lg, g)), "p");
                    Expr gs =
                        b.let(pr * (b.load(t.dP, jj * J + g) - b.load(t.Dg, g)) * s.scale, "gs");
                    b.store(t.S, jj * J + g, gs);
                    if (keep_p) b.store(t.dP, jj * J + g, pr);
                });
            },
            Loop::threads);
        if (t.dZ >= 0)
            b.loop(
                0, rows,
                [&](Expr g) { by_offset(t.dZ, g * W - qlo, t.S, g, J, cols, i0 + g - j0, -1); },
                Loop::threads);
    }
    // The end of a query strip in the backward: dQ += dZQ aQ over the reachable rows, dQ out to
    // dq, then the strip's share of the table gradients (at part_at in the sample's partials):
    // dZQ^T Q, and dZQ's column sums row by row, so they vectorise over w (each still sums in
    // row order).
    void finish_query_strip(int dQ, int dq, Expr i0, Expr rows, int dZ, Expr qlo, Expr wq,
                            int zq_part, int zb_part, Expr part_at, int Qs) {
        if (s.aq) fold_rows(dQ, rows, dZ, qlo, wq, eq);
        b.loop(
            0, rows,
            [&](Expr g) {
                b.loop(0, s.D,
                       [&](Expr x) { b.store(dq, at(i0 + g, x, s.D), b.load(dQ, g * s.D + x)); });
            },
            Loop::threads);
        if (s.aq) add_partial(zq_part, part_at, wq, dZ, rows, Qs, W);
        if (s.bias)
            b.loop(0, rows, [&](Expr g) {
                b.loop(
                    0, wq, [&](Expr w) { b.add_to(zb_part, part_at + w, b.load(dZ, g * W + w)); },
                    Loop::threads);
            });
    }
    // Which rows the part's partials cover, for the reduction (written once, by head 0).
    void store_range(int range, Expr lo, Expr count) {
        b.when(h == 0, [&] {
            b.store(range, tile * 2, lo);
            b.store(range, tile * 2 + 1, count);
        });
    }

    // The end of a forward strip: O = A / L out to `out` and the log-sum-exp M + log L to
    // `lse`, for the strip's rows (A row-major, M and L per row).
    void finish_forward_strip(int out, int lse, int A, int M, int L, Expr i0, Expr rows) {
        b.loop(
            0, rows,
            [&](Expr r) {
                Expr inv = b.let(Expr(1.0) / b.load(L, r));
                b.loop(0, s.Dv, [&](Expr x) {
                    b.store(out, at(i0 + r, x, s.Dv), b.load(A, r * s.Dv + x) * inv);
                });
                b.store(lse, (o + i0 + r) * H + h, b.load(M, r) + log(b.load(L, r)));
            },
            Loop::threads);
    }

    Expr masked(Expr score, Expr i, Expr j) {
        return s.causal ? select(j > i, Expr(minus_inf), score) : score;
    }
};

// The forward on tensor cores, in FlashAttention-2's structure: warp w owns the strip's rows
// 16w .. 16w + 15, and the scores S, the output accumulator O and the row statistics are
// fragments (registers on the GPU): S = Q K^T into S, the relation terms and masks element by
// element, the row max and sum by quad shuffles, P = exp(S - m) in place, O += P V with S's
// registers as the A operand. The relation projections of each tile pair are tensor-core
// products too (project_tile: the strip's queries and the tile's keys onto the 2J rows the pair
// reaches, into shared memory), so the key loop touches global memory only to stage K, V and
// table rows (or, in saved shapes, to read the saved projections). Rows and columns past the
// strip and the tile read the last valid ones (in bounds) and are masked to -inf.
kir::Kernel flash_forward_program(const RelposShape& s) {
    Program p("relpos_forward", s);
    Builder& b = p.b;
    const auto J = RelposShape::J;
    static_assert(J == kir::kFragmentRows); // the strip is one fragment's rows
    const kir::Elem e = elem_of(s.dtype);
    const int out = b.buffer("out", e), lse = b.buffer("lse", kir::Elem::f32);
    p.saved_buffers();
    // Shared memory, first come first served: the strip's queries, the projection tiles and
    // the table rows they are made from, then K and V (double-buffered where that still fits:
    // not with both projections). Strides 68 and 69: the score reads of zq (row r - c + const,
    // column r) and zk (column c) meet no bank conflict (bench/results/gpu_static.md).
    const int Qs = p.staged("Qs", J, s.D);
    const auto tp = p.take_tile_projections(J + 4, J + 5);
    const auto kv = p.streamed("Ks", s.D, "Vs", s.Dv);
    const int Ks = kv.a, Vs = kv.b;
    p.take_bias_rows(kv.copies);
    const int S = b.fragment("S", J), O = b.fragment("O", s.Dv);
    // Per row: the running max M and sum L, the tile's max Mt and sum Lt (then O's rescale).
    const int M = b.fragment("M", 1), L = b.fragment("L", 1);
    const int Mt = b.fragment("Mt", 1), Lt = b.fragment("Lt", 1);
    p.own_strip();
    Expr i0 = p.start, n = p.n;
    Expr rows = b.let(min(p.G, n - i0), "rows");
    p.stage(Qs, p.q, i0, rows, s.D);
    b.each(O, [&](Expr, Expr) { b.put(O, 0.0); });
    b.each(M, [&](Expr, Expr) {
        b.put(M, minus_inf);
        b.put(L, 0.0);
    });
    Expr kend = b.let(s.causal ? min(n, i0 + rows) : n, "kend");
    p.stream(
        kv, p.k, p.v, Expr(std::int64_t(0)), kend, kir::ceil_div(kend, J),
        [&](Expr t) {
            const bool two = kv.copies == 2;
            const auto tile = p.key_tile(t, i0, rows, kend, two ? -1 : Ks, -1, two ? -1 : Vs, -1);
            p.project_pair(tp, Qs, 0, Ks, kv.at(t, s.D), tile.klo, tile.saturated);
            b.each(S, [&](Expr, Expr) { b.put(S, 0.0); });
            b.mma({S, 0, J, 1}, {Qs, 0, s.D, 1}, {Ks, kv.at(t, s.D), 1, s.D}, J, J, s.D,
                  p.precision());
            b.each(S, [&](Expr r, Expr c) {
                Expr ra = b.let(min(r, rows - 1), "ra"), ca = b.let(min(c, tile.cols - 1), "ca");
                Expr i = b.let(i0 + ra, "i"), j = b.let(tile.j0 + ca, "j");
                Expr u = b.let(p.pair_row(i - j), "u");
                Expr sc = p.masked(
                    p.score(b.here(S), ra, ca, u, tp.zq, tile.klo, tp.zk, tile.klo, i, j), i, j);
                b.put(S, select(r < rows && c < tile.cols, sc, Expr(minus_inf)));
            });
            b.row_reduce(Mt, S, kir::Reduce::max);
            b.each(M, [&](Expr, Expr) { b.put(Mt, max(b.here(M), b.here(Mt))); });
            // A row with every score masked so far keeps M = -inf and weighs nothing.
            b.each(S, [&](Expr, Expr) {
                b.put(S,
                      select(b.here(Mt) > Expr(minus_inf), exp(b.here(S) - b.here(Mt)), Expr(0.0)));
            });
            b.row_reduce(Lt, S, kir::Reduce::sum);
            b.each(M, [&](Expr, Expr) {
                Expr corr = b.let(
                    select(b.here(Mt) > Expr(minus_inf), exp(b.here(M) - b.here(Mt)), Expr(1.0)),
                    "corr");
                b.put(L, b.here(L) * corr + b.here(Lt));
                b.put(M, b.here(Mt));
                b.put(Lt, corr);
            });
            b.each(O, [&](Expr, Expr) { b.put(O, b.here(O) * b.here(Lt)); });
            // O += P V: P rounded to the data's type by the mma, as FlashAttention does.
            b.mma({O, 0, s.Dv, 1}, {S, 0, J, 1}, {Vs, kv.at(t, s.Dv), s.Dv, 1}, J, s.Dv, J,
                  p.precision());
        },
        [&](Expr t, Expr j0, Expr cols) { p.prefetch_bias(t, i0, rows, j0, cols); });
    b.each(O, [&](Expr r, Expr x) {
        b.when(r < rows, [&] {
            b.store(out, p.at(i0 + r, x, s.Dv), b.here(O) / b.here(L));
            b.when(x == 0,
                   [&] { b.store(lse, (p.o + i0 + r) * p.H + p.h, b.here(M) + log(b.here(L))); });
        });
    });
    return b.finish();
}

} // namespace

kir::Kernel relpos_forward_program(const RelposShape& s) {
    static_assert(RelposShape::J % lanes == 0);
    if (relpos_flash(s)) return flash_forward_program(s);
    Program p("relpos_forward", s);
    Builder& b = p.b;
    const auto J = RelposShape::J;
    const kir::Elem e = elem_of(s.dtype);
    const int out = b.buffer("out", e), lse = b.buffer("lse", kir::Elem::f32);
    p.saved_buffers();
    const int KsT = p.staged("KsT", s.D, J), Vs = p.staged("Vs", J, s.Dv);
    const int Qs = b.scratch("Qs", p.G * s.D);
    const int ZQ = b.scratch("ZQ", p.sized(p.projects_q(), p.padded(p.W) * J));
    const int QsT = b.scratch("QsT", p.sized(p.projects_q(), Expr(J * s.D)));
    const int ZK = b.scratch("ZK", p.sized(p.projects_k(), p.padded(p.WJ) * J));
    const int S = b.scratch("S", p.G * J), M = b.scratch("M", p.G), L = b.scratch("L", p.G);
    const int A = b.scratch("A", p.G * s.Dv), T = b.scratch("T", p.G * lanes);
    p.own_strip();
    Expr i0 = p.start, n = p.n;
    Expr rows = b.let(min(p.G, n - i0), "rows");
    p.stage(Qs, p.q, i0, rows, s.D);
    b.loop(
        0, rows,
        [&](Expr g) {
            b.store(M, g, minus_inf);
            b.store(L, g, 0.0);
            b.loop(0, s.Dv, [&](Expr x) { b.store(A, g * s.Dv + x, 0.0); });
        },
        Loop::threads);
    Expr qlo = b.let(p.row(s.causal ? Expr(0) : i0 - n + 1), "qlo");
    Expr wq = b.let(p.row(i0 + rows - 1) - qlo + 1, "wq");
    if (p.projects_q()) {
        p.stage_t(QsT, p.q, i0, rows, s.D);
        p.project(ZQ, QsT, p.eq, qlo, wq, s.bias);
    }
    Expr kend = b.let(s.causal ? min(n, i0 + rows) : n, "kend");
    b.loop(0, kir::ceil_div(kend, J), [&](Expr t) {
        auto [j0, cols, klo, saturated] = p.key_tile(t, i0, rows, kend, -1, KsT, Vs, ZK);
        p.products(S, rows, Qs, KsT, s.D);
        b.loop(
            0, rows,
            [&](Expr g) {
                Expr i = b.let(i0 + g, "i");
                p.over_pairs(
                    saturated, klo, cols, i, j0,
                    [&](Expr jj, Expr u) {
                        Expr sc = p.masked(
                            p.score(b.load(S, g * J + jj), g, jj, u, ZQ, qlo, ZK, klo, i, j0 + jj),
                            i, j0 + jj);
                        b.store(S, g * J + jj, sc);
                    },
                    false);
                // The row maximum: `lanes` running maxima over the padded row (elementwise,
                // so it vectorises where a scalar max reduction would not), then their max.
                b.loop(cols, Expr(J), [&](Expr jj) { b.store(S, g * J + jj, minus_inf); });
                b.loop(0, Expr(lanes), [&](Expr c) { b.store(T, g * lanes + c, minus_inf); });
                b.loop(0, Expr(J / lanes), [&](Expr blk) {
                    b.loop(0, Expr(lanes), [&](Expr c) {
                        b.store(T, g * lanes + c,
                                max(b.load(T, g * lanes + c), b.load(S, g * J + blk * lanes + c)));
                    });
                });
                int top = b.var(Type::f32, minus_inf);
                b.loop(0, Expr(lanes),
                       [&](Expr c) { b.set(top, max(b.get(top), b.load(T, g * lanes + c))); });
                // Online softmax; a row whose scores are all masked so far stays as it is.
                Expr m_new = b.let(max(b.load(M, g), b.get(top)), "m_new");
                b.when(
                    m_new > Expr(minus_inf),
                    [&] {
                        Expr corr = b.let(exp(b.load(M, g) - m_new), "corr");
                        int sum = b.var(Type::f32, b.load(L, g) * corr);
                        b.loop(0, s.Dv, [&](Expr x) {
                            b.store(A, g * s.Dv + x, b.load(A, g * s.Dv + x) * corr);
                        });
                        b.loop(0, cols, [&](Expr jj) {
                            Expr pr = b.let(exp(b.load(S, g * J + jj) - m_new), "p");
                            b.store(S, g * J + jj, pr);
                            b.set(sum, b.get(sum) + pr);
                        });
                        b.store(L, g, b.get(sum));
                        b.store(M, g, m_new);
                    },
                    [&] { b.loop(0, cols, [&](Expr jj) { b.store(S, g * J + jj, 0.0); }); });
            },
            Loop::threads);
        // S holds the probabilities now: A += P V.
        p.blocked_rows(
            rows, cols, s.Dv, A, [&](Expr g, Expr x) { return g * s.Dv + x; },
            [&](Expr g, Expr jj) { return b.load(S, g * J + jj); },
            [&](Expr jj, Expr x) { return b.load(Vs, jj * s.Dv + x); });
    });
    p.finish_forward_strip(out, lse, A, M, L, i0, rows);
    return b.finish();
}

kir::Kernel relpos_host_forward_program(const RelposShape& s) {
    // Per-query scratch is J wide, a strip (G = 64, relpos_setup) at most J rows, and
    // products() pads key rows to a multiple of `block` within the tile.
    static_assert(RelposShape::J % block == 0);
    Program p("relpos_forward", s);
    Builder& b = p.b;
    const auto J = RelposShape::J;
    const kir::Elem e = elem_of(s.dtype);
    const int out = b.buffer("out", e), lse = b.buffer("lse", kir::Elem::f32);
    p.saved_buffers();
    const int QsT = b.scratch("QsT", Expr(J * s.D));
    const int ZQ = b.scratch("ZQ", p.sized(p.projects_q(), p.padded(p.W) * J));
    const int KsT = b.scratch("KsT", p.sized(p.projects_k(), Expr(J * s.D)));
    const int ZK = b.scratch("ZK", p.sized(p.projects_k(), p.padded(p.WJ) * J));
    // ST[c * J + r]: the score, then the probability, of key c of the tile for query r.
    const int ST = b.scratch("ST", Expr(J * J));
    // Per query of the strip: the running maximum and sum, the tile's maximum, the shift of
    // its exponentials and the factor that rescales what came before.
    const int M = b.scratch("M", Expr(J)), L = b.scratch("L", Expr(J)), T = b.scratch("T", Expr(J)),
              Shift = b.scratch("Shift", Expr(J)), Corr = b.scratch("Corr", Expr(J));
    const int A = b.scratch("A", p.G * s.Dv);
    p.own_strip();
    Expr i0 = p.start, n = p.n;
    Expr rows = b.let(min(p.G, n - i0), "rows");
    // Queries past the strip are zero in QsT; their columns of ST are never read into outputs.
    p.stage_t(QsT, p.q, i0, rows, s.D);
    b.loop(0, Expr(J), [&](Expr r) {
        b.store(M, r, minus_inf);
        b.store(L, r, 0.0);
    });
    b.loop(
        0, rows, [&](Expr r) { b.loop(0, s.Dv, [&](Expr x) { b.store(A, r * s.Dv + x, 0.0); }); },
        Loop::threads);
    Expr qlo = b.let(p.row(s.causal ? Expr(0) : i0 - n + 1), "qlo");
    Expr wq = b.let(p.row(i0 + rows - 1) - qlo + 1, "wq");
    if (p.projects_q()) p.project(ZQ, QsT, p.eq, qlo, wq, s.bias);
    Expr kend = b.let(s.causal ? min(n, i0 + rows) : n, "kend");
    b.loop(0, kir::ceil_div(kend, J), [&](Expr t) {
        auto [j0, cols, klo, saturated] =
            p.key_tile(t, i0, rows, kend, -1, p.projects_k() ? KsT : -1, -1, ZK);
        // S^T = K Q^T, the keys read in place.
        p.products(
            ST, cols, [&](Expr c, Expr x) { return b.load(p.k, p.at(j0 + c, x, s.D)); }, QsT, s.D);
        b.loop(
            0, cols,
            [&](Expr c) {
                Expr j = b.let(j0 + c, "j");
                p.over_queries(saturated, klo, rows, i0, j, [&](Expr r, Expr u) {
                    Expr i = i0 + r;
                    Expr sc = p.score(b.load(ST, c * J + r), r, c, u, ZQ, qlo, ZK, klo, i, j);
                    b.store(ST, c * J + r, p.masked(sc, i, j));
                });
            },
            Loop::threads);
        // Online softmax across the strip's queries (vectorised over them, no horizontal
        // reductions). A query whose scores are all masked so far keeps M = -inf and adds
        // exp(-inf) = 0.
        b.loop(0, Expr(J), [&](Expr r) { b.store(T, r, minus_inf); });
        b.loop(0, cols, [&](Expr c) {
            b.loop(0, Expr(J),
                   [&](Expr r) { b.store(T, r, max(b.load(T, r), b.load(ST, c * J + r))); });
        });
        b.loop(0, Expr(J), [&](Expr r) {
            Expr m_old = b.let(b.load(M, r), "m_old");
            Expr m_new = b.let(max(m_old, b.load(T, r)), "m_new");
            Expr live = b.let(m_new > Expr(minus_inf), "live");
            Expr corr = b.let(select(live, exp(m_old - m_new), Expr(1.0)), "corr");
            b.store(M, r, m_new);
            b.store(Shift, r, select(live, m_new, Expr(0.0)));
            b.store(Corr, r, corr);
            b.store(L, r, b.load(L, r) * corr);
        });
        b.loop(
            0, rows,
            [&](Expr r) {
                Expr corr = b.let(b.load(Corr, r), "corr");
                b.loop(0, s.Dv,
                       [&](Expr x) { b.store(A, r * s.Dv + x, b.load(A, r * s.Dv + x) * corr); });
            },
            Loop::threads);
        b.loop(0, cols, [&](Expr c) {
            b.loop(0, Expr(J), [&](Expr r) {
                Expr pr = b.let(exp(b.load(ST, c * J + r) - b.load(Shift, r)), "p");
                b.store(ST, c * J + r, pr);
                b.store(L, r, b.load(L, r) + pr);
            });
        });
        // A += P V, the values read in place.
        p.blocked_rows(
            rows, cols, s.Dv, A, [&](Expr r, Expr x) { return r * s.Dv + x; },
            [&](Expr r, Expr c) { return b.load(ST, c * J + r); },
            [&](Expr c, Expr x) { return b.load(p.v, p.at(j0 + c, x, s.Dv)); });
    });
    p.finish_forward_strip(out, lse, A, M, L, i0, rows);
    return b.finish();
}

namespace {

// The query pass on tensor cores, in FlashAttention-2's structure: per strip, for each key tile,
// S = Q K^T and dP = dO V^T into fragments (warp w: the strip's rows 16w..), dS = P (dP - D)
// scale element by element (P = exp(S - lse), relation terms and masks as in the forward),
// dQ += dS K into a fragment with dS's registers as A. Where tables need dS by offset, it is
// also stored to a [query][key] tile for by_offset. dQ leaves the registers once per strip.
kir::Kernel flash_query_grad_program(const RelposShape& s) {
    Program p("relpos_query_grad", s);
    Builder& b = p.b;
    const auto J = RelposShape::J;
    const bool by_row = s.aq || s.bias; // whether dZQ is needed
    const auto [dO, out, lse, dq, delta, zq_part, zb_part, range] = p.query_grad_globals();
    const int Qs = p.staged("Qs", J, s.D), dOs = p.staged("dOs", J, s.Dv);
    const auto tp = p.take_tile_projections(J + 4, J + 5); // rows: queries, as the forward's
    const auto kv = p.streamed("Ks", s.D, "Vs", s.Dv);
    const int Ks = kv.a, Vs = kv.b;
    p.take_bias_rows(kv.copies);
    const int Dg = b.scratch("Dg", p.G), Lg = b.scratch("Lg", p.G);
    const int dZ = b.scratch("dZ", by_row ? p.G * p.W : Expr(1));
    const int dSx = b.scratch("dSx", by_row ? Expr(J * J) : Expr(1)); // [query][key]
    const int dQx = b.scratch("dQx", p.G * s.D);
    const auto Jh = Program::Jh;
    const int S = b.fragment("S", Jh), dP = b.fragment("dP", Jh), dQ = b.fragment("dQ", s.D);
    const int Lv = b.fragment("Lv", 1), Dv = b.fragment("Dv", 1);
    p.own_part();
    Expr n = p.n;
    auto [slo, sw, part] = p.query_partials(zq_part, zb_part);
    p.over_strips([&](Expr i0, Expr rows) {
        Expr qlo = b.let(p.row(s.causal ? Expr(0) : i0 - n + 1), "qlo");
        Expr wq = b.let(p.row(i0 + rows - 1) - qlo + 1, "wq");
        p.stage(Qs, p.q, i0, rows, s.D);
        p.stage(dOs, dO, i0, rows, s.Dv);
        b.loop(
            0, rows,
            [&](Expr g) {
                Expr d = p.row_delta(dOs, out, i0, g);
                b.store(Dg, g, d);
                b.store(delta, (p.o + i0 + g) * p.H + p.h, d);
                b.store(Lg, g, b.load(lse, (p.o + i0 + g) * p.H + p.h));
                if (by_row) b.loop(0, wq, [&](Expr w) { b.store(dZ, g * p.W + w, 0.0); });
            },
            Loop::threads);
        b.each(Lv, [&](Expr r, Expr) {
            Expr ra = min(r, rows - 1);
            b.put(Lv, b.load(Lg, ra));
            b.put(Dv, b.load(Dg, ra));
        });
        b.each(dQ, [&](Expr, Expr) { b.put(dQ, 0.0); });
        Expr kend = b.let(s.causal ? min(n, i0 + rows) : n, "kend");
        p.stream(
            kv, p.k, p.v, Expr(std::int64_t(0)), kend, kir::ceil_div(kend, J),
            [&](Expr t) {
                const bool two = kv.copies == 2;
                const auto tile =
                    p.key_tile(t, i0, rows, kend, two ? -1 : Ks, -1, two ? -1 : Vs, -1);
                p.project_pair(tp, Qs, 0, Ks, kv.at(t, s.D), tile.klo, tile.saturated);
                // The tile's keys in halves (as the key pass does its queries): S and dP of a half
                // are 16 registers a thread each beside dQ's 32.
                p.halves(
                    {S, Qs, Ks, s.D, kv.at(t, s.D)}, {dP, dOs, Vs, s.Dv, kv.at(t, s.Dv)},
                    [&](Expr c0) {
                        b.each(S, [&](Expr r,
                                      Expr ch) { // r: a query of the strip, c: a key of the tile
                            Expr c = b.let(c0 + ch, "c");
                            Expr ra = b.let(min(r, rows - 1), "ra"),
                                 ca = b.let(min(c, tile.cols - 1), "ca");
                            Expr i = b.let(i0 + ra, "i"), j = b.let(tile.j0 + ca, "j");
                            Expr u = b.let(p.pair_row(i - j), "u");
                            Expr sc = p.masked(p.score(b.here(S), ra, ca, u, tp.zq, tile.klo, tp.zk,
                                                       tile.klo, i, j),
                                               i, j);
                            Expr pr = b.let(
                                select(r < rows && c < tile.cols, exp(sc - b.here(Lv)), Expr(0.0)),
                                "p");
                            b.put(S, pr * (b.here(dP) - b.here(Dv)) * s.scale);
                            if (by_row) b.store(dSx, r * J + c, b.here(S));
                        });
                        // dQ += dS K over the half's keys: dS rounded to the data's type by the
                        // mma, as FlashAttention does.
                        b.mma({dQ, 0, s.D, 1}, {S, 0, Jh, 1},
                              {Ks, kv.at(t, s.D) + c0 * s.D, s.D, 1}, J, s.D, Jh, p.precision());
                    });
                if (by_row)
                    b.loop(
                        0, rows,
                        [&](Expr g) {
                            p.by_offset(dZ, g * p.W - qlo, dSx, g * J, 1, tile.cols,
                                        i0 + g - tile.j0, -1);
                        },
                        Loop::threads);
            },
            [&](Expr t, Expr j0, Expr cols) { p.prefetch_bias(t, i0, rows, j0, cols); });
        b.each(dQ, [&](Expr r, Expr x) { b.store(dQx, r * s.D + x, b.here(dQ)); });
        p.finish_query_strip(dQx, dq, i0, rows, dZ, qlo, wq, zq_part, zb_part,
                             part * p.WP + qlo - slo, Qs);
    });
    p.store_range(range, slo, sw);
    return b.finish();
}

} // namespace

kir::Kernel relpos_query_grad_program(const RelposShape& s) {
    if (relpos_flash(s)) return flash_query_grad_program(s);
    Program p("relpos_query_grad", s);
    Builder& b = p.b;
    const auto J = RelposShape::J;
    const bool by_row = s.aq || s.bias; // whether dZQ is needed
    const auto [dO, out, lse, dq, delta, zq_part, zb_part, range] = p.query_grad_globals();
    // The strip is staged transposed (QsT, dOsT) once, so each key tile is staged row-major
    // only (KsT just for its projections): scores and dP are [key][query] tiles.
    const int Qs = b.scratch("Qs", p.sized(s.aq, p.G * s.D)), dOs = b.scratch("dOs", p.G * s.Dv);
    const int QsT = p.staged("QsT", s.D, J), dOsT = p.staged("dOsT", s.Dv, J);
    const int Dg = b.scratch("Dg", p.G), Lg = b.scratch("Lg", p.G);
    const int ZQ = b.scratch("ZQ", p.sized(p.projects_q(), p.padded(p.W) * J));
    const int dZ = b.scratch("dZ", by_row ? p.G * p.W : Expr(1));
    const int dQ = b.scratch("dQ", p.G * s.D);
    const int Ks = p.staged("Ks", J, s.D), Vs = p.staged("Vs", J, s.Dv);
    const int KsT = b.scratch("KsT", p.sized(p.projects_k(), Expr(J * s.D)));
    const int ZK = b.scratch("ZK", p.sized(p.projects_k(), p.padded(p.WJ) * J));
    const int S = b.scratch("S", Expr(J * J)), dP = b.scratch("dP", Expr(J * J));
    const int dSh = s.tensor_cores ? p.staged("dSh", J, J) : -1; // dS in the data's type
    p.own_part();
    Expr n = p.n;
    auto [slo, sw, part] = p.query_partials(zq_part, zb_part);
    p.over_strips([&](Expr i0, Expr rows) {
        Expr qlo = b.let(p.row(s.causal ? Expr(0) : i0 - n + 1), "qlo");
        Expr wq = b.let(p.row(i0 + rows - 1) - qlo + 1, "wq");
        if (s.aq) p.stage(Qs, p.q, i0, rows, s.D);
        p.stage(dOs, dO, i0, rows, s.Dv);
        p.stage_t(QsT, p.q, i0, rows, s.D);
        p.stage_t(dOsT, dO, i0, rows, s.Dv);
        b.loop(
            0, rows,
            [&](Expr g) {
                Expr d = p.row_delta(dOs, out, i0, g);
                b.store(Dg, g, d);
                b.store(delta, (p.o + i0 + g) * p.H + p.h, d);
                b.store(Lg, g, b.load(lse, (p.o + i0 + g) * p.H + p.h));
                b.loop(0, s.D, [&](Expr x) { b.store(dQ, g * s.D + x, 0.0); });
                if (by_row) b.loop(0, wq, [&](Expr w) { b.store(dZ, g * p.W + w, 0.0); });
            },
            Loop::threads);
        if (p.projects_q()) p.project(ZQ, QsT, p.eq, qlo, wq, s.bias);
        Expr kend = b.let(s.causal ? min(n, i0 + rows) : n, "kend");
        b.loop(0, kir::ceil_div(kend, J), [&](Expr t) {
            auto [j0, cols, klo, saturated] =
                p.key_tile(t, i0, rows, kend, Ks, p.projects_k() ? KsT : -1, Vs, ZK);
            p.products(S, cols, Ks, QsT, s.D);
            p.products(dP, cols, Vs, dOsT, s.Dv);
            p.score_grads({S, dP, Lg, Dg, ZQ, ZK, by_row ? dZ : -1}, i0, rows, qlo, j0, cols, klo,
                          saturated, false);
            // S holds the score gradients now, [key][query].
            if (s.tensor_cores) // dS^T rounded to the data's type, as FlashAttention does
                p.mma_rows(rows, dQ, s.D, p.rounded(dSh, S), Expr(1), Expr(J), Ks);
            else
                p.blocked_rows(
                    rows, cols, s.D, dQ, [&](Expr g, Expr x) { return g * s.D + x; },
                    [&](Expr g, Expr jj) { return b.load(S, jj * J + g); },
                    [&](Expr jj, Expr x) { return b.load(Ks, jj * s.D + x); });
        });
        p.finish_query_strip(dQ, dq, i0, rows, dZ, qlo, wq, zq_part, zb_part,
                             part * p.WP + qlo - slo, Qs);
    });
    p.store_range(range, slo, sw);
    return b.finish();
}

namespace {

// The key pass on tensor cores, in FlashAttention-2's structure: per strip of keys (warp w:
// the strip's keys 16w..), for each query tile, S^T = K Q^T and dP^T = V dO^T into fragments,
// P^T and dS^T element by element (each query's lse and D read by column), then dV += P^T dO
// and dK += dS^T Q with the fragments' registers as A. Where key-side tables need dS by offset,
// it is also stored to a [key][query] tile for by_offset. dK and dV leave the registers once
// per strip.
kir::Kernel flash_key_grad_program(const RelposShape& s) {
    Program p("relpos_key_grad", s);
    Builder& b = p.b;
    const auto J = RelposShape::J;
    const auto [dO, lse, delta, dk, dv, zk_part, range] = p.key_grad_globals();
    const int Ks = p.staged("Ks", J, s.D), Vs = p.staged("Vs", J, s.Dv);
    const auto tp = p.take_tile_projections(J + 3, J + 4); // rows: keys
    const auto qd = p.streamed("Qt", s.D, "dOt", s.Dv);
    const int Qt = qd.a, dOt = qd.b;
    const int dZ = b.scratch("dZ", s.ak ? p.G * p.W : Expr(1));
    const int dSx = b.scratch("dSx", s.ak ? Expr(J * J) : Expr(1)); // [key][query]
    const int dKx = b.scratch("dKx", p.G * s.D);
    const int Lt = p.small("Lt", qd.copies * J), Dt = p.small("Dt", qd.copies * J);
    p.take_bias_rows(qd.copies);
    p.query_rows_prefetched = qd.copies == 2 && b.decl(Lt).space == kir::Space::shared &&
                              b.decl(Dt).space == kir::Space::shared;
    const auto Jh = Program::Jh;
    const int P = b.fragment("P", Jh), dS = b.fragment("dS", Jh);
    const int dK = b.fragment("dK", s.D), dV = b.fragment("dV", s.Dv);
    p.own_part();
    Expr n = p.n;
    auto [slo, sw, part] = p.key_partials(zk_part);
    p.over_strips([&](Expr j0, Expr cols) {
        Expr klo = b.let(p.row(s.causal ? Expr(0) : -(j0 + cols - 1)), "klo");
        Expr wk = b.let(p.row(n - 1 - j0) - klo + 1, "wk");
        p.stage(Ks, p.k, j0, cols, s.D);
        p.stage(Vs, p.v, j0, cols, s.Dv);
        if (s.ak)
            b.loop(
                0, cols,
                [&](Expr jj) { b.loop(0, wk, [&](Expr w) { b.store(dZ, jj * p.W + w, 0.0); }); },
                Loop::threads);
        b.each(dK, [&](Expr, Expr) { b.put(dK, 0.0); });
        b.each(dV, [&](Expr, Expr) { b.put(dV, 0.0); });
        Expr first = b.let(s.causal ? j0 : Expr(0), "first"); // queries that see these keys
        p.stream(
            qd, p.q, dO, first, n, kir::ceil_div(n - first, J),
            [&](Expr t) {
                const bool two = qd.copies == 2;
                // Where the tile's lse and D are (prefetched: its half of Lt and Dt).
                Expr rows_at = p.query_rows_prefetched ? b.let(t % 2 * Expr(J), "rows_at")
                                                       : Expr(std::int64_t(0));
                const auto [i0, rows, qlo, saturated] = p.query_tile(
                    first + t * J, j0, cols, {two ? -1 : Qt, two ? -1 : dOt, -1, Lt, Dt, -1}, dO,
                    lse, delta, t % 2);
                p.project_pair(tp, Qt, qd.at(t, s.D), Ks, 0, qlo, saturated);
                // The tile's queries in halves: P^T and dS^T of a half are 16 registers a thread
                // each rather than 32, beside dK and dV's 64 (a whole tile spilled).
                p.halves(
                    {P, Ks, Qt, s.D, qd.at(t, s.D)}, {dS, Vs, dOt, s.Dv, qd.at(t, s.Dv)},
                    [&](Expr c0) {
                        b.each(P, [&](Expr r,
                                      Expr ch) { // r: a key of the strip, c: a query of the tile
                            Expr c = b.let(c0 + ch, "c");
                            Expr ra = b.let(min(r, cols - 1), "ra"),
                                 ca = b.let(min(c, rows - 1), "ca");
                            Expr i = b.let(i0 + ca, "i"), j = b.let(j0 + ra, "j");
                            Expr u = b.let(p.pair_row(i - j), "u");
                            Expr sc = p.masked(
                                p.score(b.here(P), ca, ra, u, tp.zq, qlo, tp.zk, qlo, i, j), i, j);
                            Expr pr = b.let(select(r < cols && c < rows,
                                                   exp(sc - b.load(Lt, rows_at + ca)), Expr(0.0)),
                                            "p");
                            b.put(P, pr);
                            b.put(dS, pr * (b.here(dS) - b.load(Dt, rows_at + ca)) * s.scale);
                            if (s.ak) b.store(dSx, r * J + c, b.here(dS));
                        });
                        // dV += P^T dO and dK += dS^T Q over the half's queries, P and dS rounded
                        // to the data's type by the mma.
                        b.mma({dV, 0, s.Dv, 1}, {P, 0, Jh, 1},
                              {dOt, qd.at(t, s.Dv) + c0 * s.Dv, s.Dv, 1}, J, s.Dv, Jh,
                              p.precision());
                        b.mma({dK, 0, s.D, 1}, {dS, 0, Jh, 1},
                              {Qt, qd.at(t, s.D) + c0 * s.D, s.D, 1}, J, s.D, Jh, p.precision());
                    });
                if (s.ak)
                    b.loop(
                        0, cols,
                        [&](Expr jj) {
                            p.by_offset(dZ, jj * p.W - klo, dSx, jj * J, 1, rows, i0 - j0 - jj, 1);
                        },
                        Loop::threads);
            },
            [&](Expr t, Expr from, Expr count) {
                p.prefetch_query_rows(t, from, count, j0, cols, Lt, Dt, lse, delta);
            });
        b.each(dK, [&](Expr r, Expr x) { b.store(dKx, r * s.D + x, b.here(dK)); });
        b.each(dV, [&](Expr r, Expr x) {
            b.when(r < cols, [&] { b.store(dv, p.at(j0 + r, x, s.Dv), b.here(dV)); });
        });
        if (s.ak) p.fold_rows(dKx, cols, dZ, klo, wk, p.ek);
        b.loop(
            0, cols,
            [&](Expr jj) {
                b.loop(0, s.D, [&](Expr x) {
                    b.store(dk, p.at(j0 + jj, x, s.D), b.load(dKx, jj * s.D + x));
                });
            },
            Loop::threads);
        if (s.ak) p.add_partial(zk_part, part * p.WP + klo - slo, wk, dZ, cols, Ks, p.W);
    });
    p.store_range(range, slo, sw);
    return b.finish();
}

} // namespace

kir::Kernel relpos_key_grad_program(const RelposShape& s) {
    if (relpos_flash(s)) return flash_key_grad_program(s);
    Program p("relpos_key_grad", s);
    Builder& b = p.b;
    const auto J = RelposShape::J;
    const auto [dO, lse, delta, dk, dv, zk_part, range] = p.key_grad_globals();
    // The strip is staged transposed (KsT, VsT) once, so each query tile is staged row-major
    // only (QtT just for its projections): scores and dP are [query][key] tiles.
    const int Ks = b.scratch("Ks", p.sized(s.ak, p.G * s.D));
    const int KsT = p.staged("KsT", s.D, J), VsT = p.staged("VsT", s.Dv, J);
    const int ZK = b.scratch("ZK", p.sized(p.projects_k(), p.padded(p.W) * J));
    const int dZ = b.scratch("dZ", s.ak ? p.G * p.W : Expr(1));
    const int dK = b.scratch("dK", p.G * s.D), dV = b.scratch("dV", p.G * s.Dv);
    const int Qt = p.staged("Qt", J, s.D), dOt = p.staged("dOt", J, s.Dv);
    const int QtT = b.scratch("QtT", p.sized(p.projects_q(), Expr(J * s.D)));
    const int St = b.scratch("St", Expr(J * J)), dPt = b.scratch("dPt", Expr(J * J));
    const int Lt = b.scratch("Lt", Expr(J)), Dt = b.scratch("Dt", Expr(J));
    const int ZQ = b.scratch("ZQ", p.sized(p.projects_q(), p.padded(p.WJ) * J));
    const int Th = s.tensor_cores ? p.staged("Th", J, J) : -1; // P, then dS, in the data's type
    p.own_part();
    Expr n = p.n;
    auto [slo, sw, part] = p.key_partials(zk_part);
    p.over_strips([&](Expr j0, Expr cols) {
        Expr klo = b.let(p.row(s.causal ? Expr(0) : -(j0 + cols - 1)), "klo");
        Expr wk = b.let(p.row(n - 1 - j0) - klo + 1, "wk");
        if (s.ak) p.stage(Ks, p.k, j0, cols, s.D);
        p.stage_t(KsT, p.k, j0, cols, s.D);
        p.stage_t(VsT, p.v, j0, cols, s.Dv);
        b.loop(
            0, cols,
            [&](Expr jj) {
                b.loop(0, s.D, [&](Expr x) { b.store(dK, jj * s.D + x, 0.0); });
                b.loop(0, s.Dv, [&](Expr x) { b.store(dV, jj * s.Dv + x, 0.0); });
                if (s.ak) b.loop(0, wk, [&](Expr w) { b.store(dZ, jj * p.W + w, 0.0); });
            },
            Loop::threads);
        if (p.projects_k()) p.project(ZK, KsT, p.ek, klo, wk, false);
        Expr first = b.let(s.causal ? j0 : Expr(0), "first"); // queries that see these keys
        b.loop(0, kir::ceil_div(n - first, J), [&](Expr t) {
            const auto [i0, rows, qlo, saturated] =
                p.query_tile(first + t * J, j0, cols, {Qt, dOt, QtT, Lt, Dt, ZQ}, dO, lse, delta);
            p.products(St, rows, Qt, KsT, s.D);
            p.products(dPt, rows, dOt, VsT, s.Dv);
            b.loop(
                0, rows,
                [&](Expr ii) {
                    Expr i = b.let(i0 + ii, "i");
                    Expr lt = b.let(b.load(Lt, ii), "lt"), dt = b.let(b.load(Dt, ii), "dt");
                    p.over_pairs(saturated, qlo, cols, i, j0, [&](Expr jj, Expr u) {
                        Expr sc = p.masked(p.score(b.load(St, ii * J + jj), ii, jj, u, ZQ, qlo, ZK,
                                                   klo, i, j0 + jj),
                                           i, j0 + jj);
                        Expr pr = b.let(exp(sc - lt), "p");
                        Expr gs = b.let(pr * (b.load(dPt, ii * J + jj) - dt) * s.scale, "gs");
                        b.store(St, ii * J + jj, pr);
                        b.store(dPt, ii * J + jj, gs);
                    });
                },
                Loop::threads);
            if (s.ak)
                b.loop(
                    0, cols,
                    [&](Expr jj) {
                        p.by_offset(dZ, jj * p.W - klo, dPt, jj, J, rows, i0 - j0 - jj, 1);
                    },
                    Loop::threads);
            // St and dPt hold the probabilities and score gradients now, [query][key].
            if (s.tensor_cores) { // P^T and dS^T rounded to the data's type
                p.mma_rows(cols, dV, s.Dv, p.rounded(Th, St), Expr(1), Expr(J), dOt);
                p.mma_rows(cols, dK, s.D, p.rounded(Th, dPt), Expr(1), Expr(J), Qt);
            } else {
                p.blocked_rows(
                    cols, rows, s.Dv, dV, [&](Expr jj, Expr x) { return jj * s.Dv + x; },
                    [&](Expr jj, Expr ii) { return b.load(St, ii * J + jj); },
                    [&](Expr ii, Expr x) { return b.load(dOt, ii * s.Dv + x); });
                p.blocked_rows(
                    cols, rows, s.D, dK, [&](Expr jj, Expr x) { return jj * s.D + x; },
                    [&](Expr jj, Expr ii) { return b.load(dPt, ii * J + jj); },
                    [&](Expr ii, Expr x) { return b.load(Qt, ii * s.D + x); });
            }
        });
        if (s.ak) p.fold_rows(dK, cols, dZ, klo, wk, p.ek);
        b.loop(
            0, cols,
            [&](Expr jj) {
                b.loop(0, s.D, [&](Expr x) {
                    b.store(dk, p.at(j0 + jj, x, s.D), b.load(dK, jj * s.D + x));
                });
                b.loop(0, s.Dv, [&](Expr x) {
                    b.store(dv, p.at(j0 + jj, x, s.Dv), b.load(dV, jj * s.Dv + x));
                });
            },
            Loop::threads);
        if (s.ak) p.add_partial(zk_part, part * p.WP + klo - slo, wk, dZ, cols, Ks, p.W);
    });
    p.store_range(range, slo, sw);
    return b.finish();
}

bool relpos_one_pass_backward(const RelposShape& s) {
    return s.dtype == DType::f32 && !s.tensor_cores;
}

kir::Kernel relpos_grad_program(const RelposShape& s) {
    Program p("relpos_grad", s);
    Builder& b = p.b;
    const auto J = RelposShape::J;
    const auto f32 = kir::Elem::f32;
    const bool by_row = s.aq || s.bias; // whether dZQ is needed
    const int dO = b.buffer("dO", f32), out = b.buffer("out", f32), lse = b.buffer("lse", f32);
    const int dq = b.buffer("dq", f32), dk = b.buffer("dk", f32), dv = b.buffer("dv", f32);
    const int zq_part = b.buffer("zq_part", f32), zb_part = b.buffer("zb_part", f32);
    const int zk_part = b.buffer("zk_part", f32);
    const int range = b.buffer("range", kir::Elem::i64);
    p.saved_buffers();
    // The query pass's scratch, with the strip's rows also row-major (Qs) for dK.
    const int Qs = b.scratch("Qs", p.G * s.D), dOs = b.scratch("dOs", p.G * s.Dv);
    const int QsT = p.staged("QsT", s.D, J), dOsT = p.staged("dOsT", s.Dv, J);
    const int Dg = b.scratch("Dg", p.G), Lg = b.scratch("Lg", p.G);
    const int ZQ = b.scratch("ZQ", p.sized(p.projects_q(), p.padded(p.W) * J));
    const int dZ = b.scratch("dZ", by_row ? p.G * p.W : Expr(1));
    const int dQ = b.scratch("dQ", p.G * s.D);
    const int Ks = p.staged("Ks", J, s.D), Vs = p.staged("Vs", J, s.Dv);
    const int KsT = b.scratch("KsT", p.sized(p.projects_k(), Expr(J * s.D)));
    const int ZK = b.scratch("ZK", p.sized(p.projects_k(), p.padded(p.WJ) * J));
    // A tile pair's key-side score gradients by offset: per key, the pair's rows from klo.
    const int dZK = b.scratch("dZK", p.sized(s.ak, J * p.WJ));
    const int S = b.scratch("S", Expr(J * J)), dP = b.scratch("dP", Expr(J * J));
    p.own_part(); // a whole sample (start 0, end n): see relpos_split_backward
    Expr n = p.n;
    // A whole sample's keys reach the rows its queries do, so both sides' partials start at slo.
    auto [slo, sw, part] = p.query_partials(zq_part, zb_part, zk_part);
    // dK and dV accumulate in place over the strips, in strip order.
    b.loop(
        0, n,
        [&](Expr j) {
            b.loop(0, s.D, [&](Expr x) { b.store(dk, p.at(j, x, s.D), 0.0); });
            b.loop(0, s.Dv, [&](Expr x) { b.store(dv, p.at(j, x, s.Dv), 0.0); });
        },
        Loop::threads);
    p.over_strips([&](Expr i0, Expr rows) {
        Expr qlo = b.let(p.row(s.causal ? Expr(0) : i0 - n + 1), "qlo");
        Expr wq = b.let(p.row(i0 + rows - 1) - qlo + 1, "wq");
        p.stage(Qs, p.q, i0, rows, s.D);
        p.stage(dOs, dO, i0, rows, s.Dv);
        p.stage_t(QsT, p.q, i0, rows, s.D);
        p.stage_t(dOsT, dO, i0, rows, s.Dv);
        b.loop(
            0, rows,
            [&](Expr g) {
                Expr d = p.row_delta(dOs, out, i0, g);
                b.store(Dg, g, d);
                b.store(Lg, g, b.load(lse, (p.o + i0 + g) * p.H + p.h));
                b.loop(0, s.D, [&](Expr x) { b.store(dQ, g * s.D + x, 0.0); });
                if (by_row) b.loop(0, wq, [&](Expr w) { b.store(dZ, g * p.W + w, 0.0); });
            },
            Loop::threads);
        if (p.projects_q()) p.project(ZQ, QsT, p.eq, qlo, wq, s.bias);
        Expr kend = b.let(s.causal ? min(n, i0 + rows) : n, "kend");
        b.loop(0, kir::ceil_div(kend, J), [&](Expr t) {
            auto [j0, cols, klo, saturated] =
                p.key_tile(t, i0, rows, kend, Ks, p.projects_k() ? KsT : -1, Vs, ZK);
            p.products(S, cols, Ks, QsT, s.D);
            p.products(dP, cols, Vs, dOsT, s.Dv);
            p.score_grads({S, dP, Lg, Dg, ZQ, ZK, by_row ? dZ : -1}, i0, rows, qlo, j0, cols, klo,
                          saturated, true);
            // S holds the score gradients dS now and dP the probabilities P, [key][query]:
            // dQ += dS K, dV += P^T dO, dK += dS^T Q (the key pass's sums, in its order).
            p.blocked_rows(
                rows, cols, s.D, dQ, [&](Expr g, Expr x) { return g * s.D + x; },
                [&](Expr g, Expr jj) { return b.load(S, jj * J + g); },
                [&](Expr jj, Expr x) { return b.load(Ks, jj * s.D + x); });
            p.blocked_rows(
                cols, rows, s.Dv, dv, [&](Expr jj, Expr x) { return p.at(j0 + jj, x, s.Dv); },
                [&](Expr jj, Expr g) { return b.load(dP, jj * J + g); },
                [&](Expr g, Expr x) { return b.load(dOs, g * s.Dv + x); });
            p.blocked_rows(
                cols, rows, s.D, dk, [&](Expr jj, Expr x) { return p.at(j0 + jj, x, s.D); },
                [&](Expr jj, Expr g) { return b.load(S, jj * J + g); },
                [&](Expr g, Expr x) { return b.load(Qs, g * s.D + x); });
            if (!s.ak) return;
            // The key-side relation terms of this pair, folded here because a later strip
            // revisits these keys: dZK by offset over the pair's rows [klo, klo + wk), then
            // dK += dZK aK in place and the pair's share of the table gradient dZK^T K.
            Expr wk = b.let(p.row(i0 + rows - 1 - j0) - klo + 1, "wk");
            b.loop(
                0, cols,
                [&](Expr jj) {
                    b.loop(0, wk, [&](Expr w) { b.store(dZK, jj * p.WJ + w, 0.0); });
                    p.by_offset(dZK, jj * p.WJ - klo, S, jj * J, 1, rows, i0 - (j0 + jj), 1);
                },
                Loop::threads);
            p.fold_rows(
                dk, [&](Expr jj, Expr x) { return p.at(j0 + jj, x, s.D); }, cols, dZK, p.WJ, klo,
                wk, p.ek);
            // Causal: the diagonal pair's rows below the partials' first row (slo, offset 0)
            // are masked pairs' (dZK is zero there) and would fall before the partial.
            Expr skip = b.let(max(slo - klo, Expr(0)), "skip");
            p.add_partial(zk_part, part * p.WP + klo + skip - slo, wk - skip, dZK, cols, Ks, p.WJ,
                          skip);
        });
        p.finish_query_strip(dQ, dq, i0, rows, dZ, qlo, wq, zq_part, zb_part,
                             part * p.WP + qlo - slo, Qs);
    });
    p.store_range(range, slo, sw);
    return b.finish();
}

kir::Kernel relpos_project_program(const RelposShape& s) {
    Program p("relpos_project", s);
    Builder& b = p.b;
    p.saved_buffers();
    const auto J = RelposShape::J;
    const int XsT = b.scratch("XsT", Expr(J * s.D)), PT = b.scratch("PT", p.padded(p.W) * J);
    p.own_strip();
    Expr i0 = p.start, n = p.n;
    Expr rows = b.let(min(p.G, n - i0), "rows");
    // The strip's projections onto the rows its tokens reach, by the same products as the
    // strip and tile projections of the unsaved programs (so the same bits), then each token's
    // own rows.
    auto save = [&](int src, int tab, int dst, bool with_bias, bool query) {
        Expr lo = b.let(query ? p.q_lo(i0) : p.k_lo(i0 + rows - 1), "lo");
        Expr hi = b.let(query ? p.row(i0 + rows - 1) : p.row(n - 1 - i0), "hi");
        p.stage_t(XsT, src, i0, rows, s.D);
        p.project(PT, XsT, tab, lo, hi - lo + 1, with_bias);
        b.loop(
            0, rows,
            [&](Expr g) {
                Expr i = b.let(i0 + g, "i");
                Expr first = b.let(query ? p.q_lo(i) : p.k_lo(i), "first");
                Expr last = query ? p.row(i) : p.row(n - 1 - i);
                b.loop(0, last - first + 1, [&](Expr w) {
                    b.store(dst, p.saved_at(i, first + w, first),
                            b.load(PT, (first + w - lo) * J + g));
                });
            },
            Loop::threads);
    };
    if (s.aq) save(p.q, p.eq, p.zqs, s.bias, true);
    if (s.ak) save(p.k, p.ek, p.zks, false, false);
    return b.finish();
}

kir::Kernel relpos_table_reduce_program() {
    Builder b("relpos_table_reduce");
    Expr H = b.param("H"), U = b.param("U"), parts = b.param("parts"), WP = b.param("WP"),
         width = b.param("width");
    const int part = b.buffer("part", kir::Elem::f32), range = b.buffer("range", kir::Elem::i64),
              out = b.buffer("out", kir::Elem::f32);
    const std::int64_t R = relpos_reduce_rows;
    Expr blocks = b.let(kir::ceil_div(U, Expr(R)), "blocks");
    Expr h = b.let(b.pid() / blocks, "h"), u0 = b.let(b.pid() % blocks * R, "u0");
    // Row u0 + r of the instance's R, one per thread on the GPU; its width in order (so the
    // CPU vectorises it).
    auto over_rows = [&](const std::function<void(Expr)>& body) {
        b.loop(
            0, Expr(R),
            [&](Expr r) {
                Expr u = b.let(u0 + r, "u");
                b.when(u < U, [&] { body(u); });
            },
            Loop::threads);
    };
    over_rows([&](Expr u) {
        b.loop(0, width, [&](Expr x) { b.store(out, (h * U + u) * width + x, 0.0); });
    });
    b.loop(0, parts, [&](Expr t) {
        Expr lo = b.let(b.load(range, t * 2), "lo"), count = b.let(b.load(range, t * 2 + 1));
        over_rows([&](Expr u) {
            b.when(u >= lo && u < lo + count, [&] {
                Expr from = b.let(((t * H + h) * WP + u - lo) * width, "from");
                b.loop(0, width, [&](Expr x) {
                    b.add_to(out, (h * U + u) * width + x, b.load(part, from + x));
                });
            });
        });
    });
    return b.finish();
}

RelposFlops relpos_executed_flops(const RelposShape& s, const std::vector<std::int64_t>& lengths,
                                  std::int64_t H, std::int64_t Delta) {
    // The tensor-core programs project per tile pair (project_tile): another schedule.
    if (s.tensor_cores) fail("internal: relpos_executed_flops counts the host's programs");
    const std::int64_t J = RelposShape::J, G = J; // the strip G is J (relpos_setup)
    const double D = double(s.D), Dv = double(s.Dv);
    const bool pq = s.aq && !s.saved, pk = s.ak && !s.saved;
    const bool one_pass = relpos_one_pass_backward(s); // the host's backward (relpos_backward)
    auto row = [&](std::int64_t d) { return std::clamp(d, -Delta, Delta) + Delta; };
    auto pad = [](std::int64_t r) { return double((r + block - 1) / block * block); };
    // products() over `rows` rows, J columns and `width` deep; a projection onto `rows` rows.
    auto prod = [&](std::int64_t rows, double width) { return 2 * pad(rows) * double(J) * width; };
    RelposFlops f;
    for (std::int64_t n : lengths) {
        double fw = 0, bw = 0;
        // Forward (and the projection program): per strip of queries, per key tile.
        for (std::int64_t i0 = 0; i0 < n; i0 += G) {
            const std::int64_t rows = std::min(G, n - i0);
            const std::int64_t qlo = row(s.causal ? 0 : i0 - n + 1);
            const std::int64_t wq = row(i0 + rows - 1) - qlo + 1;
            if (pq) fw += prod(wq, D);
            if (s.saved && s.aq) fw += prod(wq, D);
            if (s.saved && s.ak) {
                const std::int64_t lo = row(s.causal ? 0 : -(i0 + rows - 1));
                fw += prod(row(n - 1 - i0) - lo + 1, D);
            }
            const std::int64_t kend = s.causal ? std::min(n, i0 + rows) : n;
            for (std::int64_t j0 = 0; j0 < kend; j0 += J) {
                const std::int64_t cols = std::min(J, kend - j0);
                const std::int64_t klo = row(i0 - (j0 + cols - 1)), khi = row(i0 + rows - 1 - j0);
                if (pk) fw += prod(khi - klo + 1, D);
                fw += prod(rows, D) + 2.0 * double(rows * cols) * Dv;
            }
        }
        // Query pass: per strip of queries, per key tile; then the strip's relation folds.
        for (std::int64_t i0 = 0; i0 < n; i0 += G) {
            const std::int64_t rows = std::min(G, n - i0);
            const std::int64_t qlo = row(s.causal ? 0 : i0 - n + 1);
            const std::int64_t wq = row(i0 + rows - 1) - qlo + 1;
            if (pq) bw += prod(wq, D);
            const std::int64_t kend = s.causal ? std::min(n, i0 + rows) : n;
            for (std::int64_t j0 = 0; j0 < kend; j0 += J) {
                const std::int64_t cols = std::min(J, kend - j0);
                const std::int64_t klo = row(i0 - (j0 + cols - 1)), khi = row(i0 + rows - 1 - j0);
                if (pk) bw += prod(khi - klo + 1, D);
                bw += prod(cols, D) + prod(cols, Dv) + 2.0 * double(rows * cols) * D;
                if (one_pass) bw += 2.0 * double(rows * cols) * (Dv + D); // dV, dK in place
                if (one_pass && s.ak) bw += 2 * 2.0 * double(cols * (khi - klo + 1)) * D; // dZK
            }
            if (s.aq) bw += 2 * 2.0 * double(rows * wq) * D; // fold_rows, add_partial
        }
        // Key pass: per strip of keys, per query tile; then the strip's relation folds.
        for (std::int64_t j0 = 0; j0 < n && !one_pass; j0 += G) {
            const std::int64_t cols = std::min(G, n - j0);
            const std::int64_t klo = row(s.causal ? 0 : -(j0 + cols - 1));
            const std::int64_t wk = row(n - 1 - j0) - klo + 1;
            if (pk) bw += prod(wk, D);
            for (std::int64_t i0 = s.causal ? j0 : 0; i0 < n; i0 += J) {
                const std::int64_t rows = std::min(J, n - i0);
                const std::int64_t qlo = row(i0 - (j0 + cols - 1)), qhi = row(i0 + rows - 1 - j0);
                if (pq) bw += prod(qhi - qlo + 1, D);
                bw += prod(rows, D) + prod(rows, Dv) + 2.0 * double(rows * cols) * (Dv + D);
            }
            if (s.ak) bw += 2 * 2.0 * double(cols * wk) * D;
        }
        f.forward += fw * double(H);
        f.backward += bw * double(H);
    }
    return f;
}

} // namespace rag::jit
