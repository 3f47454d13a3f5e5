// Execution on a CUDA device against the CPU tier: every fused op (f32, f64; operands read
// whole, as a row, as a scalar), every example function, and the device allocator. Without a
// device every test here is skipped with the reason (tests/gpu/run.sh runs them on a GPU).
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "jit/cpu_jit.hpp"
#include "jit/gpu_function.hpp"
#include "runtime/cuda.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <filesystem>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;
const fs::path root = RAG_SOURCE_DIR;

#define SKIP_WITHOUT_DEVICE()                                                                      \
    if (!cuda::available()) {                                                                      \
        GTEST_SKIP() << "SKIPPED: no CUDA device (" << cuda::unavailable_reason() << ")";          \
    }

double rel_l2(const RaggedTensor& a, const RaggedTensor& b) {
    auto x = a.to_f64(), y = b.to_f64();
    double num = 0, den = 0;
    for (std::size_t k = 0; k < x.size(); ++k) {
        num += (x[k] - y[k]) * (x[k] - y[k]);
        den += y[k] * y[k];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// libdevice and glibc differ by a few ulps in exp, log, tanh, erfc and pow.
void expect_gpu_matches_cpu(const ir::Function& f, const std::vector<RaggedTensor>& in,
                            double tol = 1e-5) {
    auto want = jit::compile_cpu(f)->run(in);
    auto got = jit::compile_gpu(f)->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(got[k].schema(), want[k].schema()) << f.name;
        EXPECT_TRUE(got[k].structure().same_as(want[k].structure())) << f.name;
        EXPECT_LE(rel_l2(got[k], want[k]), tol) << f.name << " output " << k;
    }
}

TEST(GpuExec, EveryFusedOpMatchesTheCpuTier) {
    SKIP_WITHOUT_DEVICE();
    const char* unary[] = {"neg",  "exp",     "log",  "sqrt", "rsqrt", "abs",
                           "tanh", "sigmoid", "relu", "gelu", "silu"};
    const char* binary[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};
    for (DType t : {DType::f32, DType::f64}) {
        // Lengths 0 and 1 and enough elements for several blocks of the grid-stride loop.
        auto shapes = shapes_for("~N, ~N, 5", {{0}, {1}, {70}, {3}});
        auto x = random_batch(t, "~N, ~N, 5", shapes, 0.1, 2.0);
        auto y = random_batch(t, "~N, ~N, 5", shapes, 0.1, 2.0);
        auto row = random_dense(t, {5}, 0.1, 2.0);
        auto scalar = random_dense(t, {}, 0.1, 2.0);
        for (const char* op : unary) {
            ir::Function f;
            f.name = op;
            ir::Builder b(f);
            f.outputs = {b.op(op, {b.input(x.schema(), "x")})};
            expect_gpu_matches_cpu(f, {x});
        }
        for (const char* op : binary)
            for (const RaggedTensor* other : {&y, &row, &scalar}) {
                ir::Function f;
                f.name = op;
                ir::Builder b(f);
                f.outputs = {b.op(op, {b.input(x.schema(), "x"), b.input(other->schema(), "y")})};
                expect_gpu_matches_cpu(f, {x, *other});
            }
    }
}

TEST(GpuExec, ExamplesMatchTheCpuTier) {
    SKIP_WITHOUT_DEVICE();
    for (const auto& e : fs::directory_iterator(root / "examples")) {
        if (e.path().extension() != ".rag") continue;
        auto m = Module::load(e.path().string());
        for (const std::string& fn : m->functions()) {
            Diagnostics diags(*m->program().units[0].src);
            auto lowered = frontend::lower(m->program(), fn, std::nullopt, diags);
            ASSERT_TRUE(lowered) << diags.str();
            std::vector<RaggedTensor> in;
            for (int v : lowered->fn.inputs) {
                const Schema& s = lowered->fn.type(v);
                in.push_back(random_for(s, {3, 0, 5, 1}, s.shape.batched ? -1.0 : -0.2,
                                        s.shape.batched ? 1.0 : 0.2));
            }
            SCOPED_TRACE(e.path().filename().string() + " " + fn);
            expect_gpu_matches_cpu(lowered->fn, in);
        }
    }
}

TEST(GpuExec, AllocatorReusesFreedBlocksAndCopiesRoundTrip) {
    SKIP_WITHOUT_DEVICE();
    cuda::release_cached();
    std::vector<float> host(1000), back(1000, -1.0f);
    for (std::size_t k = 0; k < host.size(); ++k) host[k] = float(k) * 0.5f;
    std::uint64_t first = 0;
    {
        cuda::Buffer b(host.size() * sizeof(float));
        first = b.ptr();
        cuda::upload(b, host.data(), host.size() * sizeof(float));
        cuda::download(back.data(), b, back.size() * sizeof(float));
        EXPECT_EQ(back, host);
        EXPECT_GE(cuda::memory_stats().in_use, host.size() * sizeof(float));
    }
    EXPECT_EQ(cuda::memory_stats().in_use, 0u);
    EXPECT_GT(cuda::memory_stats().cached, 0u);
    cuda::Buffer again(host.size() * sizeof(float) - 8); // the same size class
    EXPECT_EQ(again.ptr(), first);
    EXPECT_EQ(cuda::memory_stats().cached, 0u);
}

TEST(GpuExec, InvalidPtxShowsTheDriverLog) {
    SKIP_WITHOUT_DEVICE();
    auto msg = error_of([] {
        cuda::Module m(".version 7.8\n.target sm_80\n.address_size 64\n"
                       ".visible .entry k() { bogus.instruction; }\n");
    });
    EXPECT_NE(msg.find("loading PTX"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bogus"), std::string::npos) << msg; // from the driver's JIT log
}

} // namespace
} // namespace rag
