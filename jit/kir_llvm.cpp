#include "jit/kir_llvm.hpp"

#include "jit/kir_cpu.hpp"
#include "jit/llvm_jit.hpp"
#include "runtime/error.hpp"
#include "runtime/memory.hpp"
#include "runtime/parallel.hpp"

#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/Transforms/Utils/ModuleUtils.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

namespace rag::jit {

using kir::Op;
using kir::Stmt;

KirLowering::KirLowering(llvm::Module& m, const kir::Kernel& k)
    : m_(m), k_(k), b_(m.getContext()), index_(b_.getInt64Ty()) {
    // Sums may be reassociated (vectorised dot products) and contracted into FMAs: the order
    // is still fixed at compile time, so every run of the same code gives the same bits.
    // Infinities stay meaningful: masked scores are -inf.
    llvm::FastMathFlags fmf;
    fmf.setAllowReassoc();
    fmf.setAllowContract();
    fmf.setNoSignedZeros();
    b_.setFastMathFlags(fmf);
}

void KirLowering::alias_scopes() {
    llvm::MDBuilder mdb(m_.getContext());
    llvm::MDNode* domain = mdb.createAnonymousAliasScopeDomain("kir");
    llvm::MDNode* globals = mdb.createAnonymousAliasScope(domain, "globals");
    std::vector<llvm::MDNode*> scopes, distinct = {globals};
    for (const auto& buf : k_.buffers) {
        const bool global = buf.space == kir::Space::global;
        scopes.push_back(global ? globals : mdb.createAnonymousAliasScope(domain, buf.name));
        if (!global) distinct.push_back(scopes.back());
    }
    scope_.clear();
    noalias_.clear();
    for (llvm::MDNode* mine : scopes) {
        std::vector<llvm::Metadata*> others;
        for (llvm::MDNode* d : distinct)
            if (d != mine) others.push_back(d);
        scope_.push_back(llvm::MDNode::get(m_.getContext(), {mine}));
        noalias_.push_back(llvm::MDNode::get(m_.getContext(), others));
    }
}

llvm::Type* KirLowering::type(kir::Type t) {
    switch (t) {
    case kir::Type::i1:
        return b_.getInt1Ty();
    case kir::Type::i64:
        return index_;
    case kir::Type::f32:
        return b_.getFloatTy();
    }
    return nullptr;
}

void KirLowering::emit_body(llvm::Value* pid, std::vector<llvm::Value*> params,
                            std::vector<llvm::Value*> buffers) {
    // The entry's i64 program id and parameters, as the kernel's integers.
    pid_ = b_.CreateSExtOrTrunc(pid, index_);
    params_.clear();
    for (llvm::Value* p : params) params_.push_back(b_.CreateSExtOrTrunc(p, index_));
    buffers_ = std::move(buffers);
    // Mutable scalars live in entry-block allocas, which mem2reg turns into registers.
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
    vars_.clear();
    for (kir::Type t : k_.vars) vars_.push_back(entry.CreateAlloca(type(t)));
    lets_.clear();
    emit(k_.body);
}

llvm::Value* KirLowering::emit_param_expr(const kir::Expr& e,
                                          const std::vector<llvm::Value*>& params) {
    // In 64 bits whatever the kernel's integers: the wrappers size whole launches with it.
    llvm::IntegerType* kernel_index = index_;
    index_ = b_.getInt64Ty();
    params_ = params;
    llvm::Value* v = value(e);
    index_ = kernel_index;
    return v;
}

void KirLowering::emit(const std::vector<Stmt>& body) {
    for (const Stmt& s : body) emit(s);
}

void KirLowering::emit(const Stmt& s) {
    switch (s.kind) {
    case Stmt::Kind::let:
        lets_[s.id] = value(s.a);
        return;
    case Stmt::Kind::assign:
        b_.CreateStore(value(s.a), vars_[std::size_t(s.id)]);
        return;
    case Stmt::Kind::store:
        store(s);
        return;
    case Stmt::Kind::loop:
        if (s.loop == kir::Loop::threads)
            threads_loop(s);
        else
            serial_loop(s, value(s.a), value(s.b), index(1));
        return;
    case Stmt::Kind::mma:
        mma(*s.mma);
        return;
    case Stmt::Kind::each:
        each(s);
        return;
    case Stmt::Kind::put:
        put(s);
        return;
    case Stmt::Kind::reduce:
        row_reduce(s);
        return;
    case Stmt::Kind::copy:
        copy16(s);
        return;
    case Stmt::Kind::await_copies:
        await_copies(s);
        return;
    case Stmt::Kind::branch: {
        llvm::Function* fn = b_.GetInsertBlock()->getParent();
        auto& ctx = m_.getContext();
        auto* then = llvm::BasicBlock::Create(ctx, "then", fn);
        auto* orelse = llvm::BasicBlock::Create(ctx, "else", fn);
        auto* merge = llvm::BasicBlock::Create(ctx, "endif", fn);
        b_.CreateCondBr(value(s.a), then, orelse);
        b_.SetInsertPoint(then);
        emit(s.body);
        b_.CreateBr(merge);
        b_.SetInsertPoint(orelse);
        emit(s.orelse);
        b_.CreateBr(merge);
        b_.SetInsertPoint(merge);
        return;
    }
    }
}

// Fragments on the CPU: scratch arrays, row-major, every element in order.
void KirLowering::each(const Stmt& s) {
    const std::int64_t cols = kir::fragment_cols(k_.buffers[std::size_t(s.id)]);
    for_range(index(0), index(kir::kFragmentRows), index(1), [&](llvm::Value* r) {
        for_range(index(0), index(cols), index(1), [&](llvm::Value* c) {
            lets_[s.a.node().i] = r;
            lets_[s.b.node().i] = c;
            current_each_ = &s;
            emit(s.body);
            current_each_ = nullptr;
        });
    });
}

llvm::Value* KirLowering::fragment_at(std::int64_t f) {
    auto* r = lets_.at(current_each_->a.node().i);
    auto* c = lets_.at(current_each_->b.node().i);
    const std::int64_t cols = kir::fragment_cols(k_.buffers[std::size_t(f)]);
    llvm::Value* at = cols == 1 ? r : b_.CreateAdd(b_.CreateMul(r, index(cols)), c);
    return b_.CreateGEP(b_.getFloatTy(), buffers_[std::size_t(f)], at);
}

llvm::Value* KirLowering::here(const kir::Node& n) {
    return b_.CreateLoad(b_.getFloatTy(), fragment_at(n.i));
}

void KirLowering::put(const Stmt& s) {
    b_.CreateStore(value(s.a), fragment_at(s.id));
}

void KirLowering::row_reduce(const Stmt& s) {
    const std::int64_t f = s.a.node().i, cols = kir::fragment_cols(k_.buffers[std::size_t(f)]);
    llvm::Type* f32 = b_.getFloatTy();
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
    llvm::Value* acc = entry.CreateAlloca(f32);
    for_range(index(0), index(kir::kFragmentRows), index(1), [&](llvm::Value* r) {
        llvm::Value* row =
            b_.CreateGEP(f32, buffers_[std::size_t(f)], b_.CreateMul(r, index(cols)));
        b_.CreateStore(b_.CreateLoad(f32, row), acc);
        for_range(index(1), index(cols), index(1), [&](llvm::Value* c) {
            llvm::Value* x = b_.CreateLoad(f32, b_.CreateGEP(f32, row, c));
            b_.CreateStore(combine(s.reduce, b_.CreateLoad(f32, acc), x), acc);
        });
        b_.CreateStore(b_.CreateLoad(f32, acc), b_.CreateGEP(f32, buffers_[std::size_t(s.id)], r));
    });
}

void KirLowering::copy16(const Stmt& s) {
    const std::int64_t src = s.c.node().i;
    const kir::Elem e = k_.buffers[std::size_t(s.id)].elem;
    llvm::Type* t = storage_type(e);
    llvm::Value *di = value(s.a), *si = value(s.b);
    for (std::int64_t x = 0; x < s.bytes / kir::elem_bytes(e); ++x) {
        llvm::Value* at = physical(src, b_.CreateAdd(si, index(x)));
        llvm::LoadInst* l = b_.CreateLoad(t, b_.CreateGEP(t, buffers_[std::size_t(src)], at));
        scoped(l, src);
        at = physical(s.id, b_.CreateAdd(di, index(x)));
        scoped(b_.CreateStore(l, b_.CreateGEP(t, buffers_[std::size_t(s.id)], at)), s.id);
    }
}

llvm::Value* KirLowering::combine(kir::Reduce op, llvm::Value* a, llvm::Value* x) {
    if (op == kir::Reduce::sum) return b_.CreateFAdd(a, x);
    return b_.CreateSelect(b_.CreateFCmpOGT(x, a), x, a); // max as the IR's max: NaN-free
}

void KirLowering::threads_loop(const Stmt& s) {
    serial_loop(s, value(s.a), value(s.b), index(1));
}

void KirLowering::serial_loop(const Stmt& s, llvm::Value* lo, llvm::Value* hi, llvm::Value* step) {
    for_range(lo, hi, step, [&](llvm::Value* i) {
        lets_[s.id] = i;
        emit(s.body);
    });
}

void KirLowering::for_range(llvm::Value* lo, llvm::Value* hi, llvm::Value* step,
                            const std::function<void(llvm::Value*)>& body) {
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    auto& ctx = m_.getContext();
    auto* pre = b_.GetInsertBlock();
    auto* head = llvm::BasicBlock::Create(ctx, "loop", fn);
    auto* inside = llvm::BasicBlock::Create(ctx, "body", fn);
    auto* exit = llvm::BasicBlock::Create(ctx, "endloop", fn);
    b_.CreateBr(head);
    b_.SetInsertPoint(head);
    auto* i = b_.CreatePHI(lo->getType(), 2);
    i->addIncoming(lo, pre);
    b_.CreateCondBr(b_.CreateICmpSLT(i, hi), inside, exit);
    b_.SetInsertPoint(inside);
    body(i);
    i->addIncoming(b_.CreateAdd(i, step), b_.GetInsertBlock());
    llvm::BranchInst* latch = b_.CreateBr(head);
    // O3 fully unrolls a constant-trip loop (a tile's J columns, a head's D features) before
    // the loop vectoriser runs; LICM then promotes the unrolled accumulators (4 rows x 64
    // columns) to scalars across the enclosing runtime loop, and the vectoriser turns that
    // loop into hundreds of strided reductions: 700 KB of IR per backward program, seconds of
    // compile time, and spilled registers at run time. Kept as loops, the constant loops are
    // the innermost ones and vectorise along their contiguous index.
    if (keep_constant_loops_ && llvm::isa<llvm::ConstantInt>(lo) &&
        llvm::isa<llvm::ConstantInt>(hi)) {
        auto& c = m_.getContext();
        llvm::MDNode* off =
            llvm::MDNode::get(c, llvm::MDString::get(c, "llvm.loop.unroll.disable"));
        llvm::MDNode* self = llvm::MDNode::getDistinct(c, {nullptr, off});
        self->replaceOperandWith(0, self);
        latch->setMetadata(llvm::LLVMContext::MD_loop, self);
    }
    b_.SetInsertPoint(exit);
}

void KirLowering::mma(const kir::Mma& x) {
    for_range(index(0), index(x.m), index(1), [&](llvm::Value* i) {
        for_range(index(0), index(x.n), index(1), [&](llvm::Value* j) { mma_element(x, i, j); });
    });
}

namespace {
// Whether an offset selects one of several buffers (holds a remainder: t % copies).
bool switches_buffer(const kir::Expr& e) {
    const kir::Node& n = e.node();
    return n.op == kir::Op::rem ||
           std::any_of(n.args.begin(), n.args.end(),
                       [](const kir::Expr& a) { return switches_buffer(a); });
}
} // namespace

llvm::Value* KirLowering::element(const kir::Matrix& mat, llvm::Value* r, llvm::Value* c) {
    const kir::BufferDecl& b = k_.buffers[std::size_t(mat.buf)];
    llvm::Type* t = storage_type(b.elem);
    llvm::Value* in =
        b_.CreateAdd(b_.CreateMul(r, value(mat.row)), b_.CreateMul(c, value(mat.col)));
    // A double buffer's half (an offset t % 2 * whole padded rows) moves the base alone:
    // physical() of the sum is the sum of physical()s, so the element's part stays the same
    // value in every key tile (with the offset inside, the GPU recomputed each ldmatrix address:
    // 10% more instructions a tile). Not for other offsets (the backward's halves): there the
    // extra live base measured 8-40 B more spills.
    if (b.row && kir::multiple_of(mat.offset, b.row) && switches_buffer(mat.offset))
        return b_.CreateGEP(
            t,
            b_.CreateGEP(t, buffers_[std::size_t(mat.buf)], physical(mat.buf, value(mat.offset))),
            physical(mat.buf, in));
    return b_.CreateGEP(t, buffers_[std::size_t(mat.buf)],
                        physical(mat.buf, b_.CreateAdd(value(mat.offset), in)));
}

llvm::Value* KirLowering::physical(std::int64_t buf, llvm::Value* at) {
    const kir::BufferDecl& b = k_.buffers[std::size_t(buf)];
    if (!b.row) return at;
    return b_.CreateAdd(at, b_.CreateMul(b_.CreateUDiv(at, index(b.row)), index(b.pad())));
}

llvm::Value* KirLowering::load_element(const kir::Matrix& mat, llvm::Value* r, llvm::Value* c) {
    const kir::Elem e = k_.buffers[std::size_t(mat.buf)].elem;
    return widen(e, b_.CreateLoad(storage_type(e), element(mat, r, c)));
}

llvm::Type* KirLowering::storage_type(kir::Elem e) {
    switch (e) {
    case kir::Elem::f32:
        return b_.getFloatTy();
    case kir::Elem::f64:
        return b_.getDoubleTy();
    case kir::Elem::f16:
        return b_.getHalfTy();
    case kir::Elem::bf16:
        return b_.getInt16Ty();
    case kir::Elem::i64:
        return b_.getInt64Ty();
    }
    return nullptr;
}

llvm::Value* KirLowering::widen(kir::Elem e, llvm::Value* raw) {
    switch (e) {
    case kir::Elem::f32:
        return raw;
    case kir::Elem::i64:
        return b_.CreateSExtOrTrunc(raw, index_);
    case kir::Elem::f64:
        return b_.CreateFPTrunc(raw, b_.getFloatTy());
    case kir::Elem::f16:
        return b_.CreateFPExt(raw, b_.getFloatTy());
    case kir::Elem::bf16: { // the upper half of an f32
        llvm::Value* bits = b_.CreateShl(b_.CreateZExt(raw, b_.getInt32Ty()), 16);
        return b_.CreateBitCast(bits, b_.getFloatTy());
    }
    }
    return nullptr;
}

llvm::Value* KirLowering::round_to(kir::Precision p, llvm::Value* x) {
    switch (p) {
    case kir::Precision::f32:
        return x;
    case kir::Precision::f16:
        return b_.CreateFPExt(b_.CreateFPTrunc(x, b_.getHalfTy()), b_.getFloatTy());
    case kir::Precision::bf16: {
        llvm::Value* bits = bf16_bits(x); // to nearest even, then back
        bits = b_.CreateShl(b_.CreateZExt(bits, b_.getInt32Ty()), 16);
        return b_.CreateBitCast(bits, b_.getFloatTy());
    }
    }
    return x;
}

llvm::Value* KirLowering::bf16_bits(llvm::Value* x) {
    llvm::Value* bits = b_.CreateBitCast(x, b_.getInt32Ty());
    llvm::Value* odd = b_.CreateAnd(b_.CreateLShr(bits, 16), 1);
    bits = b_.CreateAdd(bits, b_.CreateAdd(b_.getInt32(0x7fff), odd));
    return b_.CreateTrunc(b_.CreateLShr(bits, 16), b_.getInt16Ty());
}

void KirLowering::mma_element(const kir::Mma& x, llvm::Value* i, llvm::Value* j) {
    llvm::Type* f32 = b_.getFloatTy();
    llvm::Value* at = element(x.c, i, j);
    // The accumulator: an entry-block alloca, which mem2reg turns into a register.
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
    llvm::Value* acc = entry.CreateAlloca(f32);
    llvm::Value* c0 = x.accumulate ? static_cast<llvm::Value*>(b_.CreateLoad(f32, at))
                                   : llvm::ConstantFP::get(f32, 0.0);
    b_.CreateStore(c0, acc);
    for_range(index(0), index(x.k), index(1), [&](llvm::Value* l) {
        llvm::Value* a = round_to(x.precision, load_element(x.a, i, l));
        llvm::Value* bv = round_to(x.precision, load_element(x.b, l, j));
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(f32, acc), b_.CreateFMul(a, bv)), acc);
    });
    b_.CreateStore(b_.CreateLoad(f32, acc), at);
}

