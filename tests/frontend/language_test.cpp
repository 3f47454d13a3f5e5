// The programs of LANGUAGE.md run with the stated results, the examples' derived gradients
// agree with float64 finite differences, and calls are compiled once per schema.
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "tests/support/program.hpp"
#include "tests/support/testing.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;
const fs::path root = RAG_SOURCE_DIR;

std::shared_ptr<Module> example(const char* name) {
    return Module::load((root / "examples" / name).string());
}

RaggedTensor singles(DType t, std::vector<std::int64_t> lengths, std::int64_t c) {
    std::vector<Shape_> shapes;
    for (auto n : lengths) shapes.push_back({n, c});
    return random_batch(t, "~N, " + std::to_string(c), shapes);
}

// Independent per-sample computation of the spec's `block` for one sample (plain loops).
std::pair<Nd, Nd> block_reference(const Nd& x, const Value& p) {
    auto w = [&](const char* n) { return Nd::of(p.field(n).to_dense()); };
    Nd wu = w("wu"), wv = w("wv"), g = w("ln_g"), b = w("ln_b"), wh = w("wh"), wg = w("wg");
    const std::int64_t n = x.shape[0];
    Nd a({n, 128}), bb({n, 128});
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t o = 0; o < 128; ++o)
            for (std::int64_t c = 0; c < 384; ++c) {
                a({i, o}) += x({i, c}) * wu({c, o});
                bb({i, o}) += x({i, c}) * wv({c, o});
            }
    Nd pair({n, n, 128}), red({n, 128});
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
            double h[128], mean = 0, var = 0;
            for (int c = 0; c < 128; ++c) mean += (h[c] = a({i, c}) + bb({j, c})) / 128;
            for (int c = 0; c < 128; ++c) var += (h[c] - mean) * (h[c] - mean) / 128;
            double ln[128];
            for (int c = 0; c < 128; ++c)
                ln[c] = (h[c] - mean) / std::sqrt(var + 1e-5) * g({c}) + b({c});
            for (int o = 0; o < 128; ++o) {
                double s = h[o];
                for (int c = 0; c < 128; ++c) s += ln[c] * wh({c, o});
                pair({i, j, o}) = s;
                red({i, o}) += s / double(n);
            }
        }
    Nd y = x;
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t o = 0; o < 384; ++o)
            for (std::int64_t c = 0; c < 128; ++c) y({i, o}) += red({i, c}) * wg({c, o});
    return {y, pair};
}

TEST(Language, SinglePairSingleBlockMatchesPerSampleReference) {
    auto m = example("single_pair_single.rag");
    Value p = m->init("PairBlock", 0);
    RaggedTensor x = singles(DType::f32, {5, 17, 9}, 384);
    Value out = m->call("block", {x, p});
    ASSERT_EQ(out.elems.size(), 2u);
    const RaggedTensor &y = out.elems[0].tensor, &pair = out.elems[1].tensor;
    EXPECT_EQ(y.schema().str(), "f32[B, ~N, 384]");
    EXPECT_EQ(pair.schema().str(), "f32[B, ~N, ~N, 128]");
    EXPECT_EQ(pair.structure().lengths(0), (std::vector<std::int64_t>{5, 17, 9}));
    EXPECT_EQ(pair.structure().offsets(), (std::vector<std::int64_t>{0, 25, 314, 395}));
    // Check samples 0 and 2 exactly (f32 storage; float64 reference).
    auto xs = samples(x), ys = samples(y), ps = samples(pair);
    for (std::size_t i : {0u, 2u}) {
        auto [yr, pr] = block_reference(xs[i], p);
        EXPECT_TRUE(close(ys[i], yr, 1e-5, 1e-4)) << "sample " << i;
        EXPECT_TRUE(close(ps[i], pr, 1e-5, 1e-4)) << "sample " << i;
    }
}

TEST(Language, TrainStepLossFalls) {
    auto m = example("single_pair_single.rag");
    Value p = m->init("PairBlock", 0);
    RaggedTensor x = singles(DType::f32, {3, 6, 1, 4}, 384);
    std::vector<double> losses;
    for (int s = 0; s < 8; ++s) {
        Value r = m->call("train_step", {x, p});
        losses.push_back(r.elems[0].tensor.item());
        p = r.elems[1];
    }
    for (std::size_t s = 1; s < losses.size(); ++s)
        EXPECT_LT(losses[s], losses[s - 1]) << "step " << s;
    EXPECT_EQ(m->stats().at("train_step").compilations, 1);
}

