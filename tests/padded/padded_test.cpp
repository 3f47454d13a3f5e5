// Padded execution (frontend/padded.hpp, dsl/padded_io.hpp): the same program run on the dense
// envelope with masks must give the ragged program's results on every valid entry, values and
// gradients, on both tiers; and its memory must grow with the padded volume.
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "runtime/memory.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <filesystem>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;
const fs::path root = RAG_SOURCE_DIR;

std::vector<RaggedTensor> tensors(const Value& v) {
    std::vector<RaggedTensor> out;
    if (v.kind == Value::Kind::tensor) out.push_back(v.tensor);
    for (const auto& [_, f] : v.fields) out.push_back(f);
    for (const auto& e : v.elems)
        for (auto& t : tensors(e)) out.push_back(t);
    return out;
}

// Random arguments of fn's declared types; params groups initialised, then perturbed so that
// no gradient is trivially zero (ones/zeros initialisers).
std::vector<Value> random_args(Module& m, const std::string& fn,
                               const std::vector<std::int64_t>& lengths) {
    Diagnostics diags(*m.program().units[0].src);
    auto decl = frontend::lower(m.program(), fn, std::nullopt, diags);
    if (!decl) ADD_FAILURE() << diags.str();
    std::vector<Value> args;
    if (!decl) return args;
    for (const auto& t : decl->params) {
        if (t.kind == frontend::VType::Kind::record) {
            Value p = m.init(t.record, 3);
            for (auto& [_, f] : p.fields) {
                auto r = random_for(f.schema(), {}, -0.1, 0.1);
                auto a = f.to_f64(), b = r.to_f64();
                for (std::size_t k = 0; k < a.size(); ++k) a[k] += b[k];
                f = RaggedTensor::from_f64(f.dtype(), f.structure_ptr(), a);
            }
            args.push_back(p);
        } else {
            args.push_back(random_for(t.schema, lengths));
        }
    }
    return args;
}

// Ragged and padded calls of fn on the same arguments agree on every output (ragged outputs
// come back at their true extents, so they compare entry by entry).
void expect_padded_agrees(Module& ragged, Module& padded, const std::string& fn,
                          const std::vector<Value>& args, double tol) {
    auto want = tensors(ragged.call(fn, args));
    auto got = tensors(padded.call(fn, args));
    ASSERT_EQ(got.size(), want.size()) << fn;
    for (std::size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(got[k].schema(), want[k].schema()) << fn << " output " << k;
        ASSERT_TRUE(got[k].structure().same_as(want[k].structure())) << fn << " output " << k;
        EXPECT_LE(rel_l2(got[k], want[k]), tol) << fn << " output " << k;
    }
}

const std::vector<std::vector<std::int64_t>> length_sets = {
    {5, 5, 5, 5},     // near-uniform: no padding at all
    {3, 0, 7, 1},     // a zero-length sample
    {1, 12, 2, 1, 9}, // highly variable
};

TEST(Padded, ExamplesAgreeWithRaggedOnBothTiers) {
    const std::pair<const char*, std::vector<const char*>> cases[] = {
        {"single_pair_single.rag",
         {"block", "loss", "gradient", "train_step", "block_rect", "loss_rect", "train_step_rect",
          "block_nonleading", "loss_nonleading", "train_step_nonleading"}},
        {"encoder.rag", {"encoder", "loss", "gradient", "train_step"}},
    };
    // Gradients are compared directly, field by field: through train_step's parameters after
    // one SGD step, a wrong gradient hides below the parameters' own size.
    const std::string encoder_gradient =
        "\nfn gradient(x: f32[B, ~N, 64], labels: i64[B, ~N], p: Encoder) -> Encoder {\n"
        "    return grad(loss, wrt=p)(x, labels, p)\n}\n";
    for (const auto& [file, fns] : cases) {
        std::string src = frontend::read_source((root / "examples" / file).string());
        if (std::string(file) == "encoder.rag") src += encoder_gradient;
        for (Tier tier : {Tier::jit, Tier::interpreter}) {
            auto ragged = Module::compile(src, file);
            auto padded = Module::compile(src, file);
            ragged->set_tier(tier);
            padded->set_tier(tier);
            padded->set_padded(true);
            for (const char* fn : fns)
                for (const auto& lengths : length_sets) {
                    SCOPED_TRACE(std::string(file) + " " + fn +
                                 (tier == Tier::jit ? " jit" : " interp"));
                    expect_padded_agrees(*ragged, *padded, fn, random_args(*ragged, fn, lengths),
                                         1e-4);
                }
        }
    }
}