llvm::Value* KirLowering::math(Op op, llvm::Value* x) {
    const auto id = op == Op::exp   ? llvm::Intrinsic::exp
                    : op == Op::log ? llvm::Intrinsic::log
                                    : llvm::Intrinsic::sqrt;
    return b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, id, {x->getType()}), {x});
}

void KirLowering::scoped(llvm::Instruction* access, std::int64_t buf) {
    if (scope_.empty()) return;
    access->setMetadata(llvm::LLVMContext::MD_alias_scope, scope_[std::size_t(buf)]);
    access->setMetadata(llvm::LLVMContext::MD_noalias, noalias_[std::size_t(buf)]);
}

llvm::Value* KirLowering::load(const kir::Node& n) {
    const auto& buf = k_.buffers[std::size_t(n.i)];
    llvm::Value* at = physical(n.i, value(n.args[0]));
    llvm::Value* base = buffers_[std::size_t(n.i)];
    llvm::Type* t = storage_type(buf.elem);
    llvm::LoadInst* l = b_.CreateLoad(t, b_.CreateGEP(t, base, at));
    scoped(l, n.i);
    return widen(buf.elem, l);
}

void KirLowering::store(const Stmt& s) {
    const auto& buf = k_.buffers[std::size_t(s.id)];
    llvm::Value* at = physical(s.id, value(s.a));
    llvm::Value* v = value(s.b);
    llvm::Value* base = buffers_[std::size_t(s.id)];
    llvm::Type* t = nullptr;
    switch (buf.elem) {
    case kir::Elem::f32:
        t = v->getType();
        break;
    case kir::Elem::i64:
        t = b_.getInt64Ty();
        v = b_.CreateSExtOrTrunc(v, t);
        break;
    case kir::Elem::f64:
        t = b_.getDoubleTy();
        v = b_.CreateFPExt(v, t);
        break;
    case kir::Elem::f16:
        t = b_.getHalfTy();
        v = b_.CreateFPTrunc(v, t);
        break;
    case kir::Elem::bf16: // round to nearest even, as runtime/dtype.cpp does
        t = b_.getInt16Ty();
        v = bf16_bits(v);
        break;
    }
    scoped(b_.CreateStore(v, b_.CreateGEP(t, base, at)), s.id);
}

