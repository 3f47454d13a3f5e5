#include "jit/segmented.hpp"

#include "jit/llvm_jit.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>

#include <algorithm>
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

// Work per segment entry: a sample's `outer` extent is cut into pieces of about this many
// elements, so long samples spread over threads (pieces are independent: no shared sums).
constexpr std::int64_t piece_elements = 1 << 14;

// Per sample: where the big and small blocks start, and the (outer, n, inner) extents; a
// sample's outer extent is split into independent pieces.
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
        const std::int64_t step =
            std::max<std::int64_t>(1, piece_elements / std::max<std::int64_t>(n * inner, 1));
        for (std::int64_t o = 0; o < outer || o == 0; o += step)
            seg.insert(seg.end(),
                       {big.sample_begin(i) + o * n * inner, small.sample_begin(i) + o * inner,
                        std::min(step, outer - o), n, inner});
    }
    return seg;
}

// Runs kernel k over every segment entry, entries spread over threads.
void run_segments(SegKernel k, const std::vector<std::int64_t>& seg, const void* from, void* to) {
    const std::int64_t count = std::int64_t(seg.size() / 5);
    parallel_for(count, 1,
                 [&](std::int64_t b, std::int64_t e) { k(e - b, seg.data() + 5 * b, from, to); });
}

// Rows per block of a whole-batch sum: fixed, so the order of additions (inside a block, then
// block after block) does not depend on the thread count.
constexpr std::int64_t block_rows = 256;

// Column sums of `data` viewed as [rows, width] (t = f32 or f64): blocks of rows summed by the
// compiled kernel in parallel, then the block sums added in order, in double.
std::vector<double> column_sums(const void* data, std::int64_t rows, std::int64_t width, DType t) {
    const bool f32 = t == DType::f32;
    const std::int64_t blocks = (rows + block_rows - 1) / block_rows;
    RaggedTensor partial = RaggedTensor::zeros(
        t, Structure::make(Shape{false, {Axis::fixed_of(blocks), Axis::fixed_of(width)}}, 1,
                           {blocks, width}));
    std::vector<std::int64_t> seg;
    for (std::int64_t b = 0; b < blocks; ++b)
        seg.insert(seg.end(), {b * block_rows * width, b * width, 1,
                               std::min(block_rows, rows - b * block_rows), width});
    run_segments(kernel(f32, false, false), seg, data, partial.mutable_data());
    std::vector<double> pv = partial.to_f64(), sums(std::size_t(width), 0.0);
    for (std::int64_t b = 0; b < blocks; ++b)
        for (std::int64_t j = 0; j < width; ++j)
            sums[std::size_t(j)] += pv[std::size_t(b * width + j)];
    return sums;
}

// A global sum: every stored element, as column sums over the tensor's rows (so the compiled
// loop runs over contiguous row_width-long vectors), then the columns added in order.
double global_sum(const RaggedTensor& x) {
    const std::int64_t n = x.numel();
    if (n == 0) return 0.0;
    const std::int64_t width = x.structure().row_width() > 0 ? x.structure().row_width() : 1;
    double s = 0;
    for (double c : column_sums(x.data(), n / width, width, x.dtype())) s += c;
    return s;
}

bool is_one(const Axis& a) {
    return a.kind == AxisKind::fixed && a.extent == 1;
}

// How sum_to(g, like) runs as a segmented loop, if it can.
struct SumToPlan {
    enum Kind { identity, one_axis, columns } kind;
    int axis = -1;          // axis: the one per-sample axis of g that like has as 1
    std::int64_t width = 0; // columns: like's element count (g's innermost storage block)
};

std::optional<SumToPlan> sum_to_plan(const Shape& g, const Shape& like) {
    if (g == like) return SumToPlan{SumToPlan::identity, -1, 0};
    if (g.batched && like.batched) {
        if (g.sample_rank() != like.sample_rank()) return std::nullopt;
        int axis = -1;
        for (int a = 0; a < g.sample_rank(); ++a) {
            if (g.axes[std::size_t(a)] == like.axes[std::size_t(a)]) continue;
            if (!is_one(like.axes[std::size_t(a)]) || axis >= 0) return std::nullopt;
            axis = a;
        }
        return SumToPlan{SumToPlan::one_axis, axis, 0};
    }
    if (!g.batched || like.batched) return std::nullopt;
    // An unbatched like, after its leading 1s, equal to g's trailing static axes: those are
    // g's innermost storage axes, so the cotangent sums g's rows of that many elements.
    std::size_t lead = 0;
    while (lead < like.axes.size() && is_one(like.axes[lead])) ++lead;
    const std::size_t k = like.axes.size() - lead;
    if (k > g.axes.size()) return std::nullopt;
    std::int64_t width = 1;
    for (std::size_t a = 0; a < k; ++a) {
        const Axis& x = like.axes[lead + a];
        if (x.kind != AxisKind::fixed || !(x == g.axes[g.axes.size() - k + a])) return std::nullopt;
        width *= x.extent;
    }
    return SumToPlan{SumToPlan::columns, -1, width};
}

