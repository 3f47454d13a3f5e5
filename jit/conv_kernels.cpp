#include "jit/conv_kernels.hpp"

#include "jit/host_kernels.hpp"
#include "jit/llvm_loops.hpp"

#include <llvm/ADT/StringMap.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/TargetParser/Host.h>

#include <functional>

namespace rag::jit {
namespace {

// Rows per register tile (pixels, or a weight gradient's channels): 8 accumulators per vector
// of outputs, every weight (or dy) vector loaded once per 8 rows. Where two vectors of outputs
// remain, a pass computes both, so each input value is broadcast once per two FMAs: 16
// accumulators with AVX-512's 32 registers, and 4 rows (8 accumulators) with AVX2's 16, where
// 8 rows spilled.
constexpr int tile_rows = 8;

int rows_for(int vecs) {
    return vecs == 1 || conv_lanes() == 16 ? tile_rows : tile_rows / 2;
}

void set_vector_width(llvm::Function* fn) {
    const std::string bits = std::to_string(32 * conv_lanes());
    fn->addFnAttr("prefer-vector-width", bits);
    fn->addFnAttr("min-legal-vector-width", bits);
}

// What both kernels share: the loop over vectors of outputs (pairs, then one) and, inside it,
// over tiles of `tile` rows (then single rows) of a row count.
struct ConvEmitter {
    // Both kernels take (count, taps, cols, nout, rows, a, b, ld): row counts, a table of row
    // pointers, two float arrays and a leading dimension.
    LoopBuilder L;
    llvm::Type* f32;
    llvm::FixedVectorType* vt;
    llvm::Function* fma;
    int lanes;

