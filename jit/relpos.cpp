// Host side of fused relative-position attention: expands the map and tables, lists the
// strips, sizes the workspaces, and launches the tile programs of jit/relpos_programs.hpp
// (compiled once per shape and cached). Table gradients are summed from per-strip partials in
// a fixed order, then folded from expanded rows back into buckets, also in a fixed order.
#include "jit/relpos.hpp"

#include "ir/ops/relpos_config.hpp"
#include "jit/compile_clock.hpp"
#include "jit/kir_cpu.hpp"
#include "jit/kir_emulator.hpp"
#include "jit/relpos_programs.hpp"
#include "jit/relpos_setup.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/error.hpp"

#include <future>
#include <map>
#include <mutex>

namespace rag::jit {
namespace {

constexpr const char* op_name = "relpos_attention";

enum class Pass { forward, query_grad, key_grad, grad, reduce, project };

using Compile = std::unique_ptr<CpuKernel> (*)(const kir::Kernel&);

std::string key_of(Pass pass, const RelposSetup& setup) {
    const RelposShape& s = setup.shape;
    std::string key = std::string(setup.emulated ? "emulated/" : "") + std::to_string(int(pass));
    if (pass != Pass::reduce)
        key += "/" + std::string(dtype_name(s.dtype)) + "/" + std::to_string(s.D) + "/" +
               std::to_string(s.Dv) + "/" + std::to_string(s.aq) + std::to_string(s.ak) +
               std::to_string(s.bias) + std::to_string(s.causal) + std::to_string(s.saved) +
               std::to_string(s.tensor_cores) + "/" + std::to_string(s.scale);
    return key;
}

// The pass's program for `shape`, compiled for the host, or when `emulated` through the GPU
// lowering for the device emulator (jit/kir_emulator.hpp).
std::shared_ptr<const CpuKernel> build(Pass pass, const RelposShape& s, bool emulated) {
    CompilePhase phase("kernel_ir"); // building the program; LLVM's share is its own phase
    const Compile compile = emulated
                                ? +[](const kir::Kernel& k) { return compile_kernel_emulated(k); }
                                : &compile_kernel_cpu;
    switch (pass) {
    case Pass::forward:
        return compile(emulated ? relpos_forward_program(s) : relpos_host_forward_program(s));
    case Pass::query_grad:
        return compile(relpos_query_grad_program(s));
    case Pass::key_grad:
        return compile(relpos_key_grad_program(s));
    case Pass::grad:
        return compile(relpos_grad_program(s));
    case Pass::reduce:
        return compile(relpos_table_reduce_program());
    case Pass::project:
        break;
    }
    return compile(relpos_project_program(s));
}

// Compiled programs by key_of, once per process: built, being built on a thread of its own,
// or (deferred) built by the first caller that waits for it.
using Built = std::shared_future<std::shared_ptr<const CpuKernel>>;
struct Kernels {
    std::mutex mu;
    std::map<std::string, Built> cache;
    std::size_t started_by_runs = 0;
};
Kernels& kernels() {
    static Kernels k;
    return k;
}

// The pass's program for setup's shape: cached, in flight, or started now (on a thread of its
// own with `background`, else by whoever waits for it first); `by_run`: a run asks, not
// relpos_precompile.
Built start(Pass pass, const RelposSetup& setup, bool background, bool by_run = true) {
    Kernels& ks = kernels();
    std::lock_guard<std::mutex> lock(ks.mu);
    auto [it, fresh] = ks.cache.try_emplace(key_of(pass, setup));
    if (fresh && by_run) ++ks.started_by_runs;
    if (fresh)
        it->second = std::async(background ? std::launch::async : std::launch::deferred, build,
                                pass, setup.shape, setup.emulated)
                         .share();
    return it->second;
}

const CpuKernel& kernel(Pass pass, const RelposSetup& setup) {
    return *start(pass, setup, false).get();
}

// Whether the backward runs in one pass (relpos_grad_program) rather than two: on the host, for
// the shapes it supports, unless a test asks for the two passes.
bool one_pass(const RelposSetup& s, const RelposOptions& opt) {
    return !s.emulated && !opt.two_pass_backward && relpos_one_pass_backward(s.shape);
}

// The programs a backward runs: its pass or passes, and the table reduction when there are
// tables.
std::vector<Pass> backward_passes(const RelposSetup& s, const RelposOptions& opt) {
    std::vector<Pass> passes = {Pass::grad};
    if (!one_pass(s, opt)) passes = {Pass::query_grad, Pass::key_grad};
    if (s.cfg.has[AQ] || s.cfg.has[AK] || s.cfg.has[BIAS]) passes.push_back(Pass::reduce);
    return passes;
}

// Compiles the passes not cached yet on threads of their own, all at once (a first backward
// needs three programs, each taking LLVM a good part of a second; they do not depend on each
// other).
void prepare(const std::vector<Pass>& passes, const RelposSetup& setup) {
    CompilePhase phase("parallel_compile"); // the caller's wait counts as its compile time
    std::vector<Built> built;
    for (Pass p : passes) built.push_back(start(p, setup, true));
    for (const Built& b : built) b.wait();
}

// Splits the two-pass backward's samples into parts (relpos_split_backward) as the tier it runs
// for does (the emulated GPU as the device), or into as many as a test asks for.
void split(RelposSetup& s, const RelposOptions& opt) {
    const std::int64_t pieces = opt.backward_pieces ? opt.backward_pieces
                                : s.emulated        ? kDeviceBackwardPieces
                                                    : kHostBackwardPieces;
    relpos_split_backward(s, pieces,
                          s.emulated ? kDevicePartialBudget : relpos_host_partial_budget(s));
}

// f32 workspace counted by rag::memory (it is a Buffer).
struct Floats {
    Buffer buf;
    explicit Floats(std::size_t n) : buf(Buffer::allocate(std::max<std::size_t>(n, 1) * 4)) {}
    float* data() { return reinterpret_cast<float*>(buf.data.get()); }
};

using Setup = RelposSetup;

// An expanded table, or a dummy the programs never read when the table is absent.
// (16-byte aligned as every global buffer of a GPU launch: check_kir_launch).
template <class T> void* table(std::vector<T>& t) {
    alignas(16) static float none[4] = {};
    return t.empty() ? static_cast<void*>(none) : t.data();
}
// The relation tables as the programs read them: in the data's type on tensor cores.
void* table_q(Setup& s) {
    return s.shape.tensor_cores ? table(s.eq_half) : table(s.eq);
}
void* table_k(Setup& s) {
    return s.shape.tensor_cores ? table(s.ek_half) : table(s.ek);
}

void* ptr(const RaggedTensor& t) {
    return const_cast<void*>(t.data());
}

// Saves projections when asked and there are aq or ak projections to save.
void choose(Setup& s, bool save) {
    s.shape.saved = save && (s.shape.aq || s.shape.ak);
}
// The emulated GPU runs what the GPU would: tensor cores for the half types.
void choose(Setup& s, const RelposOptions& opt) {
    choose(s, opt.save_projections);
    s.emulated = opt.emulate_gpu;
    if (opt.emulate_gpu && relpos_tensor_cores(s.shape.dtype)) relpos_use_tensor_cores(s);
}

// The saved projections of one table: [tokens][H][WS] f32 when present, else one float.
Buffer saved_buffer(const Setup& s, bool present) {
    return Buffer::allocate(present ? std::size_t(s.tokens * s.H * s.WS) * 4 : 4);
}

RelposForward run_forward(std::span<const RaggedTensor> in, Setup& s) {
    RelposForward f;
    f.out = uninitialized(in[0].dtype(), in[2].structure_ptr()); // every row is written
    f.lse = Buffer::allocate(std::size_t(std::max<std::int64_t>(s.tokens * s.H, 1)) * 4);
    if (s.tiles.empty()) return f;
    if (s.shape.saved) {
        f.saved = true;
        f.zqs = saved_buffer(s, s.shape.aq);
        f.zks = saved_buffer(s, s.shape.ak);
        void* pbufs[] = {ptr(in[0]),  ptr(in[1]),     ptr(in[2]),       table_q(s),      table_k(s),
                         table(s.eb), s.tiles.data(), f.zqs.data.get(), f.zks.data.get()};
        kernel(Pass::project, s).launch(s.strips() * s.H, pbufs, s.params());
    }
    std::vector<void*> bufs = {ptr(in[0]),     ptr(in[1]),           ptr(in[2]),
                               table_q(s),     table_k(s),           table(s.eb),
                               s.tiles.data(), f.out.mutable_data(), f.lse.data.get()};
    if (s.shape.saved) bufs.insert(bufs.end(), {f.zqs.data.get(), f.zks.data.get()});
    kernel(Pass::forward, s).launch(s.strips() * s.H, bufs, s.params());
    return f;
}

// Sums per-part partials [part][H][WP][width] into [H][U][width], then folds expanded rows back
// into the map's rows: out[(row * H + h) * width + x], as f64 for the table's dtype.
std::vector<double> table_grad(Floats& part, std::vector<std::int64_t>& range, const Setup& s,
                               std::int64_t width) {
    Floats expanded(std::size_t(s.H * s.U * width));
    void* bufs[] = {part.data(), range.data(), expanded.data()};
    const std::int64_t params[] = {s.H, s.U, s.part_count(), s.WP, width};
    const std::int64_t blocks = (s.U + relpos_reduce_rows - 1) / relpos_reduce_rows;
    kernel(Pass::reduce, s).launch(s.H * blocks, bufs, params);
    return relpos_fold_table_grad(expanded.data(), s, width);
}

} // namespace

RelposForward relpos_forward(std::span<const RaggedTensor> in, const Attrs& at,
                             const RelposOptions& opt) {
    Setup s = relpos_setup(in, at, op_name, false);
    choose(s, opt);
    return run_forward(in, s);
}

std::vector<RaggedTensor> relpos_backward(std::span<const RaggedTensor> in, const RaggedTensor& dO,
                                          const Attrs& at, const RelposForward* fwd,
                                          const RelposOptions& opt) {
    std::vector<RaggedTensor> with_dO(in.begin(), in.end());
    with_dO.push_back(dO);
    Setup setup = relpos_setup(with_dO, at, op_name, true);
    Setup* s = &setup;
    if (dO.dtype() != in[0].dtype())
        fail(op_name, ": dO must be ", dtype_name(in[0].dtype()), " like q, got ",
             dtype_name(dO.dtype()));
    RelposForward again;
    s->emulated = opt.emulate_gpu;
    if (opt.emulate_gpu && relpos_tensor_cores(s->shape.dtype)) relpos_use_tensor_cores(*s);
    if (!fwd) {
        choose(*s, opt);
        again = run_forward(in, *s);
        fwd = &again;
    }
    // The backward reads the forward's saved projections when it has them.
    choose(*s, fwd->saved);
    const RelposShape& sh = s->shape;
    // The passes write every row of dQ, dK and dV.
    std::vector<RaggedTensor> g;
    for (int t = 0; t < 3; ++t)
        g.push_back(uninitialized(in[0].dtype(), in[std::size_t(t)].structure_ptr()));
    if (!s->tiles.empty()) {
        // One instance per part and head in the backward passes: whole samples, split into
        // runs of strips where there are few (not in the one pass, which needs whole samples).
        // The table partials are one per part, not per strip, within a budget.
        const bool one = one_pass(*s, opt);
        if (!one) split(*s, opt);
        const std::size_t parts = std::size_t(s->part_count() * s->H * s->WP);
        Floats delta(one ? 1 : std::size_t(s->tokens * s->H)); // D_i, from the query pass
        Floats zq(sh.aq ? parts * std::size_t(sh.D) : 1), zb(sh.bias ? parts : 1);
        Floats zk(sh.ak ? parts * std::size_t(sh.D) : 1);
        std::vector<std::int64_t> qrange(std::size_t(2 * s->part_count())), krange(qrange.size());
        std::vector<void*> qbufs = {
            ptr(in[0]),          ptr(in[1]),      ptr(in[2]), table_q(*s),   table_k(*s),
            table(s->eb),        s->parts.data(), ptr(dO),    ptr(fwd->out), fwd->lse.data.get(),
            g[0].mutable_data(), delta.data(),    zq.data(),  zb.data(),     qrange.data()};
        std::vector<void*> kbufs = {
            ptr(in[0]),          ptr(in[1]),          ptr(in[2]), table_q(*s),         table_k(*s),
            table(s->eb),        s->parts.data(),     ptr(dO),    fwd->lse.data.get(), delta.data(),
            g[1].mutable_data(), g[2].mutable_data(), zk.data(),  krange.data()};
        std::vector<void*> bufs = {
            ptr(in[0]),          ptr(in[1]),          ptr(in[2]),          table_q(*s),
            table_k(*s),         table(s->eb),        s->parts.data(),     ptr(dO),
            ptr(fwd->out),       fwd->lse.data.get(), g[0].mutable_data(), g[1].mutable_data(),
            g[2].mutable_data(), zq.data(),           zb.data(),           zk.data(),
            qrange.data()};
        if (sh.saved)
            for (auto* b : {&qbufs, &kbufs, &bufs})
                b->insert(b->end(), {fwd->zqs.data.get(), fwd->zks.data.get()});
        prepare(backward_passes(*s, opt), *s);
        if (one) {
            kernel(Pass::grad, *s).launch(s->part_count() * s->H, bufs, s->params());
        } else {
            kernel(Pass::query_grad, *s).launch(s->part_count() * s->H, qbufs, s->params());
            kernel(Pass::key_grad, *s).launch(s->part_count() * s->H, kbufs, s->params());
        }
        Floats* partial[] = {&zq, &zk, &zb};
        // One pass writes one range per part (a whole sample's keys reach its queries' rows).
        std::vector<std::int64_t>* ranges[] = {&qrange, one ? &qrange : &krange, &qrange};
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

namespace {
// A batch of one empty sample (ragged extents 0) of schema s, or a dense tensor; nullopt with a
// symbolic extent.
std::optional<RaggedTensor> empty_of(const Schema& s) {
    std::vector<std::int64_t> sizes;
    for (const Axis& a : s.shape.axes) {
        if (a.kind == AxisKind::symbolic) return std::nullopt;
        sizes.push_back(a.is_ragged() ? 0 : a.extent);
    }
    return RaggedTensor::zeros(s.dtype, Structure::make(s.shape, 1, std::move(sizes)));
}
} // namespace

void relpos_precompile(const ir::Function& f) {
    for (const ir::Node& n : f.nodes) {
        const bool grad = n.op == "relpos_attention_grad";
        if ((!grad && n.op != "relpos_attention") || f.type(n.args[0]).dtype == DType::f64)
            continue; // f64 runs the reference (jit/relpos_step.hpp)
        std::vector<RaggedTensor> in;
        for (std::size_t a = 0; a + (grad ? 1 : 0) < n.args.size(); ++a)
            if (auto t = empty_of(f.type(n.args[a]))) in.push_back(*t);
        if (in.size() + (grad ? 1 : 0) != n.args.size()) continue;
        std::optional<Setup> s;
        try {
            s.emplace(relpos_setup(in, n.attrs, op_name, false));
        } catch (const Error&) {
            continue;
        }
        // What relpos_forward and relpos_backward will ask for (projections are not saved on
        // the CPU tier: RelposOptions' default).
        std::vector<Pass> passes = {Pass::forward};
        if (grad)
            for (Pass p : backward_passes(*s, {})) passes.push_back(p);
        for (Pass p : passes) start(p, *s, true, false);
    }
}

std::size_t relpos_programs_started_by_runs() {
    Kernels& ks = kernels();
    std::lock_guard<std::mutex> lock(ks.mu);
    return ks.started_by_runs;
}

RaggedTensor RelposOnCpu::forward() {
    fwd_ = relpos_forward(in_, at_, opt_);
    return fwd_->out;
}

std::vector<RaggedTensor> RelposOnCpu::backward(const RaggedTensor& dO) {
    return relpos_backward(in_, dO, at_, fwd_ ? &*fwd_ : nullptr, opt_);
}

} // namespace rag::jit
