#include "jit/biased_attention_programs.hpp"

#include "jit/biased_attention_cpu.hpp"
#include "jit/kir_cpu.hpp"
#include "runtime/error.hpp"

#include <cmath>

namespace rag::jit {
namespace {

using kir::Builder;
using kir::Expr;
using kir::Loop;
using kir::Type;

constexpr std::int64_t Tq = kBiasedRows, Tk = kBiasedKeys;
const double minus_inf = -INFINITY;

// What the three programs share: the buffers in launch order, the entry the instance owns and
// the arithmetic of one score.
struct Program {
    Builder b;
    const BiasedShape& s;
    Expr H;
    int q, k, v, bias, work;
    Expr h, qo, ko, vo, oo, bo, N, M, start, lo, R;

    Program(const std::string& name, const BiasedShape& shape) : b(name), s(shape) {
        H = b.param("H");
        q = b.buffer("q", kir::Elem::f32);
        k = b.buffer("k", kir::Elem::f32);
        v = b.buffer("v", kir::Elem::f32);
        bias = b.buffer("bias", kir::Elem::f32);
        work = b.buffer("work", kir::Elem::i64);
    }

    // The backward passes' buffers after the inputs: dO, the forward's O and log-sum-exp, the
    // pass's two outputs; then the scratch both use: a tile's P and dS, the rows' delta.
    struct Backward {
        int dO, out, lse, first, second, p, ds, delta;
    };
    Backward backward(const char* first, const char* second) {
        Backward w{};
        w.dO = b.buffer("dO", kir::Elem::f32);
        w.out = b.buffer("out", kir::Elem::f32);
        w.lse = b.buffer("lse", kir::Elem::f32);
        w.first = b.buffer(first, kir::Elem::f32);
        w.second = b.buffer(second, kir::Elem::f32);
        w.p = b.scratch("p", Expr(Tq * Tk));
        w.ds = b.scratch("ds", Expr(Tq * Tk));
        w.delta = b.scratch("delta", Expr(Tq));
        return w;
    }

    // After the program's own buffers: which entry and head this instance owns.
    void own() {
        Expr e = b.let(b.pid() / H * kBiasedEntry, "entry");
        h = b.let(b.pid() % H, "h");
        Expr* fields[] = {&qo, &ko, &vo, &oo, &bo, &N, &M, &start, &lo, &R};
        const char* names[] = {"qo", "ko", "vo", "oo", "bo", "N", "M", "start", "lo", "R"};
        for (int f = 0; f < int(kBiasedEntry); ++f)
            *fields[f] = b.let(b.load(work, e + f), names[f]);
    }

    // Element offsets of query i's (or key j's) head-h row in a block starting at `base`.
    Expr qk_at(Expr base, Expr row) const { return base + (row * H + h) * s.D; }
    Expr v_at(Expr base, Expr row) const { return base + (row * H + h) * s.Dv; }

    // Whether (i, j) of a tile at (q0, k0) is a score: inside the block, and not past the
    // diagonal when causal.
    Expr valid(Expr i, Expr rows, Expr j, Expr cols, Expr q0, Expr k0) const {
        Expr in = i < rows && j < cols;
        return s.causal ? in && k0 + j <= q0 + i : in;
    }

    // scale q_i . k_j + bias(i, j) for query i and key j of the block (absolute indices).
    Expr score(Expr qb, Expr kb, Expr i, Expr j) {
        const int acc = b.var(Type::f32, 0.0);
        b.loop(0, s.D, [&](Expr d) {
            b.set(acc, b.get(acc) + b.load(q, qk_at(qb, i) + d) * b.load(k, qk_at(kb, j) + d));
        });
        return b.get(acc) * s.scale + b.load(bias, bo + (i * M + j) * H + h);
    }

