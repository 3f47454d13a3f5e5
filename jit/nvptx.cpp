#include "jit/nvptx.hpp"

#include "runtime/error.hpp"

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include <cstdlib>
#include <mutex>

namespace rag::jit {
namespace {

constexpr const char* triple = "nvptx64-nvidia-cuda";
// LLVM 16's newest PTX ISA; sm_90 needs it, sm_80 accepts it.
constexpr const char* features = "+ptx78";

std::unique_ptr<llvm::TargetMachine> target_machine(const std::string& arch) {
    check_arch(arch);
    static std::once_flag init;
    std::call_once(init, [] {
        LLVMInitializeNVPTXTargetInfo();
        LLVMInitializeNVPTXTarget();
        LLVMInitializeNVPTXTargetMC();
        LLVMInitializeNVPTXAsmPrinter();
        // 32-bit pointers to shared memory (clang's -fcuda-short-ptr): shared addresses are
        // below 228 KiB, and 64-bit ones took two registers each in the tile programs. An
        // LLVM option, so it holds for every NVPTX target machine of the process.
        auto& options = llvm::cl::getRegisteredOptions();
        auto it = options.find("nvptx-short-ptr");
        if (it != options.end()) static_cast<llvm::cl::opt<bool>*>(it->second)->setValue(true);
    });
    std::string err;
    const llvm::Target* t = llvm::TargetRegistry::lookupTarget(triple, err);
    if (!t) fail("NVPTX: this LLVM has no NVPTX target: ", err);
    // One TargetMachine per compilation: they are cheap and not safe to share across threads.
    std::unique_ptr<llvm::TargetMachine> tm(
        t->createTargetMachine(triple, arch, features, llvm::TargetOptions(), std::nullopt,
                               std::nullopt, llvm::CodeGenOpt::Aggressive));
    if (!tm) fail("NVPTX: cannot create a target machine for ", arch);
    return tm;
}

// libdevice's bytes, read once per process; each compilation parses its own copy into its
// context (LLVM modules belong to one context).
const std::string& libdevice_bytes() {
    static std::mutex mu;
    static std::string bytes;
    std::lock_guard<std::mutex> lock(mu);
    if (bytes.empty()) {
        const std::string path = libdevice_path();
        auto buf = llvm::MemoryBuffer::getFile(path);
        if (!buf)
            fail("NVPTX: cannot read libdevice at ", path, " (", buf.getError().message(),
                 "); set RAG_LIBDEVICE or CUDA_HOME");
        bytes = (*buf)->getBuffer().str();
    }
    return bytes;
}

bool calls_libdevice(const llvm::Module& m) {
    for (const llvm::Function& f : m)
        if (f.isDeclaration() && f.getName().startswith("__nv_")) return true;
    return false;
}

void link_libdevice(llvm::Module& m) {
    const std::string& bytes = libdevice_bytes();
    auto lib = llvm::parseBitcodeFile(
        llvm::MemoryBufferRef(llvm::StringRef(bytes.data(), bytes.size()), "libdevice"),
        m.getContext());
    if (!lib) fail("NVPTX: cannot parse libdevice: ", llvm::toString(lib.takeError()));
    (*lib)->setTargetTriple(m.getTargetTriple());
    (*lib)->setDataLayout(m.getDataLayout());
    if (llvm::Linker::linkModules(m, std::move(*lib), llvm::Linker::Flags::LinkOnlyNeeded))
        fail("NVPTX: linking libdevice failed");
}

// Intrinsics NVPTX in LLVM 16 turns into calls of libm functions that do not exist on the
// GPU (codegen then aborts the process): they must come from libdevice instead.
bool lowers_to_libcall(llvm::Intrinsic::ID id) {
    switch (id) {
    case llvm::Intrinsic::exp:
    case llvm::Intrinsic::exp2:
    case llvm::Intrinsic::log:
    case llvm::Intrinsic::log2:
    case llvm::Intrinsic::log10:
    case llvm::Intrinsic::sin:
    case llvm::Intrinsic::cos:
    case llvm::Intrinsic::pow:
    case llvm::Intrinsic::powi:
        return true;
    default:
        return false;
    }
}

// A PTX module must be self-contained: an undefined function would abort codegen or fail to
// load on the device, so it is reported here with the kernel's name.
void check_self_contained(const llvm::Module& m) {
    for (const llvm::Function& f : m) {
        if (!f.isDeclaration() || f.use_empty()) continue;
        if (f.isIntrinsic()) {
            if (lowers_to_libcall(f.getIntrinsicID()))
                fail("NVPTX: module ", m.getName().str(), " uses ", f.getName().str(),
                     ", which NVPTX cannot lower (use libdevice)");
            continue;
        }
        fail("NVPTX: module ", m.getName().str(), " calls the undefined function ",
             f.getName().str());
    }
    // An extern shared array is the block's dynamic shared memory, which the launch provides.
    for (const llvm::GlobalVariable& g : m.globals())
        if (g.isDeclaration() && !g.use_empty() && g.getAddressSpace() != 3)
            fail("NVPTX: module ", m.getName().str(), " references the undefined global ",
                 g.getName().str());
}

void optimise(llvm::Module& m, llvm::TargetMachine& tm) {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    // The TargetMachine's callbacks add NVVMReflect (folds libdevice's __nvvm_reflect on the
    // FTZ flag) and NVPTX's address-space inference to the pipeline.
    llvm::PassBuilder pb(&tm);
    tm.registerPassBuilderCallbacks(pb);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3).run(m, mam);
}

} // namespace

