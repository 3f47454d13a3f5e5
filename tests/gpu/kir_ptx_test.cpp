// The kernel IR's GPU lowering: every relative-position tile program, for every combination of
// relation terms, masking and storage type, becomes PTX that ptxas accepts for sm_80 and
// sm_90, with one block per program instance and barriers around its threads loops.
#include "jit/biased_attention_programs.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/relpos_programs.hpp"
#include "tests/gpu/ptxas.hpp"
#include "tests/support/testing.hpp"
#include <set>

namespace rag {
namespace {

using namespace rag::testing;
using kir::Expr;

// Each relation term on and off, both masks, every storage type, Dv != D (CI time bounds how
// many of the 2^5 x 4 combinations run).
std::vector<jit::RelposShape> shapes() {
    return {
        {DType::f32, 64, 64, false, false, false, false, 0.125}, // plain attention
        {DType::f32, 64, 64, true, true, true, false, 0.125},    // DeBERTa-style, all terms
        {DType::f16, 64, 64, false, false, true, true, 0.125},   // T5-style bias, causal
        {DType::bf16, 64, 64, true, false, false, true, 0.125},  // query term only, causal
        {DType::f64, 32, 16, false, true, true, false, 0.25},    // key term and bias, Dv != D
        // On tensor cores, as the GPU runs the half types (D = 64: every product on them).
        {DType::f16, 64, 64, true, true, true, false, 0.125, false, true},
        {DType::bf16, 64, 64, false, false, true, true, 0.125, false, true},
    };
}

std::size_t count(const std::string& s, const std::string& what) {
    std::size_t n = 0;
    for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
}

TEST(KirPtx, EveryRelposTileProgramAssembles) {
    if (ptxas_path().empty())
        GTEST_SKIP() << "SKIPPED: no ptxas (set RAG_PTXAS or CUDA_HOME); PTX not assembled";
    std::vector<kir::Kernel> kernels = {jit::relpos_table_reduce_program()};
    std::size_t with_mma = 0;
    for (const auto& s : shapes()) {
        kernels.push_back(jit::relpos_forward_program(s));
        kernels.push_back(jit::relpos_query_grad_program(s));
        kernels.push_back(jit::relpos_key_grad_program(s));
        for (std::size_t k = kernels.size() - 3; k < kernels.size(); ++k)
            with_mma += kir::print(kernels[k]).find("mma.") != std::string::npos;
        if (s.tensor_cores) {
            EXPECT_EQ(with_mma, 3u) << "every pass of a tensor-core shape has mma statements";
        } else {
            EXPECT_EQ(with_mma, 0u);
        }
        with_mma = 0;
    }
    // Which passes project both query and key terms per tile (their projection tiles take
    // the shared memory a second buffer of the streamed tiles would).
    std::set<const kir::Kernel*> both_projections;
    for (std::size_t k = 1; k < kernels.size(); k += 3)
        if (shapes()[(k - 1) / 3].aq && shapes()[(k - 1) / 3].ak)
            for (std::size_t pass = 0; pass < 3; ++pass)
                both_projections.insert(&kernels[k + pass]);
    for (const kir::Kernel& k : kernels)
        for (const char* arch : {"sm_80", "sm_90"}) {
            const std::string ptx = jit::kir_ptx(k, arch);
            EXPECT_NE(ptx.find(".entry " + k.name + "("), std::string::npos) << k.name;
            EXPECT_NE(ptx.find(".maxntid " + std::to_string(jit::kKirBlock) + ", 1, 1"),
                      std::string::npos)
                << k.name;
            // One block per SM: ptxas may use every register before it spills (gpu_static.md).
            EXPECT_NE(ptx.find(".minnctapersm 1"), std::string::npos) << k.name;
            // Nothing external but, past 48 KiB of shared arrays, the block's dynamic shared
            // memory (the TXL/DeBERTa-style forward, double-buffered beside its K^T tile).
            const bool dynamic = jit::kir_dynamic_shared_bytes(k) > 0;
            EXPECT_EQ(count(ptx, ".extern"), dynamic ? 1u : 0u) << k.name;
            EXPECT_EQ(ptx.find(".extern .shared .align 16 .b8 " + k.name + "_dynamic[]") !=
                          std::string::npos,
                      dynamic)
                << k.name;
            bool threads = false;
            for (const auto& st : k.body) threads = threads || st.loop == kir::Loop::threads;
            if (threads) {
                EXPECT_GE(count(ptx, "bar.sync"), 1u) << k.name;
            }
            // The tensor-core shapes' programs (the reduction has no products) use mma.sync.
            const bool mma = kir::print(k).find("mma.") != std::string::npos;
            EXPECT_EQ(ptx.find("mma.sync.aligned.m16n8k16") != std::string::npos, mma) << k.name;
            // ... and stage their tiles in shared memory, loading fragments with ldmatrix; the
            // forward keeps its scores in registers (row statistics by quad shuffles).
            EXPECT_EQ(ptx.find(".shared .align 16") != std::string::npos, mma) << k.name;
            EXPECT_EQ(ptx.find("ldmatrix.sync.aligned.m8n8") != std::string::npos, mma) << k.name;
            if (mma && k.name == "relpos_forward") {
                EXPECT_NE(ptx.find("shfl.sync.bfly.b32"), std::string::npos);
            }
            if (mma) {
                // The streamed tiles (the forward's and query pass's K and V, the key pass's Q
                // and dO) double-buffered: tile t + 1 copied with cp.async while t is computed,
                // but not beside both projection tiles (tensor-core products into shared
                // memory).
                const bool both = both_projections.count(&k) > 0;
                EXPECT_EQ(count(ptx, "cp.async.cg.shared.global"), both ? 0u : 4u) << ptx;
                EXPECT_EQ(count(ptx, "cp.async.wait_group 1;"), both ? 0u : 2u) << ptx;
                // Double-buffered, the loop waits for its own tile alone: the rows a tile reads
                // element by element (bias rows; the key pass's lse and D) come in its group.
                if (!both) {
                    EXPECT_EQ(count(ptx, "cp.async.wait_group 0;"), 0u) << ptx;
                }
                EXPECT_EQ(kir::print(k).find("ZKt") != std::string::npos, both);
            }
            PtxasResult r = run_ptxas(ptx, arch);
            EXPECT_EQ(r.status, 0) << k.name << " for " << arch << ":\n" << r.output;
        }
}

// The tensor-core passes project each tile pair into shared memory (project_tile), so their
// scratch does not grow with the rows a strip reaches (W, N + 63 for identity maps): the
// forward has none, the backward passes only their by-offset score gradients (dZ, per strip).
// The host's programs keep strip projections sized by W.
TEST(KirPtx, TensorCoreRelposScratchDoesNotGrowWithTheReachableRows) {
    auto scratch = [](const kir::Kernel& k, std::int64_t W) {
        // H, Delta, U, G, W, WP, WS (jit/relpos_programs.hpp's RelposParam order).
        const std::int64_t params[] = {12, W, 2 * W + 1, 64, W, W, W};
        return jit::kir_scratch_bytes(k, params);
    };
    for (const bool tensor_cores : {true, false}) {
        SCOPED_TRACE(tensor_cores ? "tensor cores" : "host programs");
        // DeBERTa-like: both relation tables, no bias (so only the tables ask for dZ).
        jit::RelposShape s{DType::f16, 64, 64, true, true, false, false, 0.125};
        s.tensor_cores = tensor_cores;
        const kir::Kernel fwd = jit::relpos_forward_program(s);
        if (tensor_cores) {
            EXPECT_EQ(scratch(fwd, 128), 0);
            EXPECT_EQ(scratch(fwd, 16384), 0);
        } else {
            EXPECT_GT(scratch(fwd, 16384), scratch(fwd, 128));
        }
        // The backward passes' dZ rows are G x W floats: nothing else may grow with W.
        for (const kir::Kernel& k :
             {jit::relpos_query_grad_program(s), jit::relpos_key_grad_program(s)}) {
            const std::int64_t grows = scratch(k, 16384) - scratch(k, 128);
            if (tensor_cores) {
                EXPECT_LE(grows, 64 * (16384 - 128) * 4 + 64) << k.name;
            } else {
                EXPECT_GT(grows, 64 * (16384 - 128) * 4 + 64) << k.name;
            }
        }
    }
}

// Attention with a bias (jit/biased_attention_programs.hpp): its three programs, plain and
// causal, Dv != D, assemble for sm_80 and sm_90, with barriers around their threads loops.
TEST(KirPtx, EveryBiasedAttentionProgramAssembles) {
    if (ptxas_path().empty())
        GTEST_SKIP() << "SKIPPED: no ptxas (set RAG_PTXAS or CUDA_HOME); PTX not assembled";
    for (const jit::BiasedShape& s :
         {jit::BiasedShape{32, 32, false, 0.17}, jit::BiasedShape{24, 16, true, 0.2}})
        for (const kir::Kernel& k :
             {jit::biased_forward_program(s), jit::biased_key_grad_program(s),
              jit::biased_query_grad_program(s)})
            for (const char* arch : {"sm_80", "sm_90"}) {
                const std::string ptx = jit::kir_ptx(k, arch);
                EXPECT_NE(ptx.find(".entry " + k.name + "("), std::string::npos) << k.name;
                EXPECT_GE(count(ptx, "bar.sync"), 2u) << k.name;
                PtxasResult r = run_ptxas(ptx, arch);
                EXPECT_EQ(r.status, 0) << k.name << " for " << arch << ":\n" << r.output;
            }
}

// A store in serial code is made by thread 0 alone, between barriers (a repeated
// read-modify-write would add up once per thread).
TEST(KirPtx, SerialStoresAreMadeByThreadZero) {
    kir::Builder b("serial_store");
    Expr n = b.param("n");
    int out = b.buffer("out", kir::Elem::f32);
    b.loop(0, n, [&](Expr i) { b.add_to(out, i, 1.0); });
    const std::string ptx = jit::kir_ptx(b.finish(), "sm_90");
    EXPECT_GE(count(ptx, "bar.sync"), 2u) << ptx;
    EXPECT_NE(ptx.find("%tid.x"), std::string::npos) << ptx;
    if (!ptxas_path().empty()) {
        EXPECT_EQ(run_ptxas(ptx, "sm_90").status, 0);
    }
}

TEST(KirPtx, ScratchIsSizedPerBlockLikeTheCpu) {
    kir::Builder b("scratchy");
    Expr n = b.param("n");
    int out = b.buffer("out", kir::Elem::f32);
    b.scratch("a", n * 3); // 12 n bytes, rounded up to 64
    b.scratch("b", Expr(5));
    b.loop(
        0, n, [&](Expr i) { b.store(out, i, 0.0); }, kir::Loop::threads);
    const kir::Kernel k = b.finish();
    const std::int64_t p7[] = {7}, p1[] = {1};
    EXPECT_EQ(jit::kir_scratch_bytes(k, p7), 192); // 84 -> 128, + 20 -> 192
    EXPECT_EQ(jit::kir_scratch_bytes(k, p1), 128); // 12 -> 64, + 20 -> 128
}

} // namespace
} // namespace rag
