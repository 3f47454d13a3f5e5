#include "jit/segmented.hpp"

#include "jit/llvm_jit.hpp"
#include "runtime/error.hpp"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>

#include <mutex>

namespace rag::jit {
namespace {

// seg[5 * s ...] = {in_base, out_base, outer, n, inner}: elements of the big side (the reduced
// input, or the gradient being expanded) and of the small side, per sample.
using SegKernel = void (*)(std::int64_t nseg, const std::int64_t* seg, const void* from, void* to);

// reduce: small[o, j] = scale * sum_r big[o, r, j];  expand: big[o, r, j] = scale * small[o, j];
// scale = 1/n for mean (n > 0), else 1.
void emit_kernel(llvm::Module& m, const std::string& name, bool f32, bool expand, bool mean) {
    auto& ctx = m.getContext();
    llvm::IRBuilder<> b(ctx);
    auto* i64 = b.getInt64Ty();
    auto* ptr = llvm::PointerType::get(ctx, 0);
    llvm::Type* t = f32 ? b.getFloatTy() : b.getDoubleTy();
    auto* fn =
        llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {i64, ptr, ptr, ptr}, false),
                               llvm::Function::ExternalLinkage, name, m);
    auto a = fn->arg_begin();
    llvm::Value *nseg = a++, *seg = a++, *from = a++, *to = a++;
    b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
    // for (i = 0; i < end; ++i) body(i): a counted loop at the insertion point.
    auto loop = [&](llvm::Value* end, const std::function<void(llvm::Value*)>& body) {
        auto* pre = b.GetInsertBlock();
        auto* head = llvm::BasicBlock::Create(ctx, "head", fn);
        auto* bodyb = llvm::BasicBlock::Create(ctx, "body", fn);
        auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
        b.CreateBr(head);
        b.SetInsertPoint(head);
        auto* i = b.CreatePHI(i64, 2);
        i->addIncoming(b.getInt64(0), pre);
        b.CreateCondBr(b.CreateICmpSLT(i, end), bodyb, exit);
        b.SetInsertPoint(bodyb);
        body(i);
        i->addIncoming(b.CreateAdd(i, b.getInt64(1)), b.GetInsertBlock());
        b.CreateBr(head);
        b.SetInsertPoint(exit);
    };
    loop(nseg, [&](llvm::Value* s) {
        auto field = [&](int k) {
            return b.CreateLoad(
                i64,
                b.CreateGEP(i64, seg, b.CreateAdd(b.CreateMul(s, b.getInt64(5)), b.getInt64(k))));
        };
        llvm::Value *big_base = field(0), *small_base = field(1), *outer = field(2), *n = field(3),
                    *inner = field(4);
        llvm::Value* scale = llvm::ConstantFP::get(t, 1.0);
        if (mean)
            scale = b.CreateSelect(b.CreateICmpSGT(n, b.getInt64(0)),
                                   b.CreateFDiv(scale, b.CreateSIToFP(n, t)), scale);
        llvm::Value* small_ptr = expand ? from : to;
        llvm::Value* big_ptr = expand ? to : from;
        auto at = [&](llvm::Value* p, llvm::Value* index) { return b.CreateGEP(t, p, index); };
        loop(outer, [&](llvm::Value* o) {
            llvm::Value* small_row = b.CreateAdd(small_base, b.CreateMul(o, inner));
            if (!expand)
                loop(inner, [&](llvm::Value* j) {
                    b.CreateStore(llvm::ConstantFP::get(t, 0.0),
                                  at(small_ptr, b.CreateAdd(small_row, j)));
                });
            loop(n, [&](llvm::Value* r) {
                llvm::Value* big_row =
                    b.CreateAdd(big_base, b.CreateMul(b.CreateAdd(b.CreateMul(o, n), r), inner));
                loop(inner, [&](llvm::Value* j) {
                    llvm::Value* sp = at(small_ptr, b.CreateAdd(small_row, j));
                    llvm::Value* bp = at(big_ptr, b.CreateAdd(big_row, j));
                    if (expand)
                        b.CreateStore(b.CreateFMul(b.CreateLoad(t, sp), scale), bp);
                    else
                        b.CreateStore(b.CreateFAdd(b.CreateLoad(t, sp), b.CreateLoad(t, bp)), sp);
                });
            });
            if (!expand && mean)
                loop(inner, [&](llvm::Value* j) {
                    llvm::Value* sp = at(small_ptr, b.CreateAdd(small_row, j));
                    b.CreateStore(b.CreateFMul(b.CreateLoad(t, sp), scale), sp);
                });
        });
    });
    b.CreateRetVoid();
}