llvm::Value* KirLowering::value(const kir::Expr& e) {
    const kir::Node& n = e.node();
    switch (n.op) {
    case Op::const_int:
        return index(n.i);
    case Op::const_float:
        return llvm::ConstantFP::get(b_.getFloatTy(), n.f);
    case Op::param:
        return params_.at(std::size_t(n.i));
    case Op::let:
        return lets_.at(n.i);
    case Op::var:
        return b_.CreateLoad(type(n.type), vars_[std::size_t(n.i)]);
    case Op::program_id:
        return pid_;
    case Op::load:
        return load(n);
    case Op::here:
        return here(n);
    default:
        break;
    }
    std::vector<llvm::Value*> a;
    for (const auto& x : n.args) a.push_back(value(x));
    const bool fp = !n.args.empty() && n.args[0].type() == kir::Type::f32;
    switch (n.op) {
    case Op::add:
        return fp ? b_.CreateFAdd(a[0], a[1]) : b_.CreateAdd(a[0], a[1]);
    case Op::sub:
        return fp ? b_.CreateFSub(a[0], a[1]) : b_.CreateSub(a[0], a[1]);
    case Op::mul:
        return fp ? b_.CreateFMul(a[0], a[1]) : b_.CreateMul(a[0], a[1]);
    case Op::div:
        return fp ? b_.CreateFDiv(a[0], a[1]) : b_.CreateSDiv(a[0], a[1]);
    case Op::rem:
        return b_.CreateSRem(a[0], a[1]);
    // Written as compare + select (not minnum), which every target lowers and vectorises.
    case Op::min:
        return b_.CreateSelect(fp ? b_.CreateFCmpOLT(a[1], a[0]) : b_.CreateICmpSLT(a[1], a[0]),
                               a[1], a[0]);
    case Op::max:
        return b_.CreateSelect(fp ? b_.CreateFCmpOGT(a[1], a[0]) : b_.CreateICmpSGT(a[1], a[0]),
                               a[1], a[0]);
    case Op::lt:
        return fp ? b_.CreateFCmpOLT(a[0], a[1]) : b_.CreateICmpSLT(a[0], a[1]);
    case Op::le:
        return fp ? b_.CreateFCmpOLE(a[0], a[1]) : b_.CreateICmpSLE(a[0], a[1]);
    case Op::gt:
        return fp ? b_.CreateFCmpOGT(a[0], a[1]) : b_.CreateICmpSGT(a[0], a[1]);
    case Op::ge:
        return fp ? b_.CreateFCmpOGE(a[0], a[1]) : b_.CreateICmpSGE(a[0], a[1]);
    case Op::eq:
        return fp ? b_.CreateFCmpOEQ(a[0], a[1]) : b_.CreateICmpEQ(a[0], a[1]);
    case Op::ne:
        return fp ? b_.CreateFCmpUNE(a[0], a[1]) : b_.CreateICmpNE(a[0], a[1]);
    case Op::and_:
        return b_.CreateAnd(a[0], a[1]);
    case Op::or_:
        return b_.CreateOr(a[0], a[1]);
    case Op::neg:
        return b_.CreateFNeg(a[0]);
    case Op::exp:
    case Op::log:
    case Op::sqrt:
        return math(n.op, a[0]);
    case Op::to_f32:
        return b_.CreateSIToFP(a[0], b_.getFloatTy());
    case Op::to_i64:
        return b_.CreateFPToSI(a[0], index_);
    case Op::select:
        return b_.CreateSelect(a[0], a[1], a[2]);
    default:
        break;
    }
    fail("internal: kernel IR op ", int(n.op), " has no lowering");
}

