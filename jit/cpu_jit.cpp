#include "jit/cpu_jit.hpp"

#include "ir/interpreter.hpp"
#include "jit/attention_cpu.hpp"
#include "jit/batched_gemm.hpp"
#include "jit/biased_attention_cpu.hpp"
#include "jit/blas.hpp"
#include "jit/conv.hpp"
#include "jit/elementwise_llvm.hpp"
#include "jit/gather.hpp"
#include "jit/gemm_programs.hpp"
#include "jit/index_map.hpp"
#include "jit/layout.hpp"
#include "jit/llvm_jit.hpp"
#include "jit/llvm_loops.hpp"
#include "jit/nn_steps.hpp"
#include "jit/placement.hpp"
#include "jit/relpos.hpp"
#include "jit/relpos_step.hpp"
#include "jit/rowwise.hpp"
#include "jit/segmented.hpp"
#include "jit/step_profile.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <llvm/IR/IRBuilder.h>

#include <atomic>
#include <map>

namespace rag::jit {
namespace {

// rows[k]: the element count of a row-access input. Row mode (groups with gather or row
// inputs) runs rows [begin, end) of `width` elements and reads gather input k at
// maps[k][row] (+ the element's place in the row); flat mode runs elements [begin, end).
using Kernel = void (*)(std::int64_t begin, std::int64_t end, void* const* in, void* const* out,
                        const std::int64_t* rows, const std::int64_t* const* maps,
                        std::int64_t width);

bool row_mode(const FusedGroup& g) {
    for (const auto& in : g.inputs)
        if (in.access != Access::full && in.access != Access::scalar) return true;
    return false;
}

// Emits the body of one fused loop: element i of every output from element i of the inputs.
class GroupEmitter {
  public:
    GroupEmitter(llvm::Module& m, const ir::Function& f, const FusedGroup& g)
        : m_(m), f_(f), g_(g), t_(g.dtype == DType::f32 ? llvm::Type::getFloatTy(m.getContext())
                                                        : llvm::Type::getDoubleTy(m.getContext())) {
    }

    void emit(const std::string& name) {
        auto& ctx = m_.getContext();
        auto* i64 = llvm::Type::getInt64Ty(ctx);
        auto* ptr = llvm::PointerType::get(ctx, 0);
        LoopBuilder L(m_, name, {i64, i64, ptr, ptr, ptr, ptr, i64});
        auto& b = L.b;
        llvm::Value *begin = L.arg(0), *end = L.arg(1), *ins = L.arg(2), *outs = L.arg(3),
                    *rows = L.arg(4), *maps = L.arg(5), *width = L.arg(6);
        std::vector<llvm::Value*> in_ptr, row_len, map_ptr, out_ptr;
        for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
            in_ptr.push_back(b.CreateLoad(ptr, b.CreateConstGEP1_64(ptr, ins, k)));
            row_len.push_back(b.CreateLoad(i64, b.CreateConstGEP1_64(i64, rows, k)));
            map_ptr.push_back(g_.inputs[k].access == Access::gather ||
                                      g_.inputs[k].access == Access::gather_bcast
                                  ? b.CreateLoad(ptr, b.CreateConstGEP1_64(ptr, maps, k))
                                  : nullptr);
        }
        for (std::size_t k = 0; k < g_.outputs.size(); ++k)
            out_ptr.push_back(b.CreateLoad(ptr, b.CreateConstGEP1_64(ptr, outs, k)));
        bool whole_rows = false; // which version of the row loop is being emitted
        std::vector<llvm::Value*> row_start(g_.inputs.size()); // map[k][r], in the row loop
        // Element i (row r, place j in the row): load the inputs, compute, store the outputs.
        auto element = [&](llvm::Value* i, llvm::Value* r, llvm::Value* j) {
            for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
                llvm::Value* at = nullptr;
                switch (g_.inputs[k].access) {
                case Access::full:
                    at = i;
                    break;
                case Access::scalar:
                    at = b.getInt64(0);
                    break;
                case Access::row: // in row mode the operand repeats inside each row
                    at = !r           ? b.CreateURem(i, row_len[k])
                         : whole_rows ? j
                                      : b.CreateURem(j, row_len[k]);
                    break;
                case Access::gather:
                    at = b.CreateAdd(row_start[k], j);
                    break;
                case Access::gather_bcast:
                    at = row_start[k];
                    break;
                }
                const DType stored = f_.type(g_.inputs[k].value).dtype;
                vals_[g_.inputs[k].value] =
                    from_storage(b, L.load(storage_type(b, stored, t_), in_ptr[k], at), stored, t_);
            }
            for (int v : g_.nodes) {
                const ir::Node& n = f_.nodes[std::size_t(v)];
                std::vector<llvm::Value*> args;
                for (int a : n.args) args.push_back(vals_.at(a));
                vals_[v] = emit_elementwise(b, m_, host_math(), n, args, t_);
            }
            for (std::size_t k = 0; k < g_.outputs.size(); ++k)
                L.store(to_storage(b, vals_[g_.outputs[k]], f_.type(g_.outputs[k]).dtype, t_),
                        out_ptr[k], i);
        };
        auto row_loop = [&] {
            L.loop(begin, end, [&](llvm::Value* r) {
                llvm::Value* base = b.CreateMul(r, width);
                // Read the row maps once per row: inside the element loop LLVM could not hoist
                // them past the output stores (it cannot rule out aliasing), which kept the
                // loop scalar.
                for (std::size_t k = 0; k < g_.inputs.size(); ++k)
                    if (map_ptr[k]) row_start[k] = L.load(i64, map_ptr[k], r);
                L.loop(b.getInt64(0), width,
                       [&](llvm::Value* j) { element(b.CreateAdd(base, j), r, j); });
            });
        };
        if (row_mode(g_)) {
            // Two versions of the row loop: one for row operands as wide as the row (a bias on
            // the last axis: element j, which vectorises) and one where they repeat inside it.
            llvm::Value* whole = b.getTrue();
            for (std::size_t k = 0; k < g_.inputs.size(); ++k)
                if (g_.inputs[k].access == Access::row)
                    whole = b.CreateAnd(whole, b.CreateICmpEQ(row_len[k], width));
            auto* ctx = &m_.getContext();
            auto* fast = llvm::BasicBlock::Create(*ctx, "whole_rows", L.fn);
            auto* slow = llvm::BasicBlock::Create(*ctx, "repeating_rows", L.fn);
            auto* done = llvm::BasicBlock::Create(*ctx, "rows_done", L.fn);
            b.CreateCondBr(whole, fast, slow);
            for (bool w : {true, false}) {
                b.SetInsertPoint(w ? fast : slow);
                whole_rows = w;
                row_loop();
                b.CreateBr(done);
            }
            b.SetInsertPoint(done);
        } else
            L.loop(begin, end, [&](llvm::Value* i) { element(i, nullptr, nullptr); });
        L.finish();
    }

