#include "jit/elementwise_llvm.hpp"

#include "runtime/error.hpp"

#include <llvm/IR/Intrinsics.h>

#include <cmath>
#include <numbers>

namespace rag::jit {
namespace {

llvm::Value* call_named(llvm::IRBuilder<>& b, llvm::Module& m, const std::string& name,
                        const std::vector<llvm::Value*>& args) {
    llvm::Type* t = args[0]->getType();
    std::vector<llvm::Type*> params(args.size(), t);
    auto callee = m.getOrInsertFunction(name, llvm::FunctionType::get(t, params, false));
    // Pure (errno ignored, as under -fno-math-errno), so the loop vectoriser may call the
    // SIMD variants llvm_jit.cpp registers.
    if (auto* f = llvm::dyn_cast<llvm::Function>(callee.getCallee())) {
        f->setDoesNotAccessMemory();
        f->setDoesNotThrow();
        f->setWillReturn();
    }
    return b.CreateCall(callee, args);
}

// exp, log, sqrt, fabs and pow as LLVM intrinsics (the vectoriser maps them to libmvec);
// tanh and erfc from libm.
class HostMath final : public MathLib {
  public:
    llvm::Value* call(llvm::IRBuilder<>& b, llvm::Module& m, MathFn fn,
                      const std::vector<llvm::Value*>& args) const override {
        const bool f32 = args[0]->getType()->isFloatTy();
        auto intrinsic = [&](llvm::Intrinsic::ID id) {
            return b.CreateCall(llvm::Intrinsic::getDeclaration(&m, id, {args[0]->getType()}),
                                args);
        };
        switch (fn) {
        case MathFn::exp:
            return intrinsic(llvm::Intrinsic::exp);
        case MathFn::log:
            return intrinsic(llvm::Intrinsic::log);
        case MathFn::sqrt:
            return intrinsic(llvm::Intrinsic::sqrt);
        case MathFn::fabs:
            return intrinsic(llvm::Intrinsic::fabs);
        case MathFn::pow:
            return intrinsic(llvm::Intrinsic::pow);
        case MathFn::tanh:
            return call_named(b, m, f32 ? "tanhf" : "tanh", args);
        case MathFn::erfc:
            return call_named(b, m, f32 ? "erfcf" : "erfc", args);
        }
        fail("internal: unknown math function");
    }
};

// libdevice's correctly rounded (or few-ulp) functions; sqrt and fabs stay intrinsics, which
// NVPTX lowers to sqrt.rn and abs.
class LibdeviceMath final : public MathLib {
  public:
    llvm::Value* call(llvm::IRBuilder<>& b, llvm::Module& m, MathFn fn,
                      const std::vector<llvm::Value*>& args) const override {
        const std::string suffix = args[0]->getType()->isFloatTy() ? "f" : "";
        switch (fn) {
        case MathFn::sqrt:
        case MathFn::fabs:
            return b.CreateCall(
                llvm::Intrinsic::getDeclaration(
                    &m, fn == MathFn::sqrt ? llvm::Intrinsic::sqrt : llvm::Intrinsic::fabs,
                    {args[0]->getType()}),
                args);
        case MathFn::exp:
            return call_named(b, m, "__nv_exp" + suffix, args);
        case MathFn::log:
            return call_named(b, m, "__nv_log" + suffix, args);
        case MathFn::tanh:
            return call_named(b, m, "__nv_tanh" + suffix, args);
        case MathFn::erfc:
            return call_named(b, m, "__nv_erfc" + suffix, args);
        case MathFn::pow:
            return call_named(b, m, "__nv_pow" + suffix, args);
        }
        fail("internal: unknown math function");
    }
};

} // namespace

const MathLib& host_math() {
    static const HostMath m;
    return m;
}

const MathLib& libdevice_math() {
    static const LibdeviceMath m;
    return m;
}

llvm::Value* emit_elementwise(llvm::IRBuilder<>& b, llvm::Module& m, const MathLib& math,
                              const ir::Node& n, const std::vector<llvm::Value*>& args,
                              llvm::Type* t) {
    auto arg = [&](std::size_t k) { return args.at(k); };
    auto c = [&](double v) { return llvm::ConstantFP::get(t, v); };
    auto fn = [&](MathFn f, std::vector<llvm::Value*> xs) { return math.call(b, m, f, xs); };
    auto sigmoid = [&](llvm::Value* x) {
        return b.CreateFDiv(c(1), b.CreateFAdd(c(1), fn(MathFn::exp, {b.CreateFNeg(x)})));
    };
    // fn'(x) of unary_grad(x, y = fn(x), g), the derivatives of ir/ops/elementwise.cpp.
    auto unary_derivative = [&](const ir::Node& node, llvm::Value* x,
                                llvm::Value* y) -> llvm::Value* {
        const std::string f = node.attrs.get_str("fn");
        auto sign_of = [&](llvm::Value* v) {
            return b.CreateSelect(b.CreateFCmpOGT(v, c(0)), c(1),
                                  b.CreateSelect(b.CreateFCmpOLT(v, c(0)), c(-1), c(0)));
        };
        if (f == "neg") return c(-1);
        if (f == "exp") return y;
        if (f == "log") return b.CreateFDiv(c(1), x);
        if (f == "sqrt") return b.CreateFDiv(c(0.5), y);
        if (f == "rsqrt") return b.CreateFDiv(b.CreateFMul(c(-0.5), y), x);
        if (f == "abs") return sign_of(x);
        if (f == "tanh") return b.CreateFSub(c(1), b.CreateFMul(y, y));
        if (f == "sigmoid") return b.CreateFMul(y, b.CreateFSub(c(1), y));
        if (f == "relu") return b.CreateSelect(b.CreateFCmpOGT(x, c(0)), c(1), c(0));
        if (f == "gelu") {
            llvm::Value* phi = b.CreateFMul(
                c(0.5), fn(MathFn::erfc, {b.CreateFMul(x, c(-1 / std::numbers::sqrt2))}));
            llvm::Value* density =
                b.CreateFMul(fn(MathFn::exp, {b.CreateFMul(c(-0.5), b.CreateFMul(x, x))}),
                             c(1 / std::sqrt(2 * std::numbers::pi)));
            return b.CreateFAdd(phi, b.CreateFMul(x, density));
        }
        if (f == "silu") {
            llvm::Value* s = sigmoid(x);
            return b.CreateFMul(s, b.CreateFAdd(c(1), b.CreateFMul(x, b.CreateFSub(c(1), s))));
        }
        fail("internal: no derivative code for ", f);
    };
    const std::string& op = n.op;
    // Comparisons give 0/1 in t (NaN: only ne holds, as in the reference); where selects on it.
    auto truth = [&](llvm::Value* cond) { return b.CreateSelect(cond, c(1), c(0)); };
    if (op == "lt") return truth(b.CreateFCmpOLT(arg(0), arg(1)));
    if (op == "le") return truth(b.CreateFCmpOLE(arg(0), arg(1)));
    if (op == "gt") return truth(b.CreateFCmpOGT(arg(0), arg(1)));
    if (op == "ge") return truth(b.CreateFCmpOGE(arg(0), arg(1)));
    if (op == "eq") return truth(b.CreateFCmpOEQ(arg(0), arg(1)));
    if (op == "ne") return truth(b.CreateFCmpUNE(arg(0), arg(1)));
    if (op == "where") return b.CreateSelect(b.CreateFCmpUNE(arg(0), c(0)), arg(1), arg(2));
    if (op == "neg") return b.CreateFNeg(arg(0));
    if (op == "exp") return fn(MathFn::exp, {arg(0)});
    if (op == "log") return fn(MathFn::log, {arg(0)});
    if (op == "sqrt") return fn(MathFn::sqrt, {arg(0)});
    if (op == "rsqrt") return b.CreateFDiv(c(1), fn(MathFn::sqrt, {arg(0)}));
    if (op == "abs") return fn(MathFn::fabs, {arg(0)});
    if (op == "tanh") return fn(MathFn::tanh, {arg(0)});
    if (op == "sigmoid") return sigmoid(arg(0));
    if (op == "relu") return b.CreateSelect(b.CreateFCmpOGT(arg(0), c(0)), arg(0), c(0));
    if (op == "gelu") {
        llvm::Value* phi = b.CreateFMul(
            c(0.5), fn(MathFn::erfc, {b.CreateFMul(arg(0), c(-1 / std::numbers::sqrt2))}));
        return b.CreateFMul(arg(0), phi);
    }
    if (op == "silu") return b.CreateFMul(arg(0), sigmoid(arg(0)));
    if (op == "add") return b.CreateFAdd(arg(0), arg(1));
    if (op == "sub") return b.CreateFSub(arg(0), arg(1));
    if (op == "mul") return b.CreateFMul(arg(0), arg(1));
    if (op == "div") return b.CreateFDiv(arg(0), arg(1));
    if (op == "pow") return fn(MathFn::pow, {arg(0), arg(1)});
    if (op == "maximum") return b.CreateSelect(b.CreateFCmpOGE(arg(0), arg(1)), arg(0), arg(1));
    if (op == "minimum") return b.CreateSelect(b.CreateFCmpOLE(arg(0), arg(1)), arg(0), arg(1));
    if (op == "scale") return b.CreateFMul(arg(0), c(n.attrs.get_float("c")));
    if (op == "unary_grad") return b.CreateFMul(arg(2), unary_derivative(n, arg(0), arg(1)));
    fail("internal: no elementwise code for ", op);
}

llvm::Type* storage_type(llvm::IRBuilder<>& b, DType stored, llvm::Type* t) {
    return stored == DType::boolean ? b.getInt8Ty() : t;
}
llvm::Value* from_storage(llvm::IRBuilder<>& b, llvm::Value* v, DType stored, llvm::Type* t) {
    return stored == DType::boolean ? b.CreateUIToFP(v, t) : v;
}
llvm::Value* to_storage(llvm::IRBuilder<>& b, llvm::Value* v, DType stored, llvm::Type* t) {
    if (stored != DType::boolean) return v;
    return b.CreateZExt(b.CreateFCmpUNE(v, llvm::ConstantFP::get(t, 0.0)), b.getInt8Ty());
}

} // namespace rag::jit
