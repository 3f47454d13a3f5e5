#include "jit/cpu_jit.hpp"

#include "jit/elementwise_llvm.hpp"
#include "jit/llvm_jit.hpp"
#include "jit/segmented.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <cblas.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>

#include <atomic>
#include <map>

namespace rag::jit {
namespace {

using Kernel = void (*)(std::int64_t begin, std::int64_t end, void* const* in, void* const* out,
                        const std::int64_t* rows);

// Emits the body of one fused loop: element i of every output from element i of the inputs.
class GroupEmitter {
  public:
    GroupEmitter(llvm::Module& m, const ir::Function& f, const FusedGroup& g)
        : m_(m), f_(f), g_(g), b_(m.getContext()),
          t_(g.dtype == DType::f32 ? b_.getFloatTy() : b_.getDoubleTy()) {}

    void emit(const std::string& name) {
        auto& ctx = m_.getContext();
        auto* i64 = b_.getInt64Ty();
        auto* ptr = llvm::PointerType::get(ctx, 0);
        auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {i64, i64, ptr, ptr, ptr}, false);
        auto* fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
        auto args = fn->arg_begin();
        llvm::Value *begin = args++, *end = args++, *ins = args++, *outs = args++, *rows = args++;
        auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
        auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
        auto* body = llvm::BasicBlock::Create(ctx, "body", fn);
        auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
        b_.SetInsertPoint(entry);
        std::vector<llvm::Value*> in_ptr, row_len, out_ptr;
        for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
            in_ptr.push_back(b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, ins, k)));
            row_len.push_back(b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, rows, k)));
        }
        for (std::size_t k = 0; k < g_.outputs.size(); ++k)
            out_ptr.push_back(b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, outs, k)));
        b_.CreateBr(loop);
        b_.SetInsertPoint(loop);
        auto* i = b_.CreatePHI(i64, 2);
        i->addIncoming(begin, entry);
        b_.CreateCondBr(b_.CreateICmpSLT(i, end), body, exit);
        b_.SetInsertPoint(body);
        for (std::size_t k = 0; k < g_.inputs.size(); ++k) {
            llvm::Value* at = g_.inputs[k].access == Access::full  ? static_cast<llvm::Value*>(i)
                              : g_.inputs[k].access == Access::row ? b_.CreateURem(i, row_len[k])
                                                                   : b_.getInt64(0);
            vals_[g_.inputs[k].value] = b_.CreateLoad(t_, b_.CreateGEP(t_, in_ptr[k], at));
        }
        for (int v : g_.nodes) {
            const ir::Node& n = f_.nodes[std::size_t(v)];
            std::vector<llvm::Value*> args;
            for (int a : n.args) args.push_back(vals_.at(a));
            vals_[v] = emit_elementwise(b_, m_, host_math(), n, args, t_);
        }
        for (std::size_t k = 0; k < g_.outputs.size(); ++k)
            b_.CreateStore(vals_[g_.outputs[k]], b_.CreateGEP(t_, out_ptr[k], i));
        i->addIncoming(b_.CreateAdd(i, b_.getInt64(1)), body);
        b_.CreateBr(loop);
        b_.SetInsertPoint(exit);
        b_.CreateRetVoid();
    }

  private:
    llvm::Module& m_;
    const ir::Function& f_;
    const FusedGroup& g_;
    llvm::IRBuilder<> b_;
    llvm::Type* t_;
    std::map<int, llvm::Value*> vals_;
};

class CompiledCpu final : public CpuFunction {
  public:
    explicit CompiledCpu(const ir::Function& f) : f_(f), plan_(make_plan(f)) {
        static std::atomic<int> counter{0};
        const std::string prefix = "rag_" + std::to_string(counter++) + "_";
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = new_module(prefix + f.name, *ctx);
        for (std::size_t g = 0; g < plan_.groups.size(); ++g)
            GroupEmitter(*m, f_, plan_.groups[g]).emit(prefix + std::to_string(g));
        std::string err;
        llvm::raw_string_ostream es(err);
        if (llvm::verifyModule(*m, &es))
            fail("internal: the CPU JIT built invalid LLVM IR: ", es.str());
        for (void* k :
             add_module(std::move(m), std::move(ctx), plan_.groups.size(), prefix, &ir_, &tracker_))
            kernels_.push_back(reinterpret_cast<Kernel>(k));
    }
    ~CompiledCpu() override { remove_module(tracker_); }

    const Plan& plan() const override { return plan_; }
    const std::string& llvm_ir() const override { return ir_; }

