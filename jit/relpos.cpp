// Host side of fused relative-position attention: expands the map and tables, lists the
// strips, sizes the workspaces, and launches the tile programs of jit/relpos_programs.hpp
// (compiled once per shape and cached). Table gradients are summed from per-strip partials in
// a fixed order, then folded from expanded rows back into buckets, also in a fixed order.
#include "jit/relpos.hpp"

#include "ir/ops/relpos_config.hpp"
#include "jit/kir_cpu.hpp"
#include "jit/relpos_programs.hpp"
#include "runtime/error.hpp"

#include <map>
#include <mutex>

namespace rag::jit {
namespace {

constexpr const char* op_name = "relpos_attention";

enum class Pass { forward, query_grad, key_grad, reduce };

const CpuKernel& kernel(Pass pass, const RelposShape& s) {
    static std::mutex mu;
    static std::map<std::string, std::unique_ptr<CpuKernel>> cache;
    std::string key = std::to_string(int(pass));
    if (pass != Pass::reduce)
        key += "/" + std::string(dtype_name(s.dtype)) + "/" + std::to_string(s.D) + "/" +
               std::to_string(s.Dv) + "/" + std::to_string(s.aq) + std::to_string(s.ak) +
               std::to_string(s.bias) + std::to_string(s.causal) + "/" + std::to_string(s.scale);
    std::lock_guard<std::mutex> lock(mu);
    auto& k = cache[key];
    if (!k) {
        switch (pass) {
        case Pass::forward:
            k = compile_kernel_cpu(relpos_forward_program(s));
            break;
        case Pass::query_grad:
            k = compile_kernel_cpu(relpos_query_grad_program(s));
            break;
        case Pass::key_grad:
            k = compile_kernel_cpu(relpos_key_grad_program(s));
            break;
        case Pass::reduce:
            k = compile_kernel_cpu(relpos_table_reduce_program());
            break;
        }
    }
    return *k;
}

// f32 workspace counted by rag::memory (it is a Buffer).
struct Floats {
    Buffer buf;
    explicit Floats(std::size_t n) : buf(Buffer::allocate(std::max<std::size_t>(n, 1) * 4)) {}
    float* data() { return reinterpret_cast<float*>(buf.data.get()); }
};

// Everything the programs need that the inputs fix.
struct Setup {
    RelposConfig cfg;
    RelposShape shape;
    std::int64_t H, Delta, U, G, W, WP, tokens;
    std::vector<std::int64_t> rows_of; // expanded row u -> map row
    std::vector<std::int64_t> tiles;   // (offset, length, start) per strip of G tokens
    std::vector<std::int64_t> samples; // (offset, length, 0) per sample with tokens
    Floats eq{1}, ek{1}, eb{1};
    std::int64_t strips() const { return std::int64_t(tiles.size() / 3); }
    std::int64_t nonempty() const { return std::int64_t(samples.size() / 3); }
    std::vector<std::int64_t> params() const { return {H, Delta, U, G, W, WP}; }
};

// A table's head-major expansion [H][U][width] from its [R, H, width] storage.
Floats expand(const RaggedTensor& t, const Setup& s, std::int64_t width) {
    Floats out(std::size_t(s.H * s.U * width));
    const std::vector<double> vals = t.to_f64();
    for (std::int64_t h = 0; h < s.H; ++h)
        for (std::int64_t u = 0; u < s.U; ++u)
            for (std::int64_t x = 0; x < width; ++x)
                out.data()[(h * s.U + u) * width + x] =
                    float(vals[std::size_t((s.rows_of[std::size_t(u)] * s.H + h) * width + x)]);
    return out;
}

std::unique_ptr<Setup> setup(std::span<const RaggedTensor> in, const Attrs& at, bool with_dO) {
    auto s = std::make_unique<Setup>(
        Setup{relpos_check(in, at, op_name, with_dO), {}, 0, 0, 0, 0, 0, 0, 0, {}, {}, {}});
    const RelposConfig& c = s->cfg;
    const RaggedTensor& q = in[0];
    s->H = q.shape().axes[1].extent;
    s->shape = {q.dtype(),
                q.shape().axes[2].extent,
                in[2].shape().axes[2].extent,
                c.has[AQ],
                c.has[AK],
                c.has[BIAS],
                c.causal,
                c.scale};
    s->Delta = c.map.saturation();
    s->U = 2 * s->Delta + 1;
    s->rows_of = c.map.expand(s->Delta);
    std::int64_t longest = 0;
    for (std::int64_t b = 0; b < q.batch(); ++b)
        longest = std::max(longest, q.structure().size(b, 0));
    // Strips of G tokens reach at most W expanded rows; a whole sample reaches WP.
    s->G = 64;
    s->W = std::min(longest + s->G - 1, s->U);
    s->WP = std::max<std::int64_t>(std::min(2 * longest - 1, s->U), 1);
    for (std::int64_t b = 0; b < q.batch(); ++b) {
        const std::int64_t n = q.structure().size(b, 0),
                           o = q.structure().offsets()[std::size_t(b)];
        for (std::int64_t start = 0; start < n; start += s->G)
            s->tiles.insert(s->tiles.end(), {o, n, start});
        if (n > 0) s->samples.insert(s->samples.end(), {o, n, 0});
    }
    s->tokens = q.structure().rows();
    if (c.has[AQ]) s->eq = expand(in[std::size_t(c.table_at[AQ])], *s, s->shape.D);
    if (c.has[AK]) s->ek = expand(in[std::size_t(c.table_at[AK])], *s, s->shape.D);
    if (c.has[BIAS]) s->eb = expand(in[std::size_t(c.table_at[BIAS])], *s, 1);
    return s;
}

void* ptr(const RaggedTensor& t) {
    return const_cast<void*>(t.data());
}

RelposForward run_forward(std::span<const RaggedTensor> in, Setup& s) {
    RelposForward f;
    f.out = RaggedTensor::zeros(in[0].dtype(), in[2].structure_ptr());
    f.lse = Buffer::allocate(std::size_t(std::max<std::int64_t>(s.tokens * s.H, 1)) * 4);
    if (s.tiles.empty()) return f;
    void* bufs[] = {ptr(in[0]),  ptr(in[1]),     ptr(in[2]),           s.eq.data(),     s.ek.data(),
                    s.eb.data(), s.tiles.data(), f.out.mutable_data(), f.lse.data.get()};
    kernel(Pass::forward, s.shape).launch(s.strips() * s.H, bufs, s.params());
    return f;
}

// Sums per-sample partials [sample][H][WP][width] into [H][U][width], then folds expanded rows back
// into the map's rows: out[(row * H + h) * width + x], as f64 for the table's dtype.
std::vector<double> table_grad(Floats& part, std::vector<std::int64_t>& range, const Setup& s,
                               std::int64_t width) {
    Floats expanded(std::size_t(s.H * s.U * width));
    void* bufs[] = {part.data(), range.data(), expanded.data()};
    const std::int64_t params[] = {s.H, s.U, s.nonempty(), s.WP, width};
    kernel(Pass::reduce, s.shape).launch(s.H * s.U, bufs, params);
    const std::int64_t R = s.cfg.map.rows();
    std::vector<double> out(std::size_t(R * s.H * width), 0.0);
    for (std::int64_t u = 0; u < s.U; ++u)
        for (std::int64_t h = 0; h < s.H; ++h)
            for (std::int64_t x = 0; x < width; ++x)
                out[std::size_t((s.rows_of[std::size_t(u)] * s.H + h) * width + x)] +=
                    double(expanded.data()[(h * s.U + u) * width + x]);
    return out;
}

} // namespace

RelposForward relpos_forward(std::span<const RaggedTensor> in, const Attrs& at) {
    auto s = setup(in, at, false);
    return run_forward(in, *s);
}

std::vector<RaggedTensor> relpos_backward(std::span<const RaggedTensor> in, const RaggedTensor& dO,
                                          const Attrs& at, const RelposForward* fwd) {
    std::vector<RaggedTensor> with_dO(in.begin(), in.end());
    with_dO.push_back(dO);
    auto s = setup(with_dO, at, true);
    if (dO.dtype() != in[0].dtype())
        fail(op_name, ": dO must be ", dtype_name(in[0].dtype()), " like q, got ",
             dtype_name(dO.dtype()));
    RelposForward again;
    if (!fwd) {
        again = run_forward(in, *s);
        fwd = &again;
    }
    const RelposShape& sh = s->shape;
    std::vector<RaggedTensor> g;
    for (int t = 0; t < 3; ++t)
        g.push_back(RaggedTensor::zeros(in[0].dtype(), in[std::size_t(t)].structure_ptr()));
    if (!s->tiles.empty()) {
        // One instance per sample and head in the backward passes: their table partials are
        // one per sample (not per strip), so they stay O(tokens) for every map.
        const std::size_t parts = std::size_t(s->nonempty() * s->H * s->WP);
        Floats delta(std::size_t(s->tokens * s->H));
        Floats zq(sh.aq ? parts * std::size_t(sh.D) : 1), zb(sh.bias ? parts : 1);
        Floats zk(sh.ak ? parts * std::size_t(sh.D) : 1);
        std::vector<std::int64_t> qrange(std::size_t(2 * s->nonempty())), krange(qrange.size());
        void* qbufs[] = {ptr(in[0]),    ptr(in[1]),          ptr(in[2]),          s->eq.data(),
                         s->ek.data(),  s->eb.data(),        s->samples.data(),   ptr(dO),
                         ptr(fwd->out), fwd->lse.data.get(), g[0].mutable_data(), delta.data(),
                         zq.data(),     zb.data(),           qrange.data()};
        kernel(Pass::query_grad, sh).launch(s->nonempty() * s->H, qbufs, s->params());
        void* kbufs[] = {
            ptr(in[0]),          ptr(in[1]),          ptr(in[2]), s->eq.data(),        s->ek.data(),
            s->eb.data(),        s->samples.data(),   ptr(dO),    fwd->lse.data.get(), delta.data(),
            g[1].mutable_data(), g[2].mutable_data(), zk.data(),  krange.data()};
        kernel(Pass::key_grad, sh).launch(s->nonempty() * s->H, kbufs, s->params());
        Floats* partial[] = {&zq, &zk, &zb};
        std::vector<std::int64_t>* ranges[] = {&qrange, &krange, &qrange};
        for (int t : {AQ, AK, BIAS}) {
            if (!s->cfg.has[t]) continue;
            const RaggedTensor& table = in[std::size_t(s->cfg.table_at[t])];
            g.push_back(RaggedTensor::from_f64(
                table.dtype(), table.structure_ptr(),
                table_grad(*partial[t], *ranges[t], *s, t == BIAS ? 1 : sh.D)));
        }
    } else {
        for (int t : {AQ, AK, BIAS})
            if (s->cfg.has[t]) {
                const RaggedTensor& table = in[std::size_t(s->cfg.table_at[t])];
                g.push_back(RaggedTensor::zeros(table.dtype(), table.structure_ptr()));
            }
    }
    return g;
}

} // namespace rag::jit