TEST(Language, CompiledOncePerSchemaReusedAcrossLengths) {
    auto m = example("single_pair_single.rag");
    Value p = m->init("PairBlock", 1);
    const std::vector<std::vector<std::int64_t>> batches = {
        {5, 17, 9}, {3, 3, 3}, {1, 0, 4}, {2}, {7, 7}, {0, 0}, {1, 2, 3, 4}, {6, 1}};
    for (const auto& l : batches) m->call("block", {singles(DType::f32, l, 384), p});
    EXPECT_EQ(m->stats().at("block").compilations, 1);
    EXPECT_EQ(m->stats().at("block").cache_hits, int(batches.size()) - 1);
}

TEST(Language, GenericFunctionsSpecialisePerDtype) {
    auto m = Module::compile(R"(
        fn scale[T](x: T[B, ~N, C], s: T[]) -> T[B, ~N, C] {
            return x * s
        })");
    for (DType t : {DType::f32, DType::f64, DType::f32}) {
        RaggedTensor x = singles(t, {2, 0, 3}, 4);
        RaggedTensor s = RaggedTensor::dense(DenseArray::from_f64(t, {}, {2.0}));
        RaggedTensor y = m->call("scale", {x, s}).tensor;
        EXPECT_EQ(y.dtype(), t);
        auto xv = x.to_f64(), yv = y.to_f64();
        for (std::size_t k = 0; k < xv.size(); ++k) EXPECT_EQ(yv[k], 2 * xv[k]);
    }
    EXPECT_EQ(m->stats().at("scale").compilations, 2);
    EXPECT_EQ(m->stats().at("scale").cache_hits, 1);
}

TEST(Language, AxisZeroReducesEachSampleCompletely) {
    auto m = Module::compile("fn f(x: f32[B, ~N]) -> f32[B] { return sum(x, axis=0) }");
    auto x = RaggedTensor::from_list({DenseArray::from_f64(DType::f32, {2}, {1, 2}),
                                      DenseArray::from_f64(DType::f32, {2}, {3, 4})},
                                     "~N");
    RaggedTensor y = m->call("f", {x}).tensor;
    EXPECT_EQ(y.schema().str(), "f32[B]");
    EXPECT_EQ(y.to_f64(), (std::vector<double>{3, 7}));
}

TEST(Language, HandBuiltParamsAreCheckedAgainstTheirDeclaration) {
    auto m = Module::compile(R"(
        params P {
            a: f32[4] = ones
            b: f32[4] = zeros
        }
        fn h(x: f32[B, ~N, 4], p: P) -> f32[] { return sum(x * p.a + p.b) })");
    RaggedTensor x = RaggedTensor::from_list(
        {DenseArray::from_f64(DType::f32, {2, 4}, std::vector<double>(8, 2.0))}, "~N, 4");
    Value p = m->init("P", 0);
    EXPECT_EQ(m->call("h", {x, p}).tensor.item(), 16.0);
    Value swapped = p;
    std::swap(swapped.fields[0], swapped.fields[1]); // fields in another order: same meaning
    EXPECT_EQ(m->call("h", {x, swapped}).tensor.item(), 16.0);
    Value wrong = p;
    wrong.fields[0].second =
        RaggedTensor::dense(DenseArray::from_f64(DType::f32, {4, 8}, std::vector<double>(32, 1.0)));
    EXPECT_NE(error_of([&] {
                  m->call("h", {x, wrong});
              }).find("P.a has schema f32[4, 8], expected f32[4]"),
              std::string::npos);
    Value extra = p;
    extra.fields.push_back({"c", p.fields[0].second});
    EXPECT_NE(error_of([&] {
                  m->call("h", {x, extra});
              }).find("P has no field 'c'"),
              std::string::npos);
}

TEST(Language, OutOfRangeConstantsAreDiagnosed) {
    auto msg = error_of([] {
        Module::compile("fn g(x: f32[B, ~N]) -> f32[] { return sum(x) }\n"
                        "fn f(x: f32[B, ~N]) -> f32[B, ~N] { return grad(g, wrt=4294967296)(x) }");
    });
    EXPECT_NE(msg.find("g has no parameter 4294967296"), std::string::npos) << msg;
    msg = error_of([] {
        Module::compile("fn f(x: f32[B, ~N, 3]) -> f32[B, 3] { return sum(x, axis=1e300) }");
    });
    EXPECT_NE(msg.find("axis is out of range"), std::string::npos) << msg;
    msg = error_of([] {
        Module::compile("fn f(x: f32[B, ~N, 0]) -> f32[B, ~N, 4294967296, 4294967296] { return "
                        "reshape(x, 4294967296, 4294967296) }");
    });
    EXPECT_NE(msg.find("reshape: the extents overflow"), std::string::npos) << msg;
}

