#include "jit/gpu_function.hpp"

#include "ir/interpreter.hpp"
#include "jit/biased_attention_cpu.hpp"
#include "jit/biased_attention_programs.hpp"
#include "jit/cpu_jit.hpp"
#include "jit/gemm_programs.hpp"
#include "jit/kir_emulator.hpp"
#include "jit/kir_gpu.hpp"
#include "jit/layout_programs.hpp"
#include "jit/norm_programs.hpp"
#include "jit/placement.hpp"
#include "jit/reduce_programs.hpp"
#include "jit/relpos_gpu.hpp"
#include "jit/relpos_step.hpp"
#include "jit/segmented.hpp"
#include "runtime/cuda.hpp"
#include "runtime/error.hpp"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>

namespace rag::jit {
namespace {

// The device copies of one call's values. A value with a device copy (a GPU-tier result of this
// call or of an earlier one, not written on the host since: runtime/tensor.hpp's Residency) is
// read there; any other is uploaded at most once per call, keyed by its host buffer (an entry
// holds the buffer, so its address cannot be reused by another value while the copy is
// cached). Results stay on the device and reach the host only when it reads them: host steps of
// the same call, or the caller. Ragged-structure tables (segment entries) are uploaded once per
// call per distinct table.
class DeviceValues {
  public:
    const cuda::Buffer& of(const RaggedTensor& t) {
        if (auto d = t.device_copy()) return *held_.emplace_back(std::move(d));
        std::byte* key = t.buffer().data.get();
        if (!key) return scratch_.emplace_back(to_device(t)); // empty: nothing to share
        auto it = values_.find(key);
        if (it == values_.end()) it = values_.emplace(key, Entry{t.buffer(), to_device(t)}).first;
        return it->second.device;
    }
    // A device result, resident: downloaded when the host first reads it.
    RaggedTensor result(cuda::Buffer b, DType t, const StructurePtr& st) {
        return resident(std::move(b), t, st);
    }
    const cuda::Buffer& table(const std::vector<std::int64_t>& v) {
        auto it = tables_.find(v);
        if (it == tables_.end()) it = tables_.emplace(v, to_device(v)).first;
        return it->second;
    }

