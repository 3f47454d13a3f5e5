// The NVPTX lowering of the kernel IR: KirLowering with libdevice math and `threads` loops
// spread over a block (see jit/kir_nvptx.hpp for the execution model and the entry ABI).
#include "jit/kir_nvptx.hpp"

#include "jit/elementwise_llvm.hpp"
#include "jit/kir_llvm.hpp"
#include "jit/nvptx.hpp"
#include "runtime/error.hpp"

#include <llvm/IR/IntrinsicsNVPTX.h>

namespace rag::jit {
namespace {

using kir::Stmt;

class NvptxLowering final : public KirLowering {
  public:
    using KirLowering::KirLowering;

    void build() {
        auto& ctx = m_.getContext();
        auto* i64 = b_.getInt64Ty();
        auto* ptr = llvm::PointerType::get(ctx, 0);
        std::vector<llvm::Type*> types(1 + k_.params.size(), i64);
        types.insert(types.end(), k_.globals() + 1, ptr);
        auto* fn = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), types, false),
                                          llvm::Function::ExternalLinkage, k_.name, m_);
        mark_kernel(*fn, kKirBlock);
        b_.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
        llvm::Value* grid = fn->getArg(0);
        std::vector<llvm::Value*> params, buffers, scratch_at;
        for (unsigned p = 0; p < k_.params.size(); ++p) params.push_back(fn->getArg(1 + p));
        unsigned global = unsigned(1 + k_.params.size());
        llvm::Value* scratch = fn->getArg(unsigned(fn->arg_size() - 1));
        // This block's scratch: the arrays at 64-byte aligned offsets, blockIdx.x regions in.
        llvm::Value* offset = b_.getInt64(0);
        for (const auto& buf : k_.buffers) {
            if (buf.space == kir::Space::global) {
                buffers.push_back(fn->getArg(global++));
                scratch_at.push_back(nullptr);
                continue;
            }
            buffers.push_back(nullptr);
            scratch_at.push_back(offset);
            llvm::Value* bytes = b_.CreateMul(emit_param_expr(buf.size, params), b_.getInt64(4));
            offset = b_.CreateAnd(b_.CreateAdd(b_.CreateAdd(offset, bytes), b_.getInt64(63)),
                                  b_.getInt64(~std::int64_t(63)));
        }
        llvm::Value* block = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x);
        llvm::Value* mine = b_.CreateGEP(b_.getInt8Ty(), scratch, b_.CreateMul(block, offset));
        for (std::size_t k = 0; k < buffers.size(); ++k)
            if (!buffers[k]) buffers[k] = b_.CreateGEP(b_.getInt8Ty(), mine, scratch_at[k]);
        tid_ = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x);
        ntid_ = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x);
        llvm::Value* blocks = sreg(llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x);
        auto* pre = b_.GetInsertBlock();
        auto* head = llvm::BasicBlock::Create(ctx, "instances", fn);
        auto* body = llvm::BasicBlock::Create(ctx, "instance", fn);
        auto* exit = llvm::BasicBlock::Create(ctx, "done", fn);
        b_.CreateBr(head);
        b_.SetInsertPoint(head);
        auto* pid = b_.CreatePHI(i64, 2);
        pid->addIncoming(block, pre);
        b_.CreateCondBr(b_.CreateICmpSLT(pid, grid), body, exit);
        b_.SetInsertPoint(body);
        emit_body(pid, params, buffers);
        barrier(); // the next instance reuses the scratch
        pid->addIncoming(b_.CreateAdd(pid, blocks), b_.GetInsertBlock());
        b_.CreateBr(head);
        b_.SetInsertPoint(exit);
        b_.CreateRetVoid();
    }

  protected:
    llvm::Value* math(kir::Op op, llvm::Value* x) override {
        const MathFn f = op == kir::Op::exp   ? MathFn::exp
                         : op == kir::Op::log ? MathFn::log
                                              : MathFn::sqrt;
        return libdevice_math().call(b_, m_, f, {x});
    }

    void threads_loop(const Stmt& s) override {
        if (depth_ > 0) return KirLowering::threads_loop(s);
        barrier();
        llvm::Value* lo = value(s.a);
        llvm::Value* hi = value(s.b);
        ++depth_;
        serial_loop(s, b_.CreateAdd(lo, tid_), hi, ntid_);
        --depth_;
        barrier();
    }

    // Serial code runs in every thread: a store there is made by thread 0 alone (a repeated
    // read-modify-write would add up), between barriers so that no thread still reads the old
    // value and every thread sees the new one.
    void store(const Stmt& s) override {
        if (depth_ > 0) return KirLowering::store(s);
        barrier();
        llvm::Function* fn = b_.GetInsertBlock()->getParent();
        auto* then = llvm::BasicBlock::Create(m_.getContext(), "thread0", fn);
        auto* done = llvm::BasicBlock::Create(m_.getContext(), "stored", fn);
        b_.CreateCondBr(b_.CreateICmpEQ(tid_, b_.getInt64(0)), then, done);
        b_.SetInsertPoint(then);
        KirLowering::store(s);
        b_.CreateBr(done);
        b_.SetInsertPoint(done);
        barrier();
    }

  private:
    llvm::Value* sreg(llvm::Intrinsic::ID id) {
        return b_.CreateZExt(b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, id)),
                             b_.getInt64Ty());
    }
    void barrier() {
        b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, llvm::Intrinsic::nvvm_barrier0));
    }

    llvm::Value* tid_ = nullptr;
    llvm::Value* ntid_ = nullptr;
    int depth_ = 0;
};

} // namespace

std::string kir_ptx(const kir::Kernel& k, const std::string& arch) {
    llvm::LLVMContext ctx;
    auto m = new_nvptx_module("kir_" + k.name, ctx, arch);
    NvptxLowering(*m, k).build();
    return compile_ptx(*m, PtxOptions{arch, false});
}

std::int64_t kir_scratch_bytes(const kir::Kernel& k, std::span<const std::int64_t> params) {
    std::int64_t offset = 0;
    for (const auto& buf : k.buffers)
        if (buf.space == kir::Space::scratch)
            offset = (offset + kir::evaluate(buf.size, params) * 4 + 63) / 64 * 64;
    return offset;
}

} // namespace rag::jit
