#include "jit/segmented.hpp"

#include "jit/elementwise_llvm.hpp"
#include "jit/host_kernels.hpp"
#include "jit/llvm_jit.hpp"
#include "jit/llvm_loops.hpp"
#include "jit/placement.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <type_traits>

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

// The eight kernels (f64/f32 x reduce/expand x sum/mean), each compiled the first time it is
// used.
SegKernel kernel(bool f32, bool expand, bool mean) {
    static HostKernels table("segmented",
                             {"sum.f64", "sum.f32", "expand_sum.f64", "expand_sum.f32", "mean.f64",
                              "mean.f32", "expand_mean.f64", "expand_mean.f32"},
                             [](llvm::Module& m, const std::string& name, std::size_t k) {
                                 emit_kernel(m, name, k & 1, k & 2, k & 4);
                             });
    return reinterpret_cast<SegKernel>(
        table.get(std::size_t((f32 ? 1 : 0) | (expand ? 2 : 0) | (mean ? 4 : 0))));
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
// loop runs over contiguous row_width-long vectors), then the columns added in order. An
// unbatched tensor is one row of all its elements, which would be one block on one thread
// with a partial as large as the tensor: it is summed as rows of its last axis instead.
double global_sum(const RaggedTensor& x) {
    const std::int64_t n = x.numel();
    if (n == 0) return 0.0;
    std::int64_t width = x.structure().row_width() > 0 ? x.structure().row_width() : 1;
    const Shape& shape = x.shape();
    if (!shape.batched && shape.sample_rank() >= 2 && shape.axes.back().kind == AxisKind::fixed &&
        shape.axes.back().extent > 0 && n % shape.axes.back().extent == 0)
        width = shape.axes.back().extent;
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
    if (like.batched) return std::nullopt;
    // An unbatched like, after its leading 1s, equal to g's trailing static axes: those are
    // g's innermost storage axes (an unbatched g is row-major), so the cotangent sums g's rows
    // of that many elements.
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

// ---- max/min, softmax, logsumexp and their gradients over one per-sample axis ----------------
//
// The same segment entries as the sums; each (outer, inner) position is a *line* of n elements
// reduced in place. Lines with inner = 1 (the reduced axis innermost, the usual case) run with
// the reduction in registers: max/min over explicit vectors of W lanes, sums with `reassoc` so
// the vectoriser reorders them; lines with inner > 1 keep their accumulators in small-side
// buffers and run (r, j) loops that vectorise over j. Semantics are those of
// ir/ops/reduction.cpp: NaN propagates through max/min, softmax/logsumexp shift by the line's
// max over non-NaN entries when finite (else 0), an empty max (min) is -inf (+inf), an empty
// logsumexp -inf, and the max/min gradient goes to the first matching position along the axis.

enum class LineOp : int {
    max,
    min,
    softmax,
    logsumexp,
    softmax_grad,
    logsumexp_grad,
    extreme_grad
};
constexpr int line_ops = 7;

// k(nseg, seg, a, b, c, d, e); "big" buffers have x's structure, "small" ones one element per line:
//   max, min:        a = x, b = y (small)
//   softmax:         a = x, b = y (big), c = shift (small scratch), d = sum (small scratch)
//   logsumexp:       a = x, b = y (small), c = shift (small scratch)
//   softmax_grad:    a = y, b = g, c = dx (big), d = dot (small scratch)
//   logsumexp_grad:  a = x, b = y (small), c = g (small), d = dx
//   extreme_grad:    a = x, b = y (small), c = g (small), d = dx, e = taken (small scratch)
//                    (reduce_grad of max/min)
using LineKernel = void (*)(std::int64_t nseg, const std::int64_t* seg, void* a, void* b, void* c,
                            void* d, void* e);

void emit_line_kernel(llvm::Module& m, const std::string& name, bool f32, LineOp op) {
    auto& ctx = m.getContext();
    auto* i64t = llvm::Type::getInt64Ty(ctx);
    auto* ptr = llvm::PointerType::get(ctx, 0);
    LoopBuilder L(m, name, {i64t, ptr, ptr, ptr, ptr, ptr, ptr});
    auto& b = L.b;
    llvm::Type* t = f32 ? b.getFloatTy() : b.getDoubleTy();
    const unsigned W = f32 ? 8 : 4; // lanes of the explicit max/min vectors
    auto* vt = llvm::FixedVectorType::get(t, W);
    llvm::Value *nseg = L.arg(0), *seg = L.arg(1), *A = L.arg(2), *B = L.arg(3), *C = L.arg(4),
                *D = L.arg(5), *E = L.arg(6);
    const double inf = std::numeric_limits<double>::infinity();
    auto c = [&](double v) { return llvm::ConstantFP::get(t, v); };
    auto ld = [&](llvm::Value* p, llvm::Value* i) { return L.load(t, p, i); };
    auto st = [&](llvm::Value* v, llvm::Value* p, llvm::Value* i) { L.store(v, p, i); };
    auto exp = [&](llvm::Value* x) { return host_math().call(b, m, MathFn::exp, {x}); };
    auto log = [&](llvm::Value* x) { return host_math().call(b, m, MathFn::log, {x}); };
    auto finite = [&](llvm::Value* v) { return b.CreateFCmpOEQ(b.CreateFSub(v, v), c(0)); };
    auto isnan = [&](llvm::Value* v) { return b.CreateFCmpUNO(v, v); };
    // then() when cond holds, else other().
    auto branch = [&](llvm::Value* cond, const std::function<void()>& then,
                      const std::function<void()>& other) {
        auto* tb = llvm::BasicBlock::Create(ctx, "then", L.fn);
        auto* eb = llvm::BasicBlock::Create(ctx, "else", L.fn);
        auto* jb = llvm::BasicBlock::Create(ctx, "join", L.fn);
        b.CreateCondBr(cond, tb, eb);
        b.SetInsertPoint(tb);
        then();
        b.CreateBr(jb);
        b.SetInsertPoint(eb);
        other();
        b.CreateBr(jb);
        b.SetInsertPoint(jb);
    };
    L.loop(L.i64(0), nseg, [&](llvm::Value* s) {
        auto field = [&](int k) {
            return L.load(i64t, seg, b.CreateAdd(b.CreateMul(s, L.i64(5)), L.i64(k)));
        };
        llvm::Value *big_base = field(0), *small_base = field(1), *outer = field(2), *n = field(3),
                    *inner = field(4);
        L.loop(L.i64(0), outer, [&](llvm::Value* o) {
            llvm::Value* sr = b.CreateAdd(small_base, b.CreateMul(o, inner));
            llvm::Value* bb = b.CreateAdd(big_base, b.CreateMul(b.CreateMul(o, n), inner));
            // inner = 1: element r of the line is big[bb + r], its result small[sr].
            auto over_line = [&](const std::function<void(llvm::Value*)>& body) {
                L.loop(L.i64(0), n, [&](llvm::Value* r) { body(b.CreateAdd(bb, r)); });
            };
            auto sum_line = [&](const std::function<llvm::Value*(llvm::Value*)>& term) {
                return L.reduce(L.i64(0), n, {c(0)},
                                [&](llvm::Value* r, const std::vector<llvm::Value*>& acc) {
                                    return std::vector<llvm::Value*>{
                                        L.add_reassoc(acc[0], term(b.CreateAdd(bb, r)))};
                                })[0];
            };
            // The max (min) of the line's non-NaN entries (+-inf if none) and whether it has a
            // NaN: W lanes at a time, then the tail.
            auto extreme_line = [&](bool min) {
                const auto id = min ? llvm::Intrinsic::minnum : llvm::Intrinsic::maxnum;
                llvm::Value* init = c(min ? inf : -inf);
                llvm::Value* chunks = b.CreateSDiv(n, L.i64(W));
                auto* mask_t = llvm::FixedVectorType::get(b.getInt1Ty(), W);
                auto v = L.reduce(
                    L.i64(0), chunks,
                    {b.CreateVectorSplat(W, init), llvm::Constant::getNullValue(mask_t)},
                    [&](llvm::Value* k, const std::vector<llvm::Value*>& acc) {
                        llvm::Value* p =
                            b.CreateGEP(t, A, b.CreateAdd(bb, b.CreateMul(k, L.i64(W))));
                        llvm::Value* x = b.CreateAlignedLoad(vt, p, llvm::Align(f32 ? 4 : 8));
                        return std::vector<llvm::Value*>{b.CreateBinaryIntrinsic(id, acc[0], x),
                                                         b.CreateOr(acc[1], isnan(x))};
                    });
                llvm::Value* e = min ? b.CreateFPMinReduce(v[0]) : b.CreateFPMaxReduce(v[0]);
                llvm::Value* any = b.CreateOrReduce(v[1]);
                return L.reduce(b.CreateMul(chunks, L.i64(W)), n, {e, any},
                                [&](llvm::Value* r, const std::vector<llvm::Value*>& acc) {
                                    llvm::Value* x = ld(A, b.CreateAdd(bb, r));
                                    return std::vector<llvm::Value*>{
                                        b.CreateBinaryIntrinsic(id, acc[0], x),
                                        b.CreateOr(acc[1], isnan(x))};
                                });
            };
            // inner > 1: every (r, j) at big[bb + r * inner + j], its line's small[sr + j].
            auto over_plane = [&](const std::function<void(llvm::Value*, llvm::Value*)>& body) {
                L.loop(L.i64(0), n, [&](llvm::Value* r) {
                    llvm::Value* row = b.CreateAdd(bb, b.CreateMul(r, inner));
                    L.loop(L.i64(0), inner,
                           [&](llvm::Value* j) { body(b.CreateAdd(row, j), b.CreateAdd(sr, j)); });
                });
            };
            auto over_small = [&](const std::function<void(llvm::Value*)>& body) {
                L.loop(L.i64(0), inner, [&](llvm::Value* j) { body(b.CreateAdd(sr, j)); });
            };
            auto shift = [&](llvm::Value* mx) { return b.CreateSelect(finite(mx), mx, c(0)); };
            llvm::Value* line = b.CreateICmpEQ(inner, L.i64(1));
            switch (op) {
            case LineOp::max:
            case LineOp::min: {
                const bool min = op == LineOp::min;
                const auto id = min ? llvm::Intrinsic::minnum : llvm::Intrinsic::maxnum;
                branch(
                    line,
                    [&] {
                        auto r = extreme_line(min);
                        st(b.CreateSelect(r[1], llvm::ConstantFP::getNaN(t), r[0]), B, sr);
                    },
                    [&] {
                        over_small([&](llvm::Value* k) { st(c(min ? inf : -inf), B, k); });
                        over_plane([&](llvm::Value* i, llvm::Value* k) {
                            llvm::Value *a = ld(B, k), *x = ld(A, i);
                            st(b.CreateSelect(b.CreateFCmpUNO(a, x), llvm::ConstantFP::getNaN(t),
                                              b.CreateBinaryIntrinsic(id, a, x)),
                               B, k);
                        });
                    });
                break;
            }
            case LineOp::softmax:
            case LineOp::logsumexp: {
                const bool soft = op == LineOp::softmax;
                branch(
                    line,
                    [&] {
                        llvm::Value* sh = shift(extreme_line(false)[0]);
                        llvm::Value* sum = sum_line([&](llvm::Value* i) {
                            llvm::Value* e = exp(b.CreateFSub(ld(A, i), sh));
                            if (soft) st(e, B, i);
                            return e;
                        });
                        if (soft)
                            over_line(
                                [&](llvm::Value* i) { st(b.CreateFDiv(ld(B, i), sum), B, i); });
                        else
                            st(b.CreateFAdd(sh, log(sum)), B, sr);
                    },
                    [&] {
                        llvm::Value* sums = soft ? D : B;
                        over_small([&](llvm::Value* k) { st(c(-inf), C, k); });
                        over_plane([&](llvm::Value* i, llvm::Value* k) {
                            st(b.CreateBinaryIntrinsic(llvm::Intrinsic::maxnum, ld(C, k), ld(A, i)),
                               C, k);
                        });
                        over_small([&](llvm::Value* k) {
                            st(shift(ld(C, k)), C, k);
                            st(c(0), sums, k);
                        });
                        over_plane([&](llvm::Value* i, llvm::Value* k) {
                            llvm::Value* e = exp(b.CreateFSub(ld(A, i), ld(C, k)));
                            if (soft) st(e, B, i);
                            st(b.CreateFAdd(ld(sums, k), e), sums, k);
                        });
                        if (soft)
                            over_plane([&](llvm::Value* i, llvm::Value* k) {
                                st(b.CreateFDiv(ld(B, i), ld(D, k)), B, i);
                            });
                        else
                            over_small([&](llvm::Value* k) {
                                st(b.CreateFAdd(ld(C, k), log(ld(B, k))), B, k);
                            });
                    });
                break;
            }
            case LineOp::softmax_grad:
                branch(
                    line,
                    [&] {
                        llvm::Value* dot = sum_line(
                            [&](llvm::Value* i) { return b.CreateFMul(ld(B, i), ld(A, i)); });
                        over_line([&](llvm::Value* i) {
                            st(b.CreateFMul(ld(A, i), b.CreateFSub(ld(B, i), dot)), C, i);
                        });
                    },
                    [&] {
                        over_small([&](llvm::Value* k) { st(c(0), D, k); });
                        over_plane([&](llvm::Value* i, llvm::Value* k) {
                            st(b.CreateFAdd(ld(D, k), b.CreateFMul(ld(B, i), ld(A, i))), D, k);
                        });
                        over_plane([&](llvm::Value* i, llvm::Value* k) {
                            st(b.CreateFMul(ld(A, i), b.CreateFSub(ld(B, i), ld(D, k))), C, i);
                        });
                    });
                break;
            case LineOp::logsumexp_grad: {
                // g exp(x - y), 0 where y = -inf.
                auto grad = [&](llvm::Value* i, llvm::Value* k) {
                    llvm::Value *y = ld(B, k), *g = ld(C, k);
                    st(b.CreateSelect(b.CreateFCmpUNE(y, c(-inf)),
                                      b.CreateFMul(g, exp(b.CreateFSub(ld(A, i), y))), c(0)),
                       D, i);
                };
                branch(
                    line, [&] { over_line([&](llvm::Value* i) { grad(i, sr); }); },
                    [&] { over_plane(grad); });
                break;
            }
            case LineOp::extreme_grad: {
                // g at the first position of each line equal to y (or both NaN), else 0.
                auto match = [&](llvm::Value* x, llvm::Value* y) {
                    return b.CreateOr(b.CreateFCmpOEQ(x, y), b.CreateAnd(isnan(x), isnan(y)));
                };
                branch(
                    line,
                    [&] { // zeros, then find the first match
                        over_line([&](llvm::Value* i) { st(c(0), D, i); });
                        llvm::Value* y = ld(B, sr);
                        llvm::Value* found = L.reduce(
                            L.i64(0), n, {L.i64(-1)},
                            [&](llvm::Value* r, const std::vector<llvm::Value*>& acc) {
                                llvm::Value* m = match(ld(A, b.CreateAdd(bb, r)), y);
                                return std::vector<llvm::Value*>{b.CreateSelect(
                                    b.CreateAnd(b.CreateICmpSLT(acc[0], L.i64(0)), m), r, acc[0])};
                            })[0];
                        branch(
                            b.CreateICmpSGE(found, L.i64(0)),
                            [&] { st(ld(C, sr), D, b.CreateAdd(bb, found)); }, [] {});
                    },
                    [&] { // one pass over (r, j), whether line j is taken in e[j] (0 or 1)
                        over_small([&](llvm::Value* k) { st(c(0), E, k); });
                        over_plane([&](llvm::Value* i, llvm::Value* k) {
                            llvm::Value* taken = b.CreateFCmpONE(ld(E, k), c(0));
                            llvm::Value* hit =
                                b.CreateAnd(match(ld(A, i), ld(B, k)), b.CreateNot(taken));
                            st(b.CreateSelect(hit, ld(C, k), c(0)), D, i);
                            st(b.CreateSelect(b.CreateOr(taken, hit), c(1), c(0)), E, k);
                        });
                    });
                break;
            }
            }
        });
    });
    L.finish();
}

// The 14 line kernels (7 ops x f64/f32), each compiled the first time it is used; `ir` gets
// its optimised module's text.
LineKernel line_kernel(bool f32, LineOp op, const std::string** ir = nullptr) {
    static HostKernels table("lines",
                             {"max.f64", "max.f32", "min.f64", "min.f32", "softmax.f64",
                              "softmax.f32", "logsumexp.f64", "logsumexp.f32", "softmax_grad.f64",
                              "softmax_grad.f32", "logsumexp_grad.f64", "logsumexp_grad.f32",
                              "extreme_grad.f64", "extreme_grad.f32"},
                             [](llvm::Module& m, const std::string& name, std::size_t k) {
                                 emit_line_kernel(m, name, k & 1, LineOp(k / 2));
                             });
    return reinterpret_cast<LineKernel>(table.get(std::size_t(2 * int(op) + (f32 ? 1 : 0)), ir));
}

// The axis plan of a line op: a batched value's (axis_plan), or an unbatched array's axis, which
// runs as one sample (the padded baseline's softmax and masked max over dense envelopes).
std::optional<AxisPlan> line_axis_plan(const Shape& x, const Attrs& at) {
    if (!at.has("axis")) return std::nullopt;
    if (x.batched) return axis_plan(x, at);
    std::int64_t a = at.get_int("axis");
    const auto rank = std::int64_t(x.axes.size());
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) return std::nullopt; // the reference kernel's error
    return AxisPlan{false, int(a)};
}

bool is_line_op(const ir::Node& n) {
    if (n.op == "max" || n.op == "min" || n.op == "softmax" || n.op == "logsumexp" ||
        n.op == "softmax_grad" || n.op == "logsumexp_grad")
        return true;
    if (n.op != "reduce_grad") return false;
    const std::string kind = n.attrs.get_str("kind");
    return kind == "max" || kind == "min";
}

// The structure of reducing x along p (the reference's result structure).
StructurePtr reduced(const Structure& x, const AxisPlan& p) {
    Shape s = p.whole_sample ? Shape{true, {}} : x.shape();
    std::vector<std::int64_t> sizes;
    if (!p.whole_sample) {
        s.axes.erase(s.axes.begin() + p.axis);
        for (std::int64_t i = 0; i < x.batch(); ++i) {
            auto xs = x.sample_shape(i);
            for (int a = 0; a < int(xs.size()); ++a)
                if (a != p.axis) sizes.push_back(xs[std::size_t(a)]);
        }
    }
    return Structure::make(s, x.batch(), sizes);
}

bool identity_order(const Structure& x) {
    for (int a = 0; a < int(x.dim_order().size()); ++a)
        if (x.dim_order()[std::size_t(a)] != a) return false;
    return true;
}

// Runs line kernel `op` over every segment entry, entries spread over threads.
void run_line_kernel(bool f32, LineOp op, const std::vector<std::int64_t>& seg, const void* a,
                     const void* b_, const void* c, const void* d, void* scratch = nullptr) {
    LineKernel k = line_kernel(f32, op);
    const std::int64_t count = std::int64_t(seg.size() / 5);
    parallel_for(count, 1, [&](std::int64_t b, std::int64_t e) {
        k(e - b, seg.data() + 5 * b, const_cast<void*>(a), const_cast<void*>(b_),
          const_cast<void*>(c), const_cast<void*>(d), scratch);
    });
}

// Elements per block of a global max/min: blocks reduce in parallel, the host combines them.
constexpr std::int64_t extreme_block = 1 << 14;

// max/min without axis= (every stored entry: NaN if any, else the extremum, +-inf if empty) and
// their gradient (g at the first matching entry in the reference's order: samples in batch
// order, each in logical order, which is storage order when the storage order is logical).
template <class T>
std::optional<RaggedTensor> global_extreme(const ir::Node& n,
                                           const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    const bool min = n.op == "min" || (n.op == "reduce_grad" && n.attrs.get_str("kind") == "min");
    const std::int64_t count = x.numel();
    const T* xs = static_cast<const T*>(x.data());
    if (n.op == "reduce_grad") {
        if (!identity_order(x.structure())) return std::nullopt;
        const T y = T(vals[std::size_t(n.args[1])].item());
        const T g = T(vals[std::size_t(n.args[2])].item());
        RaggedTensor dx = uninitialized(x.dtype(), x.structure_ptr());
        fill<T>(dx, 0.0);
        for (std::int64_t e = 0; e < count; ++e)
            if (xs[e] == y || (std::isnan(xs[e]) && std::isnan(y))) {
                static_cast<T*>(dx.mutable_data())[e] = g;
                break;
            }
        return dx;
    }
    const std::int64_t blocks = (count + extreme_block - 1) / extreme_block;
    std::vector<std::int64_t> seg;
    for (std::int64_t b = 0; b < blocks; ++b)
        seg.insert(seg.end(), {b * extreme_block, b, 1,
                               std::min(extreme_block, count - b * extreme_block), 1});
    std::vector<T> partial(static_cast<std::size_t>(blocks));
    run_line_kernel(std::is_same_v<T, float>, min ? LineOp::min : LineOp::max, seg, xs,
                    partial.data(), nullptr, nullptr);
    double v =
        min ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
    for (T p : partial) {
        if (std::isnan(v)) break;
        if (std::isnan(p) || (min ? p < v : p > v)) v = double(p);
    }
    return scalar(n.type.dtype, v);
}

// Runs a line op, or returns nullopt when its runtime arguments need the reference kernel
// (structures that disagree, which it reports, or the first extremal position of a whole
// sample stored in another order than the logical one).
std::optional<RaggedTensor> run_lines(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    const bool f32 = n.type.dtype == DType::f32;
    if (!n.attrs.has("axis"))
        return f32 ? global_extreme<float>(n, vals) : global_extreme<double>(n, vals);
    const AxisPlan p = *line_axis_plan(x.shape(), n.attrs);
    // Storage puts ragged axes first, then the others, each in logical order, so dropping the
    // reduced axis keeps the small side's storage order; only the first extremal position of
    // a whole sample (reduce_grad with axis=0) needs storage order to be logical order.
    if (n.op == "reduce_grad" && p.whole_sample && !identity_order(x.structure()))
        return std::nullopt;
    StructurePtr small = reduced(x.structure(), p);
    auto seg = segments(x.structure(), *small, p);
    auto run = [&](LineOp op, const void* a, const void* b_, const void* c, const void* d,
                   void* scratch = nullptr) {
        run_line_kernel(f32, op, seg, a, b_, c, d, scratch);
    };
    auto agrees = [&](int arg, const Structure& want) {
        return vals[std::size_t(n.args[std::size_t(arg)])].structure().same_as(want);
    };
    if (n.op == "max" || n.op == "min") {
        RaggedTensor y = uninitialized(n.type.dtype, small);
        run(n.op == "max" ? LineOp::max : LineOp::min, x.data(), y.mutable_data(), nullptr,
            nullptr);
        return y;
    }
    if (n.op == "softmax" || n.op == "logsumexp") {
        const bool soft = n.op == "softmax";
        RaggedTensor y = uninitialized(n.type.dtype, soft ? x.structure_ptr() : small);
        RaggedTensor shifts = uninitialized(n.type.dtype, small);
        RaggedTensor sums = soft ? uninitialized(n.type.dtype, small) : RaggedTensor();
        run(soft ? LineOp::softmax : LineOp::logsumexp, x.data(), y.mutable_data(),
            shifts.mutable_data(), soft ? sums.mutable_data() : nullptr);
        return y;
    }
    if (n.op == "softmax_grad") {
        if (!agrees(1, x.structure())) return std::nullopt;
        RaggedTensor dx = uninitialized(n.type.dtype, x.structure_ptr());
        RaggedTensor dots = uninitialized(n.type.dtype, small);
        run(LineOp::softmax_grad, x.data(), vals[std::size_t(n.args[1])].data(), dx.mutable_data(),
            dots.mutable_data());
        return dx;
    }
    // logsumexp_grad and reduce_grad of max/min: (x, y, g), y and g with the small structure.
    if (!agrees(1, *small) || !agrees(2, *small)) return std::nullopt;
    RaggedTensor dx = uninitialized(n.type.dtype, x.structure_ptr());
    const bool lse = n.op == "logsumexp_grad";
    RaggedTensor taken = lse ? RaggedTensor() : uninitialized(n.type.dtype, small);
    run(lse ? LineOp::logsumexp_grad : LineOp::extreme_grad, x.data(),
        vals[std::size_t(n.args[1])].data(), vals[std::size_t(n.args[2])].data(), dx.mutable_data(),
        lse ? nullptr : taken.mutable_data());
    return dx;
}

} // namespace

