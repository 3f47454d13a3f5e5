// The fused elementwise groups of a plan as NVPTX kernels (see jit/ptx.hpp for their ABI).
#include "jit/elementwise_llvm.hpp"
#include "jit/kir_emulator.hpp"
#include "jit/llvm_jit.hpp"
#include "jit/nvptx.hpp"
#include "jit/ptx.hpp"
#include "runtime/error.hpp"

#include <llvm/AsmParser/Parser.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>

#include <atomic>
#include <map>
#include <sstream>

namespace rag::jit {
namespace {

// A special register: the intrinsic, or in emulation (thread: the EmuThread* parameter) the
// field at `emu_offset`.
llvm::Value* sreg(llvm::IRBuilder<>& b, llvm::Module& m, llvm::Intrinsic::ID id,
                  llvm::Value* thread, int emu_offset) {
    if (thread)
        return b.CreateLoad(b.getInt64Ty(),
                            b.CreateConstGEP1_64(b.getInt8Ty(), thread, std::uint64_t(emu_offset)));
    return b.CreateZExt(b.CreateCall(llvm::Intrinsic::getDeclaration(&m, id)), b.getInt64Ty());
}

// The group's kernel; `emulated`: built for the host (jit/kir_emulator.hpp), with an EmuThread*
// after the ABI's parameters and the host's math.
llvm::Function* emit_group_kernel(llvm::Module& m, const ir::Function& f, const FusedGroup& g,
                                  const std::string& name, bool emulated = false) {
    llvm::LLVMContext& ctx = m.getContext();
    llvm::IRBuilder<> b(ctx);
    llvm::Type* t = g.dtype == DType::f32 ? b.getFloatTy() : b.getDoubleTy();
    auto* i64 = b.getInt64Ty();
    auto* ptr = llvm::PointerType::get(ctx, 0);
    std::vector<llvm::Type*> params = {i64};
    for (std::size_t k = 0; k < g.inputs.size(); ++k) {
        params.push_back(ptr);
        params.push_back(i64);
    }
    for (std::size_t k = 0; k < g.outputs.size(); ++k) params.push_back(ptr);
    if (emulated) params.push_back(ptr);
    auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), params, false),
                                      llvm::Function::ExternalLinkage, name, m);
    llvm::Value* thread = emulated ? fn->getArg(fn->arg_size() - 1) : nullptr;
    if (!emulated) mark_kernel(*fn, kFusedBlock);
    // Inputs are only read and outputs are fresh buffers: noalias lets NVPTX use the read-only
    // data cache (ld.global.nc) for the inputs.
    for (unsigned a = 1; a < fn->arg_size(); ++a)
        if (fn->getArg(a)->getType()->isPointerTy()) fn->addParamAttr(a, llvm::Attribute::NoAlias);
    for (std::size_t k = 0; k < g.inputs.size(); ++k)
        fn->addParamAttr(unsigned(1 + 2 * k), llvm::Attribute::ReadOnly);

    auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
    auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
    auto* body = llvm::BasicBlock::Create(ctx, "body", fn);
    auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
    b.SetInsertPoint(entry);
    llvm::Value* n = fn->getArg(0);
    llvm::Value* ntid = sreg(b, m, llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x, thread, kEmuNtid);
    llvm::Value* first = b.CreateAdd(
        b.CreateMul(sreg(b, m, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, thread, kEmuCtaid),
                    ntid),
        sreg(b, m, llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, thread, kEmuTid));
    llvm::Value* stride = b.CreateMul(
        ntid, sreg(b, m, llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x, thread, kEmuNctaid));
    b.CreateBr(loop);
    b.SetInsertPoint(loop);
    auto* i = b.CreatePHI(i64, 2);
    i->addIncoming(first, entry);
    b.CreateCondBr(b.CreateICmpSLT(i, n), body, exit);
    b.SetInsertPoint(body);
    std::map<int, llvm::Value*> vals;
    for (std::size_t k = 0; k < g.inputs.size(); ++k) {
        llvm::Value* x = fn->getArg(unsigned(1 + 2 * k));
        llvm::Value* len = fn->getArg(unsigned(2 + 2 * k));
        llvm::Value* at = g.inputs[k].access == Access::full  ? static_cast<llvm::Value*>(i)
                          : g.inputs[k].access == Access::row ? b.CreateURem(i, len)
                                                              : b.getInt64(0);
        const DType stored = f.type(g.inputs[k].value).dtype;
        llvm::Type* st = storage_type(b, stored, t);
        vals[g.inputs[k].value] =
            from_storage(b, b.CreateLoad(st, b.CreateGEP(st, x, at)), stored, t);
    }
    for (int v : g.nodes) {
        const ir::Node& node = f.nodes[std::size_t(v)];
        std::vector<llvm::Value*> args;
        for (int a : node.args) args.push_back(vals.at(a));
        vals[v] = emit_elementwise(b, m, emulated ? host_math() : libdevice_math(), node, args, t);
    }
    const unsigned out0 = unsigned(1 + 2 * g.inputs.size());
    for (std::size_t k = 0; k < g.outputs.size(); ++k) {
        const DType stored = f.type(g.outputs[k]).dtype;
        b.CreateStore(to_storage(b, vals.at(g.outputs[k]), stored, t),
                      b.CreateGEP(storage_type(b, stored, t), fn->getArg(out0 + unsigned(k)), i));
    }
    i->addIncoming(b.CreateAdd(i, stride), body);
    b.CreateBr(loop);
    b.SetInsertPoint(exit);
    b.CreateRetVoid();
    return fn;
}

