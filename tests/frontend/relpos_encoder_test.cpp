// examples/relpos_encoder.rag: its DeBERTa-style and Transformer-XL-style layers train on
// ragged batches with a falling loss on the interpreter and on the JIT tier, the two tiers
// agree, and each loss's derived gradient matches float64 central differences.
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "jit/relpos.hpp"
#include "tests/support/program.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <filesystem>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;

std::shared_ptr<Module> relpos_example() {
    return Module::load((fs::path(RAG_SOURCE_DIR) / "examples" / "relpos_encoder.rag").string());
}

// The two layers: their params group, train step and loss.
struct Layer {
    const char *params, *train_step, *loss;
};
const Layer layers[] = {{"Deberta", "train_step_deberta", "loss_deberta"},
                        {"TransformerXL", "train_step_txl", "loss_txl"}};

// Tokens x [B, ~N, 64] and labels in {0, 1} for the given lengths (1 and lengths past the
// DeBERTa map's saturation at 32 included by the callers).
std::pair<RaggedTensor, RaggedTensor> batch(const std::vector<std::int64_t>& lengths) {
    std::vector<Shape_> shapes;
    std::vector<DenseArray> labels;
    for (auto n : lengths) {
        shapes.push_back({n, 64});
        std::vector<double> l(static_cast<std::size_t>(n));
        for (double& x : l) x = double(randint(0, 1));
        labels.push_back(DenseArray::from_f64(DType::i64, {n}, l));
    }
    return {random_batch(DType::f32, "~N, 64", shapes), RaggedTensor::from_list(labels, "~N")};
}

std::vector<double> train(Module& m, const Layer& layer, const RaggedTensor& x,
                          const RaggedTensor& labels, int steps) {
    Value p = m.init(layer.params, 0);
    std::vector<double> losses;
    for (int s = 0; s < steps; ++s) {
        Value r = m.call(layer.train_step, {x, labels, p});
        losses.push_back(r.elems[0].tensor.item());
        p = r.elems[1];
    }
    return losses;
}

TEST(RelposEncoder, TrainStepsLowerTheLossOnBothTiers) {
    const auto [x, labels] = batch({9, 1, 40, 17});
    for (const Layer& layer : layers)
        for (Tier tier : {Tier::interpreter, Tier::jit}) {
            SCOPED_TRACE(std::string(layer.train_step) +
                         (tier == Tier::jit ? " on the JIT" : " on the interpreter"));
            auto m = relpos_example();
            m->set_tier(tier);
            const auto losses = train(*m, layer, x, labels, 6);
            for (std::size_t s = 1; s < losses.size(); ++s)
                EXPECT_LT(losses[s], losses[s - 1]) << "step " << s;
            EXPECT_EQ(m->stats().at(layer.train_step).compilations, 1);
        }
}

TEST(RelposEncoder, JitAgreesWithTheInterpreter) {
    const auto [x, labels] = batch({33, 1, 12});
    for (const Layer& layer : layers) {
        SCOPED_TRACE(layer.train_step);
        auto interp = relpos_example(), jit = relpos_example();
        interp->set_tier(Tier::interpreter);
        jit->set_tier(Tier::jit);
        const Value p = interp->init(layer.params, 3);
        const Value a = interp->call(layer.train_step, {x, labels, p});
        const Value b = jit->call(layer.train_step, {x, labels, p});
        EXPECT_NEAR(a.elems[0].tensor.item(), b.elems[0].tensor.item(),
                    1e-5 * std::fabs(a.elems[0].tensor.item()));
        // The updated params: every field, so every gradient of the step is compared.
        ASSERT_EQ(a.elems[1].fields.size(), b.elems[1].fields.size());
        for (std::size_t f = 0; f < a.elems[1].fields.size(); ++f) {
            const auto& [name, ta] = a.elems[1].fields[f];
            EXPECT_TRUE(close(Nd::of(b.elems[1].fields[f].second.to_dense()), Nd::of(ta.to_dense()),
                              1e-5, 1e-4))
                << "field " << name;
        }
    }
}

