// The NVPTX lowering of the kernel IR: KirLowering with libdevice math and `threads` loops
// spread over a block (see jit/kir_nvptx.hpp for the execution model and the entry ABI).
#include "jit/kir_nvptx.hpp"

#include "jit/elementwise_llvm.hpp"
#include "jit/kir_emulator.hpp"
#include "jit/kir_llvm.hpp"
#include "jit/nvptx.hpp"
#include "runtime/error.hpp"

#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include <algorithm>
#include <functional>

namespace rag::jit {
namespace {

using kir::Stmt;

// Whether k computes without tensor cores: no fragments, and no mma on them.
bool without_tensor_cores(const kir::Kernel& k) {
    for (const kir::BufferDecl& b : k.buffers)
        if (b.space == kir::Space::fragment) return false;
    const std::function<bool(const std::vector<Stmt>&)> any = [&](const std::vector<Stmt>& body) {
        return std::any_of(body.begin(), body.end(), [&](const Stmt& s) {
            return (s.kind == Stmt::Kind::mma && kir::on_tensor_cores(*s.mma)) || any(s.body) ||
                   any(s.orelse);
        });
    };
    return !any(k.body);
}

class NvptxLowering final : public KirLowering {
  public:
    // emulated: for the host (jit/kir_emulator.hpp) instead of the GPU.
    // Programs without tensor cores (f32) keep their constant-trip loops as loops, as the CPU
    // does and for the same reason (kir_llvm.cpp's for_range): unrolled, LICM held 4 rows x 64
    // columns of accumulators across the enclosing loop, and their backward passes spilled
    // 200-670 B a thread. The tensor-core programs keep LLVM's unrolling: rolled, they spill
    // 8-52 B more (docs/design.md), and the static report's model charges an inner loop
    // without HMMAs once.
    NvptxLowering(llvm::Module& m, const kir::Kernel& k, bool emulated)
        : KirLowering(m, k), emulated_(emulated) {
        keep_constant_loops_ = without_tensor_cores(k);
        // 32-bit integers, emulated too (so that the emulator runs the device's arithmetic):
        // 64-bit indices took two registers and two instructions each, and the tile programs'
        // loop-invariant ones were what spilled.
        index_ = b_.getInt32Ty();
    }

