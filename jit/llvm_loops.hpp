// Counted loops and reductions for hand-written LLVM kernels (internal to jit/). Kernels built
// with these take every extent as a runtime argument, so one compiled function serves every
// length; the O3 pipeline vectorises the innermost loops (reductions carry `reassoc` so the
// vectoriser may reorder their sums).
#pragma once
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <functional>
#include <string>
#include <vector>

namespace rag::jit {

class LoopBuilder {
  public:
    // A new function `name` in `m` returning void with these parameter types; every pointer
    // parameter is marked noalias (kernels never pass one buffer twice) so loops vectorise
    // without runtime alias checks.
    LoopBuilder(llvm::Module& m, const std::string& name, std::vector<llvm::Type*> params)
        : b(m.getContext()), m_(m) {
        auto* fty = llvm::FunctionType::get(b.getVoidTy(), params, false);
        fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m);
        for (auto& a : fn->args())
            if (a.getType()->isPointerTy()) a.addAttr(llvm::Attribute::NoAlias);
        b.SetInsertPoint(llvm::BasicBlock::Create(m.getContext(), "entry", fn));
    }

    llvm::Value* arg(unsigned k) { return fn->getArg(k); }
    llvm::Value* i64(std::int64_t v) { return b.getInt64(v); }
    llvm::Type* ptr() { return llvm::PointerType::get(m_.getContext(), 0); }

    // for (i = begin; i < end; ++i) body(i)
    void loop(llvm::Value* begin, llvm::Value* end, const std::function<void(llvm::Value*)>& body) {
        reduce(begin, end, {}, [&](llvm::Value* i, const std::vector<llvm::Value*>&) {
            body(i);
            return std::vector<llvm::Value*>{};
        });
    }

    // acc = init; for (i = begin; i < end; ++i) acc = body(i, acc); returns acc.
    std::vector<llvm::Value*>
    reduce(llvm::Value* begin, llvm::Value* end, std::vector<llvm::Value*> init,
           const std::function<std::vector<llvm::Value*>(llvm::Value*,
                                                         const std::vector<llvm::Value*>&)>& body) {
        auto& ctx = m_.getContext();
        auto* pre = b.GetInsertBlock();
        auto* head = llvm::BasicBlock::Create(ctx, "head", fn);
        auto* bodyb = llvm::BasicBlock::Create(ctx, "body", fn);
        auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
        b.CreateBr(head);
        b.SetInsertPoint(head);
        auto* i = b.CreatePHI(b.getInt64Ty(), 2);
        i->addIncoming(begin, pre);
        std::vector<llvm::PHINode*> acc;
        std::vector<llvm::Value*> cur;
        for (llvm::Value* v : init) {
            acc.push_back(b.CreatePHI(v->getType(), 2));
            acc.back()->addIncoming(v, pre);
            cur.push_back(acc.back());
        }
        b.CreateCondBr(b.CreateICmpSLT(i, end), bodyb, exit);
        b.SetInsertPoint(bodyb);
        std::vector<llvm::Value*> next = body(i, cur);
        auto* latch = b.GetInsertBlock();
        i->addIncoming(b.CreateAdd(i, b.getInt64(1)), latch);
        for (std::size_t k = 0; k < acc.size(); ++k) acc[k]->addIncoming(next[k], latch);
        b.CreateBr(head);
        b.SetInsertPoint(exit);
        return cur;
    }

    // Element `index` of a `t` array.
    llvm::Value* load(llvm::Type* t, llvm::Value* base, llvm::Value* index) {
        return b.CreateLoad(t, b.CreateGEP(t, base, index));
    }
    void store(llvm::Value* v, llvm::Value* base, llvm::Value* index) {
        b.CreateStore(v, b.CreateGEP(v->getType(), base, index));
    }
    // A sum that the vectoriser may reassociate.
    llvm::Value* add_reassoc(llvm::Value* a, llvm::Value* c) {
        auto* v = b.CreateFAdd(a, c);
        llvm::FastMathFlags f;
        f.setAllowReassoc();
        llvm::cast<llvm::Instruction>(v)->setFastMathFlags(f);
        return v;
    }

    void finish() { b.CreateRetVoid(); }

    llvm::IRBuilder<> b;
    llvm::Function* fn = nullptr;

  private:
    llvm::Module& m_;
};

} // namespace rag::jit