TEST(RelposEncoder, LossGradientsMatchFiniteDifferences) {
    // Every float input of each loss (tokens and every params field) in float64.
    for (const Layer& layer : layers) {
        SCOPED_TRACE(layer.loss);
        auto m = relpos_example();
        Diagnostics diags(*m->program().units[0].src);
        auto lowered = frontend::lower(m->program(), layer.loss, std::nullopt, diags);
        ASSERT_TRUE(lowered) << diags.str();
        ir::Function f = with_dtype(lowered->fn, DType::f32, DType::f64);
        std::vector<RaggedTensor> inputs;
        std::vector<int> wrt;
        for (std::size_t k = 0; k < f.inputs.size(); ++k) {
            const Schema& s = f.type(f.inputs[k]);
            inputs.push_back(random_for(s, {3, 1, 36}, s.shape.batched ? -1.0 : -0.3,
                                        s.shape.batched ? 1.0 : 0.3));
            if (is_floating(s.dtype)) wrt.push_back(int(k));
        }
        check_program_gradient(f, inputs, wrt, 2e-5, 6);
    }
}

TEST(RelposEncoder, CompiledOncePerSchemaAcrossLengths) {
    for (const Layer& layer : layers) {
        auto m = relpos_example();
        Value p = m->init(layer.params, 1);
        const std::vector<std::vector<std::int64_t>> lengths = {{5, 17}, {1}, {64, 0, 3}, {2, 2}};
        for (const auto& l : lengths) {
            const auto [x, labels] = batch(l);
            m->call(layer.train_step, {x, labels, p});
        }
        EXPECT_EQ(m->stats().at(layer.train_step).compilations, 1) << layer.train_step;
        EXPECT_EQ(m->stats().at(layer.train_step).cache_hits, 3) << layer.train_step;
    }
}

// The first call of a function with relative-position attention finds its tile programs
// already started by compilation (jit/relpos.hpp, relpos_precompile: LLVM builds them while
// the function's own kernels compile), forward and backward: its runs start none. The scale
// is this test's own, so no other test compiled these programs first.
TEST(RelposEncoder, CompilationStartsTheTilePrograms) {
    auto m = Module::compile(R"(
fn loss(q: f32[B, ~N, 2, 8], k: f32[B, ~N, 2, 8], v: f32[B, ~N, 2, 8], t: f32[9, 2, 8]) -> f32[] {
    return sum(sum(sum(relpos_attention(q, k, v, map=clip(4), aq=t, scale=0.3712))))
}
fn step(q: f32[B, ~N, 2, 8], k: f32[B, ~N, 2, 8], v: f32[B, ~N, 2, 8], t: f32[9, 2, 8]) -> f32[9, 2, 8] {
    return grad(loss, wrt=t)(q, k, v, t)
}
)",
                             "precompile.rag");
    m->set_tier(Tier::jit);
    std::vector<Shape_> shapes = {{5, 2, 8}, {11, 2, 8}};
    const RaggedTensor q = random_batch(DType::f32, "~N, 2, 8", shapes);
    const RaggedTensor t = random_dense(DType::f32, {9, 2, 8});
    const std::size_t before = jit::relpos_programs_started_by_runs();
    const Value g = m->call("step", {q, q, q, t});
    EXPECT_EQ(jit::relpos_programs_started_by_runs(), before);
    EXPECT_GT(g.tensor.numel(), 0);
}

TEST(RelposEncoder, TransformerXLRejectsSamplesPastItsTable) {
    auto m = relpos_example();
    const auto [x, labels] = batch({3, 65});
    const std::string msg = error_of([&] {
        m->call("train_step_txl", {x, labels, m->init("TransformerXL", 0)});
    });
    EXPECT_NE(msg.find("sample 1 has N = 65 tokens but identity(64) covers N <= L = 64"),
              std::string::npos)
        << msg;
}

} // namespace
} // namespace rag
