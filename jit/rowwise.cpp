#include "jit/rowwise.hpp"

#include "jit/host_kernels.hpp"
#include "jit/llvm_jit.hpp"
#include "jit/llvm_loops.hpp"
#include "jit/placement.hpp"
#include "jit/uninitialized.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <llvm/IR/Intrinsics.h>

namespace rag::jit {
namespace {

// (r0, r1, C, eps, x, g, b_or_dy, out, dgb): rows [r0, r1) of C features.
// forward: out = y. gradient: out = dx (may be null), dgb += the parameter gradients of these
// rows (double[2C] = dg then db for layernorm, double[C] = dg for rmsnorm).
using RowKernel = void (*)(std::int64_t, std::int64_t, std::int64_t, double, const void*,
                           const void*, const void*, void*, double*);

enum Which { ln_fwd, ln_grad, rms_fwd, rms_grad };

// Row statistics and arithmetic in the element type: an f32 row is summed in 16 vector lanes
// (relative error ~1e-7 for rows of hundreds of features, far inside REFERENCE.md's 1e-5), and
// with twice the lanes of double layernorm ran 2.4x faster and its gradient 1.25x (8K rows of
// 128, one thread). The parameter-gradient sums, which run over every row, stay in double.
void emit(llvm::Module& m, const std::string& name, bool f32, Which which) {
    auto& ctx = m.getContext();
    llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
    llvm::Type* f64 = llvm::Type::getDoubleTy(ctx);
    llvm::Type* p = llvm::PointerType::get(ctx, 0);
    LoopBuilder L(m, name, {i64, i64, i64, f64, p, p, p, p, p});
    auto& b = L.b;
    llvm::Type* t = f32 ? b.getFloatTy() : b.getDoubleTy();
    llvm::Value *r0 = L.arg(0), *r1 = L.arg(1), *C = L.arg(2), *eps = L.arg(3), *x = L.arg(4),
                *g = L.arg(5), *bd = L.arg(6), *out = L.arg(7), *dgb = L.arg(8);
    if (f32) eps = b.CreateFPTrunc(eps, t);
    auto zero = llvm::ConstantFP::get(t, 0.0);
    auto one = llvm::ConstantFP::get(t, 1.0);
    llvm::Value* Cd = b.CreateSIToFP(C, t);
    auto ld = [&](llvm::Value* base, llvm::Value* at) { return L.load(t, base, at); };
    auto st = [&](llvm::Value* v, llvm::Value* base, llvm::Value* at) { L.store(v, base, at); };
    auto wide = [&](llvm::Value* v) { return f32 ? b.CreateFPExt(v, f64) : v; };
    auto sqrt = [&](llvm::Value* v) {
        return b.CreateCall(llvm::Intrinsic::getDeclaration(&m, llvm::Intrinsic::sqrt, {t}), {v});
    };
    const bool layer = which == ln_fwd || which == ln_grad;
    const bool grad = which == ln_grad || which == rms_grad;
    llvm::Value* has_dx = grad ? b.CreateIsNotNull(out) : nullptr;
    L.loop(r0, r1, [&](llvm::Value* r) {
        llvm::Value* base = b.CreateMul(r, C);
        auto at = [&](llvm::Value* j) { return b.CreateAdd(base, j); };
        // mean and rstd (layernorm), or rstd (rmsnorm), as the reference computes them.
        llvm::Value* mean = zero;
        llvm::Value* rstd;
        if (layer) {
            llvm::Value* s = L.reduce(L.i64(0), C, {zero}, [&](llvm::Value* j, auto& acc) {
                return std::vector<llvm::Value*>{L.add_reassoc(acc[0], ld(x, at(j)))};
            })[0];
            mean = b.CreateFDiv(s, Cd);
            llvm::Value* v = L.reduce(L.i64(0), C, {zero}, [&](llvm::Value* j, auto& acc) {
                llvm::Value* d = b.CreateFSub(ld(x, at(j)), mean);
                return std::vector<llvm::Value*>{L.add_reassoc(acc[0], b.CreateFMul(d, d))};
            })[0];
            rstd = b.CreateFDiv(one, sqrt(b.CreateFAdd(b.CreateFDiv(v, Cd), eps)));
        } else {
            llvm::Value* s = L.reduce(L.i64(0), C, {zero}, [&](llvm::Value* j, auto& acc) {
                llvm::Value* xv = ld(x, at(j));
                return std::vector<llvm::Value*>{L.add_reassoc(acc[0], b.CreateFMul(xv, xv))};
            })[0];
            rstd = b.CreateFDiv(one, sqrt(b.CreateFAdd(b.CreateFDiv(s, Cd), eps)));
        }
        auto xh = [&](llvm::Value* j) {
            return b.CreateFMul(b.CreateFSub(ld(x, at(j)), mean), rstd);
        };
        if (which == ln_fwd) {
            L.loop(L.i64(0), C, [&](llvm::Value* j) {
                st(b.CreateFAdd(b.CreateFMul(xh(j), ld(g, j)), ld(bd, j)), out, at(j));
            });
            return;
        }
        if (which == rms_fwd) {
            L.loop(L.i64(0), C, [&](llvm::Value* j) {
                st(b.CreateFMul(ld(x, at(j)), b.CreateFMul(rstd, ld(g, j))), out, at(j));
            });
            return;
        }
        // Gradients. layernorm: dxh = dy g, m1 = mean(dxh), m2 = mean(dxh xh),
        // dx = rstd (dxh - m1 - xh m2), dg += dy xh, db += dy.
        // rmsnorm: m = mean(dy g x), dx = rstd dy g - x rstd^3 m, dg += dy x rstd.
        llvm::Value *m1 = zero, *m2 = zero;
        if (layer) {
            auto sums = L.reduce(L.i64(0), C, {zero, zero}, [&](llvm::Value* j, auto& acc) {
                llvm::Value* dxh = b.CreateFMul(ld(bd, at(j)), ld(g, j));
                return std::vector<llvm::Value*>{L.add_reassoc(acc[0], dxh),
                                                 L.add_reassoc(acc[1], b.CreateFMul(dxh, xh(j)))};
            });
            m1 = b.CreateFDiv(sums[0], Cd);
            m2 = b.CreateFDiv(sums[1], Cd);
            L.loop(L.i64(0), C, [&](llvm::Value* j) {
                llvm::Value* dy = ld(bd, at(j));
                llvm::Value* pg = b.CreateGEP(f64, dgb, j);
                b.CreateStore(b.CreateFAdd(b.CreateLoad(f64, pg), wide(b.CreateFMul(dy, xh(j)))),
                              pg);
                llvm::Value* pb = b.CreateGEP(f64, dgb, b.CreateAdd(j, C));
                b.CreateStore(b.CreateFAdd(b.CreateLoad(f64, pb), wide(dy)), pb);
            });
        } else {
            llvm::Value* s = L.reduce(L.i64(0), C, {zero}, [&](llvm::Value* j, auto& acc) {
                llvm::Value* v = b.CreateFMul(b.CreateFMul(ld(bd, at(j)), ld(g, j)), ld(x, at(j)));
                return std::vector<llvm::Value*>{L.add_reassoc(acc[0], v)};
            })[0];
            m1 = b.CreateFDiv(s, Cd);
            L.loop(L.i64(0), C, [&](llvm::Value* j) {
                llvm::Value* v = b.CreateFMul(b.CreateFMul(ld(bd, at(j)), ld(x, at(j))), rstd);
                llvm::Value* pg = b.CreateGEP(f64, dgb, j);
                b.CreateStore(b.CreateFAdd(b.CreateLoad(f64, pg), wide(v)), pg);
            });
        }
        auto* fn = b.GetInsertBlock()->getParent();
        auto* then = llvm::BasicBlock::Create(ctx, "dx", fn);
        auto* done = llvm::BasicBlock::Create(ctx, "done", fn);
        b.CreateCondBr(has_dx, then, done);
        b.SetInsertPoint(then);
        L.loop(L.i64(0), C, [&](llvm::Value* j) {
            llvm::Value* dy = ld(bd, at(j));
            llvm::Value* v;
            if (layer) {
                llvm::Value* dxh = b.CreateFMul(dy, ld(g, j));
                v = b.CreateFMul(rstd,
                                 b.CreateFSub(b.CreateFSub(dxh, m1), b.CreateFMul(xh(j), m2)));
            } else {
                llvm::Value* r3 = b.CreateFMul(b.CreateFMul(rstd, rstd), rstd);
                v = b.CreateFSub(b.CreateFMul(b.CreateFMul(rstd, dy), ld(g, j)),
                                 b.CreateFMul(b.CreateFMul(ld(x, at(j)), r3), m1));
            }
            st(v, out, at(j));
        });
        b.CreateBr(done);
        b.SetInsertPoint(done);
    });
    L.finish();
}

// The eight kernels (f64/f32 x four), each compiled the first time it is used.
RowKernel kernel(bool f32, Which which) {
    static HostKernels table("rowwise",
                             {"layernorm.f64", "layernorm.f32", "layernorm_grad.f64",
                              "layernorm_grad.f32", "rmsnorm.f64", "rmsnorm.f32",
                              "rmsnorm_grad.f64", "rmsnorm_grad.f32"},
                             [](llvm::Module& m, const std::string& name, std::size_t k) {
                                 emit(m, name, k & 1, Which(k >> 1));
                             });
    return reinterpret_cast<RowKernel>(table.get(std::size_t((f32 ? 1 : 0) | (int(which) << 1))));
}

// Rows per block of the parameter-gradient sums: fixed, so the order of additions (within a
// block, then block after block) is the same on any number of threads.
constexpr std::int64_t block_rows = 64;

template <class T> void store_sums(const std::vector<double>& s, RaggedTensor& t) {
    T* d = static_cast<T*>(t.mutable_data());
    for (std::size_t k = 0; k < s.size(); ++k) d[k] = T(s[k]);
}

} // namespace

bool is_rowwise(const ir::Node& n) {
    if (n.type.dtype != DType::f32 && n.type.dtype != DType::f64) return false;
    return n.op == "layernorm" || n.op == "rmsnorm" || n.op == "layernorm_grad" ||
           n.op == "rmsnorm_grad";
}

bool same_norm_grad(const ir::Node& a, const ir::Node& b) {
    if (a.op != b.op || a.args != b.args || (a.op != "layernorm_grad" && a.op != "rmsnorm_grad"))
        return false;
    const double dflt = a.op == "layernorm_grad" ? 1e-5 : 1e-6;
    return a.attrs.get_float("eps", dflt) == b.attrs.get_float("eps", dflt);
}

void run_rowwise(const ir::Function& f, int i, const std::vector<int>& also,
                 std::vector<RaggedTensor>& vals) {
    const ir::Node& n = f.nodes[std::size_t(i)];
    auto arg = [&](int k) -> const RaggedTensor& {
        return vals[std::size_t(n.args[std::size_t(k)])];
    };
    const bool layer = n.op == "layernorm" || n.op == "layernorm_grad";
    const bool grad = n.op == "layernorm_grad" || n.op == "rmsnorm_grad";
    const RaggedTensor& x = arg(0);
    const RaggedTensor& g = arg(1);
    // layernorm(x, g, b), rmsnorm(x, g), layernorm_grad(x, g, b, dy), rmsnorm_grad(x, g, dy).
    const RaggedTensor* bd = grad ? &arg(layer ? 3 : 2) : layer ? &arg(2) : nullptr;
    if (grad && !x.structure().same_as(bd->structure())) {
        // Unequal extents: the reference kernel names the sample.
        std::vector<RaggedTensor> args;
        for (int a : n.args) args.push_back(vals[std::size_t(a)]);
        vals[std::size_t(i)] = reference_kernel(n.op, args, n.attrs);
        fail("internal: ", n.op, " accepted unequal structures");
    }
    const bool f32 = n.type.dtype == DType::f32;
    const std::int64_t C = x.shape().axes.back().extent;
    const std::int64_t rows = C ? x.numel() / C : 0;
    const double eps = n.attrs.get_float("eps", layer ? 1e-5 : 1e-6);
    const Which which = layer ? (grad ? ln_grad : ln_fwd) : (grad ? rms_grad : rms_fwd);
    RowKernel k = kernel(f32, which);
    if (!grad) {
        RaggedTensor y = uninitialized(x.dtype(), x.structure_ptr());
        void* out = y.mutable_data();
        const std::int64_t grain = std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(C, 1));
        parallel_for(rows, grain, [&](std::int64_t a, std::int64_t e) {
            k(a, e, C, eps, x.data(), g.data(), bd ? bd->data() : nullptr, out, nullptr);
        });
        vals[std::size_t(i)] = std::move(y);
        return;
    }
    // Which cotangents are wanted: wrt of this node and its siblings.
    std::vector<int> nodes = {i};
    nodes.insert(nodes.end(), also.begin(), also.end());
    bool want_dx = false;
    for (int v : nodes) want_dx |= f.nodes[std::size_t(v)].attrs.get_int("wrt") == 0;
    RaggedTensor dx;
    if (want_dx) dx = uninitialized(x.dtype(), x.structure_ptr());
    void* dx_ptr = want_dx ? dx.mutable_data() : nullptr;
    const std::int64_t width = layer ? 2 * C : C;
    const std::int64_t blocks = (rows + block_rows - 1) / block_rows;
    std::vector<double> partial(std::size_t(blocks * width), 0.0);
    const std::int64_t grain =
        std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(block_rows * C, 1));
    parallel_for(blocks, grain, [&](std::int64_t a, std::int64_t e) {
        for (std::int64_t blk = a; blk < e; ++blk)
            k(blk * block_rows, std::min(rows, (blk + 1) * block_rows), C, eps, x.data(), g.data(),
              bd->data(), dx_ptr, partial.data() + blk * width);
    });
    std::vector<double> sums(std::size_t(width), 0.0);
    for (std::int64_t blk = 0; blk < blocks; ++blk)
        for (std::int64_t j = 0; j < width; ++j)
            sums[std::size_t(j)] += partial[std::size_t(blk * width + j)];
    for (int v : nodes) {
        const std::int64_t wrt = f.nodes[std::size_t(v)].attrs.get_int("wrt");
        if (wrt == 0) {
            vals[std::size_t(v)] = dx;
            continue;
        }
        RaggedTensor p = RaggedTensor::zeros(g.dtype(), g.structure_ptr());
        std::vector<double> part(sums.begin() + (wrt - 1) * C, sums.begin() + wrt * C);
        if (f32)
            store_sums<float>(part, p);
        else
            store_sums<double>(part, p);
        vals[std::size_t(v)] = std::move(p);
    }
}

} // namespace rag::jit