using EmuEntry = void (*)(void* const* params, EmuThread* thread);

// The fused kernels built for the host: each behind a wrapper taking cuLaunchKernel's
// parameter array, so one launch runs as it would on the device, thread by thread.
class CompiledEmulatedFused final : public EmulatedFused {
  public:
    CompiledEmulatedFused(const ir::Function& f, const Plan& plan) {
        static std::atomic<int> counter{0};
        const std::string prefix = "emu_fused_" + std::to_string(counter++) + "_";
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = new_module(prefix, *ctx);
        for (std::size_t g = 0; g < plan.groups.size(); ++g) {
            llvm::Function* k =
                emit_group_kernel(*m, f, plan.groups[g], prefix + "k" + std::to_string(g), true);
            llvm::IRBuilder<> b(*ctx);
            auto* ptr = llvm::PointerType::get(*ctx, 0);
            auto* w = llvm::Function::Create(
                llvm::FunctionType::get(b.getVoidTy(), {ptr, ptr}, false),
                llvm::Function::ExternalLinkage, prefix + std::to_string(g), *m);
            b.SetInsertPoint(llvm::BasicBlock::Create(*ctx, "entry", w));
            std::vector<llvm::Value*> args;
            for (unsigned a = 0; a + 1 < k->arg_size(); ++a) {
                llvm::Value* at = b.CreateLoad(ptr, b.CreateConstGEP1_64(ptr, w->getArg(0), a));
                args.push_back(b.CreateLoad(k->getArg(a)->getType(), at));
            }
            args.push_back(w->getArg(1));
            b.CreateCall(k, args);
            b.CreateRetVoid();
        }
        for (void* e : add_module(std::move(m), std::move(ctx), plan.groups.size(), prefix, nullptr,
                                  &tracker_))
            entries_.push_back(reinterpret_cast<EmuEntry>(e));
    }
    ~CompiledEmulatedFused() override { remove_module(tracker_); }

    void launch(std::size_t group, unsigned blocks,
                const std::vector<void*>& params) const override {
        for (unsigned blk = 0; blk < blocks; ++blk)
            for (int tid = 0; tid < kFusedBlock; ++tid) {
                EmuThread t{tid, kFusedBlock, blk, blocks, nullptr, nullptr, nullptr};
                entries_.at(group)(params.data(), &t);
            }
    }

  private:
    std::vector<EmuEntry> entries_;
    llvm::orc::ResourceTrackerSP tracker_;
};

// PTX identifiers: letters, digits, _ and $.
std::string ptx_identifier(const std::string& s) {
    std::string out;
    for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return out;
}

} // namespace

PtxProgram fused_ptx(const ir::Function& f, const Plan& plan, const std::string& arch, bool ftz) {
    PtxProgram out;
    out.arch = arch;
    llvm::LLVMContext ctx;
    auto m = new_nvptx_module("rag_" + ptx_identifier(f.name), ctx, arch);
    for (std::size_t g = 0; g < plan.groups.size(); ++g) {
        PtxKernel k;
        k.name = "rag_" + ptx_identifier(f.name) + "_fused" + std::to_string(g);
        k.group = int(g);
        for (int v : plan.groups[g].nodes) {
            if (!k.description.empty()) k.description += ", ";
            k.description += "%" + std::to_string(v) + " " + f.nodes[std::size_t(v)].op;
        }
        emit_group_kernel(*m, f, plan.groups[g], k.name);
        out.kernels.push_back(std::move(k));
    }
    out.ptx = compile_ptx(*m, PtxOptions{arch, ftz});
    return out;
}

std::unique_ptr<EmulatedFused> compile_fused_emulated(const ir::Function& f, const Plan& plan) {
    return std::make_unique<CompiledEmulatedFused>(f, plan);
}

std::string ptx_from_llvm_ir(const std::string& ir, const std::string& arch, bool ftz) {
    llvm::LLVMContext ctx;
    llvm::SMDiagnostic diag;
    auto m = llvm::parseAssemblyString(ir, diag, ctx);
    if (!m) {
        std::string msg;
        llvm::raw_string_ostream os(msg);
        diag.print("ir", os);
        fail("NVPTX: cannot parse LLVM IR: ", os.str());
    }
    auto layout = new_nvptx_module("layout", ctx, arch);
    m->setTargetTriple(layout->getTargetTriple());
    m->setDataLayout(layout->getDataLayout());
    return compile_ptx(*m, PtxOptions{arch, ftz});
}

std::string describe(const PtxProgram& p, const ir::Function& f, const Plan& plan) {
    std::ostringstream os;
    os << "// rag: " << p.kernels.size() << " GPU kernel" << (p.kernels.size() == 1 ? "" : "s")
       << " of " << f.name << " for " << p.arch << "\n";
    for (const PtxKernel& k : p.kernels) os << "//   " << k.name << ": " << k.description << "\n";
    int other = 0;
    for (const Step& s : plan.steps) other += s.kind != Step::Kind::fused;
    if (other)
        os << "// " << other << " other plan step" << (other == 1 ? "" : "s")
           << ": kernel-IR programs on the device (GEMMs, norms, attention, reductions; not in "
              "this module) or host kernels (see jit/gpu_function.hpp)\n";
    os << p.ptx;
    return os.str();
}

} // namespace rag::jit