// A function named where a value is needed (returned, in a tuple, in arithmetic, a gradient
// transform returned) is a diagnostic at its span, not an empty result at run time; bound by
// let and called later it is still a function.
TEST(Language, FunctionsUsedAsValuesAreDiagnosed) {
    const std::string defs = "fn layer(h: f32[B, ~N, 3]) -> f32[B, ~N, 3] { return h * 2.0 }\n"
                             "fn loss(h: f32[B, ~N, 3]) -> f32[] { return sum(h) }\n";
    const std::pair<std::string, std::string> cases[] = {
        {"fn c(x: f32[B, ~N, 3]) -> f32[] { return layer }", "'layer' is a function, not a value"},
        {"fn c(x: f32[B, ~N, 3]) { return (x, layer) }", "'layer' is a function, not a value"},
        {"fn c(x: f32[B, ~N, 3]) -> f32[B, ~N, 3] { return layer + x }", "'layer' is a function"},
        {"fn c(x: f32[B, ~N, 3]) { return grad(loss, wrt=0) }",
         "'grad(loss, wrt=0)' is a function, not a value: call it, grad(loss, wrt=0)(...)"}};
    for (const auto& [fn, want] : cases) {
        const std::string msg = error_of([&] { Module::compile(defs + fn); });
        EXPECT_NE(msg.find(want), std::string::npos) << fn << "\n" << msg;
        EXPECT_NE(msg.find(":3:"), std::string::npos) << "at the use: " << msg;
    }
    auto m = Module::compile(defs + "fn c(x: f32[B, ~N, 3]) -> f32[] { let q = layer\n"
                                    "return loss(q(x)) }");
    const RaggedTensor x = singles(DType::f32, {2, 3}, 3);
    EXPECT_NEAR(m->call("c", {x}).tensor.item(), 2 * m->call("loss", {x}).tensor.item(), 1e-5);
}

TEST(Language, ABadRelposMapListsEveryMap) {
    const std::string msg = error_of([] {
        Module::compile("fn f(q: f32[B, ~N, 2, 4], k: f32[B, ~N, 2, 4], v: f32[B, ~N, 2, 4]) -> "
                        "f32[B, ~N, 2, 4] { return relpos_attention(q, k, v, map=3) }");
    });
    EXPECT_NE(msg.find("identity, clip(D), t5_buckets(...), log_buckets(...) or buckets(D, ...)"),
              std::string::npos)
        << msg;
}

TEST(Language, NumberLiteralsCanBeResults) {
    auto m =
        Module::compile("fn f(x: f32[B, ~N, 3]) { return (x, 2) }\nfn g() -> f32[] { return 1.5 }");
    Value r = m->call("f", {singles(DType::f32, {1, 2}, 3)});
    EXPECT_EQ(r.elems[1].tensor.item(), 2.0);
    EXPECT_EQ(m->call("g", {}).tensor.item(), 1.5);
}

TEST(Language, BroadcastCreatesPairAxes) {
    auto m = Module::compile(
        "fn f(a: f32[B, ~N, 4]) -> f32[B, ~N, ~N, 4] { return a[:, :, new, :] + a[:, new, :, :] }");
    RaggedTensor y = m->call("f", {singles(DType::f32, {2, 3}, 4)}).tensor;
    EXPECT_EQ(y.structure().offsets(), (std::vector<std::int64_t>{0, 4, 13}));
}

TEST(Language, EqualRowCountsWithDifferentShapesAreRejectedNamingTheSample) {
    auto m = Module::compile(
        "fn f(x: f32[B, ~N, ~M, 4], y: f32[B, ~N, ~M, 4]) -> f32[B, ~N, ~M, 4] { return x + y }");
    auto x = random_batch(DType::f32, "~N, ~M, 4", {{2, 6, 4}});
    auto y = random_batch(DType::f32, "~N, ~M, 4", {{3, 4, 4}});
    auto msg = error_of([&] { m->call("f", {x, y}); });
    EXPECT_NE(msg.find("sample 0 has N = 3 but argument x has N = 2"), std::string::npos) << msg;
}

TEST(Language, DeclaredRaggedNamesBindAtTheCall) {
    // Lengths that happen to be equal still bind to ~N; a square pair must be square.
    auto m = Module::compile("fn f(x: f32[B, ~N, ~N]) -> f32[B, ~N] { return sum(x, axis=2) }");
    auto ok = random_batch(DType::f32, "~A, ~A", {{3, 3}, {1, 1}});
    EXPECT_EQ(m->call("f", {ok}).tensor.schema().str(), "f32[B, ~N]");
    auto bad = random_batch(DType::f32, "~A, ~C", {{3, 3}, {1, 2}});
    auto msg = error_of([&] { m->call("f", {bad}); });
    EXPECT_NE(msg.find("sample 1"), std::string::npos) << msg;
    auto wrong = random_batch(DType::f32, "~A", {{3}});
    EXPECT_NE(error_of([&] { m->call("f", {wrong}); }).find("expected f32[B, ~N, ~N]"),
              std::string::npos);
}