std::optional<std::int64_t> sum_to_columns(const Shape& g, const Shape& like) {
    const std::optional<SumToPlan> p = sum_to_plan(g, like);
    if (!p || p->kind != SumToPlan::columns) return std::nullopt;
    return p->width;
}

// Rows narrower than this (a cross entropy over a few classes) run transposed: a line kernel
// over rows of 4 elements calls the scalar exp per element, while over a [width][rows] block its
// plane path vectorises across rows (90K pixels x 4 classes: 1.8 ms -> see the commit).
constexpr std::int64_t narrow = 16;
// Rows per transposed block.
constexpr std::int64_t narrow_rows = 64;

// Runs op (softmax or logsumexp) over the rows of x [rows][width] (width < narrow) in blocks of
// narrow_rows, each transposed to [width][block] so that the kernel's lines are its columns:
// softmax writes y [rows][width], logsumexp y [rows].
template <class T>
void narrow_rows_typed(LineOp op, const T* x, T* y, std::int64_t rows, std::int64_t width) {
    T xt[narrow * narrow_rows], yt[narrow * narrow_rows], shift[narrow_rows], sum[narrow_rows];
    const LineKernel k = line_kernel(std::is_same_v<T, float>, op);
    for (std::int64_t r0 = 0; r0 < rows; r0 += narrow_rows) {
        const std::int64_t n = std::min(narrow_rows, rows - r0);
        for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t c = 0; c < width; ++c) xt[c * n + r] = x[(r0 + r) * width + c];
        const std::int64_t seg[5] = {0, 0, 1, width, n};
        if (op == LineOp::logsumexp) {
            k(1, seg, xt, y + r0, shift, nullptr, nullptr);
            continue;
        }
        k(1, seg, xt, yt, shift, sum, nullptr);
        for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t c = 0; c < width; ++c) y[(r0 + r) * width + c] = yt[c * n + r];
    }
}