  private:
    struct Entry {
        Buffer host;
        cuda::Buffer device;
    };
    std::map<const std::byte*, Entry> values_;
    std::map<std::vector<std::int64_t>, cuda::Buffer> tables_;
    std::deque<cuda::Buffer> scratch_; // uploads of empty values (stable addresses)
    // Device copies read this call, held so that a host write elsewhere cannot free them.
    std::deque<std::shared_ptr<const cuda::Buffer>> held_;
};

// sum/mean over one axis, their gradients, softmax and its gradient (f32) on the device through
// their kernel-IR programs (jit/reduce_programs.hpp). Says whether node i ran here.
bool run_segment_program(const ir::Node& n, std::size_t i, std::vector<RaggedTensor>& vals,
                         DeviceValues& dev) {
    std::vector<RaggedTensor> args;
    for (int a : n.args) args.push_back(vals[std::size_t(a)]);
    std::optional<SegmentJob> job = segment_job(n, args);
    if (!job) return false;
    const SegOp op = job->op;
    const GpuKernel& k =
        gpu_kernel("segment/" + std::to_string(int(op)), [op] { return segment_program(op); });
    cuda::Buffer out = device_buffer(std::size_t(job->out->numel()) * 4);
    std::vector<const cuda::Buffer*> ptrs = {&dev.table(job->seg)};
    for (const RaggedTensor& t : job->inputs) ptrs.push_back(&dev.of(t));
    ptrs.push_back(&out);
    k.launch(job->grid(), ptrs, {});
    vals[i] = dev.result(std::move(out), DType::f32, job->out);
    return true;
}

// Transposes of static axes (a weight's, in every backward through x @ W) on the device through
// the transpose program (jit/layout_programs.hpp). Says whether node i ran here.
bool run_transpose_program(const ir::Node& n, std::size_t i, std::vector<RaggedTensor>& vals,
                           DeviceValues& dev) {
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    std::optional<TransposeJob> job = transpose_job(n, x);
    if (!job) return false;
    const DType t = n.type.dtype;
    const GpuKernel& k = gpu_kernel(transpose_kernel_key(t), [t] { return transpose_program(t); });
    cuda::Buffer out = device_buffer(std::size_t(job->total) * dtype_size(t));
    const cuda::Buffer* ptrs[] = {&dev.of(x), &out};
    k.launch(job->grid(), ptrs, job->params());
    vals[i] = dev.result(std::move(out), t, job->out);
    return true;
}

// out[c] = the sum over p < P of part[p * C + c] in p order, stored as t: the ordered second
// pass of split-K GEMMs and of norm parameter gradients (no atomics anywhere).
void sum_partials(const cuda::Buffer& part, std::int64_t P, std::int64_t C, DType t,
                  const cuda::Buffer& out) {
    const GpuKernel& sums =
        gpu_kernel("sums/" + std::string(dtype_name(t)), [t] { return column_sums_program(t); });
    const cuda::Buffer* ptrs[] = {&part, &out};
    const std::int64_t params[] = {P, C};
    sums.launch(column_sums_grid(C), ptrs, params);
}

// zeros_like on the device: a memset there, where the reference kernel's zeros would be uploaded.
bool run_zeros_like(const ir::Node& n, std::size_t i, std::vector<RaggedTensor>& vals,
                    DeviceValues& dev) {
    if (n.op != "zeros_like") return false;
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    const DType t = n.type.dtype;
    vals[i] =
        dev.result(device_zeros(std::size_t(x.numel()) * dtype_size(t)), t, x.structure_ptr());
    return true;
}

// sum_to onto an unbatched value of g's trailing static axes (a bias gradient: the sum of g's
// rows) on the device when g is there: per-block partials in row order (row_sums), summed in
// block order (column_sums). Says whether node i ran here.
bool run_sum_to_program(const ir::Node& n, std::size_t i, std::vector<RaggedTensor>& vals,
                        DeviceValues& dev) {
    if (n.op != "sum_to") return false;
    const RaggedTensor& g = vals[std::size_t(n.args[0])];
    const RaggedTensor& like = vals[std::size_t(n.args[1])];
    const DType t = n.type.dtype;
    if (g.dtype() != t || (t != DType::f32 && t != DType::f16 && t != DType::bf16)) return false;
    const std::optional<std::int64_t> C = sum_to_columns(g.shape(), like.shape());
    if (!C || *C == 0 || g.numel() == 0) return false; // the host's zeros
    // Where g is: a host value (a bucket map's table gradient, folded on the host) is summed
    // there, which moves nothing, where the device would take an upload of g for a result of
    // C elements.
    if (!g.device_copy()) return false;
    const std::int64_t R = g.numel() / *C, P = row_sums_grid(R);
    const GpuKernel& rows =
        gpu_kernel("row_sums/" + std::string(dtype_name(t)), [t] { return row_sums_program(t); });
    cuda::Buffer part = device_buffer(std::size_t(P * *C) * 4);
    const cuda::Buffer* ptrs[] = {&dev.of(g), &part};
    const std::int64_t params[] = {R, *C};
    rows.launch(P, ptrs, params);
    cuda::Buffer out = device_buffer(std::size_t(*C) * dtype_size(t));
    sum_partials(part, P, *C, t, out);
    vals[i] = dev.result(std::move(out), t, like.structure_ptr());
    return true;
}

// x @ W over packed rows and weight gradients (f32, f16, bf16) on the device through the GEMM
// tile program (jit/gemm_programs.hpp): tensor cores for the half types. Says whether node i
// ran here.
bool run_gemm_program(const ir::Node& n, std::size_t i, std::vector<RaggedTensor>& vals,
                      DeviceValues& dev) {
    const DType t = n.type.dtype;
    if (t != DType::f32 && t != DType::f16 && t != DType::bf16) return false;
    std::optional<GemmJob> job = gemm_job(n, vals);
    if (!job) return false;
    if (job->M == 0 || job->N == 0) {
        vals[i] = RaggedTensor::zeros(t, job->out);
        return true;
    }
    job->split_for(cuda::device().multiprocessors);
    const bool split = job->splits > 1;
    const GpuKernel& k =
        gpu_kernel(std::string(split ? "gemm_partial/" : "gemm/").append(dtype_name(t)),
                   [t, split] { return gemm_program(t, split); });
    const std::int64_t mn = job->M * job->N;
    cuda::Buffer c = device_buffer(std::size_t(mn) * dtype_size(t));
    // Split K: f32 partials per split, summed in split order (no atomics).
    cuda::Buffer part = split ? device_buffer(std::size_t(job->splits * mn) * 4) : cuda::Buffer();
    const cuda::Buffer* ptrs[] = {&dev.of(vals[std::size_t(n.args[0])]),
                                  &dev.of(vals[std::size_t(n.args[1])]), split ? &part : &c};
    k.launch(job->grid(), ptrs, job->params());
    if (split) sum_partials(part, job->splits, mn, t, c);
    vals[i] = dev.result(std::move(c), t, job->out);
    return true;
}

// layernorm, rmsnorm (f32, f16, bf16) and their gradients on the device through the norm
// programs (jit/norm_programs.hpp): node i and its sibling gradients `also` in one pass. Says
// whether they ran here.
bool run_norm_program(const ir::Function& f, int i, const std::vector<int>& also,
                      std::vector<RaggedTensor>& vals, DeviceValues& dev) {
    std::optional<NormJob> job = norm_job(f, i, also, vals);
    if (!job) return false;
    const DType t = job->dtype;
    const bool grad = !job->wants.empty();
    const bool layer = job->op == NormOp::layernorm || job->op == NormOp::layernorm_grad;
    char eps[32];
    std::snprintf(eps, sizeof eps, "%a", job->eps); // exact: eps is baked into the program
    const GpuKernel& k = gpu_kernel("norm/" + std::to_string(int(job->op)) + "/" +
                                        std::string(dtype_name(t)) + "/" + eps,
                                    [&] { return norm_program(job->op, t, job->eps); });
    const RaggedTensor& x = job->inputs[0];
    cuda::Buffer out = device_buffer(std::size_t(x.numel()) * dtype_size(t));
    const int parts = grad ? (layer ? 2 : 1) : 0;
    std::vector<cuda::Buffer> part;
    for (int p = 0; p < parts; ++p)
        part.push_back(device_buffer(std::size_t(job->grid() * job->C) * 4));
    std::vector<const cuda::Buffer*> ptrs;
    for (const RaggedTensor& in : job->inputs) ptrs.push_back(&dev.of(in));
    ptrs.push_back(&out);
    for (const auto& b : part) ptrs.push_back(&b);
    const std::int64_t params[] = {job->rows, job->C};
    k.launch(job->grid(), ptrs, params);
    RaggedTensor first = dev.result(std::move(out), t, x.structure_ptr());
    if (!grad) {
        vals[std::size_t(i)] = first;
        return true;
    }
    // dx, then dg and db: the partials summed over instances in order.
    std::vector<RaggedTensor> grads = {first};
    const StructurePtr& param = job->inputs[1].structure_ptr();
    for (int p = 0; p < parts; ++p) {
        cuda::Buffer sum = device_buffer(std::size_t(job->C) * dtype_size(t));
        sum_partials(part[std::size_t(p)], job->grid(), job->C, t, sum);
        grads.push_back(dev.result(std::move(sum), t, param));
    }
    for (const auto& [node, wrt] : job->wants) vals[std::size_t(node)] = grads.at(std::size_t(wrt));
    return true;
}

// attention(q, k, v, bias=) and triangle attention (f32) on the device through their tile
// programs (jit/biased_attention_programs.hpp): node i and its sibling gradients `also` from
// one backward (after the forward, whose O and log-sum-exp it reads). Says whether they ran
// here: other dtypes, and lengths the op rejects (the host step names the sample), do not.
bool run_biased_program(const ir::Function& f, int i, const std::vector<int>& also,
                        std::vector<RaggedTensor>& vals, DeviceValues& dev) {
    const ir::Node& n = f.nodes[std::size_t(i)];
    const bool grad = n.op == "biased_attention_grad";
    if ((!grad && n.op != "biased_attention") || n.type.dtype != DType::f32) return false;
    std::vector<RaggedTensor> in;
    std::vector<const RaggedTensor*> all;
    for (int a : n.args) all.push_back(&vals[std::size_t(a)]);
    for (int a = 0; a < 4; ++a) in.push_back(*all[std::size_t(a)]);
    for (const RaggedTensor* t : all)
        if (t->dtype() != DType::f32) return false;
    if (!biased_lengths_agree(all, int(n.attrs.get_int("axis", 1)))) return false;
    const BiasedWork w = biased_work(in, n.attrs);
    const BiasedShape& s = w.shape;
    char scale[32];
    std::snprintf(scale, sizeof scale, "%a", s.scale); // exact: baked into the programs
    const std::string shape = std::to_string(s.D) + "/" + std::to_string(s.Dv) + "/" +
                              std::to_string(s.causal) + "/" + scale;
    auto program = [&](const char* pass, kir::Kernel (*make)(const BiasedShape&)) -> auto& {
        return gpu_kernel(std::string("biased/") + pass + "/" + shape, [&] { return make(s); });
    };
    const std::int64_t params[] = {w.H};
    const cuda::Buffer *q = &dev.of(in[0]), *k = &dev.of(in[1]), *v = &dev.of(in[2]),
                       *bias = &dev.of(in[3]);
    cuda::Buffer out = device_zeros(std::size_t(w.out->numel()) * 4);
    cuda::Buffer lse = device_zeros(std::size_t(std::max<std::int64_t>(w.tokens * w.H, 1)) * 4);
    if (w.grid(w.forward) > 0) {
        const cuda::Buffer* ptrs[] = {q, k, v, bias, &dev.table(w.forward), &out, &lse};
        program("forward", biased_forward_program).launch(w.grid(w.forward), ptrs, params);
    }
    if (!grad) {
        vals[std::size_t(i)] = dev.result(std::move(out), DType::f32, w.out);
        return true;
    }
    const cuda::Buffer* dO = &dev.of(*all[4]);
    std::vector<cuda::Buffer> g;
    for (const RaggedTensor& t : in) g.push_back(device_zeros(std::size_t(t.numel()) * 4));
    if (w.grid(w.keys) > 0) {
        const cuda::Buffer* ptrs[] = {q,  k,    v,    bias,  &dev.table(w.keys),
                                      dO, &out, &lse, &g[1], &g[2]};
        program("key_grad", biased_key_grad_program).launch(w.grid(w.keys), ptrs, params);
    }
    if (w.grid(w.queries) > 0) {
        const cuda::Buffer* ptrs[] = {q,  k,    v,    bias,  &dev.table(w.queries),
                                      dO, &out, &lse, &g[0], &g[3]};
        program("query_grad", biased_query_grad_program).launch(w.grid(w.queries), ptrs, params);
    }
    std::vector<int> nodes = {i};
    nodes.insert(nodes.end(), also.begin(), also.end());
    for (int node : nodes) {
        const std::size_t wrt = std::size_t(f.nodes[std::size_t(node)].attrs.get_int("wrt"));
        vals[std::size_t(node)] =
            dev.result(std::move(g.at(wrt)), DType::f32, in[wrt].structure_ptr());
    }
    return true;
}

// One relpos application on the device (jit/relpos_step.hpp): the forward's O and
// log-sum-exp stay there for the backward.
class RelposOnGpu {
  public:
    RelposOnGpu(std::span<const RaggedTensor> in, const Attrs& at) : dev_(in, at) {}
    RaggedTensor forward() {
        dev_.forward();
        return dev_.out();
    }
    std::vector<RaggedTensor> backward(const RaggedTensor& dO) {
        dev_.set_dO(dO);
        dev_.backward();
        return dev_.gradients();
    }

