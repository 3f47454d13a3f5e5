#include "jit/layout_programs.hpp"

#include "ir/ops/kernel_util.hpp"
#include "jit/layout.hpp"
#include "runtime/error.hpp"

namespace rag::jit {

using kir::Expr;

kir::Kernel transpose_program(DType t) {
    const kir::Elem e = kir::elem_of(t);
    kir::Builder b("transpose_" + std::string(dtype_name(t)));
    Expr total = b.param("total"), ea = b.param("ea"), mid = b.param("mid"), eb = b.param("eb"),
         inner = b.param("inner");
    const int x = b.buffer("x", e), out = b.buffer("out", e);
    Expr e0 = b.let(b.pid() * kTransposeChunk, "e0");
    b.loop(
        e0, min(total, e0 + kTransposeChunk),
        [&](Expr at) {
            // at = (((o eb + j) mid + m) ea + i) inner + w, read from (((o ea + i) mid + m) eb
            // + j) inner + w.
            Expr w = b.let(at % inner, "w"), r = b.let(at / inner, "r");
            Expr i = b.let(r % ea, "i"), r2 = b.let(r / ea, "r2");
            Expr m = b.let(r2 % mid, "m"), r3 = b.let(r2 / mid, "r3");
            Expr j = b.let(r3 % eb, "j"), o = b.let(r3 / eb, "o");
            b.store(out, at, b.load(x, (((o * ea + i) * mid + m) * eb + j) * inner + w));
        },
        kir::Loop::threads);
    return b.finish();
}

std::optional<TransposeJob> transpose_job(const ir::Node& n, const RaggedTensor& x) {
    const DType t = n.type.dtype;
    if (n.op != "transpose" || (t != DType::f32 && t != DType::f16 && t != DType::bf16))
        return std::nullopt;
    int a = kern::sample_axis(x.shape(), n.attrs.get_int("a"), "transpose");
    int b = kern::sample_axis(x.shape(), n.attrs.get_int("b"), "transpose");
    if (a > b) std::swap(a, b);
    const auto& axes = x.shape().axes;
    for (std::size_t k = std::size_t(a); k < axes.size(); ++k)
        if (axes[k].kind != AxisKind::fixed) return std::nullopt;
    TransposeJob job;
    job.total = x.numel();
    job.ea = axes[std::size_t(a)].extent;
    job.eb = axes[std::size_t(b)].extent;
    for (int k = a + 1; k < b; ++k) job.mid *= axes[std::size_t(k)].extent;
    for (std::size_t k = std::size_t(b) + 1; k < axes.size(); ++k) job.inner *= axes[k].extent;
    // With at most one of ea, mid, eb above 1 no element moves: a view (jit/layout.hpp), free.
    if ((job.ea > 1) + (job.mid > 1) + (job.eb > 1) <= 1) return std::nullopt;
    job.out = transposed_structure(x, n.type.shape, a, b);
    return job;
}

} // namespace rag::jit