template <class T>
void softmax_rows_typed(const T* x, T* y, std::int64_t rows, std::int64_t width, bool causal) {
    if (!causal && width < narrow && rows > 1)
        return narrow_rows_typed(LineOp::softmax, x, y, rows, width);
    std::vector<std::int64_t> seg;
    if (!causal)
        seg = {0, 0, rows, width, 1};
    else
        for (std::int64_t r = 0; r < rows; ++r)
            seg.insert(seg.end(), {r * width, r, 1, std::min(width, r + 1), 1});
    std::vector<T> shift(std::size_t(std::max<std::int64_t>(rows, 1))), sum(shift.size());
    line_kernel(std::is_same_v<T, float>, LineOp::softmax)(std::int64_t(seg.size() / 5), seg.data(),
                                                           const_cast<T*>(x), y, shift.data(),
                                                           sum.data(), nullptr);
    if (causal)
        for (std::int64_t r = 0; r + 1 < width && r < rows; ++r)
            std::fill(y + r * width + r + 1, y + (r + 1) * width, T(0));
}

void softmax_rows(DType t, const void* x, void* y, std::int64_t rows, std::int64_t width,
                  bool causal) {
    if (t == DType::f32)
        softmax_rows_typed(static_cast<const float*>(x), static_cast<float*>(y), rows, width,
                           causal);
    else
        softmax_rows_typed(static_cast<const double*>(x), static_cast<double*>(y), rows, width,
                           causal);
}