  private:
    llvm::Module& m_;
    const ir::Function& f_;
    const FusedGroup& g_;
    llvm::Type* t_;
    std::map<int, llvm::Value*> vals_;
};

// x @ W over packed rows, or the weight gradient x^T g over packed rows: one GEMM each,
// whatever the ragged structure of x.
void run_gemm(const ir::Node& n, RaggedTensor& result, const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& a = vals[std::size_t(n.args[0])];
    const RaggedTensor& b = vals[std::size_t(n.args[1])];
    if (n.op == "matmul" && b.shape().batched) {
        result = run_batched_gemm(n, vals);
        return;
    }
    const std::optional<GemmJob> found = gemm_job(n, vals);
    if (!found) { // operands that disagree: the reference kernel says which sample
        result = reference_kernel(n.op, {a, b}, n.attrs);
        return;
    }
    const GemmJob& job = *found;
    if (job.M == 0 || job.N == 0 || job.K == 0) { // nothing to multiply: zeros
        result = RaggedTensor::zeros(n.type.dtype, job.out);
        return;
    }
    result = uninitialized(n.type.dtype, job.out); // the GEMM (beta = 0) writes every element
    // Row-major: out[M, N] = a[M, K] b[K, N], or a[K, M]^T b[K, N] for the weight gradient.
    const auto ta = job.a_transposed ? CblasTrans : CblasNoTrans;
    const int m = int(job.M), d = int(job.N), k = int(job.K);
    const int lda = int(job.a_transposed ? job.M : job.K);
    if (n.type.dtype == DType::f32)
        gemm(CblasRowMajor, ta, CblasNoTrans, m, d, k, 1.0f, static_cast<const float*>(a.data()),
             lda, static_cast<const float*>(b.data()), d,
             static_cast<float*>(result.mutable_data()), d);
    else
        gemm(CblasRowMajor, ta, CblasNoTrans, m, d, k, 1.0, static_cast<const double*>(a.data()),
             lda, static_cast<const double*>(b.data()), d,
             static_cast<double*>(result.mutable_data()), d);
}

// The nodes a step computes: a fused group's members, else its node and the sibling gradient
// nodes the same pass writes.
std::vector<int> step_nodes(const Plan& plan, const Step& s) {
    if (s.kind == Step::Kind::fused) return plan.groups[std::size_t(s.index)].nodes;
    std::vector<int> nodes = {s.index};
    nodes.insert(nodes.end(), s.also.begin(), s.also.end());
    return nodes;
}

