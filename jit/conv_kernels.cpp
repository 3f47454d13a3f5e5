#include "jit/conv_kernels.hpp"

#include "jit/host_kernels.hpp"
#include "jit/llvm_loops.hpp"

#include <llvm/ADT/StringMap.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/TargetParser/Host.h>

namespace rag::jit {
namespace {

// Output pixels per register tile: 8 accumulators of one vector each, every weight vector
// loaded once per 8 pixels and every input value broadcast once per vector of outputs. With
// AVX2's 16 registers that leaves room for the weight and the broadcast; a wider tile spilled.
constexpr int tile_rows = 8;

void set_vector_width(llvm::Function* fn) {
    const std::string bits = std::to_string(32 * conv_lanes());
    fn->addFnAttr("prefer-vector-width", bits);
    fn->addFnAttr("min-legal-vector-width", bits);
}

// for cb < nout / lanes: for each tile of 8 pixels (then single pixels): accumulate over taps
// and channels in registers, then store the tile's vectors.
void emit_rows(llvm::Module& m, const std::string& name) {
    auto& ctx = m.getContext();
    llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
    llvm::Type* p = llvm::PointerType::get(ctx, 0);
    LoopBuilder L(m, name, {i64, i64, i64, i64, p, p, p, i64});
    auto& b = L.b;
    const int lanes = int(conv_lanes());
    set_vector_width(L.fn);
    llvm::Type* f32 = b.getFloatTy();
    auto* vt = llvm::FixedVectorType::get(f32, unsigned(lanes));
    llvm::Value *count = L.arg(0), *taps = L.arg(1), *cols = L.arg(2), *nout = L.arg(3),
                *rows = L.arg(4), *w = L.arg(5), *out = L.arg(6), *ldo = L.arg(7);
    llvm::Function* fma = llvm::Intrinsic::getDeclaration(&m, llvm::Intrinsic::fmuladd, {vt});
    llvm::Value* zero = llvm::Constant::getNullValue(vt);
    llvm::Value* full = b.CreateMul(b.CreateSDiv(count, L.i64(tile_rows)), L.i64(tile_rows));
    L.loop(L.i64(0), b.CreateSDiv(nout, L.i64(lanes)), [&](llvm::Value* cb) {
        llvm::Value* c0 = b.CreateMul(cb, L.i64(lanes));
        auto tile = [&](llvm::Value* p0, int n) {
            std::vector<llvm::Value*> acc(std::size_t(n), zero);
            acc = L.reduce(L.i64(0), taps, acc, [&](llvm::Value* t, const auto& a) {
                std::vector<llvm::Value*> src;
                for (int r = 0; r < n; ++r)
                    src.push_back(L.load(
                        p, rows, b.CreateAdd(b.CreateMul(b.CreateAdd(p0, L.i64(r)), taps), t)));
                llvm::Value* wrow = b.CreateMul(t, cols);
                return L.reduce(L.i64(0), cols, a, [&](llvm::Value* i, const auto& s) {
                    llvm::Value* at = b.CreateAdd(b.CreateMul(b.CreateAdd(wrow, i), nout), c0);
                    llvm::Value* wv =
                        b.CreateAlignedLoad(vt, b.CreateGEP(f32, w, at), llvm::Align(4));
                    std::vector<llvm::Value*> next;
                    for (int r = 0; r < n; ++r) {
                        llvm::Value* x = L.load(f32, src[std::size_t(r)], i);
                        next.push_back(b.CreateCall(
                            fma, {b.CreateVectorSplat(unsigned(lanes), x), wv, s[std::size_t(r)]}));
                    }
                    return next;
                });
            });
            for (int r = 0; r < n; ++r) {
                llvm::Value* at = b.CreateAdd(b.CreateMul(b.CreateAdd(p0, L.i64(r)), ldo), c0);
                b.CreateAlignedStore(acc[std::size_t(r)], b.CreateGEP(f32, out, at),
                                     llvm::Align(4));
            }
        };
        L.loop(L.i64(0), b.CreateSDiv(full, L.i64(tile_rows)),
               [&](llvm::Value* k) { tile(b.CreateMul(k, L.i64(tile_rows)), tile_rows); });
        L.loop(full, count, [&](llvm::Value* q) { tile(q, 1); });
    });
    L.finish();
}

// for cb < nout / lanes, t < taps: for each tile of 8 channels i (then single channels):
// accumulate over the pixels in registers, then store the tile's vectors.
void emit_weight_rows(llvm::Module& m, const std::string& name) {
    auto& ctx = m.getContext();
    llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
    llvm::Type* p = llvm::PointerType::get(ctx, 0);
    LoopBuilder L(m, name, {i64, i64, i64, i64, p, p, i64, p});
    auto& b = L.b;
    const int lanes = int(conv_lanes());
    set_vector_width(L.fn);
    llvm::Type* f32 = b.getFloatTy();
    auto* vt = llvm::FixedVectorType::get(f32, unsigned(lanes));
    llvm::Value *count = L.arg(0), *taps = L.arg(1), *cols = L.arg(2), *nout = L.arg(3),
                *rows = L.arg(4), *dy = L.arg(5), *ldy = L.arg(6), *part = L.arg(7);
    llvm::Function* fma = llvm::Intrinsic::getDeclaration(&m, llvm::Intrinsic::fmuladd, {vt});
    llvm::Value* zero = llvm::Constant::getNullValue(vt);
    llvm::Value* full = b.CreateMul(b.CreateSDiv(cols, L.i64(tile_rows)), L.i64(tile_rows));
    L.loop(L.i64(0), b.CreateSDiv(nout, L.i64(lanes)), [&](llvm::Value* cb) {
        llvm::Value* c0 = b.CreateMul(cb, L.i64(lanes));
        L.loop(L.i64(0), taps, [&](llvm::Value* t) {
            auto tile = [&](llvm::Value* i0, int n) {
                std::vector<llvm::Value*> acc(std::size_t(n), zero);
                acc = L.reduce(L.i64(0), count, acc, [&](llvm::Value* q, const auto& a) {
                    llvm::Value* src = L.load(p, rows, b.CreateAdd(b.CreateMul(q, taps), t));
                    llvm::Value* dv = b.CreateAlignedLoad(
                        vt, b.CreateGEP(f32, dy, b.CreateAdd(b.CreateMul(q, ldy), c0)),
                        llvm::Align(4));
                    std::vector<llvm::Value*> next;
                    for (int r = 0; r < n; ++r) {
                        llvm::Value* x = L.load(f32, src, b.CreateAdd(i0, L.i64(r)));
                        next.push_back(b.CreateCall(
                            fma, {b.CreateVectorSplat(unsigned(lanes), x), dv, a[std::size_t(r)]}));
                    }
                    return next;
                });
                for (int r = 0; r < n; ++r) {
                    llvm::Value* k = b.CreateAdd(b.CreateMul(t, cols), b.CreateAdd(i0, L.i64(r)));
                    b.CreateAlignedStore(
                        acc[std::size_t(r)],
                        b.CreateGEP(f32, part, b.CreateAdd(b.CreateMul(k, nout), c0)),
                        llvm::Align(4));
                }
            };
            L.loop(L.i64(0), b.CreateSDiv(full, L.i64(tile_rows)),
                   [&](llvm::Value* k) { tile(b.CreateMul(k, L.i64(tile_rows)), tile_rows); });
            L.loop(full, cols, [&](llvm::Value* i) { tile(i, 1); });
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