void logsumexp_rows(DType t, const void* x, void* y, std::int64_t rows, std::int64_t width) {
    if (rows == 0) return;
    if (width < narrow && rows > 1) {
        if (t == DType::f32)
            narrow_rows_typed(LineOp::logsumexp, static_cast<const float*>(x),
                              static_cast<float*>(y), rows, width);
        else
            narrow_rows_typed(LineOp::logsumexp, static_cast<const double*>(x),
                              static_cast<double*>(y), rows, width);
        return;
    }
    const std::int64_t seg[5] = {0, 0, rows, width, 1};
    std::vector<double> shift(
        static_cast<std::size_t>(rows)); // scratch of rows elements of t (<= double)
    line_kernel(t == DType::f32, LineOp::logsumexp)(1, seg, const_cast<void*>(x), y, shift.data(),
                                                    nullptr, nullptr);
}

std::string line_kernel_ir(std::string_view op, DType t) {
    const std::string* ir = nullptr;
    const std::string names[] = {
        "max", "min", "softmax", "logsumexp", "softmax_grad", "logsumexp_grad", "extreme_grad"};
    int k = 0;
    while (k < line_ops && names[k] != op) ++k;
    if (k == line_ops || (t != DType::f32 && t != DType::f64)) fail("line_kernel_ir: ", op);
    line_kernel(t == DType::f32, LineOp(k), &ir);
    // The function's definition: from its `define` line to the closing brace (the kernel is
    // its module's one entry, which add_module names rag_entry_0).
    const std::string name = "@rag_entry_0(";
    const std::size_t at = ir->find(name);
    const std::size_t begin = ir->rfind("define", at);
    if (at == std::string::npos || begin == std::string::npos) return {};
    return ir->substr(begin, ir->find("\n}\n", at) - begin);
}

