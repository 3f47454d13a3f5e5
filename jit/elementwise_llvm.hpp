// The value of one elementwise IR node as LLVM IR, shared by every target: the CPU tier's fused
// loops and the NVPTX kernels emit the same op bodies, so both agree with the reference kernels
// (ties, NaN order). Only the math library differs between targets, through a MathLib.
#pragma once
#include "ir/ir.hpp"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <vector>

namespace rag::jit {

// Math functions with no single LLVM instruction.
enum class MathFn { exp, log, sqrt, fabs, tanh, erfc, pow };

// How a target computes a MathFn on `t` (f32 or f64): the host calls LLVM intrinsics and libm,
// NVPTX (which cannot lower llvm.exp and friends in LLVM 16) calls libdevice's __nv_* functions.
class MathLib {
  public:
    virtual ~MathLib() = default;
    virtual llvm::Value* call(llvm::IRBuilder<>& b, llvm::Module& m, MathFn fn,
                              const std::vector<llvm::Value*>& args) const = 0;
};

const MathLib& host_math();
const MathLib& libdevice_math(); // declares __nv_expf etc.; link libdevice before codegen

// Emits node `n` (an op is_fusable_op accepts) at b's insert point. `args` are its operands'
// values, of type `t`. Throws rag::Error for an op it cannot emit.
llvm::Value* emit_elementwise(llvm::IRBuilder<>& b, llvm::Module& m, const MathLib& math,
                              const ir::Node& n, const std::vector<llvm::Value*>& args,
                              llvm::Type* t);

// Inside a fused loop every value has the loop's float type t; bool tensors (one byte per
// element) are read as 0/1 and written back as 0/1 bytes. The type a tensor of `stored` dtype
// is read and written as, and the conversions to and from t.
llvm::Type* storage_type(llvm::IRBuilder<>& b, DType stored, llvm::Type* t);
llvm::Value* from_storage(llvm::IRBuilder<>& b, llvm::Value* v, DType stored, llvm::Type* t);
llvm::Value* to_storage(llvm::IRBuilder<>& b, llvm::Value* v, DType stored, llvm::Type* t);

} // namespace rag::jit