// The eight kernels (f32/f64 x reduce/expand x sum/mean), compiled once per process.
SegKernel kernel(bool f32, bool expand, bool mean) {
    static std::once_flag once;
    static SegKernel table[8];
    std::call_once(once, [] {
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = new_module("rag_segmented", *ctx);
        for (int k = 0; k < 8; ++k)
            emit_kernel(*m, "rag_segmented_" + std::to_string(k), k & 1, k & 2, k & 4);
        std::string err;
        llvm::raw_string_ostream es(err);
        if (llvm::verifyModule(*m, &es)) fail("internal: segmented kernels: ", es.str());
        auto addrs = add_module(std::move(m), std::move(ctx), 8, "rag_segmented_");
        for (int k = 0; k < 8; ++k) table[k] = reinterpret_cast<SegKernel>(addrs[std::size_t(k)]);
    });
    return table[(f32 ? 1 : 0) | (expand ? 2 : 0) | (mean ? 4 : 0)];
}

struct AxisPlan {
    bool whole_sample; // axis=0
    int axis;          // the per-sample axis otherwise
};

std::optional<AxisPlan> axis_plan(const Shape& x, const Attrs& at) {
    if (!at.has("axis") || !x.batched) return std::nullopt;
    std::int64_t a = at.get_int("axis");
    if (a < 0) a += x.logical_rank();
    if (a == 0) return AxisPlan{true, -1};
    return AxisPlan{false, int(a - 1)};
}

// Per sample: where the big and small blocks start, and the (outer, n, inner) extents.
std::vector<std::int64_t> segments(const Structure& big, const Structure& small,
                                   const AxisPlan& p) {
    std::vector<std::int64_t> seg;
    const int d = big.rank();
    for (std::int64_t i = 0; i < big.batch(); ++i) {
        std::int64_t outer = 1, n = big.sample_numel(i), inner = 1;
        if (!p.whole_sample) {
            const int q = big.dim_order()[std::size_t(p.axis)];
            n = big.size(i, p.axis);
            for (int a = 0; a < d; ++a) {
                const int pos = big.dim_order()[std::size_t(a)];
                if (pos < q) outer *= big.size(i, a);
                if (pos > q) inner *= big.size(i, a);
            }
        }
        seg.insert(seg.end(), {big.sample_begin(i), small.sample_begin(i), outer, n, inner});
    }
    return seg;
}

} // namespace

bool is_segmented(const ir::Function& f, const ir::Node& n) {
    const DType t = n.type.dtype;
    if (t != DType::f32 && t != DType::f64) return false;
    if (n.op == "sum" || n.op == "mean")
        return axis_plan(f.type(n.args[0]).shape, n.attrs).has_value();
    if (n.op == "reduce_grad") {
        const std::string kind = n.attrs.get_str("kind");
        return (kind == "sum" || kind == "mean") &&
               axis_plan(f.type(n.args[0]).shape, n.attrs).has_value();
    }
    return false;
}

RaggedTensor run_segmented(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    const AxisPlan p = *axis_plan(x.shape(), n.attrs);
    const bool f32 = n.type.dtype == DType::f32;
    if (n.op == "reduce_grad") {
        const RaggedTensor& g = vals[std::size_t(n.args[2])];
        RaggedTensor dx = RaggedTensor::zeros(x.dtype(), x.structure_ptr());
        auto seg = segments(x.structure(), g.structure(), p);
        kernel(f32, true, n.attrs.get_str("kind") == "mean")(x.batch(), seg.data(), g.data(),
                                                             dx.mutable_data());
        return dx;
    }
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < x.batch(); ++i) {
        auto s = x.structure().sample_shape(i);
        if (p.whole_sample) continue;
        for (int a = 0; a < int(s.size()); ++a)
            if (a != p.axis) sizes.push_back(s[std::size_t(a)]);
    }
    RaggedTensor y =
        RaggedTensor::zeros(n.type.dtype, Structure::make(n.type.shape, x.batch(), sizes));
    auto seg = segments(x.structure(), y.structure(), p);
    kernel(f32, false, n.op == "mean")(x.batch(), seg.data(), x.data(), y.mutable_data());
    return y;
}

} // namespace rag::jit