  private:
    RelposOnDevice dev_;
};

class CompiledGpu final : public GpuFunction {
  public:
    explicit CompiledGpu(const ir::Function& f) : f_(f), plan_(make_plan(f)) {
        if (cuda::emulated()) { // the same kernels built for the host; no PTX
            emulated_ = compile_fused_emulated(f_, plan_);
            return;
        }
        ptx_ = fused_ptx(f_, plan_, device_arch());
        module_ = std::make_unique<cuda::Module>(ptx_.ptx);
        for (const PtxKernel& k : ptx_.kernels) kernels_.push_back(module_->kernel(k.name));
    }

    const PtxProgram& ptx() const override { return ptx_; }

    using GpuFunction::run;
    std::vector<RaggedTensor> run(const std::vector<RaggedTensor>& inputs,
                                  Placement* where) const override {
        std::vector<RaggedTensor> vals = ir::bind_inputs(f_, inputs);
        Placement place;
        const cuda::Transfers before = cuda::transfers();
        DeviceValues dev;
        RelposNodes<RelposOnGpu> relpos(true); // self-attention too
        for (const Step& s : plan_.steps) {
            const std::int64_t refs = reference_runs;
            if (s.kind == Step::Kind::fused) {
                run_group(std::size_t(s.index), vals, dev);
                if (reference_runs != refs)
                    ++place.reference["fused"];
                else
                    ++place.device;
                continue;
            }
            const ir::Node& n = f_.nodes[std::size_t(s.index)];
            // Device kernels where there are some; else the CPU tier's host kernels (f64
            // GEMMs, batched GEMMs, f64 norms, cross-attention, layout, other reductions), which
            // also compute the sibling gradients of a rowwise or attention step; else the
            // reference kernels.
            const std::size_t i = std::size_t(s.index);
            if (relpos.run(f_, i, vals)) { // with an attention step's sibling gradients
                for (int j : s.also)
                    if (!relpos.run(f_, std::size_t(j), vals)) reference(std::size_t(j), vals);
                count(place, n, refs, true);
                continue;
            }
            if (run_segment_program(n, i, vals, dev) || run_transpose_program(n, i, vals, dev) ||
                run_sum_to_program(n, i, vals, dev) || run_zeros_like(n, i, vals, dev) ||
                run_gemm_program(n, i, vals, dev) ||
                run_norm_program(f_, s.index, s.also, vals, dev) ||
                run_biased_program(f_, s.index, s.also, vals, dev)) {
                count(place, n, refs, true);
                continue;
            }
            // No device kernel: the CPU tier's host kernels (f64 and batched GEMMs,
            // cross-attention, layout, ...), reported as host fallbacks, else the reference.
            if (run_host_step(f_, s, vals)) {
                count(place, n, refs, false);
                continue;
            }
            reference(i, vals);
            for (int j : s.also) reference(std::size_t(j), vals);
            count(place, n, refs, false);
        }
        const cuda::Transfers after = cuda::transfers();
        place.uploaded = std::int64_t(after.uploaded - before.uploaded);
        place.downloaded = std::int64_t(after.downloaded - before.downloaded);
        if (where) *where = std::move(place);
        std::vector<RaggedTensor> out;
        for (int o : f_.outputs) out.push_back(vals[std::size_t(o)]);
        return out;
    }