    // P and dS of a tile from the forward's log-sum-exp: p = exp(score - lse) (0 for a row
    // without keys), dS = p (dO_i . v_j - delta_i).
    void probabilities(int dO, int lse, int p, int ds, int delta, Expr qb, Expr kb, Expr vb,
                       Expr ob, Expr lb, Expr q0, Expr rows, Expr k0, Expr cols) {
        b.loop(
            0, Tq * Tk,
            [&](Expr e) {
                Expr i = b.let(e / Tk, "i"), j = b.let(e % Tk, "j");
                b.when(
                    valid(i, rows, j, cols, q0, k0),
                    [&] {
                        Expr L = b.let(b.load(lse, (lb + q0 + i) * H + h), "L");
                        Expr x = b.let(score(qb, kb, q0 + i, k0 + j), "x");
                        Expr pe = b.let(select(L == Expr(minus_inf), Expr(0.0), exp(x - L)), "p");
                        const int dp = b.var(Type::f32, 0.0);
                        b.loop(0, s.Dv, [&](Expr c) {
                            b.set(dp, b.get(dp) + b.load(dO, v_at(ob, q0 + i) + c) *
                                                      b.load(v, v_at(vb, k0 + j) + c));
                        });
                        b.store(p, e, pe);
                        b.store(ds, e, pe * (b.get(dp) - b.load(delta, i)));
                    },
                    [&] {
                        b.store(p, e, 0.0);
                        b.store(ds, e, 0.0);
                    });
            },
            Loop::threads);
    }

