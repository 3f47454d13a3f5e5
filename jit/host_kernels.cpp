#include "jit/host_kernels.hpp"

#include "jit/compile_clock.hpp"
#include "jit/llvm_jit.hpp"
#include "runtime/error.hpp"

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

namespace rag::jit {
namespace {

struct Compiled {
    std::mutex mu;
    std::vector<std::string> names;
};
Compiled& compiled() {
    static Compiled* c = new Compiled; // never destroyed: kernels may compile during exit
    return *c;
}

} // namespace

struct HostKernels::Slot {
    std::once_flag once;
    void* address = nullptr;
    std::string ir;
};

HostKernels::HostKernels(std::string family, std::vector<std::string> names, Emit emit)
    : family_(std::move(family)), names_(std::move(names)), emit_(std::move(emit)),
      slots_(new Slot[names_.size()]) {}

HostKernels::~HostKernels() = default;

void* HostKernels::get(std::size_t k, const std::string** ir) {
    if (k >= names_.size()) fail("internal: host kernel ", family_, " ", k, " out of range");
    Slot& s = slots_[k];
    std::call_once(s.once, [&] {
        CompilePhase phase("host_kernels");
        const std::string prefix = "rag_" + family_ + "_" + std::to_string(k) + "_";
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = new_module("rag_" + family_ + "_" + names_[k], *ctx); // named in the profile
        emit_(*m, prefix + "0", k);
        s.address = add_module(std::move(m), std::move(ctx), 1, prefix, &s.ir).at(0);
        Compiled& c = compiled();
        std::lock_guard<std::mutex> lock(c.mu);
        c.names.push_back(family_ + "/" + names_[k]);
    });
    if (ir) *ir = &s.ir;
    return s.address;
}

std::vector<std::string> host_kernels_compiled() {
    Compiled& c = compiled();
    std::lock_guard<std::mutex> lock(c.mu);
    return c.names;
}

} // namespace rag::jit