// Every op the Padder rewrites, with its gradient, against the ragged program; f64 so the only
// difference allowed is summation order.
const char* ops_src = R"(
fn red(x: f64[B, ~N, ~N, 3]) -> f64[] {
    let a = mean(x, axis=2) * 0.5 + sum(x, axis=1) * 0.25
    let b = max(x, axis=2) + min(x, axis=1)
    let c = mean(x, axis=0)
    return mean(a * a) + sum(b * b) + mean(c * c) + mean(x * x * x) + max(x) - min(x)
}
fn soft(x: f64[B, ~N, ~M, 3]) -> f64[] {
    let s = softmax(x, axis=2) * x
    let l = logsumexp(x, axis=1)
    return mean(s * s) + mean(exp(l))
}
fn att(q: f64[B, ~N, 2, 4], k: f64[B, ~M, 2, 4], v: f64[B, ~M, 2, 3]) -> f64[] {
    let o = attention(q, k, v)
    return mean(o * o * o)
}
fn bmm(a: f64[B, ~N, ~N], b: f64[B, ~N, 3]) -> f64[] {
    let c = a @ b
    return mean(c * c)
}
fn losses(x: f64[B, ~N, 4], y: i64[B, ~N], t: f64[B, ~N, 4]) -> f64[] {
    return cross_entropy(x, y) + mse(x, t)
}
fn logs(x: f64[B, ~N, ~M, 3]) -> f64[] {
    let l = log(softmax(x, axis=2)) # -inf at padded keys: masks there must select, not multiply
    return mean(l) + sum(exp(max(l, axis=2)))
}
fn sq(y: f64[B, ~N, ~M, 3]) -> f64[] { return mean(y * y) }
fn logs_into_grad(x: f64[B, ~N, ~M, 3]) -> f64[] {
    let (v, g) = value_and_grad(sq, wrt=0)(log(softmax(x, axis=2)))
    return v + mean(g)
}
fn red_grad(x: f64[B, ~N, ~N, 3]) -> f64[B, ~N, ~N, 3] { return grad(red, wrt=0)(x) }
fn soft_grad(x: f64[B, ~N, ~M, 3]) -> f64[B, ~N, ~M, 3] { return grad(soft, wrt=0)(x) }
fn att_grad(q: f64[B, ~N, 2, 4], k: f64[B, ~M, 2, 4], v: f64[B, ~M, 2, 3]) -> (f64[B, ~N, 2, 4], f64[B, ~M, 2, 4]) {
    return (grad(att, wrt=0)(q, k, v), grad(att, wrt=1)(q, k, v))
}
fn bmm_grad(a: f64[B, ~N, ~N], b: f64[B, ~N, 3]) -> f64[B, ~N, 3] { return grad(bmm, wrt=1)(a, b) }
fn losses_grad(x: f64[B, ~N, 4], y: i64[B, ~N], t: f64[B, ~N, 4]) -> f64[B, ~N, 4] {
    return grad(losses, wrt=0)(x, y, t)
}
)";

TEST(Padded, MaskedOpsAndTheirGradientsAgreeWithRagged) {
    for (Tier tier : {Tier::jit, Tier::interpreter}) {
        auto ragged = Module::compile(ops_src, "ops.rag");
        auto padded = Module::compile(ops_src, "ops.rag");
        ragged->set_tier(tier);
        padded->set_tier(tier);
        padded->set_padded(true);
        for (const std::string& fn : ragged->functions())
            for (const auto& lengths : length_sets) {
                SCOPED_TRACE(fn + (tier == Tier::jit ? " jit" : " interp"));
                expect_padded_agrees(*ragged, *padded, fn, random_args(*ragged, fn, lengths),
                                     1e-10);
            }
    }
}

// The padded program materialises the envelope: its peak memory for the square pair state is
// at least B * N_max^2 * 128 floats, far above the ragged program's at these lengths.
TEST(Padded, MemoryGrowsWithThePaddedVolume) {
    auto ragged = Module::load((root / "examples" / "single_pair_single.rag").string());
    auto padded = Module::load((root / "examples" / "single_pair_single.rag").string());
    padded->set_padded(true);
    const std::vector<std::int64_t> lengths = {2, 2, 2, 2, 2, 2, 2, 40};
    auto args = random_args(*ragged, "block", lengths);
    auto peak = [&](Module& m) {
        m.call("block", args); // compile outside the measurement
        memory::reset_peak();
        const auto before = memory::stats().current;
        m.call("block", args);
        return memory::stats().peak - before;
    };
    const double envelope_pair = 8.0 * 40 * 40 * 128 * 4;
    const double ragged_pair = (7 * 4 + 1600) * 128.0 * 4;
    const double p = double(peak(*padded)), r = double(peak(*ragged));
    EXPECT_GE(p, envelope_pair) << "padded peak " << p;
    EXPECT_GT(p, 4 * r) << "ragged peak " << r << " (pair state " << ragged_pair << ")";
}

TEST(Padded, CompilesOncePerSchemaAcrossLengths) {
    auto m = Module::load((root / "examples" / "encoder.rag").string());
    m->set_padded(true);
    for (const auto& lengths : length_sets)
        m->call("train_step", random_args(*m, "train_step", lengths));
    EXPECT_EQ(m->stats().at("train_step").compilations, 1);
    EXPECT_EQ(m->stats().at("train_step").cache_hits, 2);
}

TEST(Padded, UnsupportedOpsAreCompileErrors) {
    auto m = Module::compile(R"(
fn f(x: f32[B, 3, ~H, ~W]) -> f32[] { return sum(pad(x)) }
)");
    m->set_padded(true);
    auto args = std::vector<Value>{
        random_for(Schema{DType::f32, Shape{true, parse_axes("3, ~H, ~W")}}, {2, 3})};
    std::string msg = error_of([&] { m->call("f", args); });
    EXPECT_NE(msg.find("padded execution does not support pad"), std::string::npos) << msg;
    m->set_padded(false);
    EXPECT_NO_THROW(m->call("f", args));
}

} // namespace
} // namespace rag