namespace {

using Entry = void (*)(std::int64_t begin, std::int64_t end, void* const* buffers,
                       const std::int64_t* params, char* scratch);

// The CPU wrapper: void name(begin, end, buffers, params, scratch) runs instances
// begin .. end - 1 one after another; scratch arrays are carved from `scratch` at 64-byte
// aligned offsets computed from the parameters.
bool host_has_avx512() {
    static const bool has = [] {
        llvm::StringMap<bool> features;
        return llvm::sys::getHostCPUFeatures(features) && features.lookup("avx512f");
    }();
    return has;
}

class CpuLowering final : public KirLowering {
  public:
    CpuLowering(llvm::Module& m, const kir::Kernel& k) : KirLowering(m, k) {
        keep_constant_loops_ = true;
    }

  protected:
    // exp as the intrinsic (libm; the loop vectoriser maps it to libmvec), plus glibc's
    // 16-lane AVX-512 variant, which LLVM 16's libmvec table lacks, so 512-bit loops with
    // exp stay 512 bits wide.
    llvm::Value* math(kir::Op op, llvm::Value* x) override {
        llvm::Value* v = KirLowering::math(op, x);
        if (op != kir::Op::exp || !host_has_avx512()) return v;
        const char* name = "_ZGVeN16v_expf";
        if (!m_.getFunction(name)) {
            auto* vec = llvm::FixedVectorType::get(b_.getFloatTy(), 16);
            auto callee = m_.getOrInsertFunction(name, llvm::FunctionType::get(vec, {vec}, false));
            llvm::appendToCompilerUsed(m_, {llvm::cast<llvm::Function>(callee.getCallee())});
        }
        llvm::cast<llvm::CallInst>(v)->addFnAttr(
            llvm::Attribute::get(m_.getContext(), "vector-function-abi-variant",
                                 "_ZGV_LLVM_N16v_llvm.exp.f32(_ZGVeN16v_expf)"));
        return v;
    }

