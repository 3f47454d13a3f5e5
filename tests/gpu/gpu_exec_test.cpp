// Execution on a CUDA device against the CPU tier: every fused op (f32, f64; operands read
// whole, as a row, as a scalar), every example function, the segment programs, the
// relative-position tile programs (forward and every gradient, four mechanisms, bidirectional
// and causal, f32 and f16) and the device allocator. Without a device every test here is
// skipped with the reason (tests/gpu/run.sh runs them on a GPU).
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "jit/cpu_jit.hpp"
#include "jit/gpu_function.hpp"
#include "jit/kir_gpu.hpp"
#include "jit/relpos.hpp"
#include "jit/relpos_gpu.hpp"
#include "runtime/cuda.hpp"
#include "tests/gpu/relpos_cases.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;
const fs::path root = source_root();

#define SKIP_WITHOUT_DEVICE()                                                                      \
    if (!cuda::available()) {                                                                      \
        GTEST_SKIP() << "SKIPPED: no CUDA device (" << cuda::unavailable_reason() << ")";          \
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
            // Adam's second moments are non-negative (random ones would make NaN on both tiers).
            std::vector<bool> moment;
            for (const auto& t : lowered->params)
                for (const auto& [name, _] : t.leaves())
                    moment.push_back(t.kind == frontend::VType::Kind::record &&
                                     t.record.rfind("Adam[", 0) == 0 && name.rfind("v.", 0) == 0);
            // Inputs with derived ragged axes (FCN's labels at ~H[::4][*4]) need lengths
            // derived from the others', which random_for does not make; the image ops run as
            // counted host steps on this tier and are tested on the CPU (test_images.py).
            bool derived = false;
            for (int v : lowered->fn.inputs)
                for (const Axis& a : lowered->fn.type(v).shape.axes)
                    derived = derived || (a.is_ragged() && a.name.find('[') != std::string::npos);
            if (derived) continue;
            std::vector<RaggedTensor> in;
            for (std::size_t k = 0; k < lowered->fn.inputs.size(); ++k) {
                const Schema& s = lowered->fn.type(lowered->fn.inputs[k]);
                const bool nonneg = k < moment.size() && moment[k];
                in.push_back(random_for(s, {3, 0, 5, 1},
                                        s.shape.batched ? -1.0
                                        : nonneg        ? 0.0
                                                        : -0.2,
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

TEST(GpuExec, DeviceCopiesAndBorrowedMemory) {
    SKIP_WITHOUT_DEVICE();
    cuda::release_cached();
    const std::size_t bytes = 300 * sizeof(float);
    std::vector<float> host(300), back(300, -1.0f);
    for (std::size_t k = 0; k < host.size(); ++k) host[k] = float(k) - 7.5f;
    cuda::Buffer src(bytes), dst(bytes);
    cuda::upload(src, host.data(), bytes);
    cuda::copy(dst, src, bytes);
    cuda::download(back.data(), dst, bytes);
    EXPECT_EQ(back, host);
    EXPECT_THROW(cuda::copy(dst, src, bytes + 4096), Error);
    // Memory rag does not own (a DLPack import) is read and written like its own, and never
    // joins the allocator's cache.
    const auto before = cuda::memory_stats();
    {
        cuda::Buffer view = cuda::Buffer::borrow(src.ptr(), bytes);
        std::fill(back.begin(), back.end(), -1.0f);
        cuda::download(back.data(), view, bytes);
        EXPECT_EQ(back, host);
    }
    const auto after = cuda::memory_stats();
    EXPECT_EQ(after.in_use, before.in_use);
    EXPECT_EQ(after.cached, before.cached);
    // A DLPack consumer's stream waits for rag's: CUDA's legacy and per-thread default streams
    // (on a device an event and cuStreamWaitEvent; nothing to order when emulated).
    cuda::order_before(1);
    cuda::order_before(2);
    cuda::order_before(-1); // no synchronisation asked for
    EXPECT_THROW(cuda::order_before(0), Error);
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

bool bitwise_equal(const RaggedTensor& a, const RaggedTensor& b) {
    const std::size_t n = std::size_t(a.numel()) * dtype_size(a.dtype());
    return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), n) == 0;
}

// The tile programs on the device against the same programs on the CPU: the output, every
// gradient (q, k, v and each table), and the same bits on a second run (no atomics).
TEST(GpuExec, RelposTileProgramsMatchTheCpuKernels) {
    SKIP_WITHOUT_DEVICE();
    // Around the 64-token strip and tile: empty, single, 63/64/65, several strips.
    const std::vector<std::int64_t> lengths = {65, 1, 0, 130, 64, 63};
    for (DType t : {DType::f32, DType::f16})
        for (const Mechanism& m : mechanisms(130))
            for (bool causal : {false, true}) {
                SCOPED_TRACE(m.name + (causal ? " causal " : " bidirectional ") +
                             std::string(dtype_name(t)));
                const RelposCase c = relpos_case(m, t, causal, lengths);
                const double tol = t == DType::f32 ? 1e-5 : 2e-3;
                const RaggedTensor want = jit::relpos_forward(c.in, c.at).out;
                const RaggedTensor got = jit::relpos_forward_gpu(c.in, c.at);
                EXPECT_TRUE(got.structure().same_as(want.structure()));
                EXPECT_LE(rel_l2(got, want), tol) << "output";
                const auto gw = jit::relpos_backward(c.in, c.dO, c.at);
                const auto gg = jit::relpos_backward_gpu(c.in, c.dO, c.at);
                ASSERT_EQ(gg.size(), gw.size());
                for (std::size_t k = 0; k < gw.size(); ++k) {
                    EXPECT_EQ(gg[k].schema(), gw[k].schema()) << "gradient " << k;
                    EXPECT_LE(rel_l2(gg[k], gw[k]), tol) << "gradient " << k;
                }
                const auto again = jit::relpos_backward_gpu(c.in, c.dO, c.at);
                for (std::size_t k = 0; k < gg.size(); ++k)
                    EXPECT_TRUE(bitwise_equal(again[k], gg[k])) << "gradient " << k;
            }
}

// One long sample past every map's saturation, many strips per (sample, head) instance, and
// more instances than the launch has blocks.
TEST(GpuExec, RelposLongSampleMatchesTheCpuKernels) {
    SKIP_WITHOUT_DEVICE();
    for (const Mechanism& m : mechanisms(1000)) {
        SCOPED_TRACE(m.name);
        const RelposCase c = relpos_case(m, DType::f32, false, {1000, 3});
        EXPECT_LE(rel_l2(jit::relpos_forward_gpu(c.in, c.at), jit::relpos_forward(c.in, c.at).out),
                  1e-5);
        const auto gw = jit::relpos_backward(c.in, c.dO, c.at);
        const auto gg = jit::relpos_backward_gpu(c.in, c.dO, c.at);
        for (std::size_t k = 0; k < gw.size(); ++k)
            EXPECT_LE(rel_l2(gg[k], gw[k]), 1e-5) << "gradient " << k;
    }
}

// Relpos applications read q, k, v and dO that are on the device in place, and leave O, dq, dk
// and dv there until the host reads them (the table gradients are folded on the host). Against
// the same application on host inputs: exactly those four fewer uploads, the same downloads (the
// expanded table gradients), the same bits.
TEST(GpuExec, RelposReadsAndLeavesValuesOnTheDevice) {
    SKIP_WITHOUT_DEVICE();
    const RelposCase c = relpos_case(mechanisms(70)[0], DType::f32, false, {70, 5});
    auto moved = [&](const std::vector<RaggedTensor>& in, const RaggedTensor& dO) {
        const cuda::Transfers t0 = cuda::transfers();
        jit::RelposOnDevice d(in, c.at);
        d.set_dO(dO);
        d.backward(); // the forward first
        std::vector<RaggedTensor> out = d.gradients();
        out.push_back(d.out());
        const cuda::Transfers t1 = cuda::transfers();
        return std::tuple{t1.uploaded - t0.uploaded, t1.downloaded - t0.downloaded, out};
    };
    auto bytes = [](const RaggedTensor& t) { return std::uint64_t(t.numel()) * 4; };
    std::vector<RaggedTensor> on = c.in;
    for (std::size_t k = 0; k < 3; ++k) on[k] = jit::to_resident(c.in[k]);
    const auto [up_host, down_host, from_host] = moved(c.in, c.dO);
    const auto [up_dev, down_dev, from_dev] = moved(on, jit::to_resident(c.dO));
    EXPECT_EQ(up_host - up_dev, bytes(c.in[0]) + bytes(c.in[1]) + bytes(c.in[2]) + bytes(c.dO));
    EXPECT_EQ(down_dev, down_host);
    ASSERT_EQ(from_dev.size(), from_host.size());
    for (std::size_t k : {std::size_t(0), std::size_t(1), std::size_t(2), from_dev.size() - 1})
        EXPECT_NE(from_dev[k].device_copy(), nullptr) << "result " << k;
    for (std::size_t k = 0; k < from_dev.size(); ++k)
        EXPECT_TRUE(bitwise_equal(from_dev[k], from_host[k])) << "result " << k;
}

// Maps whose expanded rows are their rows (Transformer-XL's identity) expand the tables and
// fold their gradients on the device (transposes): a backward on device inputs downloads
// nothing (the inputs' host bytes are marked stale, so any host read would download), and
// every gradient, the tables' included, stays there, with the CPU kernels' values.
TEST(GpuExec, IdentityMapTablesStayOnTheDevice) {
    SKIP_WITHOUT_DEVICE();
    const RelposCase c = relpos_case(mechanisms(70)[1], DType::f32, false, {70, 5});
    std::vector<RaggedTensor> on = c.in;
    for (RaggedTensor& t : on) {
        t = jit::to_resident(t);
        t.share_device();
    }
    const RaggedTensor dO = jit::to_resident(c.dO);
    const cuda::Transfers t0 = cuda::transfers();
    jit::RelposOnDevice d(on, c.at);
    d.set_dO(dO);
    d.backward();
    const std::vector<RaggedTensor> got = d.gradients();
    EXPECT_EQ(cuda::transfers().downloaded - t0.downloaded, 0u);
    const auto want = jit::relpos_backward(c.in, c.dO, c.at);
    ASSERT_EQ(got.size(), 6u); // dq, dk, dv and the three tables'
    for (std::size_t k = 0; k < got.size(); ++k) {
        EXPECT_NE(got[k].device_copy(), nullptr) << "gradient " << k;
        EXPECT_LE(rel_l2(got[k], want[k]), 1e-5) << "gradient " << k;
    }
}

TEST(GpuExec, RelposErrorsAreTheCpuTiersErrors) {
    SKIP_WITHOUT_DEVICE();
    const Mechanism m = mechanisms(10)[0];
    RelposCase c = relpos_case(m, DType::f32, false, {5, 7});
    RelposCase other = relpos_case(m, DType::f32, false, {5, 6});
    c.in[1] = other.in[1]; // k of another length in sample 1
    const std::string cpu = error_of([&] { jit::relpos_forward(c.in, c.at); });
    const std::string gpu = error_of([&] { jit::relpos_forward_gpu(c.in, c.at); });
    EXPECT_NE(cpu.find("sample 1"), std::string::npos) << cpu;
    EXPECT_EQ(gpu, cpu);
}

// relpos_attention, its gradients (every wrt), segmented sums, softmax and their gradients,
// and layernorm's sibling gradients, through the GPU tier against the CPU tier.
TEST(GpuExec, GpuTierRunsRelposAndReductionsOnTheDevice) {
    SKIP_WITHOUT_DEVICE();
    const Mechanism m = mechanisms(70)[1]; // every table
    const RelposCase c = relpos_case(m, DType::f32, false, {70, 0, 5});
    ir::Function f;
    f.name = "relpos_and_reductions";
    ir::Builder b(f);
    std::vector<int> args;
    const char* names[] = {"q", "k", "v", "aq", "ak", "bias"};
    for (std::size_t k = 0; k < c.in.size(); ++k)
        args.push_back(b.input(c.in[k].schema(), names[k]));
    const int dO = b.input(c.dO.schema(), "dO");
    const int o = b.op("relpos_attention", args, c.at);
    f.outputs.push_back(o);
    std::vector<int> with_dO = args;
    with_dO.push_back(dO);
    for (std::size_t k = 0; k < c.in.size(); ++k)
        f.outputs.push_back(
            b.op("relpos_attention_grad", with_dO, Attrs(c.at).set("wrt", std::int64_t(k))));
    const Attrs over_n{{"axis", std::int64_t(1)}}, last{{"axis", std::int64_t(-1)}};
    const int s = b.op("sum", {o}, over_n), mn = b.op("mean", {o}, over_n);
    const int sm = b.op("softmax", {o}, last);
    f.outputs.insert(f.outputs.end(), {s, mn, sm, b.op("softmax_grad", {sm, dO}, last)});
    f.outputs.push_back(
        b.op("reduce_grad", {o, s, s}, Attrs(over_n).set("kind", std::string("sum"))));
    f.outputs.push_back(
        b.op("reduce_grad", {o, mn, mn}, Attrs(over_n).set("kind", std::string("mean"))));
    std::vector<RaggedTensor> in = c.in;
    in.push_back(c.dO);
    // layernorm over the last axis of dO and its three gradients: one rowwise step with
    // sibling nodes, each of which must be computed.
    const RaggedTensor gain = random_dense(DType::f32, {24}), bias = random_dense(DType::f32, {24});
    const int g_in = b.input(gain.schema(), "gain"), b_in = b.input(bias.schema(), "bias");
    in.push_back(gain);
    in.push_back(bias);
    const Attrs eps{{"eps", 1e-5}};
    f.outputs.push_back(b.op("layernorm", {dO, g_in, b_in}, eps));
    for (std::int64_t k = 0; k < 3; ++k)
        f.outputs.push_back(b.op("layernorm_grad", {dO, g_in, b_in, o}, Attrs(eps).set("wrt", k)));
    ir::verify(f);
    expect_gpu_matches_cpu(f, in);
}

// attention with a bias and triangle attention, forward and every gradient, through their tile
// programs on the device, against the CPU tier; no step runs on the host.
TEST(GpuExec, GpuTierRunsBiasedAttentionOnTheDevice) {
    std::vector<std::pair<ir::Function, std::vector<RaggedTensor>>> cases;
    for (int axis : {1, 2}) {
        const std::vector<Shape_> lengths = {{70}, {0}, {1}, {9}};
        const std::string q_axes = axis == 1 ? "~N, 2, 8" : "~N, ~N, 2, 8";
        const std::string v_axes = axis == 1 ? "~N, 2, 4" : "~N, ~N, 2, 4";
        const RaggedTensor q = random_batch(DType::f32, q_axes, shapes_for(q_axes, lengths));
        const RaggedTensor k = random_batch(DType::f32, q_axes, shapes_for(q_axes, lengths));
        const RaggedTensor v = random_batch(DType::f32, v_axes, shapes_for(v_axes, lengths));
        const RaggedTensor bias =
            random_batch(DType::f32, "~N, ~N, 2", shapes_for("~N, ~N, 2", lengths));
        const RaggedTensor dO = random_batch(DType::f32, v_axes, shapes_for(v_axes, lengths));
        ir::Function f;
        f.name = "biased_axis" + std::to_string(axis);
        ir::Builder b(f);
        std::vector<int> args = {b.input(q.schema(), "q"), b.input(k.schema(), "k"),
                                 b.input(v.schema(), "v"), b.input(bias.schema(), "bias")};
        const Attrs at{{"axis", std::int64_t(axis)}};
        f.outputs.push_back(b.op("biased_attention", args, at));
        args.push_back(b.input(dO.schema(), "dO"));
        for (std::int64_t wrt = 0; wrt < 4; ++wrt)
            f.outputs.push_back(b.op("biased_attention_grad", args, Attrs(at).set("wrt", wrt)));
        ir::verify(f);
        cases.push_back({f, {q, k, v, bias, dO}});
    }
    SKIP_WITHOUT_DEVICE();
    for (const auto& [f, in] : cases) {
        expect_gpu_matches_cpu(f, in);
        jit::Placement where;
        jit::compile_gpu(f)->run(in, &where);
        EXPECT_TRUE(where.host.empty() && where.reference.empty()) << f.name;
        EXPECT_GT(where.device, 0) << f.name;
    }
}

// x @ W and its weight gradient through the GPU tier's GEMM program (tensor cores for f16 and
// bf16) against the CPU tier (BLAS for f32, the reference kernels for the half types).
TEST(GpuExec, GpuTierRunsGemmStepsOnTheDevice) {
    // The functions are built (and checked) without a device too.
    std::vector<std::pair<ir::Function, std::vector<RaggedTensor>>> cases;
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
        // 733 rows: the weight gradient's K is split (split-K) on any device.
        const std::vector<Shape_> lengths = {{300}, {0}, {33}, {400}};
        const RaggedTensor x = random_batch(t, "~N, 96", shapes_for("~N, 96", lengths));
        const RaggedTensor w = random_dense(t, {96, 80});
        const RaggedTensor g = random_batch(t, "~N, 80", shapes_for("~N, 80", lengths));
        ir::Function f;
        f.name = std::string("gemms_").append(dtype_name(t));
        ir::Builder b(f);
        const int xi = b.input(x.schema(), "x"), wi = b.input(w.schema(), "w"),
                  gi = b.input(g.schema(), "g");
        f.outputs = {b.op("matmul", {xi, wi}, {}), b.op("matmul_weight_grad", {xi, gi}, {})};
        ir::verify(f);
        cases.push_back({f, {x, w, g}});
    }
    SKIP_WITHOUT_DEVICE();
    for (const auto& [f, in] : cases)
        expect_gpu_matches_cpu(f, in, f.name == "gemms_f32" ? 1e-5 : 4e-3);
}

// Results stay on the device between calls (runtime/tensor.hpp's Residency): a result passed
// into the next call is not uploaded again, nothing is downloaded until the host reads it, and a
// host write drops the device copy, so the next call uploads the new values. The bytes are
// counted by the calls' Placement (exact: x, then w, are the only uploads).
TEST(GpuExec, ResultsStayOnTheDeviceAcrossCalls) {
    const std::vector<Shape_> lengths = {{30}, {0}, {7}};
    const RaggedTensor x = random_batch(DType::f32, "~N, 64", shapes_for("~N, 64", lengths));
    const RaggedTensor w = random_dense(DType::f32, {64, 32}, 0.5, 1.0);
    ir::Function f;
    f.name = "step";
    ir::Builder b(f);
    const int xi = b.input(x.schema(), "x"), wi = b.input(w.schema(), "w");
    f.outputs = {b.op("mul", {wi, wi}), b.op("matmul", {xi, wi}, {})};
    ir::verify(f);
    SKIP_WITHOUT_DEVICE();
    const auto gpu = jit::compile_gpu(f);
    const auto cpu = jit::compile_cpu(f);
    const auto x_bytes = std::int64_t(x.numel()) * 4, w_bytes = std::int64_t(w.numel()) * 4;
    auto run = [&](const RaggedTensor& xs, const RaggedTensor& ws, std::int64_t up) {
        jit::Placement p;
        auto out = gpu->run({xs, ws}, &p);
        EXPECT_EQ(p.uploaded, up);
        EXPECT_EQ(p.downloaded, 0);
        EXPECT_EQ(p.device, 2);
        return out;
    };
    auto expect_cpu = [&](const std::vector<RaggedTensor>& got, const RaggedTensor& ws) {
        const auto want = cpu->run({x, ws});
        for (std::size_t k = 0; k < got.size(); ++k) EXPECT_LE(rel_l2(got[k], want[k]), 1e-6);
    };
    const auto first = run(x, w, x_bytes + w_bytes);
    ASSERT_NE(first[0].device_copy(), nullptr);
    // w' = w * w from the first call is read where it is.
    const auto second = run(x, first[0], x_bytes);
    // Reading a result downloads it once.
    const cuda::Transfers t0 = cuda::transfers();
    expect_cpu(second, first[0]);
    EXPECT_EQ(cuda::transfers().downloaded - t0.downloaded,
              std::uint64_t(w_bytes + w_bytes + x.numel() / 64 * 32 * 4)); // w', w'', y
    EXPECT_NE(second[0].device_copy(), nullptr) << "reading keeps the device copy";
    // A host write drops the copy: the next call uploads the written values.
    RaggedTensor written = second[0];
    static_cast<float*>(written.mutable_data())[5] = 3.0f;
    EXPECT_EQ(written.device_copy(), nullptr);
    expect_cpu(run(x, written, x_bytes + w_bytes), written);
    // A tensor put on the device by hand is read there too.
    const RaggedTensor on_device = jit::to_resident(x);
    EXPECT_EQ(on_device.device_copy() != nullptr, true);
    expect_cpu(run(on_device, w, w_bytes), w);
}

TEST(GpuExec, KernelIrLaunchesFewerBlocksThanInstances) {
    SKIP_WITHOUT_DEVICE();
    // Each instance writes its own id: every one of 100000 instances runs exactly once even
    // though the launch has at most multiprocessors x 8 blocks.
    kir::Builder kb("ids");
    const int out = kb.buffer("out", kir::Elem::i64);
    kb.store(out, kb.pid(), kb.pid() + 1);
    const jit::GpuKernel& k = jit::gpu_kernel("test/ids", [&] { return kb.finish(); });
    const std::int64_t grid = 100000;
    cuda::Buffer buf = jit::device_zeros(std::size_t(grid) * 8);
    const cuda::Buffer* ptrs[] = {&buf};
    k.launch(grid, ptrs, {});
    std::vector<std::int64_t> got(static_cast<std::size_t>(grid));
    cuda::download(got.data(), buf, got.size() * 8);
    for (std::int64_t i = 0; i < grid; ++i) ASSERT_EQ(got[std::size_t(i)], i + 1) << i;
}

} // namespace
} // namespace rag
