#include "jit/llvm_jit.hpp"

#include "jit/compile_clock.hpp"
#include "jit/object_cache.hpp"
#include "runtime/error.hpp"

#include <llvm/ADT/StringExtras.h>
#include <llvm/Analysis/TargetLibraryInfo.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/CompileUtils.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/BLAKE3.h>
#include <llvm/Support/DynamicLibrary.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include <time.h>

namespace rag::jit {
namespace {

struct Jit {
    std::unique_ptr<llvm::orc::LLJIT> lljit;
    std::unique_ptr<llvm::TargetMachine> tm;
    std::optional<llvm::orc::JITTargetMachineBuilder> jtmb; // for each thread's TargetMachine
    std::string cpu, features;                              // the host's, for the disk cache key
    std::mutex mu; // held while adding to or removing from the JIT
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
        out->jtmb = jtmb;
        out->cpu = jtmb.getCPU();
        out->features = jtmb.getFeatures().getString();
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

// A TargetMachine of the calling thread's own: optimisation and code generation run outside
// the JIT's lock, so modules compiled on several threads at once do not wait for each other.
llvm::TargetMachine& thread_tm(Jit& j) {
    thread_local std::unique_ptr<llvm::TargetMachine> tm;
    if (!tm) tm = take(j.jtmb->createTargetMachine());
    return *tm;
}

// CPU seconds of the calling thread: on a loaded machine wall time says little about LLVM's
// cost, the thread's CPU time does.
double thread_cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

std::size_t instruction_count(const llvm::Module& m) {
    std::size_t n = 0;
    for (const llvm::Function& f : m) n += f.getInstructionCount();
    return n;
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

// Bump when optimise() or the code generation settings change in a way the IR does not show:
// entries of another format are never read.
constexpr const char* kCacheFormat = "1";

// The disk cache key: everything that decides the machine code of `m` (jit/object_cache.hpp).
std::string cache_key(const llvm::Module& m, const Jit& j) {
    std::string text;
    llvm::raw_string_ostream os(text);
    m.print(os, nullptr);
    llvm::BLAKE3 h;
    for (const std::string& part :
         {std::string("rag " RAG_VERSION " format "), std::string(kCacheFormat),
          std::string(" llvm " LLVM_VERSION_STRING " "), j.tm->getTargetTriple().str(),
          " cpu " + j.cpu, " features " + j.features, std::string(" O3 codegen aggressive\n")})
        h.update(part);
    h.update(os.str());
    return llvm::toHex(h.final(), true);
}

std::string entry_name(std::size_t k) {
    return "rag_entry_" + std::to_string(k);
}

// Callers name modules and entries with a process-wide counter (rag_7_0); the disk cache key
// must not depend on how many modules the process compiled before, so the entries become
// rag_entry_k and the module's own names a constant. Callers only see the addresses.
void canonical_names(llvm::Module& m, std::size_t count, const std::string& prefix) {
    m.setModuleIdentifier("rag_module");
    m.setSourceFileName("rag_module");
    for (std::size_t k = 0; k < count; ++k)
        if (llvm::Function* f = m.getFunction(prefix + std::to_string(k)))
            f->setName(entry_name(k));
        else
            fail("internal: module has no function ", prefix, k);
}

// Adds the object to the JIT and looks up the entries rag_entry_0 .. count-1. On failure the object
// is removed again; `must` turns a failure into a rag::Error naming LLVM's reason.
bool link(Jit& j, std::unique_ptr<llvm::MemoryBuffer> obj, std::size_t count,
          std::vector<void*>& out, llvm::orc::ResourceTrackerSP* tracker, bool must = false) {
    // Each module gets a JITDylib of its own, so equal modules (their entries carry canonical
    // names, see canonical_names) never clash; libm and the process come from the main one.
    static std::atomic<std::uint64_t> counter{0};
    auto made = j.lljit->createJITDylib("rag_module_" + std::to_string(counter++));
    if (!made) check(made.takeError());
    llvm::orc::JITDylib& jd = *made;
    jd.addToLinkOrder(j.lljit->getMainJITDylib());
    auto rt = jd.createResourceTracker();
    auto give_up = [&](llvm::Error e) {
        llvm::consumeError(j.lljit->getExecutionSession().removeJITDylib(jd));
        if (must) check(std::move(e));
        llvm::consumeError(std::move(e));
        out.clear();
        return false;
    };
    if (llvm::Error e = j.lljit->addObjectFile(rt, std::move(obj))) return give_up(std::move(e));
    for (std::size_t k = 0; k < count; ++k) {
        auto sym = j.lljit->lookup(jd, entry_name(k));
        if (!sym) return give_up(sym.takeError());
        out.push_back(sym->toPtr<void*>());
    }
    if (tracker) *tracker = rt;
    return true;
}

} // namespace

std::unique_ptr<llvm::Module> new_module(const std::string& name, llvm::LLVMContext& ctx) {
    auto m = std::make_unique<llvm::Module>(name, ctx);
    Jit& j = jit();
    m->setDataLayout(j.lljit->getDataLayout());
    m->setTargetTriple(j.tm->getTargetTriple().str());
    return m;
}

std::vector<void*> add_module(std::unique_ptr<llvm::Module> module,
                              std::unique_ptr<llvm::LLVMContext> ctx, std::size_t count,
                              const std::string& prefix, std::string* ir,
                              llvm::orc::ResourceTrackerSP* tracker) {
    // The machine code is copied out, so both go at return: the module before its context.
    const std::unique_ptr<llvm::LLVMContext> context = std::move(ctx);
    const std::unique_ptr<llvm::Module> m = std::move(module);
    std::optional<CompilePhase> phase(std::in_place, "llvm_opt");
    const auto t_start = std::chrono::steady_clock::now();
    const double cpu_start = thread_cpu_seconds();
    double cpu_opt = 0, cpu_gen = 0;
    std::size_t ir_in = 0, ir_out = 0;
    const std::string name = m->getName().str();
    std::string err;
    llvm::raw_string_ostream es(err);
    if (llvm::verifyModule(*m, &es))
        fail("internal: module ", m->getName().str(), " is invalid LLVM IR: ", es.str());
    Jit& j = jit();
    canonical_names(*m, count, prefix);
    // Only modules that are run are cached (count == 0 asks for the optimised IR alone).
    std::string key;
    if (count > 0 && !object_cache_dir().empty()) {
        phase.reset();
        phase.emplace("disk_cache");
        key = cache_key(*m, j);
    }
    const auto report = [&](const char* how) {
        if (!profiling()) return;
        const double cpu = thread_cpu_seconds() - cpu_start;
        std::fprintf(
            stderr,
            "module %s: %zu symbols, %s, %.3f s (thread CPU %.3f s: optimise %.3f, code "
            "generation %.3f; %zu -> %zu instructions)\n",
            name.c_str(), count, how,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(), cpu,
            cpu_opt, cpu_gen, ir_in, ir_out);
    };
    std::vector<void*> out;
    if (!key.empty()) {
        if (auto hit = load_cached_object(key)) {
            std::lock_guard<std::mutex> lock(j.mu);
            if (link(j, llvm::MemoryBuffer::getMemBufferCopy(hit->object, name), count, out,
                     tracker)) {
                if (ir) *ir += hit->ir;
                report("from the disk cache");
                return out;
            }
            count_disk_cache_rejected(); // the JIT refused it: compile afresh below
        }
    }
    phase.reset();
    phase.emplace("llvm_opt");
    llvm::TargetMachine& tm = thread_tm(j);
    if (profiling()) ir_in = instruction_count(*m);
    const double cpu_before_opt = thread_cpu_seconds();
    optimise(*m, tm);
    if (profiling()) {
        cpu_opt = thread_cpu_seconds() - cpu_before_opt;
        ir_out = instruction_count(*m);
    }
    std::string text;
    if (ir || !key.empty()) {
        llvm::raw_string_ostream os(text);
        m->print(os, nullptr);
    }
    if (ir) *ir += text;
    if (count == 0) return out;
    phase.reset();
    phase.emplace("llvm_codegen");
    const double cpu_before_gen = thread_cpu_seconds();
    auto obj = take(llvm::orc::SimpleCompiler(tm)(*m));
    cpu_gen = thread_cpu_seconds() - cpu_before_gen;
    if (!key.empty())
        store_cached_object(key, {std::string(obj->getBuffer()), ir ? std::move(text) : ""});
    std::lock_guard<std::mutex> lock(j.mu);
    if (!link(j, std::move(obj), count, out, tracker, true))
        fail("internal: CPU JIT: module ", name, " did not link");
    report("compiled");
    return out;
}

void remove_module(llvm::orc::ResourceTrackerSP& tracker) {
    if (!tracker) return;
    Jit& j = jit();
    std::lock_guard<std::mutex> lock(j.mu);
    // Removing the module's JITDylib frees its code and the JITDylib itself.
    if (llvm::Error e = j.lljit->getExecutionSession().removeJITDylib(tracker->getJITDylib()))
        llvm::consumeError(std::move(e)); // nothing left to do
    tracker = nullptr;
}

} // namespace rag::jit