RaggedTensor scalar(DType t, double v) {
    return RaggedTensor::from_f64(t, Structure::make(Shape{false, {}}, 1, {}), {v});
}

// Fills every element of a float tensor with v, spread over threads.
template <class T> void fill(RaggedTensor& t, double v) {
    T* d = static_cast<T*>(t.mutable_data());
    parallel_for(t.numel(), 1 << 16,
                 [&](std::int64_t b, std::int64_t e) { std::fill(d + b, d + e, T(v)); });
}

} // namespace

bool is_segmented(const ir::Function& f, const ir::Node& n) {
    const DType t = n.type.dtype;
    if (t != DType::f32 && t != DType::f64) return false;
    const Shape& x = f.type(n.args[0]).shape;
    if (n.op == "sum" || n.op == "mean") return !n.attrs.has("axis") || axis_plan(x, n.attrs);
    if (n.op == "reduce_grad") {
        const std::string kind = n.attrs.get_str("kind");
        return (kind == "sum" || kind == "mean") && (!n.attrs.has("axis") || axis_plan(x, n.attrs));
    }
    if (n.op == "sum_to")
        return f.type(n.args[0]).dtype == t && sum_to_plan(x, f.type(n.args[1]).shape).has_value();
    return false;
}

RaggedTensor run_segmented(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    const bool f32 = n.type.dtype == DType::f32;
    if (n.op == "sum_to") {
        const RaggedTensor& like = vals[std::size_t(n.args[1])];
        const SumToPlan sp = *sum_to_plan(x.shape(), like.shape());
        if (sp.kind == SumToPlan::identity && x.structure().same_as(like.structure())) return x;
        // Runtime extents must agree on every axis but the summed ones, as the reference
        // kernel requires; otherwise it reports.
        bool ok =
            sp.kind != SumToPlan::identity && (!like.shape().batched || x.batch() == like.batch());
        if (ok && sp.kind == SumToPlan::one_axis)
            for (std::int64_t i = 0; i < x.batch() && ok; ++i)
                for (int a = 0; a < x.structure().rank(); ++a)
                    if (a != sp.axis && x.structure().size(i, a) != like.structure().size(i, a))
                        ok = false;
        if (!ok) return evaluate("sum_to", {x, like}, n.attrs);
        if (sp.kind == SumToPlan::one_axis) {
            RaggedTensor out = uninitialized(like.dtype(), like.structure_ptr());
            auto seg = segments(x.structure(), like.structure(), AxisPlan{false, sp.axis});
            run_segments(kernel(f32, false, false), seg, x.data(), out.mutable_data());
            return out;
        }
        if (sp.width == 0) return RaggedTensor::zeros(like.dtype(), like.structure_ptr());
        auto sums = column_sums(x.data(), x.numel() / sp.width, sp.width, x.dtype());
        return RaggedTensor::from_f64(like.dtype(), like.structure_ptr(), sums);
    }
    if (!n.attrs.has("axis")) {
        const double count = double(x.numel());
        const bool mean =
            n.op == "mean" || (n.op == "reduce_grad" && n.attrs.get_str("kind") == "mean");
        if (n.op != "reduce_grad") {
            const double s = global_sum(x);
            return scalar(n.type.dtype, mean ? (count > 0 ? s / count : 0.0) : s);
        }
        // d/dx of a global sum (mean) is g (g / count) everywhere.
        const double g = vals[std::size_t(n.args[2])].item();
        RaggedTensor dx = uninitialized(x.dtype(), x.structure_ptr());
        const double v = mean && count > 0 ? g / count : g;
        if (f32)
            fill<float>(dx, v);
        else
            fill<double>(dx, v);
        return dx;
    }
    const AxisPlan p = *axis_plan(x.shape(), n.attrs);
    if (n.op == "reduce_grad") {
        const RaggedTensor& g = vals[std::size_t(n.args[2])];
        RaggedTensor dx = uninitialized(x.dtype(), x.structure_ptr());
        auto seg = segments(x.structure(), g.structure(), p);
        run_segments(kernel(f32, true, n.attrs.get_str("kind") == "mean"), seg, g.data(),
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
    RaggedTensor y = uninitialized(n.type.dtype, Structure::make(n.type.shape, x.batch(), sizes));
    auto seg = segments(x.structure(), y.structure(), p);
    run_segments(kernel(f32, false, n.op == "mean"), seg, x.data(), y.mutable_data());
    return y;
}

} // namespace rag::jit