bool is_segmented(const ir::Function& f, const ir::Node& n) {
    const DType t = n.type.dtype;
    if (t != DType::f32 && t != DType::f64) return false;
    const Shape& x = f.type(n.args[0]).shape;
    if (n.op == "sum" || n.op == "mean") return !n.attrs.has("axis") || axis_plan(x, n.attrs);
    if (n.op == "reduce_grad" && !is_line_op(n)) {
        const std::string kind = n.attrs.get_str("kind");
        return (kind == "sum" || kind == "mean") && (!n.attrs.has("axis") || axis_plan(x, n.attrs));
    }
    if (n.op == "sum_to")
        return f.type(n.args[0]).dtype == t && sum_to_plan(x, f.type(n.args[1]).shape).has_value();
    if (is_line_op(n)) {
        // max/min (and their gradients) over one axis, including a whole sample, or globally;
        // softmax and logsumexp over one per-sample axis (the batch axis is the reference's
        // error).
        const bool extreme = n.op == "max" || n.op == "min" || n.op == "reduce_grad";
        if (!n.attrs.has("axis")) return extreme;
        const auto p = line_axis_plan(x, n.attrs);
        return p && (extreme || !p->whole_sample);
    }
    return false;
}

RaggedTensor run_segmented(const ir::Node& n, const std::vector<RaggedTensor>& vals) {
    const RaggedTensor& x = vals[std::size_t(n.args[0])];
    if (is_line_op(n)) {
        if (auto y = run_lines(n, vals)) return *y;
        std::vector<RaggedTensor> args;
        for (int a : n.args) args.push_back(vals[std::size_t(a)]);
        return reference_kernel(n.op, args, n.attrs);
    }
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
        if (!ok) return reference_kernel("sum_to", {x, like}, n.attrs);
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
