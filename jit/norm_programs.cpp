#include "jit/norm_programs.hpp"

#include "runtime/error.hpp"

namespace rag::jit {

using kir::Expr;
using kir::Loop;
using kir::Type;

namespace {

kir::Elem elem(DType t) {
    if (t == DType::f16) return kir::Elem::f16;
    if (t == DType::bf16) return kir::Elem::bf16;
    if (t == DType::f32) return kir::Elem::f32;
    fail("internal: the norm programs take f32, f16 or bf16, not ", dtype_name(t));
}

// Row r's statistics: the mean (layernorm; 0 for rmsnorm) and 1 / sqrt(variance + eps), or
// 1 / sqrt(mean(x^2) + eps) for rmsnorm, summed in feature order.
struct Stats {
    Expr mean, rstd;
};
Stats row_stats(kir::Builder& b, int x, Expr base, Expr C, bool layer, double eps) {
    Expr n = b.let(to_f32(C), "n");
    Expr mean = Expr(0.0);
    if (layer) {
        int sum = b.var(Type::f32, 0.0);
        b.loop(0, C, [&](Expr c) { b.set(sum, b.get(sum) + b.load(x, base + c)); });
        mean = b.let(b.get(sum) / n, "mean");
    }
    int sq = b.var(Type::f32, 0.0);
    b.loop(0, C, [&](Expr c) {
        Expr d = b.let(b.load(x, base + c) - mean, "d");
        b.set(sq, b.get(sq) + d * d);
    });
    return {mean, b.let(Expr(1.0) / sqrt(b.get(sq) / n + eps), "rstd")};
}

} // namespace

kir::Kernel norm_program(NormOp op, DType t, double eps) {
    static const char* names[] = {"layernorm", "rmsnorm", "layernorm_grad", "rmsnorm_grad"};
    const bool layer = op == NormOp::layernorm || op == NormOp::layernorm_grad;
    const bool grad = op == NormOp::layernorm_grad || op == NormOp::rmsnorm_grad;
    const kir::Elem e = elem(t);
    kir::Builder b(std::string(names[int(op)]) + "_" + std::string(dtype_name(t)));
    Expr R = b.param("R"), C = b.param("C");
    const int x = b.buffer("x", e), g = b.buffer("g", e);
    const int bias = !grad && layer ? b.buffer("b", e) : -1;
    const int dy = grad ? b.buffer("dy", e) : -1;
    const int out = b.buffer(grad ? "dx" : "y", e);
    const int dg_part = grad ? b.buffer("dg_part", kir::Elem::f32) : -1;
    const int db_part = grad && layer ? b.buffer("db_part", kir::Elem::f32) : -1;
    const int mean_s = b.scratch("mean", Expr(kNormRows)),
              rstd_s = b.scratch("rstd", Expr(kNormRows));
    Expr r0 = b.let(b.pid() * kNormRows, "r0");
    Expr rows = b.let(min(Expr(kNormRows), R - r0), "rows");
    b.loop(
        0, rows,
        [&](Expr k) {
            Expr base = b.let((r0 + k) * C, "base");
            Stats st = row_stats(b, x, base, C, layer, eps);
            b.store(mean_s, k, st.mean);
            b.store(rstd_s, k, st.rstd);
            if (!grad) {
                b.loop(0, C, [&](Expr c) {
                    Expr y = (b.load(x, base + c) - st.mean) * st.rstd * b.load(g, c);
                    b.store(out, base + c, bias >= 0 ? y + b.load(bias, c) : y);
                });
                return;
            }
            // layernorm: dx = rstd (dxh - mean(dxh) - xh mean(dxh xh)), dxh = dy g;
            // rmsnorm:   dx = rstd dy g - x rstd^3 mean(dy g x).
            int m1 = b.var(Type::f32, 0.0), m2 = b.var(Type::f32, 0.0);
            b.loop(0, C, [&](Expr c) {
                Expr xh = b.let((b.load(x, base + c) - st.mean) * st.rstd, "xh");
                Expr dxh = b.let(b.load(dy, base + c) * b.load(g, c), "dxh");
                b.set(m1, b.get(m1) + dxh);
                b.set(m2, b.get(m2) + dxh * xh);
            });
            Expr n = to_f32(C);
            Expr a1 = b.let(b.get(m1) / n, "a1"), a2 = b.let(b.get(m2) / n, "a2");
            b.loop(0, C, [&](Expr c) {
                Expr xh = b.let((b.load(x, base + c) - st.mean) * st.rstd, "xh");
                Expr dxh = b.let(b.load(dy, base + c) * b.load(g, c), "dxh");
                b.store(out, base + c,
                        layer ? st.rstd * (dxh - a1 - xh * a2) : st.rstd * (dxh - xh * a2));
            });
        },
        Loop::threads);
    if (grad) // this instance's share of dg (and db): its rows, in order, per feature
        b.loop(
            0, C,
            [&](Expr c) {
                int dg = b.var(Type::f32, 0.0), db = b.var(Type::f32, 0.0);
                b.loop(0, rows, [&](Expr k) {
                    Expr at = b.let((r0 + k) * C + c, "at");
                    Expr d = b.let(b.load(dy, at), "d");
                    b.set(dg,
                          b.get(dg) + d * (b.load(x, at) - b.load(mean_s, k)) * b.load(rstd_s, k));
                    b.set(db, b.get(db) + d);
                });
                b.store(dg_part, b.pid() * C + c, b.get(dg));
                if (db_part >= 0) b.store(db_part, b.pid() * C + c, b.get(db));
            },
            Loop::threads);
    return b.finish();
}

kir::Kernel column_sums_program(DType t) {
    kir::Builder b("column_sums_" + std::string(dtype_name(t)));
    Expr P = b.param("P"), C = b.param("C");
    const int part = b.buffer("part", kir::Elem::f32), out = b.buffer("out", elem(t));
    Expr c0 = b.let(b.pid() * kSumColumns, "c0");
    b.loop(
        c0, min(C, c0 + kSumColumns),
        [&](Expr c) {
            int sum = b.var(Type::f32, 0.0);
            b.loop(0, P, [&](Expr p) { b.set(sum, b.get(sum) + b.load(part, p * C + c)); });
            b.store(out, c, b.get(sum));
        },
        Loop::threads);
    return b.finish();
}

kir::Kernel row_sums_program(DType t) {
    kir::Builder b("row_sums_" + std::string(dtype_name(t)));
    Expr R = b.param("R"), C = b.param("C");
    const int x = b.buffer("x", elem(t)), part = b.buffer("part", kir::Elem::f32);
    Expr r0 = b.let(b.pid() * kSumRows, "r0");
    Expr r1 = b.let(min(R, r0 + kSumRows), "r1");
    b.loop(
        0, C,
        [&](Expr c) {
            int sum = b.var(Type::f32, 0.0);
            b.loop(r0, r1, [&](Expr r) { b.set(sum, b.get(sum) + b.load(x, r * C + c)); });
            b.store(part, b.pid() * C + c, b.get(sum));
        },
        Loop::threads);
    return b.finish();
}

std::optional<NormJob> norm_job(const ir::Function& f, int i, const std::vector<int>& also,
                                const std::vector<RaggedTensor>& vals) {
    const ir::Node& n = f.nodes[std::size_t(i)];
    const DType t = n.type.dtype;
    if (t != DType::f32 && t != DType::f16 && t != DType::bf16) return std::nullopt;
    NormJob job;
    if (n.op == "layernorm")
        job.op = NormOp::layernorm;
    else if (n.op == "rmsnorm")
        job.op = NormOp::rmsnorm;
    else if (n.op == "layernorm_grad")
        job.op = NormOp::layernorm_grad;
    else if (n.op == "rmsnorm_grad")
        job.op = NormOp::rmsnorm_grad;
    else
        return std::nullopt;
    const bool layer = job.op == NormOp::layernorm || job.op == NormOp::layernorm_grad;
    const bool grad = job.op == NormOp::layernorm_grad || job.op == NormOp::rmsnorm_grad;
    job.dtype = t;
    job.eps = n.attrs.get_float("eps", layer ? 1e-5 : 1e-6);
    // layernorm(x, g, b), rmsnorm(x, g), layernorm_grad(x, g, b, dy), rmsnorm_grad(x, g, dy).
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    job.inputs = {x, vals[std::size_t(n.args[1])]};
    if (!grad && layer) job.inputs.push_back(vals[std::size_t(n.args[2])]);
    if (grad) {
        const RaggedTensor& dy = vals[std::size_t(n.args.back())];
        if (!dy.structure().same_as(x.structure())) return std::nullopt;
        job.inputs.push_back(dy);
    }
    for (const RaggedTensor& in : job.inputs)
        if (in.dtype() != t) return std::nullopt;
    job.C = x.shape().axes.back().extent;
    job.rows = job.C ? x.numel() / job.C : 0;
    if (grad) {
        job.wants.push_back({i, n.attrs.get_int("wrt")});
        for (int j : also) job.wants.push_back({j, f.nodes[std::size_t(j)].attrs.get_int("wrt")});
    }
    return job;
}

} // namespace rag::jit
