#include "dsl/ptx_listing.hpp"

#include "frontend/lower.hpp"
#include "jit/kir_gpu.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/ptx.hpp"
#include "runtime/cuda.hpp"
#include "runtime/error.hpp"

#include <sstream>

namespace rag {

std::string list_gpu_kernels(Module& m, const std::string& fn, const std::vector<Value>& args,
                             const std::string& arch, const std::string& inputs) {
    if (!cuda::emulated())
        fail("internal: listing GPU kernels needs the emulated device (RAG_GPU_EMULATE=1)");
    Diagnostics diags(*m.program().units.at(0).src);
    auto lowered = frontend::lower(m.program(), fn, std::nullopt, diags);
    if (!lowered) throw CompileError(diags.str());
    const jit::Plan plan = jit::make_plan(lowered->fn);
    const jit::PtxProgram fused = jit::fused_ptx(lowered->fn, plan, arch);

    const std::size_t before = jit::gpu_kernels_loaded().size();
    const Tier tier = m.tier();
    m.set_tier(Tier::gpu);
    try {
        m.call(fn, args);
    } catch (...) {
        m.set_tier(tier);
        throw;
    }
    m.set_tier(tier);
    const auto all = jit::gpu_kernels_loaded();
    std::vector<std::pair<std::string, std::string>> modules; // title, PTX
    if (!fused.kernels.empty())
        modules.emplace_back("fused elementwise kernels of the plan", fused.ptx);
    for (std::size_t k = before; k < all.size(); ++k)
        modules.emplace_back("kernel-IR program " + all[k].second->name + " [" + all[k].first + "]",
                             jit::kir_ptx(*all[k].second, arch));

    std::ostringstream os;
    const std::size_t programs = all.size() - before;
    const std::size_t kernels = fused.kernels.size() + programs;
    os << "// rag: " << kernels << " GPU kernel" << (kernels == 1 ? "" : "s") << " of " << fn
       << " for " << arch << " in " << modules.size() << " module"
       << (modules.size() == 1 ? "" : "s") << ": " << fused.kernels.size() << " fused elementwise, "
       << programs << " kernel-IR program" << (programs == 1 ? "" : "s")
       << "\n// the programs are those one call on " << inputs
       << " launched on the GPU tier (the emulated device; other lengths may pick others, "
          "e.g. split-K GEMMs)\n";
    std::size_t index = 0;
    if (!fused.kernels.empty()) {
        ++index;
        os << "//   module " << index << ": " << fused.kernels.size()
           << " fused elementwise kernels\n";
        for (const jit::PtxKernel& k : fused.kernels)
            os << "//     " << k.name << ": " << k.description << "\n";
    }
    for (std::size_t k = before; k < all.size(); ++k)
        os << "//   module " << ++index << ": " << all[k].second->name << " (" << all[k].first
           << ")\n";
    for (std::size_t k = 0; k < modules.size(); ++k)
        os << "// ==== module " << k + 1 << " of " << modules.size() << ": " << modules[k].first
           << " ====\n"
           << modules[k].second;
    return os.str();
}

} // namespace rag
