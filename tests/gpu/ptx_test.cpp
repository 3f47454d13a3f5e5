// GPU code generation without a GPU: every fused kernel of every example function, and every
// op the kernels fuse, becomes PTX that NVIDIA's ptxas accepts for sm_80 and sm_90; modules
// the GPU cannot run are rag::Errors (never an abort of the process).
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "jit/plan.hpp"
#include "jit/ptx.hpp"
#include "tests/gpu/ptxas.hpp"
#include "tests/support/testing.hpp"

#include <cstdlib>
#include <filesystem>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;
const fs::path root = source_root();
const char* const archs[] = {"sm_80", "sm_90"};

const char* const no_ptxas = "SKIPPED: no ptxas (set RAG_PTXAS or CUDA_HOME); PTX not assembled";

// The PTX has every kernel of the program as an entry with the fused kernels' launch bound,
// calls nothing external, and ptxas accepts it.
void expect_assembles(const jit::PtxProgram& p, const std::string& what) {
    for (const jit::PtxKernel& k : p.kernels)
        EXPECT_NE(p.ptx.find(".entry " + k.name + "("), std::string::npos) << what << " " << k.name;
    EXPECT_EQ(p.ptx.find(".extern"), std::string::npos) << what;
    if (!p.kernels.empty()) {
        EXPECT_NE(p.ptx.find(".maxntid " + std::to_string(jit::kFusedBlock) + ", 1, 1"),
                  std::string::npos)
            << what;
    }
    PtxasResult r = run_ptxas(p.ptx, p.arch);
    EXPECT_EQ(r.status, 0) << what << " for " << p.arch << ":\n" << r.output;
}

TEST(Ptx, EveryExampleKernelAssembles) {
    if (ptxas_path().empty()) GTEST_SKIP() << no_ptxas;
    int files = 0, kernels = 0;
    for (const auto& e : fs::directory_iterator(root / "examples")) {
        if (e.path().extension() != ".rag") continue;
        ++files;
        auto m = Module::load(e.path().string());
        for (const std::string& fn : m->functions()) {
            Diagnostics diags(*m->program().units[0].src);
            auto lowered = frontend::lower(m->program(), fn, std::nullopt, diags);
            ASSERT_TRUE(lowered) << diags.str();
            const jit::Plan plan = jit::make_plan(lowered->fn);
            for (const char* arch : archs) {
                auto p = jit::fused_ptx(lowered->fn, plan, arch);
                EXPECT_EQ(p.kernels.size(), plan.groups.size());
                expect_assembles(p, e.path().filename().string() + " " + fn);
                kernels += int(p.kernels.size());
            }
        }
    }
    EXPECT_GE(files, 2);
    EXPECT_GT(kernels, 0); // the examples do have fused groups
}

// One function applying every fusable op, for f32 and f64, with operands read whole, as a row
// and as a scalar: every libdevice function the kernels call links and assembles.
TEST(Ptx, EveryFusedOpAssembles) {
    if (ptxas_path().empty()) GTEST_SKIP() << no_ptxas;
    const char* unary[] = {"neg",  "exp",     "log",  "sqrt", "rsqrt", "abs",
                           "tanh", "sigmoid", "relu", "gelu", "silu"};
    const char* binary[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};
    for (DType t : {DType::f32, DType::f64}) {
        ir::Function f;
        f.name = "all_ops_" + std::string(dtype_name(t));
        ir::Builder b(f);
        int x = b.input({t, Shape{true, parse_axes("~N, 5")}}, "x");
        int row = b.input({t, Shape{false, parse_axes("5")}}, "row");
        int scalar = b.input({t, Shape{false, {}}}, "s");
        for (const char* op : unary) f.outputs.push_back(b.op(op, {x}));
        for (const char* op : binary)
            for (int y : {x, row, scalar}) f.outputs.push_back(b.op(op, {x, y}));
        f.outputs.push_back(b.op("scale", {x}, Attrs().set("c", 0.25)));
        const jit::Plan plan = jit::make_plan(f);
        ASSERT_EQ(plan.groups.size(), 1u) << jit::print(plan, f);
        for (const char* arch : archs) {
            auto p = jit::fused_ptx(f, plan, arch);
            expect_assembles(p, f.name);
        }
    }
}

TEST(Ptx, FlushToZeroReachesLibdeviceAndCodegen) {
    ir::Function f;
    f.name = "expo";
    ir::Builder b(f);
    f.outputs = {b.op("exp", {b.input({DType::f32, Shape{true, parse_axes("~N")}}, "x")})};
    const jit::Plan plan = jit::make_plan(f);
    const std::string ieee = jit::fused_ptx(f, plan, "sm_90", false).ptx;
    const std::string ftz = jit::fused_ptx(f, plan, "sm_90", true).ptx;
    // libdevice's expf uses ex2.approx.ftz either way; with FTZ the arithmetic flushes too.
    EXPECT_EQ(ieee.find("fma.rn.ftz"), std::string::npos) << ieee;
    EXPECT_NE(ftz.find("fma.rn.ftz"), std::string::npos) << ftz;
}

TEST(Ptx, UnsupportedArchitectureIsAnError) {
    ir::Function f;
    f.name = "neg";
    ir::Builder b(f);
    f.outputs = {b.op("neg", {b.input({DType::f32, Shape{true, parse_axes("~N")}}, "x")})};
    auto msg = error_of([&] { jit::fused_ptx(f, jit::make_plan(f), "sm_75"); });
    EXPECT_NE(msg.find("sm_75"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sm_80 and sm_90"), std::string::npos) << msg;
}

// NVPTX in LLVM 16 aborts the process on llvm.exp.f32 ("Undefined external symbol expf"); the
// check before codegen turns it, and any undefined function, into an error.
TEST(Ptx, ModulesTheGpuCannotRunAreErrors) {
    const std::string head = "define ptx_kernel void @k(ptr %p) {\n"
                             "  %x = load float, ptr %p\n";
    const std::string tail = "  store float %y, ptr %p\n  ret void\n}\n";
    auto msg = error_of([&] {
        jit::ptx_from_llvm_ir(head + "  %y = call float @llvm.exp.f32(float %x)\n" + tail +
                                  "declare float @llvm.exp.f32(float)\n",
                              "sm_90");
    });
    EXPECT_NE(msg.find("llvm.exp.f32"), std::string::npos) << msg;
    msg = error_of([&] {
        jit::ptx_from_llvm_ir(head + "  %y = call float @expf(float %x)\n" + tail +
                                  "declare float @expf(float)\n",
                              "sm_90");
    });
    EXPECT_NE(msg.find("undefined function expf"), std::string::npos) << msg;
    msg = error_of([&] { jit::ptx_from_llvm_ir("this is not IR", "sm_90"); });
    EXPECT_NE(msg.find("cannot parse"), std::string::npos) << msg;
    // The same kernel through libdevice is fine.
    const std::string ok = jit::ptx_from_llvm_ir(head + "  %y = call float @__nv_expf(float %x)\n" +
                                                     tail + "declare float @__nv_expf(float)\n",
                                                 "sm_90");
    EXPECT_NE(ok.find(".entry k("), std::string::npos);
}

} // namespace
} // namespace rag
