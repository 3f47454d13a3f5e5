#include "jit/elementwise_llvm.hpp"

#include "runtime/error.hpp"

#include <llvm/IR/Intrinsics.h>

#include <numbers>

namespace rag::jit {
namespace {

llvm::Value* call_named(llvm::IRBuilder<>& b, llvm::Module& m, const std::string& name,
                        const std::vector<llvm::Value*>& args) {
    llvm::Type* t = args[0]->getType();
    std::vector<llvm::Type*> params(args.size(), t);
    auto callee = m.getOrInsertFunction(name, llvm::FunctionType::get(t, params, false));
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
    const std::string& op = n.op;
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
    fail("internal: no elementwise code for ", op);
}

} // namespace rag::jit