    void build(const std::string& name) {
        auto& ctx = m_.getContext();
        auto* i64 = b_.getInt64Ty();
        auto* ptr = llvm::PointerType::get(ctx, 0);
        // The GPU entry takes its values one by one; the emulated one arrays and a thread.
        std::vector<llvm::Type*> types(1 + k_.params.size(), i64);
        types.insert(types.end(), k_.globals() + 1, ptr);
        if (emulated_) types = {i64, ptr, ptr, ptr, ptr};
        auto* fn = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), types, false),
                                          llvm::Function::ExternalLinkage, name, m_);
        // One block per SM is all the tile programs ask of ptxas: left to itself it caps
        // registers for occupancy (168 for 3 blocks of 128 threads) and spills the fragments
        // and unrolled tiles instead; FlashAttention's kernels are bound the same way.
        if (!emulated_) mark_kernel(*fn, kKirBlock, 1);
        b_.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
        llvm::Value* grid = fn->getArg(0);
        std::vector<llvm::Value*> params, buffers, scratch_at;
        auto param = [&](unsigned p) -> llvm::Value* {
            if (!emulated_) return fn->getArg(1 + p);
            return b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, fn->getArg(1), p));
        };
        unsigned global = 0;
        auto next_global = [&]() -> llvm::Value* {
            if (!emulated_) return fn->getArg(unsigned(1 + k_.params.size()) + global++);
            return b_.CreateLoad(ptr, b_.CreateConstGEP1_64(ptr, fn->getArg(2), global++));
        };
        for (unsigned p = 0; p < k_.params.size(); ++p) params.push_back(param(p));
        llvm::Value* scratch = fn->getArg(emulated_ ? 3 : unsigned(fn->arg_size() - 1));
        if (emulated_) thread_ = fn->getArg(4);
        // This block's scratch: the arrays at 64-byte aligned offsets, blockIdx.x regions in.
        // Shared arrays past the static limit: at their offsets in the block's dynamic shared
        // memory, one extern array (the emulator keeps them apart, to check each).
        llvm::Value* offset = b_.getInt64(0);
        const std::vector<std::int64_t> shared_at = kir::shared_offsets(k_);
        llvm::GlobalVariable* dynamic = nullptr;
        if (!emulated_ && kir_dynamic_shared_bytes(k_) > 0) {
            auto* t = llvm::ArrayType::get(b_.getInt8Ty(), 0);
            dynamic = new llvm::GlobalVariable(m_, t, false, llvm::GlobalValue::ExternalLinkage,
                                               nullptr, k_.name + "_dynamic", nullptr,
                                               llvm::GlobalValue::NotThreadLocal, 3);
            dynamic->setAlignment(llvm::Align(16));
        }
        for (std::size_t at = 0; at < k_.buffers.size(); ++at) {
            const kir::BufferDecl& buf = k_.buffers[at];
            if (buf.space == kir::Space::global) {
                buffers.push_back(next_global());
                scratch_at.push_back(nullptr);
                continue;
            }
            if (buf.space == kir::Space::fragment) { // registers (slot())
                buffers.push_back(nullptr);
                scratch_at.push_back(nullptr);
                continue;
            }
            if (buf.space == kir::Space::shared && dynamic) {
                buffers.push_back(
                    b_.CreateConstGEP1_64(b_.getInt8Ty(), dynamic, std::uint64_t(shared_at[at])));
                scratch_at.push_back(nullptr);
                continue;
            }
            if (buf.space == kir::Space::shared) { // a static array of the block
                auto* t = llvm::ArrayType::get(
                    storage_type(buf.elem),
                    std::uint64_t(kir::array_bytes(buf, {}) / kir::elem_bytes(buf.elem)));
                auto* g = new llvm::GlobalVariable(
                    m_, t, false, llvm::GlobalValue::InternalLinkage, llvm::UndefValue::get(t),
                    k_.name + "_" + buf.name, nullptr, llvm::GlobalValue::NotThreadLocal,
                    emulated_ ? 0 : 3);
                g->setAlignment(llvm::Align(16));
                buffers.push_back(g);
                scratch_at.push_back(nullptr);
                continue;
            }
            buffers.push_back(nullptr);
            scratch_at.push_back(offset); // a value, never null
            llvm::Value* bytes = b_.CreateMul(emit_param_expr(buf.size, params), b_.getInt64(4));
            offset = b_.CreateAnd(b_.CreateAdd(b_.CreateAdd(offset, bytes), b_.getInt64(63)),
                                  b_.getInt64(~std::int64_t(63)));
        }
        llvm::Value* block = sreg(Sreg::ctaid);
        llvm::Value* mine = b_.CreateGEP(b_.getInt8Ty(), scratch, b_.CreateMul(block, offset));
        for (std::size_t k = 0; k < buffers.size(); ++k)
            if (scratch_at[k]) buffers[k] = b_.CreateGEP(b_.getInt8Ty(), mine, scratch_at[k]);
        tid_ = b_.CreateTrunc(sreg(Sreg::tid), index_);
        ntid_ = b_.CreateTrunc(sreg(Sreg::ntid), index_);
        llvm::Value* blocks = sreg(Sreg::nctaid);
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
        if (emulated_) return KirLowering::math(op, x); // the host's libm
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
        b_.CreateCondBr(b_.CreateICmpEQ(tid_, index(0)), then, done);
        b_.SetInsertPoint(then);
        KirLowering::store(s);
        b_.CreateBr(done);
        b_.SetInsertPoint(done);
        barrier();
    }

    // On tensor cores: each warp takes 16 x 8 tiles of C in turn and runs mma.sync m16n8k16
    // over k, its fragments loaded from the operands' views as the PTX ISA lays them out
    // ("Matrix Fragments for mma.m16n8k16 with floating point type"): lane = 4 g + t holds
    //   A: rows g, g + 8 (register r & 1) by columns 2t, 2t + 1 (+ 8 for r >= 2),
    //   B: rows 2t, 2t + 1 (+ 8 for register 1) of column g,
    //   C: rows g, g + 8 (element q >> 1) by columns 2t + (q & 1).
    // C stays in registers over k. Otherwise the block's threads share C's elements.
    void mma(const kir::Mma& x) override {
        if (k_.buffers[std::size_t(x.c.buf)].space == kir::Space::fragment) return fragment_mma(x);
        barrier();
        if (!kir::on_tensor_cores(x)) {
            llvm::Value* n = index(x.n);
            for_range(tid_, index(x.m * x.n), ntid_, [&](llvm::Value* e) {
                mma_element(x, b_.CreateUDiv(e, n), b_.CreateURem(e, n));
            });
            barrier();
            return;
        }
        llvm::Value* lane = b_.CreateAnd(tid_, 31);
        llvm::Value* g = b_.CreateLShr(lane, 2);
        llvm::Value* t2 = b_.CreateShl(b_.CreateAnd(lane, 3), 1);
        const std::int64_t tiles_n = x.n / 8;
        const bool f16 = x.precision == kir::Precision::f16;
        llvm::Function* op = llvm::Intrinsic::getDeclaration(
            &m_, f16 ? llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_f32_f32
                     : llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16);
        llvm::Type* f32 = b_.getFloatTy();
        llvm::Function* fn = b_.GetInsertBlock()->getParent();
        llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
        std::vector<llvm::Value*> acc;
        for (int q = 0; q < 4; ++q) acc.push_back(entry.CreateAlloca(f32));
        llvm::FunctionType* sig = op->getFunctionType();
        for_range(
            b_.CreateLShr(tid_, 5), index(x.m / 16 * tiles_n), b_.CreateLShr(ntid_, 5),
            [&](llvm::Value* tile) {
                llvm::Value* i0 = b_.CreateMul(b_.CreateUDiv(tile, index(tiles_n)), index(16));
                llvm::Value* j0 = b_.CreateMul(b_.CreateURem(tile, index(tiles_n)), index(8));
                llvm::Value* rows[2] = {b_.CreateAdd(i0, g),
                                        b_.CreateAdd(i0, b_.CreateAdd(g, index(8)))};
                llvm::Value* cols = b_.CreateAdd(j0, t2);
                std::vector<llvm::Value*> at;
                for (int q = 0; q < 4; ++q) {
                    at.push_back(element(x.c, rows[q >> 1], b_.CreateAdd(cols, index(q & 1))));
                    llvm::Value* c0 = x.accumulate
                                          ? static_cast<llvm::Value*>(b_.CreateLoad(f32, at.back()))
                                          : llvm::ConstantFP::get(f32, 0.0);
                    b_.CreateStore(c0, acc[std::size_t(q)]);
                }
                for_range(index(0), index(x.k), index(16), [&](llvm::Value* l0) {
                    std::vector<llvm::Value*> args = fragment(x, false, i0, l0, lane, sig);
                    for (llvm::Value* r : fragment(x, true, j0, l0, lane, sig)) args.push_back(r);
                    for (int q = 0; q < 4; ++q)
                        args.push_back(b_.CreateLoad(f32, acc[std::size_t(q)]));
                    llvm::Value* d = mma_sync(op, f16, args);
                    for (unsigned q = 0; q < 4; ++q)
                        b_.CreateStore(b_.CreateExtractValue(d, q), acc[q]);
                });
                for (int q = 0; q < 4; ++q)
                    b_.CreateStore(b_.CreateLoad(f32, acc[std::size_t(q)]), at[std::size_t(q)]);
            });
        barrier();
    }

    // Fragments live in registers: each thread holds, for warp w = tid / 32 and lane 4g + t,
    // the mma accumulator's elements of rows 16w + g and 16w + g + 8 (element q of 16 x 8 tile
    // jt: row 16w + g + 8 (q >> 1), column 8 jt + 2t + (q & 1), slot 4 jt + q), and of a row
    // vector rows 16w + g (slot 0) and 16w + g + 8 (slot 1), as each of the quad's 4 lanes.
    // Every slot index is a constant of the code (each and mma are unrolled), so the slots are
    // an entry-block array that SROA turns into registers.
    void each(const Stmt& s) override {
        const std::int64_t cols = kir::fragment_cols(k_.buffers[std::size_t(s.id)]);
        llvm::Value* lane = b_.CreateAnd(tid_, 31);
        llvm::Value* r0 =
            b_.CreateAdd(b_.CreateShl(b_.CreateLShr(tid_, 5), 4), b_.CreateLShr(lane, 2));
        llvm::Value* t2 = b_.CreateShl(b_.CreateAnd(lane, 3), 1);
        const std::int64_t slots = cols == 1 ? 2 : cols / 8 * 4;
        ++depth_; // like a threads loop: stores are the owning thread's
        current_each_ = &s;
        for (std::int64_t q = 0; q < slots; ++q) {
            slot_ = q;
            half_ = cols == 1 ? q : (q & 3) >> 1;
            lets()[s.a.node().i] = b_.CreateAdd(r0, index(8 * half_));
            lets()[s.b.node().i] =
                cols == 1 ? index(0) : b_.CreateAdd(t2, index(q / 4 * 8 + (q & 1)));
            emit(s.body);
        }
        current_each_ = nullptr;
        --depth_;
    }
    llvm::Value* here(const kir::Node& n) override {
        return b_.CreateLoad(b_.getFloatTy(), slot_of(n.i));
    }
    void put(const Stmt& s) override { b_.CreateStore(value(s.a), slot_of(s.id)); }
    // Each thread folds its own elements of a row in column order, then the quad's four
    // partials meet by butterfly shuffles (lane ^ 1, then lane ^ 2).
    void row_reduce(const Stmt& s) override {
        const std::int64_t f = s.a.node().i;
        const std::int64_t tiles = kir::fragment_cols(k_.buffers[std::size_t(f)]) / 8;
        llvm::Type* f32 = b_.getFloatTy();
        for (std::int64_t h = 0; h < 2; ++h) {
            llvm::Value* acc = nullptr;
            for (std::int64_t jt = 0; jt < tiles; ++jt)
                for (std::int64_t e = 0; e < 2; ++e) {
                    llvm::Value* x = b_.CreateLoad(f32, slot(f, 4 * jt + 2 * h + e));
                    acc = acc ? combine(s.reduce, acc, x) : x;
                }
            for (int mask : {1, 2}) acc = combine(s.reduce, acc, shfl_xor(acc, mask));
            b_.CreateStore(acc, slot(s.id, h));
        }
    }
    // C (a fragment) += A B on tensor cores: warp w computes C's rows 16w.. for every 16 x 8
    // tile and k step, unrolled; its accumulators are C's slots, and a fragment A's registers
    // are its own slots packed in pairs (the C layout of two neighbouring tiles is the A layout
    // of their 16 columns).
    void fragment_mma(const kir::Mma& x) {
        barrier(); // shared operands written before are complete
        const bool f16 = x.precision == kir::Precision::f16;
        llvm::Function* op = llvm::Intrinsic::getDeclaration(
            &m_, f16 ? llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_f32_f32
                     : llvm::Intrinsic::nvvm_mma_m16n8k16_row_col_bf16);
        llvm::FunctionType* sig = op->getFunctionType();
        llvm::Type* f32 = b_.getFloatTy();
        llvm::Value* lane = b_.CreateAnd(tid_, 31);
        llvm::Value* i0 = b_.CreateShl(b_.CreateLShr(tid_, 5), 4);
        const bool a_fragment = k_.buffers[std::size_t(x.a.buf)].space == kir::Space::fragment;
        for (std::int64_t ks = 0; ks < x.k / 16; ++ks) {
            std::vector<llvm::Value*> a;
            if (a_fragment) {
                for (std::int64_t r = 0; r < 4; ++r)
                    a.push_back(pack(b_.CreateLoad(f32, slot(x.a.buf, 8 * ks + 2 * r)),
                                     b_.CreateLoad(f32, slot(x.a.buf, 8 * ks + 2 * r + 1)), f16,
                                     sig->getParamType(unsigned(r))));
            } else {
                a = fragment(x, false, i0, index(16 * ks), lane, sig);
            }
            for (std::int64_t jt = 0; jt < x.n / 8; ++jt) {
                std::vector<llvm::Value*> args = a;
                for (llvm::Value* r : fragment(x, true, index(8 * jt), index(16 * ks), lane, sig))
                    args.push_back(r);
                for (std::int64_t q = 0; q < 4; ++q)
                    args.push_back(b_.CreateLoad(f32, slot(x.c.buf, 4 * jt + q)));
                llvm::Value* d = mma_sync(op, f16, args);
                for (unsigned q = 0; q < 4; ++q)
                    b_.CreateStore(b_.CreateExtractValue(d, q), slot(x.c.buf, 4 * jt + q));
            }
        }
    }

    // copy16 as one 16-byte load and store when the indices are multiples of the count: both
    // addresses are then 16-byte aligned, as shared arrays are (padded rows included) and
    // every global buffer is at launch (check_kir_launch refuses others), so the key loops stage
    // with no scalar fallback; else element by element.
    void copy16(const Stmt& s) override {
        const std::int64_t src = s.c.node().i;
        const kir::Elem e = k_.buffers[std::size_t(s.id)].elem;
        const std::int64_t n = 16 / kir::elem_bytes(e);
        const kir::BufferDecl& to = k_.buffers[std::size_t(s.id)];
        const kir::BufferDecl& from = k_.buffers[std::size_t(src)];
        llvm::Type* t = storage_type(e);
        auto address = [&](std::int64_t buf, const kir::Expr& at) {
            return b_.CreateGEP(t, buffer(int(buf)), physical(buf, value(at)));
        };
        if (s.bytes == 4) // copy4_async: one element, naturally aligned
            return cp_async(s.id, address(s.id, s.a), address(src, s.b), 4);
        if (!kir::multiple_of(s.a, n) || !kir::multiple_of(s.b, n) || to.row % n != 0 ||
            from.row % n != 0)
            return KirLowering::copy16(s);
        if (s.async) return cp_async(s.id, address(s.id, s.a), address(src, s.b), 16);
        // Four 32-bit words whatever the element (LLVM splits <8 x i16>, bf16's storage, into
        // two 8-byte accesses).
        auto* v = llvm::FixedVectorType::get(b_.getInt32Ty(), 4);
        llvm::LoadInst* l = b_.CreateAlignedLoad(v, address(src, s.b), llvm::Align(16));
        scoped(l, src);
        scoped(b_.CreateAlignedStore(l, address(s.id, s.a), llvm::Align(16)), s.id);
    }

    // cp.async.commit_group, cp.async.wait_group n, then bar.sync (see Builder::await_copies).
    void await_copies(const Stmt& s) override {
        if (emulated_) {
            auto* ptr = llvm::PointerType::get(m_.getContext(), 0);
            auto* type = llvm::FunctionType::get(b_.getVoidTy(), {ptr, b_.getInt64Ty()}, false);
            b_.CreateCall(type, b_.CreateLoad(ptr, emu_field(kEmuCpWait)),
                          {thread_, b_.getInt64(s.id)});
        } else {
            using llvm::Intrinsic::getDeclaration;
            b_.CreateCall(getDeclaration(&m_, llvm::Intrinsic::nvvm_cp_async_commit_group));
            b_.CreateCall(getDeclaration(&m_, llvm::Intrinsic::nvvm_cp_async_wait_group),
                          {b_.getInt32(std::uint32_t(s.id))});
        }
        barrier();
    }

  private:
    // cp.async.cg.shared.global [to], [from], 16 (cached in L2 only: a staged tile is read once
    // per block), or .ca with 4 bytes (the only cache mode for fewer than 16), or the
    // EmuThread's cp_async on the same addresses.
    void cp_async(std::int64_t region, llvm::Value* to, llvm::Value* from, std::int64_t bytes) {
        if (emulated_) {
            auto* ptr = llvm::PointerType::get(m_.getContext(), 0);
            auto* i64 = b_.getInt64Ty();
            auto* type =
                llvm::FunctionType::get(b_.getVoidTy(), {ptr, i64, ptr, ptr, ptr, i64}, false);
            b_.CreateCall(
                type, b_.CreateLoad(ptr, emu_field(kEmuCpAsync)),
                {thread_, b_.getInt64(region), buffer(int(region)), to, from, b_.getInt64(bytes)});
            return;
        }
        // Inline PTX, not LLVM 16's intrinsics: those select only 64-bit shared addresses, and
        // shared pointers are 32-bit here (nvptx.cpp).
        auto* global = llvm::PointerType::get(m_.getContext(), 1);
        auto* type = llvm::FunctionType::get(b_.getVoidTy(), {b_.getInt32Ty(), global}, false);
        const std::string text = bytes == 16 ? "cp.async.cg.shared.global [$0], [$1], 16;"
                                             : "cp.async.ca.shared.global [$0], [$1], 4;";
        b_.CreateCall(
            type, llvm::InlineAsm::get(type, text, "r,l,~{memory}", true),
            {b_.CreatePtrToInt(to, b_.getInt32Ty()), b_.CreateAddrSpaceCast(from, global)});
    }

    // Slot q of fragment f's registers (an entry-block array made on first use).
    llvm::Value* slot(std::int64_t f, std::int64_t q) {
        llvm::Value*& array = fragments_[f];
        if (!array) {
            const std::int64_t cols = kir::fragment_cols(k_.buffers[std::size_t(f)]);
            llvm::Function* fn = b_.GetInsertBlock()->getParent();
            llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
            array = entry.CreateAlloca(b_.getFloatTy(), b_.getInt32(cols == 1 ? 2 : cols / 2));
        }
        return b_.CreateConstGEP1_64(b_.getFloatTy(), array, std::uint64_t(q));
    }
    // The current element of each's fragment f: its slot, or its row's in a row vector.
    llvm::Value* slot_of(std::int64_t f) {
        const bool vector = kir::fragment_cols(k_.buffers[std::size_t(f)]) == 1;
        return slot(f, vector ? half_ : slot_);
    }
    // Two f32 values rounded to the mma's half type, as one register (the first in the low
    // half).
    llvm::Value* pack(llvm::Value* v0, llvm::Value* v1, bool f16, llvm::Type* as) {
        llvm::Value* half[2];
        llvm::Value* v[2] = {v0, v1};
        for (int e = 0; e < 2; ++e) {
            llvm::Value* bits =
                f16 ? b_.CreateBitCast(b_.CreateFPTrunc(v[e], b_.getHalfTy()), b_.getInt16Ty())
                    : bf16_bits(v[e]);
            half[e] = b_.CreateZExt(bits, b_.getInt32Ty());
        }
        return b_.CreateBitCast(b_.CreateOr(half[0], b_.CreateShl(half[1], 16)), as);
    }
    // shfl.sync.bfly.b32 over the whole warp: the value of lane ^ mask.
    llvm::Value* shfl_xor(llvm::Value* v, int mask) {
        if (!emulated_)
            return b_.CreateCall(
                llvm::Intrinsic::getDeclaration(&m_, llvm::Intrinsic::nvvm_shfl_sync_bfly_f32),
                {b_.getInt32(0xffffffffu), v, b_.getInt32(std::uint32_t(mask)), b_.getInt32(31)});
        auto* ptr = llvm::PointerType::get(m_.getContext(), 0);
        auto* type = llvm::FunctionType::get(b_.getFloatTy(),
                                             {ptr, b_.getFloatTy(), b_.getInt64Ty()}, false);
        return b_.CreateCall(type, b_.CreateLoad(ptr, emu_field(kEmuShfl)),
                             {thread_, v, b_.getInt64(mask)});
    }

    // The registers of one operand's fragment, as the mma intrinsic's parameter types: A's
    // four for rows x0.. and columns y0.. (x0 = i0, y0 = l0), or B's two (x0 = j0, y0 = l0).
    // In the view V(x, y) (A(x, y), or B(y, x)), register m holds V(x0 + dx_m + g, y0 + dy_m +
    // 2t + e) in half e, dx_m = 8 (m & 1) and dy_m = 8 (m >> 1) for A, dx_m = 0 and dy_m = 8m
    // for B: the 8 x 8 matrix m of ldmatrix, whose lanes 8m .. 8m + 7 give the addresses of its
    // rows: V(x0 + dx_m + i, y0 + dy_m) for lane 8m + i, or V(x0 + dx_m, y0 + dy_m + i) with
    // .trans (lane (g, t) then receives the transposed elements).
    std::vector<llvm::Value*> fragment(const kir::Mma& x, bool operand_b, llvm::Value* x0,
                                       llvm::Value* y0, llvm::Value* lane,
                                       llvm::FunctionType* sig) {
        const kir::Matrix& mat = operand_b ? x.b : x.a;
        const int count = operand_b ? 2 : 4;
        const unsigned first = operand_b ? 4 : 0; // the intrinsic's parameter
        auto at = [&](llvm::Value* vx, llvm::Value* vy) {
            return operand_b ? element(mat, vy, vx) : element(mat, vx, vy);
        };
        auto dx = [&](llvm::Value* m) {
            return operand_b ? index(0) : b_.CreateShl(b_.CreateAnd(m, 1), 3);
        };
        auto dy = [&](llvm::Value* m) {
            return b_.CreateShl(operand_b ? m : b_.CreateLShr(m, 1), 3);
        };
        const kir::FragmentLoad how = kir::fragment_load(k_, x, operand_b);
        std::vector<llvm::Value*> regs;
        if (how == kir::FragmentLoad::elements) {
            const bool f16 = x.precision == kir::Precision::f16;
            llvm::Value* g = b_.CreateLShr(lane, 2);
            llvm::Value* t2 = b_.CreateShl(b_.CreateAnd(lane, 3), 1);
            for (int m = 0; m < count; ++m) {
                llvm::Value* v[2];
                for (int e = 0; e < 2; ++e) {
                    llvm::Value* vx = b_.CreateAdd(b_.CreateAdd(x0, dx(index(m))), g);
                    llvm::Value* vy =
                        b_.CreateAdd(b_.CreateAdd(y0, dy(index(m))), b_.CreateAdd(t2, index(e)));
                    v[e] = widen_at(mat, at(vx, vy));
                }
                regs.push_back(pack(v[0], v[1], f16, sig->getParamType(first + unsigned(m))));
            }
            return regs;
        }
        const bool trans = how == kir::FragmentLoad::ldmatrix_trans;
        llvm::Value* m = b_.CreateAnd(b_.CreateLShr(lane, 3), count - 1);
        llvm::Value* i = b_.CreateAnd(lane, 7);
        llvm::Value* vx = b_.CreateAdd(x0, dx(m));
        llvm::Value* vy = b_.CreateAdd(y0, dy(m));
        llvm::Value* row = trans ? at(vx, b_.CreateAdd(vy, i)) : at(b_.CreateAdd(vx, i), vy);
        std::vector<llvm::Value*> words = ldmatrix(mat, row, count, trans);
        for (int r = 0; r < count; ++r)
            regs.push_back(
                b_.CreateBitCast(words[std::size_t(r)], sig->getParamType(first + unsigned(r))));
        return regs;
    }
    llvm::Value* widen_at(const kir::Matrix& mat, llvm::Value* address) {
        const kir::Elem e = k_.buffers[std::size_t(mat.buf)].elem;
        return widen(e, b_.CreateLoad(storage_type(e), address));
    }
    // ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16 of this lane's row address: the
    // count 32-bit registers, or in emulation the EmuThread's ldmatrix on the same addresses.
    std::vector<llvm::Value*> ldmatrix(const kir::Matrix& mat, llvm::Value* row, int count,
                                       bool trans) {
        std::vector<llvm::Value*> words;
        if (!emulated_) {
            using llvm::Intrinsic::ID;
            const ID ids[2][2] = {{llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x2_b16,
                                   llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x2_trans_b16},
                                  {llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_b16,
                                   llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_trans_b16}};
            llvm::Value* r = b_.CreateCall(
                llvm::Intrinsic::getDeclaration(&m_, ids[count == 4][trans], {row->getType()}),
                {row});
            for (unsigned q = 0; q < unsigned(count); ++q)
                words.push_back(b_.CreateExtractValue(r, q));
            return words;
        }
        auto* i32 = b_.getInt32Ty();
        auto* ptr = llvm::PointerType::get(m_.getContext(), 0);
        llvm::Function* fn = b_.GetInsertBlock()->getParent();
        llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
        llvm::Value* out = entry.CreateAlloca(i32, b_.getInt32(4));
        auto* type = llvm::FunctionType::get(
            b_.getVoidTy(), {ptr, b_.getInt64Ty(), ptr, ptr, b_.getInt64Ty(), ptr}, false);
        b_.CreateCall(type, b_.CreateLoad(ptr, emu_field(kEmuLdmatrix)),
                      {thread_, b_.getInt64(mat.buf), buffer(mat.buf), row,
                       b_.getInt64(count + (trans ? 8 : 0)), out});
        for (unsigned q = 0; q < unsigned(count); ++q)
            words.push_back(b_.CreateLoad(i32, b_.CreateConstGEP1_64(i32, out, q)));
        return words;
    }

    enum class Sreg { tid, ntid, ctaid, nctaid };
    // A special register: %tid.x and the like, or the EmuThread's field.
    llvm::Value* sreg(Sreg r) {
        if (emulated_) {
            const int at[] = {kEmuTid, kEmuNtid, kEmuCtaid, kEmuNctaid};
            return b_.CreateLoad(b_.getInt64Ty(), emu_field(at[int(r)]));
        }
        const llvm::Intrinsic::ID ids[] = {llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x,
                                           llvm::Intrinsic::nvvm_read_ptx_sreg_ntid_x,
                                           llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x,
                                           llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x};
        return b_.CreateZExt(b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, ids[int(r)])),
                             b_.getInt64Ty());
    }
    void barrier() {
        if (emulated_) {
            auto* ptr = llvm::PointerType::get(m_.getContext(), 0);
            auto* type = llvm::FunctionType::get(b_.getVoidTy(), {ptr}, false);
            b_.CreateCall(type, b_.CreateLoad(ptr, emu_field(kEmuBarrier)), {thread_});
            return;
        }
        b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, llvm::Intrinsic::nvvm_barrier0));
    }
    llvm::Value* emu_field(int offset) {
        return b_.CreateConstGEP1_64(b_.getInt8Ty(), thread_, std::uint64_t(offset));
    }
    // mma.sync: the intrinsic's result, or in emulation the EmuThread's mma on the same
    // registers, returned as the same {float x 4}.
    llvm::Value* mma_sync(llvm::Function* op, bool f16, const std::vector<llvm::Value*>& args) {
        if (!emulated_) return b_.CreateCall(op, args);
        auto* i32 = b_.getInt32Ty();
        auto* f32 = b_.getFloatTy();
        llvm::Function* fn = b_.GetInsertBlock()->getParent();
        llvm::IRBuilder<> entry(&fn->getEntryBlock(), fn->getEntryBlock().begin());
        llvm::Value* regs = entry.CreateAlloca(i32, b_.getInt32(6));
        llvm::Value* acc = entry.CreateAlloca(f32, b_.getInt32(4));
        for (unsigned r = 0; r < 6; ++r)
            b_.CreateStore(b_.CreateBitCast(args[r], i32), b_.CreateConstGEP1_64(i32, regs, r));
        for (unsigned q = 0; q < 4; ++q)
            b_.CreateStore(args[6 + q], b_.CreateConstGEP1_64(f32, acc, q));
        auto* ptr = llvm::PointerType::get(m_.getContext(), 0);
        auto* type =
            llvm::FunctionType::get(b_.getVoidTy(), {ptr, b_.getInt64Ty(), ptr, ptr}, false);
        b_.CreateCall(type, b_.CreateLoad(ptr, emu_field(kEmuMma)),
                      {thread_, b_.getInt64(f16 ? 0 : 1), regs, acc});
        llvm::Value* d = llvm::UndefValue::get(op->getReturnType());
        for (unsigned q = 0; q < 4; ++q)
            d = b_.CreateInsertValue(d, b_.CreateLoad(f32, b_.CreateConstGEP1_64(f32, acc, q)), q);
        return d;
    }

    bool emulated_;
    std::map<std::int64_t, llvm::Value*> fragments_; // fragment -> its slots
    std::int64_t slot_ = 0, half_ = 0;               // each's current element
    llvm::Value* thread_ = nullptr;                  // emulation: the EmuThread*
    llvm::Value* tid_ = nullptr;
    llvm::Value* ntid_ = nullptr;
    int depth_ = 0;
};

} // namespace