// A random value of a declared type; records come from init().
Value random_value(Module& m, const frontend::VType& t, const std::vector<std::int64_t>& lengths) {
    if (t.kind == frontend::VType::Kind::record) return m.init(t.record, 7);
    return random_for(t.schema, lengths);
}

// Random arguments of fn's declared types.
std::vector<Value> random_args(Module& m, const char* fn,
                               const std::vector<std::int64_t>& lengths) {
    Diagnostics diags(*m.program().units[0].src);
    auto decl = frontend::lower(m.program(), fn, std::nullopt, diags);
    if (!decl) ADD_FAILURE() << diags.str();
    std::vector<Value> args;
    if (decl)
        for (const auto& t : decl->params) args.push_back(random_value(m, t, lengths));
    return args;
}

TEST(Language, EveryExampleTrainStepLowersItsLoss) {
    const std::pair<const char*, const char*> cases[] = {
        {"single_pair_single.rag", "train_step_rect"},
        {"single_pair_single.rag", "train_step_nonleading"},
        {"encoder.rag", "train_step"}};
    for (auto [file, fn] : cases) {
        auto m = example(file);
        std::vector<Value> args = random_args(*m, fn, {4, 1, 6});
        std::size_t slot = 0;
        for (std::size_t k = 0; k < args.size(); ++k)
            if (args[k].kind == Value::Kind::record) slot = k;
        double first = 0, last = 0;
        for (int s = 0; s < 6; ++s) {
            Value r = m->call(fn, args);
            (s == 0 ? first : last) = r.elems[0].tensor.item();
            args[slot] = r.elems[1];
        }
        EXPECT_LT(last, first) << file << " " << fn;
    }
}

TEST(Language, EveryExampleCompilesOncePerSchemaAcrossLengths) {
    const std::vector<std::vector<std::int64_t>> batches = {
        {5, 17, 9}, {4, 4, 4}, {0, 3, 1}, {1}, {2, 2}, {7, 0, 0, 2}, {3, 1, 4, 1}, {6}};
    const std::pair<const char*, const char*> cases[] = {
        {"single_pair_single.rag", "block"},
        {"single_pair_single.rag", "train_step"},
        {"single_pair_single.rag", "block_rect"},
        {"single_pair_single.rag", "train_step_nonleading"},
        {"encoder.rag", "encoder"},
        {"encoder.rag", "train_step"}};
    for (auto [file, fn] : cases) {
        auto m = example(file);
        for (const auto& lengths : batches) m->call(fn, random_args(*m, fn, lengths));
        EXPECT_EQ(m->stats().at(fn).compilations, 1) << file << " " << fn;
        EXPECT_EQ(m->stats().at(fn).cache_hits, int(batches.size()) - 1) << file << " " << fn;
    }
}

TEST(Language, ANewStaticExtentCompilesOnceMore) {
    auto m = Module::compile("fn sq(x: f32[B, ~N, C]) -> f32[B, ~N, C] { return x * x + x }");
    for (std::int64_t c : {4, 8, 4, 8, 4}) m->call("sq", {singles(DType::f32, {3, 0, 2}, c)});
    EXPECT_EQ(m->stats().at("sq").compilations, 2);
    EXPECT_EQ(m->stats().at("sq").cache_hits, 3);
}

// Every example's loss: the derived gradient (IR autodiff) agrees with float64 central
// differences of the same program, run in float64.
void check_example_gradient(const char* file, const char* fn,
                            const std::vector<std::int64_t>& lengths) {
    auto m = example(file);
    Diagnostics diags(*m->program().units[0].src);
    auto lowered = frontend::lower(m->program(), fn, std::nullopt, diags);
    ASSERT_TRUE(lowered) << diags.str();
    ir::Function f = with_dtype(lowered->fn, DType::f32, DType::f64);
    std::vector<RaggedTensor> inputs;
    std::vector<int> wrt;
    for (std::size_t k = 0; k < f.inputs.size(); ++k) {
        const Schema& s = f.type(f.inputs[k]);
        inputs.push_back(
            random_for(s, lengths, s.shape.batched ? -1.0 : -0.3, s.shape.batched ? 1.0 : 0.3));
        if (is_floating(s.dtype)) wrt.push_back(int(k));
    }
    check_program_gradient(f, inputs, wrt, 2e-5, 6);
}

TEST(Language, ExampleGradientsMatchFiniteDifferences) {
    check_example_gradient("single_pair_single.rag", "loss", {2, 0, 3});
    check_example_gradient("single_pair_single.rag", "loss_rect", {2, 1, 3});
    check_example_gradient("single_pair_single.rag", "loss_nonleading", {1, 3});
    check_example_gradient("encoder.rag", "loss", {3, 1, 4});
}

} // namespace
} // namespace rag