// For each step, the values to drop once it has run: those no later step reads (last use), and
// those it computes that nothing reads, except the function's outputs. Without this every
// intermediate of a call stayed live to its end: a four-block Pairformer's loss held all its
// activations, its peak several times the padded envelope of one block, where a forward needs
// a few pair states at once. Dropping a value drops one reference (views share storage), and
// the inputs stay the caller's.
std::vector<std::vector<int>> release_points(const ir::Function& f, const Plan& plan) {
    constexpr int kNever = -1;
    std::vector<int> last(f.nodes.size(), kNever);
    for (std::size_t k = 0; k < plan.steps.size(); ++k)
        for (int v : step_nodes(plan, plan.steps[k])) {
            last[std::size_t(v)] = std::max(last[std::size_t(v)], int(k)); // computed here
            for (int a : f.nodes[std::size_t(v)].args) last[std::size_t(a)] = int(k); // read here
        }
    for (int o : f.outputs) last[std::size_t(o)] = kNever;
    std::vector<std::vector<int>> out(plan.steps.size());
    for (std::size_t v = 0; v < last.size(); ++v)
        if (last[v] != kNever) out[std::size_t(last[v])].push_back(int(v));
    return out;
}

class CompiledCpu final : public CpuFunction {
  public:
    explicit CompiledCpu(const ir::Function& f)
        : f_(f), plan_(make_plan(f)), release_after_(release_points(f_, plan_)) {
        relpos_precompile(f_); // on other threads, while this one compiles the fused groups
        static std::atomic<int> counter{0};
        const std::string prefix = "rag_" + std::to_string(counter++) + "_";
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = new_module(prefix + f.name, *ctx);
        for (std::size_t g = 0; g < plan_.groups.size(); ++g)
            GroupEmitter(*m, f_, plan_.groups[g]).emit(prefix + std::to_string(g));
        for (void* k :
             add_module(std::move(m), std::move(ctx), plan_.groups.size(), prefix, &ir_, &tracker_))
            kernels_.push_back(reinterpret_cast<Kernel>(k));
    }
    ~CompiledCpu() override {
        profile_.print(plan_, f_);
        remove_module(tracker_);
    }

    const Plan& plan() const override { return plan_; }
    const std::string& llvm_ir() const override { return ir_; }

    using CpuFunction::run;
    std::vector<RaggedTensor> run(const std::vector<RaggedTensor>& inputs,
                                  Placement* where) const override {
        std::vector<RaggedTensor> vals = ir::bind_inputs(f_, inputs);
        Placement place;
        if (profile_.on()) profile_.count_call();
        RelposNodes<RelposOnCpu> relpos;
        for (std::size_t k = 0; k < plan_.steps.size(); ++k) {
            const Step& s = plan_.steps[k];
            const double t0 = profile_.on() ? StepProfile::now() : 0.0;
            const std::int64_t refs = reference_runs;
            run_step(s, vals, relpos);
            for (int v : release_after_[k]) vals[std::size_t(v)] = RaggedTensor();
            if (profile_.on()) profile_.add(k, StepProfile::now() - t0);
            // A step that reached a reference kernel (its own, or a host kernel's fallback).
            if (reference_runs != refs)
                ++place.reference[step_op(s)];
            else
                ++place.compiled;
        }
        if (where) *where = std::move(place);
        std::vector<RaggedTensor> out;
        for (int o : f_.outputs) out.push_back(vals[std::size_t(o)]);
        return out;
    }

  private:
    void run_step(const Step& s, std::vector<RaggedTensor>& vals,
                  RelposNodes<RelposOnCpu>& relpos) const {
        if (s.kind == Step::Kind::fused)
            run_group(std::size_t(s.index), vals);
        else if (!run_host_step(f_, s, vals) && !relpos.run(f_, std::size_t(s.index), vals))
            reference(std::size_t(s.index), vals); // relpos: fused tile kernels
    }

    // The op a step is reported under: the node's op, or "fused" for a fused group.
    std::string step_op(const Step& s) const {
        if (s.kind != Step::Kind::fused) return f_.nodes[std::size_t(s.index)].op;
        std::string ops;
        for (int v : plan_.groups[std::size_t(s.index)].nodes)
            ops += (ops.empty() ? "" : "+") + f_.nodes[std::size_t(v)].op;
        return ops;
    }

    void reference(std::size_t i, std::vector<RaggedTensor>& vals) const {
        const ir::Node& n = f_.nodes[i];
        std::vector<RaggedTensor> args;
        for (int a : n.args) args.push_back(vals[std::size_t(a)]);
        vals[i] = reference_kernel(n.op, args, n.attrs);
    }