std::string kir_ptx(const kir::Kernel& k, const std::string& arch) {
    llvm::LLVMContext ctx;
    auto m = new_nvptx_module("kir_" + k.name, ctx, arch);
    NvptxLowering(*m, k, false).build(k.name);
    return compile_ptx(*m, PtxOptions{arch, false});
}

void lower_kir_emulated(llvm::Module& m, const kir::Kernel& k, const std::string& entry) {
    NvptxLowering(m, k, true).build(entry);
}

void check_kir_launch(const kir::Kernel& k, std::span<const std::uint64_t> buffers,
                      std::span<const std::int64_t> params, const std::string& where,
                      std::span<const std::size_t> bytes) {
    const std::string kernel = where.empty() ? k.name : k.name + " " + where;
    if (buffers.size() != k.globals() || params.size() != k.params.size())
        fail("internal: kernel ", kernel, " launched with ", buffers.size(), " buffers and ",
             params.size(), " parameters, wants ", k.globals(), " and ", k.params.size());
    for (std::size_t i = 0; i < buffers.size(); ++i)
        if (buffers[i] % 16 != 0)
            fail("internal: kernel ", kernel, " launched with global buffer ", i,
                 " not 16-byte aligned");
    constexpr std::int64_t limit = std::int64_t(1) << 31;
    for (std::size_t p = 0; p < params.size(); ++p)
        if (params[p] >= limit || params[p] < -limit)
            fail("GPU kernel ", kernel, ": ", k.params[p], " = ", params[p],
                 " does not fit the kernels' 32-bit indices (at most 2^31 - 1)");
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        const auto elements =
            std::int64_t(bytes[i] / std::size_t(kir::elem_bytes(k.buffers[i].elem)));
        if (elements >= limit)
            fail("GPU kernel ", kernel, ": buffer ", k.buffers[i].name, " holds ", elements,
                 " elements; the kernels index at most 2^31 - 1 (split the batch)");
    }
}

std::int64_t kir_dynamic_shared_bytes(const kir::Kernel& k) {
    const std::int64_t bytes = kir::shared_bytes(k);
    return bytes > kir::kStaticSharedBytes ? bytes : 0;
}

std::int64_t kir_scratch_bytes(const kir::Kernel& k, std::span<const std::int64_t> params) {
    std::int64_t offset = 0;
    for (const auto& buf : k.buffers)
        if (kir::in_scratch_region(buf, true))
            offset = (offset + kir::array_bytes(buf, params) + 63) / 64 * 64;
    return offset;
}

} // namespace rag::jit
