#include "jit/llvm_jit.hpp"

#include "jit/compile_clock.hpp"
#include "runtime/error.hpp"

#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

namespace rag::jit {
namespace {

struct Jit {
    std::unique_ptr<llvm::orc::LLJIT> lljit;
    std::unique_ptr<llvm::TargetMachine> tm;
    std::mutex mu;
};

// An LLVM failure (say, an unresolved symbol) becomes a rag::Error, never an abort.
void check(llvm::Error e) {
    if (e) fail("CPU JIT: ", llvm::toString(std::move(e)));
}

template <class T> T take(llvm::Expected<T> v) {
    if (!v) check(v.takeError());
    return std::move(*v);
}

// The process-wide JIT, made on first use (a failure is reported and retried next time). It
// lives as long as the process: compiled code may run until exit.
Jit& jit() {
    static Jit* j = [] {
        CompilePhase phase("llvm_init");
        llvm::InitializeNativeTarget();
        llvm::InitializeNativeTargetAsmPrinter();
        auto jtmb = take(llvm::orc::JITTargetMachineBuilder::detectHost());
        jtmb.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
        auto out = std::make_unique<Jit>();
        out->tm = take(jtmb.createTargetMachine());
        out->lljit = take(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(jtmb).create());
        // libm (tanh, erfc), libmvec (SIMD exp, log, pow) and the rest of the process are
        // reachable from generated code.
        llvm::sys::DynamicLibrary::LoadLibraryPermanently("libmvec.so.1");
        out->lljit->getMainJITDylib().addGenerator(
            take(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
                out->lljit->getDataLayout().getGlobalPrefix())));
        return out.release();
    }();
    return *j;
}

// RAG_JIT_PROFILE=1 also prints each module's compile time to stderr.
bool profiling() {
    static const bool on = [] {
        const char* e = std::getenv("RAG_JIT_PROFILE");
        return e && *e && std::string(e) != "0";
    }();
    return on;
}

void optimise(llvm::Module& m, llvm::TargetMachine& tm) {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    // glibc's libmvec gives the loop vectoriser SIMD exp, log and pow.
    llvm::TargetLibraryInfoImpl tlii(llvm::Triple(m.getTargetTriple()));
    tlii.addVectorizableFunctionsFromVecLib(llvm::TargetLibraryInfoImpl::LIBMVEC_X86,
                                            llvm::Triple(m.getTargetTriple()));
    // LLVM 16's libmvec table predates glibc 2.35's SIMD erfc and tanh (gelu and tanh loops).
    const auto fixed = [](unsigned n) { return llvm::ElementCount::getFixed(n); };
    tlii.addVectorizableFunctions({{"erfcf", "_ZGVbN4v_erfcf", fixed(4)},
                                   {"erfcf", "_ZGVdN8v_erfcf", fixed(8)},
                                   {"erfc", "_ZGVbN2v_erfc", fixed(2)},
                                   {"erfc", "_ZGVdN4v_erfc", fixed(4)},
                                   {"tanhf", "_ZGVbN4v_tanhf", fixed(4)},
                                   {"tanhf", "_ZGVdN8v_tanhf", fixed(8)},
                                   {"tanh", "_ZGVbN2v_tanh", fixed(2)},
                                   {"tanh", "_ZGVdN4v_tanh", fixed(4)}});
    fam.registerPass([&] { return llvm::TargetLibraryAnalysis(tlii); });
    llvm::PassBuilder pb(&tm);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(m, mam);
}

} // namespace

std::unique_ptr<llvm::Module> new_module(const std::string& name, llvm::LLVMContext& ctx) {
    auto m = std::make_unique<llvm::Module>(name, ctx);
    Jit& j = jit();
    m->setDataLayout(j.lljit->getDataLayout());
    m->setTargetTriple(j.tm->getTargetTriple().str());
    return m;
}

std::vector<void*> add_module(std::unique_ptr<llvm::Module> m,
                              std::unique_ptr<llvm::LLVMContext> ctx, std::size_t count,
                              const std::string& prefix, std::string* ir,
                              llvm::orc::ResourceTrackerSP* tracker) {
    std::optional<CompilePhase> phase(std::in_place, "llvm_opt");
    const auto t_start = std::chrono::steady_clock::now();
    const std::string name = m->getName().str();
    std::string err;
    llvm::raw_string_ostream es(err);
    if (llvm::verifyModule(*m, &es))
        fail("internal: module ", m->getName().str(), " is invalid LLVM IR: ", es.str());
    Jit& j = jit();
    std::lock_guard<std::mutex> lock(j.mu);
    optimise(*m, *j.tm);
    if (ir) {
        llvm::raw_string_ostream os(*ir);
        m->print(os, nullptr);
    }
    std::vector<void*> out;
    if (count == 0) return out;
    phase.reset();
    phase.emplace("llvm_codegen");
    auto rt = j.lljit->getMainJITDylib().createResourceTracker();
    check(j.lljit->addIRModule(rt, llvm::orc::ThreadSafeModule(std::move(m), std::move(ctx))));
    for (std::size_t k = 0; k < count; ++k) {
        auto sym = j.lljit->lookup(prefix + std::to_string(k));
        if (!sym) {
            llvm::consumeError(rt->remove());
            check(sym.takeError());
        }
        out.push_back(sym->toPtr<void*>());
    }
    if (tracker) *tracker = rt;
    if (profiling())
        std::fprintf(
            stderr, "module %s: %zu symbols, %.3f s\n", name.c_str(), count,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
    return out;
}

void remove_module(llvm::orc::ResourceTrackerSP& tracker) {
    if (!tracker) return;
    std::lock_guard<std::mutex> lock(jit().mu);
    if (llvm::Error e = tracker->remove()) llvm::consumeError(std::move(e)); // nothing left to do
    tracker = nullptr;
}

} // namespace rag::jit