    void run_group(std::size_t g, std::vector<RaggedTensor>& vals) const {
        const FusedGroup& grp = plan_.groups[g];
        std::vector<const RaggedTensor*> shaped; // the operands the loop's structure comes from
        for (const auto& in : grp.inputs)
            if (in.access != Access::row && in.access != Access::scalar)
                shaped.push_back(&vals[std::size_t(in.value)]);
        StructurePtr st = broadcast_structure(f_.type(grp.nodes.front()).shape, shaped);
        const bool rowwise = row_mode(grp);
        const std::int64_t width = st ? st->row_width() : 0;
        bool ok = st != nullptr;
        std::vector<void*> in, out;
        std::vector<std::int64_t> rows;
        std::vector<std::vector<std::int64_t>> map_store(grp.inputs.size());
        std::vector<const std::int64_t*> maps(grp.inputs.size(), nullptr);
        for (std::size_t k = 0; ok && k < grp.inputs.size(); ++k) {
            const RaggedTensor& t = vals[std::size_t(grp.inputs[k].value)];
            in.push_back(const_cast<void*>(t.data()));
            rows.push_back(std::max<std::int64_t>(t.numel(), 1));
            const Access a = grp.inputs[k].access;
            if (a == Access::row && rowwise && width % rows.back() != 0) ok = false;
            if (a == Access::gather && t.structure().row_width() != width) ok = false;
            if (ok && (a == Access::gather || a == Access::gather_bcast)) {
                map_store[k] = gather_rows(*st, t);
                maps[k] = map_store[k].data();
            }
        }
        if (!ok) { // unequal runtime extents: the reference kernels say which sample
            for (int v : grp.nodes) reference(std::size_t(v), vals);
            return;
        }
        for (int o : grp.outputs) {
            vals[std::size_t(o)] = uninitialized(f_.type(o).dtype, st); // bool or grp.dtype
            out.push_back(vals[std::size_t(o)].mutable_data());
        }
        Kernel k = kernels_[g];
        if (rowwise) {
            if (width == 0) return;
            parallel_for(st->rows(), std::max<std::int64_t>(1, (1 << 15) / width),
                         [&](std::int64_t b, std::int64_t e) {
                             k(b, e, in.data(), out.data(), rows.data(), maps.data(), width);
                         });
            return;
        }
        // Chunks of whole 64-element blocks: where the vectorised body ends and the scalar tail
        // begins (whose math may round differently) then depends on the element count alone.
        constexpr std::int64_t block = 64;
        const std::int64_t n = st->numel();
        parallel_for((n + block - 1) / block, (1 << 15) / block,
                     [&](std::int64_t b, std::int64_t e) {
                         k(b * block, std::min(e * block, n), in.data(), out.data(), rows.data(),
                           maps.data(), width);
                     });
    }

    ir::Function f_;
    Plan plan_;
    std::vector<std::vector<int>> release_after_; // release_points(f_, plan_)
    std::string ir_;
    llvm::orc::ResourceTrackerSP tracker_;
    std::vector<Kernel> kernels_;
    StepProfile profile_;
};

} // namespace

bool run_host_step(const ir::Function& f, const Step& s, std::vector<RaggedTensor>& vals) {
    const ir::Node& n = f.nodes[std::size_t(s.index)];
    RaggedTensor& out = vals[std::size_t(s.index)];
    switch (s.kind) {
    case Step::Kind::segmented:
        out = run_segmented(n, vals);
        return true;
    case Step::Kind::layout:
        out = run_layout(n, vals);
        return true;
    case Step::Kind::gather:
        out = run_gather_step(n, vals);
        return true;
    case Step::Kind::image:
        out = run_image_step(n, vals);
        return true;
    case Step::Kind::nn:
        out = run_nn_step(n, vals);
        return true;
    case Step::Kind::rowwise:
        run_rowwise(f, s.index, s.also, vals);
        return true;
    case Step::Kind::attention:
        if (is_biased_attention(n))
            run_biased_attention(f, s.index, s.also, vals);
        else
            run_attention(f, s.index, s.also, vals);
        return true;
    case Step::Kind::gemm:
        run_gemm(n, out, vals);
        return true;
    case Step::Kind::fused:
    case Step::Kind::relpos: // the caller's RelposNodes
    case Step::Kind::reference:
        break;
    }
    return false;
}

std::unique_ptr<CpuFunction> compile_cpu(const ir::Function& f) {
    return std::make_unique<CompiledCpu>(f);
}

} // namespace rag::jit