    std::vector<RaggedTensor> run(const std::vector<RaggedTensor>& inputs) const override {
        if (inputs.size() != f_.inputs.size())
            fail(f_.name, " takes ", f_.inputs.size(), " tensors, got ", inputs.size());
        std::vector<RaggedTensor> vals(f_.nodes.size());
        for (std::size_t i = 0; i < f_.nodes.size(); ++i) {
            const ir::Node& n = f_.nodes[i];
            if (n.op == "input") {
                std::size_t k = std::size_t(n.attrs.get_int("index"));
                if (inputs[k].schema() != n.type)
                    fail(f_.name, ": argument ", k, (n.label.empty() ? "" : " (" + n.label + ")"),
                         " has schema ", inputs[k].schema().str(), ", expected ", n.type.str());
                vals[i] = inputs[k];
            } else if (n.op == "const") {
                vals[i] = RaggedTensor::dense(
                    DenseArray::from_f64(n.type.dtype, {}, {n.attrs.get_float("value")}));
            }
        }
        for (const Step& s : plan_.steps) {
            if (s.kind == Step::Kind::fused)
                run_group(std::size_t(s.index), vals);
            else if (s.kind == Step::Kind::segmented)
                vals[std::size_t(s.index)] = run_segmented(f_.nodes[std::size_t(s.index)], vals);
            else if (s.kind == Step::Kind::gemm)
                run_gemm(f_.nodes[std::size_t(s.index)], vals[std::size_t(s.index)], vals);
            else
                reference(std::size_t(s.index), vals);
        }
        std::vector<RaggedTensor> out;
        for (int o : f_.outputs) out.push_back(vals[std::size_t(o)]);
        return out;
    }

  private:
    void reference(std::size_t i, std::vector<RaggedTensor>& vals) const {
        const ir::Node& n = f_.nodes[i];
        std::vector<RaggedTensor> args;
        for (int a : n.args) args.push_back(vals[std::size_t(a)]);
        vals[i] = evaluate(n.op, args, n.attrs);
    }

    void run_group(std::size_t g, std::vector<RaggedTensor>& vals) const {
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
        if (!shape_from ||
            !same) { // unequal runtime extents: the reference kernels say which sample
            for (int v : grp.nodes) reference(std::size_t(v), vals);
            return;
        }
        const StructurePtr& st = shape_from->structure_ptr();
        std::vector<void*> in, out;
        std::vector<std::int64_t> rows;
        for (const auto& x : grp.inputs) {
            const RaggedTensor& t = vals[std::size_t(x.value)];
            in.push_back(const_cast<void*>(t.data()));
            rows.push_back(std::max<std::int64_t>(t.numel(), 1));
        }
        for (int o : grp.outputs) {
            vals[std::size_t(o)] = RaggedTensor::zeros(grp.dtype, st);
            out.push_back(vals[std::size_t(o)].mutable_data());
        }
        Kernel k = kernels_[g];
        parallel_for(st->numel(), 1 << 15, [&](std::int64_t b, std::int64_t e) {
            k(b, e, in.data(), out.data(), rows.data());
        });
    }

    // x @ W over packed rows, or the weight gradient x^T g over packed rows: one GEMM each,
    // whatever the ragged structure of x.
    static void run_gemm(const ir::Node& n, RaggedTensor& result,
                         const std::vector<RaggedTensor>& vals) {
        const RaggedTensor& a = vals[std::size_t(n.args[0])];
        const RaggedTensor& b = vals[std::size_t(n.args[1])];
        const bool weight_grad = n.op == "matmul_weight_grad";
        const std::int64_t C = weight_grad ? n.type.shape.axes[0].extent : b.shape().axes[0].extent;
        const std::int64_t D = weight_grad ? n.type.shape.axes[1].extent : b.shape().axes[1].extent;
        if (weight_grad) {
            result = RaggedTensor::zeros(n.type.dtype, Structure::make(n.type.shape, 1, {C, D}));
        } else {
            std::vector<std::int64_t> sizes = a.structure().sizes();
            const int d = a.structure().rank();
            for (std::int64_t i = 0; i < a.batch(); ++i) sizes[std::size_t(i * d + d - 1)] = D;
            result =
                RaggedTensor::zeros(n.type.dtype, Structure::make(n.type.shape, a.batch(), sizes));
        }
        const std::int64_t rows = C ? a.numel() / C : 0;
        if (rows == 0 || C == 0 || D == 0) return; // zeros
        // Row-major: out[rows, D] = a[rows, C] b[C, D], or out[C, D] = a[rows, C]^T b[rows, D].
        const auto ta = weight_grad ? CblasTrans : CblasNoTrans;
        const int m = int(weight_grad ? C : rows), k = int(weight_grad ? rows : C);
        if (n.type.dtype == DType::f32)
            cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, m, int(D), k, 1.0f,
                        static_cast<const float*>(a.data()), int(C),
                        static_cast<const float*>(b.data()), int(D), 0.0f,
                        static_cast<float*>(result.mutable_data()), int(D));
        else
            cblas_dgemm(CblasRowMajor, ta, CblasNoTrans, m, int(D), k, 1.0,
                        static_cast<const double*>(a.data()), int(C),
                        static_cast<const double*>(b.data()), int(D), 0.0,
                        static_cast<double*>(result.mutable_data()), int(D));
    }

    ir::Function f_;
    Plan plan_;
    std::string ir_;
    llvm::orc::ResourceTrackerSP tracker_;
    std::vector<Kernel> kernels_;
};

} // namespace

std::unique_ptr<CpuFunction> compile_cpu(const ir::Function& f) {
    return std::make_unique<CompiledCpu>(f);
}

} // namespace rag::jit