    ConvEmitter(llvm::Module& m, const std::string& name)
        : L(m, name, signature(m.getContext())), f32(L.b.getFloatTy()),
          vt(llvm::FixedVectorType::get(f32, unsigned(conv_lanes()))),
          fma(llvm::Intrinsic::getDeclaration(&m, llvm::Intrinsic::fmuladd, {vt})),
          lanes(int(conv_lanes())) {
        set_vector_width(L.fn);
    }
    static std::vector<llvm::Type*> signature(llvm::LLVMContext& ctx) {
        llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
        llvm::Type* p = llvm::PointerType::get(ctx, 0);
        return {i64, i64, i64, i64, p, p, p, i64};
    }
    llvm::Value* vload(llvm::Value* base, llvm::Value* at) {
        return L.b.CreateAlignedLoad(vt, L.b.CreateGEP(f32, base, at), llvm::Align(4));
    }
    void vstore(llvm::Value* v, llvm::Value* base, llvm::Value* at) {
        L.b.CreateAlignedStore(v, L.b.CreateGEP(f32, base, at), llvm::Align(4));
    }
    // acc[r vecs + v] += x[r] * y[v], x broadcast once per row.
    void update(std::vector<llvm::Value*>& acc, const std::vector<llvm::Value*>& x,
                const std::vector<llvm::Value*>& y) {
        for (std::size_t r = 0; r < x.size(); ++r) {
            llvm::Value* s = L.b.CreateVectorSplat(unsigned(lanes), x[r]);
            for (std::size_t v = 0; v < y.size(); ++v)
                acc[r * y.size() + v] = L.b.CreateCall(fma, {s, y[v], acc[r * y.size() + v]});
        }
    }
    // pass(c0, vecs) for every vector of nout outputs; tile(c0, vecs, r0, n) for rows
    // [r0, r0 + n) of `count`, in tiles of rows_for(vecs) then single rows.
    void outputs(llvm::Value* nout, llvm::Value* count,
                 const std::function<void(llvm::Value*, int, llvm::Value*, int)>& tile) {
        auto& b = L.b;
        auto pass = [&](llvm::Value* c0, int vecs) {
            const int n = rows_for(vecs);
            llvm::Value* full = b.CreateMul(b.CreateSDiv(count, L.i64(n)), L.i64(n));
            L.loop(L.i64(0), b.CreateSDiv(full, L.i64(n)),
                   [&](llvm::Value* k) { tile(c0, vecs, b.CreateMul(k, L.i64(n)), n); });
            L.loop(full, count, [&](llvm::Value* q) { tile(c0, vecs, q, 1); });
        };
        llvm::Value* pairs = b.CreateSDiv(nout, L.i64(2 * lanes));
        L.loop(L.i64(0), pairs,
               [&](llvm::Value* cb) { pass(b.CreateMul(cb, L.i64(2 * lanes)), 2); });
        L.loop(b.CreateMul(pairs, L.i64(2)), b.CreateSDiv(nout, L.i64(lanes)),
               [&](llvm::Value* cb) { pass(b.CreateMul(cb, L.i64(lanes)), 1); });
    }
};

// out[p][c0 ...] for a tile of pixels: accumulate over taps and channels in registers, then
// store the tile's vectors.
void emit_rows(llvm::Module& m, const std::string& name) {
    ConvEmitter E(m, name);
    LoopBuilder& L = E.L;
    auto& b = L.b;
    llvm::Type* p = llvm::PointerType::get(m.getContext(), 0);
    llvm::Value *count = L.arg(0), *taps = L.arg(1), *cols = L.arg(2), *nout = L.arg(3),
                *rows = L.arg(4), *w = L.arg(5), *out = L.arg(6), *ldo = L.arg(7);
    E.outputs(nout, count, [&](llvm::Value* c0, int vecs, llvm::Value* p0, int n) {
        std::vector<llvm::Value*> acc(std::size_t(n * vecs), llvm::Constant::getNullValue(E.vt));
        acc = L.reduce(L.i64(0), taps, acc, [&](llvm::Value* t, const auto& a) {
            std::vector<llvm::Value*> src;
            for (int r = 0; r < n; ++r)
                src.push_back(
                    L.load(p, rows, b.CreateAdd(b.CreateMul(b.CreateAdd(p0, L.i64(r)), taps), t)));
            llvm::Value* wrow = b.CreateMul(t, cols);
            return L.reduce(L.i64(0), cols, a, [&](llvm::Value* i, const auto& s) {
                llvm::Value* at = b.CreateAdd(b.CreateMul(b.CreateAdd(wrow, i), nout), c0);
                std::vector<llvm::Value*> wv, x, next(s.begin(), s.end());
                for (int v = 0; v < vecs; ++v)
                    wv.push_back(E.vload(w, b.CreateAdd(at, L.i64(v * E.lanes))));
                for (int r = 0; r < n; ++r) x.push_back(L.load(E.f32, src[std::size_t(r)], i));
                E.update(next, x, wv);
                return next;
            });
        });
        for (int r = 0; r < n; ++r)
            for (int v = 0; v < vecs; ++v)
                E.vstore(acc[std::size_t(r * vecs + v)], out,
                         b.CreateAdd(b.CreateMul(b.CreateAdd(p0, L.i64(r)), ldo),
                                     b.CreateAdd(c0, L.i64(v * E.lanes))));
    });
    L.finish();
}

// part[t][i][c0 ...] for each tap t and a tile of channels i: accumulate over the pixels in
// registers, then store the tile's vectors.
void emit_weight_rows(llvm::Module& m, const std::string& name) {
    ConvEmitter E(m, name);
    LoopBuilder& L = E.L;
    auto& b = L.b;
    llvm::Type* p = llvm::PointerType::get(m.getContext(), 0);
    llvm::Value *count = L.arg(0), *taps = L.arg(1), *cols = L.arg(2), *nout = L.arg(3),
                *rows = L.arg(4), *dy = L.arg(5), *part = L.arg(6), *ldy = L.arg(7);
    L.loop(L.i64(0), taps, [&](llvm::Value* t) {
        E.outputs(nout, cols, [&](llvm::Value* c0, int vecs, llvm::Value* i0, int n) {
            std::vector<llvm::Value*> acc(std::size_t(n * vecs),
                                          llvm::Constant::getNullValue(E.vt));
            acc = L.reduce(L.i64(0), count, acc, [&](llvm::Value* q, const auto& a) {
                llvm::Value* src = L.load(p, rows, b.CreateAdd(b.CreateMul(q, taps), t));
                llvm::Value* at = b.CreateAdd(b.CreateMul(q, ldy), c0);
                std::vector<llvm::Value*> dv, x, next(a.begin(), a.end());
                for (int v = 0; v < vecs; ++v)
                    dv.push_back(E.vload(dy, b.CreateAdd(at, L.i64(v * E.lanes))));
                for (int r = 0; r < n; ++r)
                    x.push_back(L.load(E.f32, src, b.CreateAdd(i0, L.i64(r))));
                E.update(next, x, dv);
                return next;
            });
            for (int r = 0; r < n; ++r) {
                llvm::Value* k = b.CreateAdd(b.CreateMul(t, cols), b.CreateAdd(i0, L.i64(r)));
                for (int v = 0; v < vecs; ++v)
                    E.vstore(
                        acc[std::size_t(r * vecs + v)], part,
                        b.CreateAdd(b.CreateMul(k, nout), b.CreateAdd(c0, L.i64(v * E.lanes))));
            }
        });
    });
    L.finish();
}

HostKernels& table() {
    static HostKernels kernels("conv", {"rows.f32", "weight_rows.f32"},
                               [](llvm::Module& m, const std::string& name, std::size_t k) {
                                   (k == 0 ? emit_rows : emit_weight_rows)(m, name);
                               });
    return kernels;
}

} // namespace

std::int64_t conv_lanes() {
    static const std::int64_t lanes = [] {
        llvm::StringMap<bool> features;
        return llvm::sys::getHostCPUFeatures(features) && features.lookup("avx512f") ? 16 : 8;
    }();
    return lanes;
}

ConvRows conv_rows_kernel() {
    return reinterpret_cast<ConvRows>(table().get(0));
}

ConvWeightRows conv_weight_rows_kernel() {
    return reinterpret_cast<ConvWeightRows>(table().get(1));
}

} // namespace rag::jit