  private:
    // A step that reached a reference kernel is a reference step; else a device kernel, or a
    // host fallback named op_dtype (matmul_f64: the f64 GEMM has no device kernel).
    static void count(Placement& place, const ir::Node& n, std::int64_t refs, bool device) {
        if (reference_runs != refs)
            ++place.reference[n.op];
        else if (device)
            ++place.device;
        else
            ++place.host[n.op + "_" + std::string(dtype_name(n.type.dtype))];
    }

    void reference(std::size_t i, std::vector<RaggedTensor>& vals) const {
        const ir::Node& n = f_.nodes[i];
        std::vector<RaggedTensor> args;
        for (int a : n.args) args.push_back(vals[std::size_t(a)]);
        vals[i] = reference_kernel(n.op, args, n.attrs);
    }

    // The group's kernel over the packed elements; operands of unequal runtime structure go
    // to the reference kernels, which name the offending sample (as on the CPU tier).
    void run_group(std::size_t g, std::vector<RaggedTensor>& vals, DeviceValues& dev) const {
        const FusedGroup& grp = plan_.groups[g];
        const RaggedTensor* shape_from = nullptr;
        bool same = true;
        for (const auto& in : grp.inputs) {
            if (in.access != Access::full) continue;
            const RaggedTensor& t = vals[std::size_t(in.value)];
            if (!shape_from)
                shape_from = &t;
            else
                same = same && t.structure().same_as(shape_from->structure());
        }
        if (!shape_from || !same) {
            for (int v : grp.nodes) reference(std::size_t(v), vals);
            return;
        }
        const StructurePtr& st = shape_from->structure_ptr();
        std::int64_t n = st->numel();
        std::vector<std::int64_t> lens;
        std::vector<std::uint64_t> ptrs;
        for (const auto& x : grp.inputs) {
            const RaggedTensor& t = vals[std::size_t(x.value)];
            ptrs.push_back(dev.of(t).ptr());
            lens.push_back(std::max<std::int64_t>(t.numel(), 1));
        }
        std::vector<cuda::Buffer> outs;
        for (std::size_t k = 0; k < grp.outputs.size(); ++k) { // bool outputs: one byte each
            outs.push_back(
                device_buffer(std::size_t(n) * dtype_size(f_.type(grp.outputs[k]).dtype)));
            ptrs.push_back(outs.back().ptr());
        }
        // cuLaunchKernel takes the address of each parameter's value, in kernel order.
        std::vector<void*> params = {&n};
        for (std::size_t k = 0; k < grp.inputs.size(); ++k) {
            params.push_back(&ptrs[k]);
            params.push_back(&lens[k]);
        }
        for (std::size_t k = 0; k < grp.outputs.size(); ++k)
            params.push_back(&ptrs[grp.inputs.size() + k]);
        const std::int64_t blocks =
            std::min<std::int64_t>((n + kFusedBlock - 1) / kFusedBlock, 65535);
        if (emulated_) // two blocks at most: the grid-stride loop is taken, the host is slow
            emulated_->launch(g, unsigned(std::min<std::int64_t>(blocks, 2)), params);
        else
            kernels_[g].launch(unsigned(blocks), kFusedBlock, params);
        for (std::size_t k = 0; k < grp.outputs.size(); ++k)
            vals[std::size_t(grp.outputs[k])] =
                dev.result(std::move(outs[k]), f_.type(grp.outputs[k]).dtype, st);
    }

    ir::Function f_;
    Plan plan_;
    PtxProgram ptx_; // empty on the emulated device
    std::unique_ptr<cuda::Module> module_;
    std::vector<cuda::Kernel> kernels_;
    std::unique_ptr<EmulatedFused> emulated_;
};

} // namespace

std::string device_arch() {
    const cuda::DeviceInfo& d = cuda::device();
    if (d.major >= 9) return "sm_90";
    if (d.major == 8) return "sm_80";
    fail("CUDA: ", d.name, " is ", d.arch(), "; rag's kernels need sm_80 or later");
}

std::unique_ptr<GpuFunction> compile_gpu(const ir::Function& f) {
    return std::make_unique<CompiledGpu>(f);
}

} // namespace rag::jit
