// Lowering of the kernel IR (jit/kir.hpp) into LLVM IR, shared by the CPU and NVPTX targets
// (internal to jit/). A target makes the function and its entry values (program id,
// parameters, buffer pointers), then calls emit_body; it overrides the hooks where its code
// differs: math functions, and how a `threads` loop is spread.
#pragma once
#include "jit/kir.hpp"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <functional>
#include <map>

namespace rag::jit {

class KirLowering {
  public:
    KirLowering(llvm::Module& m, const kir::Kernel& k);
    virtual ~KirLowering() = default;

    // Emits the kernel body at the builder's insertion point. `buffers` holds one pointer per
    // buffer of the kernel (globals, then scratch); `params` one i64 per parameter.
    void emit_body(llvm::Value* pid, std::vector<llvm::Value*> params,
                   std::vector<llvm::Value*> buffers);
    // The value of an expression over parameters only (scratch sizes, in a target's wrapper).
    llvm::Value* emit_param_expr(const kir::Expr& e, const std::vector<llvm::Value*>& params);

    llvm::IRBuilder<>& builder() { return b_; }

  protected:
    // Alias scopes (CPU): every scratch array in its own scope and all globals in one, so
    // LLVM may keep scratch accumulators in registers across loads of other arrays. Scratch
    // arrays are disjoint per instance and never passed as globals; globals may alias each
    // other (nothing is claimed between them).
    void alias_scopes();
    // exp, log, sqrt of an f32 value. Default: LLVM intrinsics (the host's libm / libmvec).
    virtual llvm::Value* math(kir::Op op, llvm::Value* x);
    // A `threads` loop. Default: an ordinary serial loop.
    virtual void threads_loop(const kir::Stmt& s);
    // A store statement. Default: the store itself (the GPU guards stores in serial code).
    virtual void store(const kir::Stmt& s);
    // An mma statement. Default: every element of C in row-major order (mma_element).
    virtual void mma(const kir::Mma& x);
    // Fragment statements and reads. Default: fragments are scratch arrays, each visits
    // their elements in row-major order, row_reduce folds each row in column order.
    virtual void each(const kir::Stmt& s);
    virtual llvm::Value* here(const kir::Node& n);
    virtual void put(const kir::Stmt& s);
    virtual void row_reduce(const kir::Stmt& s);
    // copy16: default element by element, in order (async ones too: they land at once).
    virtual void copy16(const kir::Stmt& s);
    // await_copies: default nothing (copies have landed).
    virtual void await_copies(const kir::Stmt&) {}
    llvm::Value* combine(kir::Reduce op, llvm::Value* acc, llvm::Value* x);
    // The open each statement (its row and column lets), for here() and put().
    const kir::Stmt* current_each_ = nullptr;
    std::map<std::int64_t, llvm::Value*>& lets() { return lets_; }

    // C(i, j) += the sum over l of round(A(i, l)) round(B(l, j)), l in order.
    void mma_element(const kir::Mma& x, llvm::Value* i, llvm::Value* j);
    // The address of element (r, c) of a matrix view; an operand rounded to a precision.
    llvm::Value* element(const kir::Matrix& mat, llvm::Value* r, llvm::Value* c);
    llvm::Value* load_element(const kir::Matrix& mat, llvm::Value* r, llvm::Value* c); // as f32
    // Where element `at` of buffer buf lies (BufferDecl::physical).
    llvm::Value* physical(std::int64_t buf, llvm::Value* at);
    // How an element type is stored (bf16 as i16 bits), and a stored value as f32 (or i64).
    llvm::Type* storage_type(kir::Elem e);
    llvm::Value* widen(kir::Elem e, llvm::Value* raw);
    llvm::Value* round_to(kir::Precision p, llvm::Value* x);
    // The bf16 nearest (ties to even) to an f32, as its i16 bits (runtime/dtype.cpp's rule).
    llvm::Value* bf16_bits(llvm::Value* x);
    // A counted loop over [lo, hi) by step, its body emitted by `body(index)`.
    void for_range(llvm::Value* lo, llvm::Value* hi, llvm::Value* step,
                   const std::function<void(llvm::Value*)>& body);

    // An ordinary counted loop over [lo, hi) binding the statement's index.
    void serial_loop(const kir::Stmt& s, llvm::Value* lo, llvm::Value* hi, llvm::Value* step);
    void emit(const std::vector<kir::Stmt>& body);
    llvm::Value* value(const kir::Expr& e);
    llvm::Value* buffer(int b) const { return buffers_[std::size_t(b)]; } // its base pointer

    llvm::Module& m_;
    const kir::Kernel& k_;
    llvm::IRBuilder<> b_;
    // The type of the kernel IR's integers (kir::Type::i64): i64 on the CPU; the GPU computes
    // them in 32 bits (NvptxLowering), as its integer units do, and a launch refuses buffers
    // and parameters that do not fit (check_kir_launch).
    llvm::IntegerType* index_ = nullptr;
    llvm::ConstantInt* index(std::int64_t v) const {
        return llvm::ConstantInt::get(index_, std::uint64_t(v), true);
    }
    // CPU: counted loops whose bounds are both constants carry llvm.loop.unroll.disable, so
    // the loop vectoriser sees them as loops (see for_range in kir_llvm.cpp).
    bool keep_constant_loops_ = false;

    void scoped(llvm::Instruction* access, std::int64_t buf);

  private:
    llvm::Value* fragment_at(std::int64_t f); // the CPU's address of the current element
    void emit(const kir::Stmt& s);
    llvm::Value* load(const kir::Node& n);
    llvm::Type* type(kir::Type t);

    llvm::Value* pid_ = nullptr;
    std::vector<llvm::MDNode*> scope_, noalias_; // per buffer; empty: no metadata
    std::vector<llvm::Value*> params_, buffers_, vars_;
    std::map<std::int64_t, llvm::Value*> lets_;
};

// jit/kir_nvptx.cpp's lowering of k into m, for the host: the entry `entry` is
// void(i64 grid, i64* params, void** buffers, char* scratch, EmuThread* thread), its special
// registers, barriers and mma fragments go through the EmuThread (jit/kir_emulator.hpp).
void lower_kir_emulated(llvm::Module& m, const kir::Kernel& k, const std::string& entry);

} // namespace rag::jit