    // delta_i = dO_i . O_i of the tile's queries (0 past the block).
    void deltas(int dO, int out, int delta, Expr ob, Expr q0, Expr rows) {
        b.loop(
            0, Tq,
            [&](Expr i) {
                const int sum = b.var(Type::f32, 0.0);
                b.when(i < rows, [&] {
                    b.loop(0, s.Dv, [&](Expr c) {
                        Expr at = b.let(v_at(ob, q0 + i) + c, "at");
                        b.set(sum, b.get(sum) + b.load(dO, at) * b.load(out, at));
                    });
                });
                b.store(delta, i, b.get(sum));
            },
            Loop::threads);
    }
};

} // namespace

kir::Kernel biased_forward_program(const BiasedShape& s) {
    Program p("biased_attention_forward", s);
    Builder& b = p.b;
    const int out = b.buffer("out", kir::Elem::f32), lse = b.buffer("lse", kir::Elem::f32);
    const int sc = b.scratch("s", Expr(Tq * Tk)), acc = b.scratch("acc", Expr(Tq * s.Dv));
    const int m = b.scratch("m", Expr(Tq)), l = b.scratch("l", Expr(Tq));
    p.own();
    Expr q0 = p.start, rows = b.let(min(Expr(Tq), p.N - q0), "rows");
    b.loop(
        0, Tq,
        [&](Expr i) {
            b.store(m, i, minus_inf);
            b.store(l, i, 0.0);
            b.loop(0, s.Dv, [&](Expr c) { b.store(acc, i * s.Dv + c, 0.0); });
        },
        Loop::threads);
    b.loop(0, ceil_div(p.M, Expr(Tk)), [&](Expr kt) {
        Expr k0 = b.let(kt * Tk, "k0"), cols = b.let(min(Expr(Tk), p.M - k0), "cols");
        b.loop(
            0, Tq * Tk,
            [&](Expr e) {
                Expr i = b.let(e / Tk, "i"), j = b.let(e % Tk, "j");
                b.when(
                    p.valid(i, rows, j, cols, q0, k0),
                    [&] { b.store(sc, e, p.score(p.qo, p.ko, q0 + i, k0 + j)); },
                    [&] { b.store(sc, e, minus_inf); });
            },
            Loop::threads);
        // The online softmax: the row max grows, what was summed under the old one rescales.
        b.loop(
            0, Tq,
            [&](Expr i) {
                const int top = b.var(Type::f32, b.load(m, i));
                b.loop(0, Tk, [&](Expr j) { b.set(top, max(b.get(top), b.load(sc, i * Tk + j))); });
                Expr t = b.let(b.get(top), "top");
                Expr none = b.let(t == Expr(minus_inf), "none"); // no key yet
                Expr keep = b.let(select(none, Expr(1.0), exp(b.load(m, i) - t)), "keep");
                const int sum = b.var(Type::f32, 0.0);
                b.loop(0, Tk, [&](Expr j) {
                    Expr pe = b.let(select(none, Expr(0.0), exp(b.load(sc, i * Tk + j) - t)), "p");
                    b.store(sc, i * Tk + j, pe);
                    b.set(sum, b.get(sum) + pe);
                });
                b.store(l, i, b.load(l, i) * keep + b.get(sum));
                b.store(m, i, t);
                b.loop(0, s.Dv, [&](Expr c) {
                    b.store(acc, i * s.Dv + c, b.load(acc, i * s.Dv + c) * keep);
                });
            },
            Loop::threads);
        b.loop(
            0, Tq * s.Dv,
            [&](Expr e) {
                Expr i = b.let(e / s.Dv, "i"), c = b.let(e % s.Dv, "c");
                const int sum = b.var(Type::f32, b.load(acc, e));
                b.loop(0, cols, [&](Expr j) {
                    b.set(sum, b.get(sum) +
                                   b.load(sc, i * Tk + j) * b.load(p.v, p.v_at(p.vo, k0 + j) + c));
                });
                b.store(acc, e, b.get(sum));
            },
            Loop::threads);
    });
    b.loop(
        0, Tq,
        [&](Expr i) {
            b.when(i < rows, [&] {
                Expr L = b.let(b.load(l, i), "L");
                b.loop(0, s.Dv, [&](Expr c) {
                    b.store(out, p.v_at(p.oo, q0 + i) + c,
                            select(L > Expr(0.0), b.load(acc, i * s.Dv + c) / L, Expr(0.0)));
                });
                b.store(lse, (p.lo + q0 + i) * p.H + p.h,
                        select(L > Expr(0.0), b.load(m, i) + log(L), Expr(minus_inf)));
            });
        },
        Loop::threads);
    return b.finish();
}

kir::Kernel biased_key_grad_program(const BiasedShape& s) {
    Program p("biased_attention_key_grad", s);
    Builder& b = p.b;
    const Program::Backward w = p.backward("dk", "dv");
    const int dO = w.dO, out = w.out, lse = w.lse, dk = w.first, dv = w.second, pr = w.p, ds = w.ds,
              delta = w.delta;
    const int acck = b.scratch("acck", Expr(Tk * s.D)), accv = b.scratch("accv", Expr(Tk * s.Dv));
    p.own();
    Expr k0 = p.start, cols = b.let(min(Expr(Tk), p.M - k0), "cols");
    b.loop(
        0, Tk,
        [&](Expr j) {
            b.loop(0, s.D, [&](Expr d) { b.store(acck, j * s.D + d, 0.0); });
            b.loop(0, s.Dv, [&](Expr c) { b.store(accv, j * s.Dv + c, 0.0); });
        },
        Loop::threads);
    b.loop(0, ceil_div(p.N, Expr(Tq)), [&](Expr qt) {
        Expr q0 = b.let(qt * Tq, "q0"), rows = b.let(min(Expr(Tq), p.N - q0), "rows");
        p.deltas(dO, out, delta, p.oo, q0, rows);
        p.probabilities(dO, lse, pr, ds, delta, p.qo, p.ko, p.vo, p.oo, p.lo, q0, rows, k0, cols);
        b.loop( // dV_j += sum_i P_ij dO_i, dK_j += sum_i dS_ij q_i (scaled at the end)
            0, Tk,
            [&](Expr j) {
                b.loop(0, s.Dv, [&](Expr c) {
                    const int sum = b.var(Type::f32, b.load(accv, j * s.Dv + c));
                    b.loop(0, rows, [&](Expr i) {
                        b.set(sum, b.get(sum) + b.load(pr, i * Tk + j) *
                                                    b.load(dO, p.v_at(p.oo, q0 + i) + c));
                    });
                    b.store(accv, j * s.Dv + c, b.get(sum));
                });
                b.loop(0, s.D, [&](Expr d) {
                    const int sum = b.var(Type::f32, b.load(acck, j * s.D + d));
                    b.loop(0, rows, [&](Expr i) {
                        b.set(sum, b.get(sum) + b.load(ds, i * Tk + j) *
                                                    b.load(p.q, p.qk_at(p.qo, q0 + i) + d));
                    });
                    b.store(acck, j * s.D + d, b.get(sum));
                });
            },
            Loop::threads);
    });
    b.loop(
        0, Tk,
        [&](Expr j) {
            b.when(j < cols, [&] {
                b.loop(0, s.D, [&](Expr d) {
                    b.store(dk, p.qk_at(p.ko, k0 + j) + d, b.load(acck, j * s.D + d) * s.scale);
                });
                b.loop(0, s.Dv, [&](Expr c) {
                    b.store(dv, p.v_at(p.vo, k0 + j) + c, b.load(accv, j * s.Dv + c));
                });
            });
        },
        Loop::threads);
    return b.finish();
}

kir::Kernel biased_query_grad_program(const BiasedShape& s) {
    Program p("biased_attention_query_grad", s);
    Builder& b = p.b;
    const Program::Backward w = p.backward("dq", "dbias");
    const int dO = w.dO, out = w.out, lse = w.lse, dq = w.first, dbias = w.second, pr = w.p,
              ds = w.ds, delta = w.delta;
    const int accq = b.scratch("accq", Expr(Tq * s.D));
    p.own();
    Expr q0 = p.start, rows = b.let(min(Expr(Tq), p.N - q0), "rows");
    // The sample's row blocks in order: dbias of these queries sums over them here alone.
    b.loop(0, p.R, [&](Expr r) {
        Expr qb = b.let(p.qo + r * p.N * p.H * s.D, "qb");
        Expr kb = b.let(p.ko + r * p.M * p.H * s.D, "kb");
        Expr vb = b.let(p.vo + r * p.M * p.H * s.Dv, "vb");
        Expr ob = b.let(p.oo + r * p.N * p.H * s.Dv, "ob");
        Expr lb = b.let(p.lo + r * p.N, "lb");
        b.loop(
            0, Tq * s.D, [&](Expr e) { b.store(accq, e, 0.0); }, Loop::threads);
        p.deltas(dO, out, delta, ob, q0, rows);
        b.loop(0, ceil_div(p.M, Expr(Tk)), [&](Expr kt) {
            Expr k0 = b.let(kt * Tk, "k0"), cols = b.let(min(Expr(Tk), p.M - k0), "cols");
            p.probabilities(dO, lse, pr, ds, delta, qb, kb, vb, ob, lb, q0, rows, k0, cols);
            b.loop(
                0, Tq * Tk,
                [&](Expr e) {
                    Expr i = b.let(e / Tk, "i"), j = b.let(e % Tk, "j");
                    b.when(p.valid(i, rows, j, cols, q0, k0), [&] {
                        b.add_to(dbias, p.bo + ((q0 + i) * p.M + k0 + j) * p.H + p.h,
                                 b.load(ds, e));
                    });
                },
                Loop::threads);
            b.loop(
                0, Tq * s.D,
                [&](Expr e) {
                    Expr i = b.let(e / s.D, "i"), d = b.let(e % s.D, "d");
                    const int sum = b.var(Type::f32, b.load(accq, e));
                    b.loop(0, cols, [&](Expr j) {
                        b.set(sum, b.get(sum) + b.load(ds, i * Tk + j) *
                                                    b.load(p.k, p.qk_at(kb, k0 + j) + d));
                    });
                    b.store(accq, e, b.get(sum));
                },
                Loop::threads);
        });
        b.loop(
            0, Tq * s.D,
            [&](Expr e) {
                Expr i = b.let(e / s.D, "i"), d = b.let(e % s.D, "d");
                b.when(i < rows,
                       [&] { b.store(dq, p.qk_at(qb, q0 + i) + d, b.load(accq, e) * s.scale); });
            },
            Loop::threads);
    });
    return b.finish();
}

BiasedWork biased_work(std::span<const RaggedTensor> in, const Attrs& at) {
    const RaggedTensor &q = in[0], &k = in[1], &v = in[2], &bias = in[3];
    const int axis = int(at.get_int("axis", 1));
    BiasedWork w;
    const auto& qa = q.shape().axes;
    w.H = qa[qa.size() - 2].extent;
    w.shape.D = qa.back().extent;
    w.shape.Dv = v.shape().axes.back().extent;
    w.shape.causal = at.get_bool("causal", false);
    w.shape.scale = at.get_float("scale", 1.0 / std::sqrt(double(w.shape.D)));
    const std::int64_t D = w.shape.D, Dv = w.shape.Dv, H = w.H;
    w.tokens = D > 0 && H > 0 ? q.numel() / (H * D) : 0;
    Shape oshape = q.shape();
    oshape.axes.back() = Axis::fixed_of(Dv);
    w.out = biased_out_structure(q, oshape, Dv);
    for (std::int64_t i = 0; i < q.batch(); ++i) {
        const std::int64_t N = q.structure().size(i, axis - 1), M = k.structure().size(i, axis - 1);
        const std::int64_t R = axis == 2 ? q.structure().size(i, 0) : 1;
        const std::int64_t q0 = q.structure().sample_begin(i), k0 = k.structure().sample_begin(i);
        const std::int64_t qtok = q0 / (H * D), ktok = k0 / (H * D);
        auto entry = [&](std::vector<std::int64_t>& list, std::int64_t r, std::int64_t start,
                         std::int64_t rows) {
            list.insert(list.end(),
                        {(qtok + r * N) * H * D, (ktok + r * M) * H * D, (ktok + r * M) * H * Dv,
                         (qtok + r * N) * H * Dv, bias.structure().sample_begin(i), N, M, start,
                         qtok + r * N, rows});
        };
        if (N == 0) continue;
        for (std::int64_t t = 0; t < N; t += kBiasedRows) entry(w.queries, 0, t, R);
        for (std::int64_t r = 0; r < R; ++r) {
            for (std::int64_t t = 0; t < N; t += kBiasedRows) entry(w.forward, r, t, 1);
            for (std::int64_t t = 0; t < M; t += kBiasedKeys) entry(w.keys, r, t, 1);
        }
    }
    return w;
}

std::vector<RaggedTensor> biased_attention_programs_cpu(std::span<const RaggedTensor> in,
                                                        const Attrs& at, const RaggedTensor* dO) {
    for (const RaggedTensor& t : in)
        if (t.dtype() != DType::f32) fail("internal: the biased attention programs take f32");
    const BiasedWork w = biased_work(in, at);
    auto ptr = [](const RaggedTensor& t) { return const_cast<void*>(t.data()); };
    std::vector<float> lse(std::size_t(std::max<std::int64_t>(w.tokens * w.H, 1)));
    RaggedTensor out = RaggedTensor::zeros(DType::f32, w.out);
    std::vector<std::int64_t> fwd = w.forward, keys = w.keys, queries = w.queries;
    const std::int64_t params[] = {w.H};
    void* fbufs[] = {ptr(in[0]), ptr(in[1]),         ptr(in[2]), ptr(in[3]),
                     fwd.data(), out.mutable_data(), lse.data()};
    compile_kernel_cpu(biased_forward_program(w.shape))->launch(w.grid(fwd), fbufs, params);
    if (!dO) return {out};
    std::vector<RaggedTensor> g;
    for (int t = 0; t < 4; ++t)
        g.push_back(RaggedTensor::zeros(DType::f32, in[std::size_t(t)].structure_ptr()));
    void* kbufs[] = {ptr(in[0]),          ptr(in[1]),         ptr(in[2]),         ptr(in[3]),
                     keys.data(),         ptr(*dO),           out.mutable_data(), lse.data(),
                     g[1].mutable_data(), g[2].mutable_data()};
    compile_kernel_cpu(biased_key_grad_program(w.shape))->launch(w.grid(keys), kbufs, params);
    void* qbufs[] = {ptr(in[0]),          ptr(in[1]),         ptr(in[2]),         ptr(in[3]),
                     queries.data(),      ptr(*dO),           out.mutable_data(), lse.data(),
                     g[0].mutable_data(), g[3].mutable_data()};
    compile_kernel_cpu(biased_query_grad_program(w.shape))->launch(w.grid(queries), qbufs, params);
    return g;
}

} // namespace rag::jit