  public:
    void build(const std::string& name) {
        auto& ctx = m_.getContext();
        auto* i64 = b_.getInt64Ty();
        auto* ptr = llvm::PointerType::get(ctx, 0);
        auto* fty = llvm::FunctionType::get(b_.getVoidTy(), {i64, i64, ptr, ptr, ptr}, false);
        auto* fn = llvm::Function::Create(fty, llvm::Function::ExternalLinkage, name, m_);
        fn->addFnAttr("prefer-vector-width", "512");
        auto args = fn->arg_begin();
        llvm::Value *begin = args++, *end = args++, *bufs = args++, *pars = args++,
                    *scratch = args++;
        b_.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
        alias_scopes();
        std::vector<llvm::Value*> params, buffers;
        for (std::size_t p = 0; p < k_.params.size(); ++p)
            params.push_back(b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, pars, p)));
        llvm::Value* offset = b_.getInt64(0);
        std::size_t global = 0;
        for (const auto& buf : k_.buffers) {
            if (!kir::in_scratch_region(buf, false)) {
                buffers.push_back(b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, bufs, global++)));
                continue;
            }
            buffers.push_back(b_.CreateGEP(b_.getInt8Ty(), scratch, offset));
            llvm::Value* bytes =
                buf.space == kir::Space::shared // a constant size, padding included
                    ? b_.getInt64(kir::array_bytes(buf, {}))
                    : b_.CreateMul(emit_param_expr(buf.size, params), b_.getInt64(4));
            offset = b_.CreateAnd(b_.CreateAdd(b_.CreateAdd(offset, bytes), b_.getInt64(63)),
                                  b_.getInt64(~std::int64_t(63)));
        }
        auto* pre = b_.GetInsertBlock();
        auto* head = llvm::BasicBlock::Create(ctx, "instances", fn);
        auto* body = llvm::BasicBlock::Create(ctx, "instance", fn);
        auto* exit = llvm::BasicBlock::Create(ctx, "done", fn);
        b_.CreateBr(head);
        b_.SetInsertPoint(head);
        auto* pid = b_.CreatePHI(i64, 2);
        pid->addIncoming(begin, pre);
        b_.CreateCondBr(b_.CreateICmpSLT(pid, end), body, exit);
        b_.SetInsertPoint(body);
        emit_body(pid, params, buffers);
        pid->addIncoming(b_.CreateAdd(pid, b_.getInt64(1)), b_.GetInsertBlock());
        b_.CreateBr(head);
        b_.SetInsertPoint(exit);
        b_.CreateRetVoid();
    }
};