void check_arch(const std::string& arch) {
    if (arch != "sm_80" && arch != "sm_90")
        fail("unsupported GPU architecture '", arch, "': rag emits PTX for sm_80 and sm_90");
}

std::string libdevice_path() {
    if (const char* p = std::getenv("RAG_LIBDEVICE"); p && *p) return p;
    const char* home = std::getenv("CUDA_HOME");
    if (!home || !*home) home = std::getenv("CUDA_PATH");
    const std::string root = home && *home ? home : "/usr/local/cuda";
    return root + "/nvvm/libdevice/libdevice.10.bc";
}

std::unique_ptr<llvm::Module> new_nvptx_module(const std::string& name, llvm::LLVMContext& ctx,
                                               const std::string& arch) {
    auto tm = target_machine(arch);
    auto m = std::make_unique<llvm::Module>(name, ctx);
    m->setTargetTriple(triple);
    m->setDataLayout(tm->createDataLayout());
    return m;
}

void mark_kernel(llvm::Function& f, int max_threads, int min_blocks) {
    f.setCallingConv(llvm::CallingConv::PTX_Kernel);
    // LLVM 16 emits .maxntid and .minnctapersm only from these annotations (it ignores the
    // function attributes).
    llvm::LLVMContext& ctx = f.getContext();
    auto annotate = [&](const char* key, int value) {
        llvm::Metadata* md[] = {llvm::ValueAsMetadata::get(&f), llvm::MDString::get(ctx, key),
                                llvm::ConstantAsMetadata::get(
                                    llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx), value))};
        f.getParent()
            ->getOrInsertNamedMetadata("nvvm.annotations")
            ->addOperand(llvm::MDNode::get(ctx, md));
    };
    if (max_threads > 0) annotate("maxntidx", max_threads);
    if (min_blocks > 0) annotate("minctasm", min_blocks);
}

std::string compile_ptx(llvm::Module& m, const PtxOptions& opt) {
    auto tm = target_machine(opt.arch);
    if (m.getTargetTriple() != triple) fail("internal: compile_ptx needs an NVPTX module");
    std::string err;
    llvm::raw_string_ostream es(err);
    if (llvm::verifyModule(m, &es)) fail("internal: invalid LLVM IR for NVPTX: ", es.str());
    if (calls_libdevice(m)) link_libdevice(m);
    // Everything but the kernels is internal, so O3 drops what it inlined.
    for (llvm::Function& f : m)
        if (!f.isDeclaration() && f.getCallingConv() != llvm::CallingConv::PTX_Kernel)
            f.setLinkage(llvm::GlobalValue::InternalLinkage);
    // FTZ: libdevice branches on __nvvm_reflect("__CUDA_FTZ"), codegen on the attribute.
    m.addModuleFlag(llvm::Module::Override, "nvvm-reflect-ftz", opt.ftz ? 1 : 0);
    for (llvm::Function& f : m)
        if (!f.isDeclaration())
            f.addFnAttr("denormal-fp-math-f32", opt.ftz ? "preserve-sign" : "ieee");
    optimise(m, *tm);
    check_self_contained(m);
    llvm::SmallString<0> ptx;
    llvm::raw_svector_ostream os(ptx);
    llvm::legacy::PassManager pm;
    if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CGFT_AssemblyFile))
        fail("NVPTX: the target cannot emit PTX");
    pm.run(m);
    return std::string(ptx.str());
}

} // namespace rag::jit