class CompiledCpuKernel final : public CpuKernel {
  public:
    explicit CompiledCpuKernel(const kir::Kernel& k) : k_(k) {
        static std::atomic<int> counter{0};
        const std::string name = "kir_" + std::to_string(counter++) + "_" + k.name;
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = new_module(name, *ctx);
        CpuLowering(*m, k_).build(name + "0");
        entry_ = reinterpret_cast<Entry>(
            add_module(std::move(m), std::move(ctx), 1, name, &ir_, &tracker_).at(0));
        dump();
    }
    ~CompiledCpuKernel() override { remove_module(tracker_); }

    const std::string& llvm_ir() const override { return ir_; }
    // RAG_KIR_DUMP=dir writes each compiled kernel's optimised IR to dir/<kernel name>.ll.
    void dump() const {
        if (const char* d = std::getenv("RAG_KIR_DUMP")) {
            std::error_code ec;
            llvm::raw_fd_ostream os(std::string(d) + "/" + k_.name + ".ll", ec);
            os << ir_;
        }
    }

    void launch(std::int64_t grid, std::span<void* const> buffers,
                std::span<const std::int64_t> params) const override {
        if (buffers.size() != k_.globals() || params.size() != k_.params.size())
            fail("internal: kernel ", k_.name, " launched with ", buffers.size(), " buffers and ",
                 params.size(), " parameters, wants ", k_.globals(), " and ", k_.params.size());
        std::size_t scratch = 0;
        for (const auto& b : k_.buffers)
            if (kir::in_scratch_region(b, false))
                scratch = (scratch + std::size_t(kir::array_bytes(b, params)) + 63) / 64 * 64;
        const int workers = int(std::min<std::int64_t>(num_threads(), grid));
        std::atomic<std::int64_t> next{0};
        // Each worker takes the next instance (ragged tiles differ in cost) into its own scratch.
        parallel_for(workers, 1, [&](std::int64_t wb, std::int64_t we) {
            for (std::int64_t w = wb; w < we; ++w) {
                const std::size_t bytes = std::max<std::size_t>(scratch, 64);
                char* mem = static_cast<char*>(memory::acquire(bytes));
                for (std::int64_t pid; (pid = next++) < grid;)
                    entry_(pid, pid + 1, buffers.data(), params.data(), mem);
                memory::release(mem, bytes);
            }
        });
    }

  private:
    kir::Kernel k_;
    Entry entry_ = nullptr;
    std::string ir_;
    llvm::orc::ResourceTrackerSP tracker_;
};

} // namespace

std::unique_ptr<CpuKernel> compile_kernel_cpu(const kir::Kernel& k) {
    return std::make_unique<CompiledCpuKernel>(k);
}

} // namespace rag::jit
