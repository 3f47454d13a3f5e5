// The CPU tier's compiled paths beyond elementwise chains and GEMMs: norms and their gradients
// as row loops, global reductions and sum_to as segmented loops, shape ops as views or row
// copies, and pair-creating broadcasts read through index maps. Each one is checked against
// the reference interpreter (f32 relative l2 <= 1e-5) on ragged lengths that include 0 and 1,
// in the square, rectangular and non-leading pair layouts.
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "jit/cpu_jit.hpp"
#include "jit/segmented.hpp"
#include "runtime/parallel.hpp"
#include "tests/jit/tiers.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <limits>
#include <sstream>

namespace rag {
namespace {

using namespace rag::testing;

Schema ragged(DType t, std::string_view axes) {
    return {t, Shape{true, parse_axes(axes)}};
}

Schema dense(DType t, std::string_view axes) {
    return {t, Shape{false, parse_axes(axes)}};
}

// The first word of every line of the plan printout: the step kinds, in order.
std::string kinds(const ir::Function& f) {
    std::istringstream in(jit::print(jit::compile_cpu(f)->plan(), f));
    std::string line, out;
    while (std::getline(in, line)) out += (out.empty() ? "" : " ") + line.substr(0, line.find(' '));
    return out;
}

// Random inputs for every input of f: batched values get the sample lengths (the second
// ragged name runs them backwards), unbatched ones are small.
std::vector<RaggedTensor> inputs_for(const ir::Function& f,
                                     const std::vector<std::int64_t>& lengths) {
    std::vector<RaggedTensor> in;
    for (int v : f.inputs) in.push_back(random_for(f.type(v), lengths, 0.1, 1.5));
    return in;
}

const std::vector<std::int64_t> with_0_and_1 = {3, 0, 5, 1};

TEST(CompiledOps, NormsAndAllTheirGradientsAreRowLoops) {
    for (DType t : {DType::f32, DType::f64})
        for (const char* axes : {"~N, 8", "~N, ~M, 6", "4, ~N, 5", "5", "~N, 384"}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " " + axes);
            const Schema xs = ragged(t, axes);
            const std::string C = std::to_string(xs.shape.axes.back().extent);
            ir::Function ln;
            ln.name = "layernorm";
            ir::Builder b(ln);
            int x = b.input(xs, "x"), g = b.input(dense(t, C), "g"), bb = b.input(dense(t, C), "b");
            int dy = b.input(xs, "dy");
            ln.outputs = {b.op("layernorm", {x, g, bb})};
            for (std::int64_t k = 0; k < 3; ++k)
                ln.outputs.push_back(
                    b.op("layernorm_grad", {x, g, bb, dy}, {{"eps", 1e-5}, {"wrt", k}}));
            // One pass computes the three cotangents.
            EXPECT_EQ(jit::print(jit::compile_cpu(ln)->plan(), ln),
                      "rowwise   %4 = layernorm\nrowwise   %5 %6 %7 = layernorm_grad\n");
            expect_tiers_agree(ln, inputs_for(ln, with_0_and_1));

            ir::Function rms;
            rms.name = "rmsnorm";
            ir::Builder r(rms);
            x = r.input(xs, "x"), g = r.input(dense(t, C), "g"), dy = r.input(xs, "dy");
            rms.outputs = {r.op("rmsnorm", {x, g}, {{"eps", 1e-3}})};
            for (std::int64_t k = 0; k < 2; ++k)
                rms.outputs.push_back(
                    r.op("rmsnorm_grad", {x, g, dy}, {{"eps", 1e-3}, {"wrt", k}}));
            EXPECT_EQ(kinds(rms), "rowwise rowwise");
            expect_tiers_agree(rms, inputs_for(rms, with_0_and_1));
        }
}

TEST(CompiledOps, ParameterGradientsAloneSkipTheInputGradient) {
    ir::Function f;
    f.name = "dg_db";
    ir::Builder b(f);
    const Schema xs = ragged(DType::f32, "~N, ~M, 16");
    int x = b.input(xs, "x"), g = b.input(dense(DType::f32, "16"), "g");
    int bb = b.input(dense(DType::f32, "16"), "b"), dy = b.input(xs, "dy");
    f.outputs = {b.op("layernorm_grad", {x, g, bb, dy}, {{"wrt", std::int64_t(2)}}),
                 b.op("layernorm_grad", {x, g, bb, dy}, {{"wrt", std::int64_t(1)}})};
    EXPECT_EQ(kinds(f), "rowwise");
    expect_tiers_agree(f, inputs_for(f, {40, 0, 1, 77}));
}

// dg and db sum over every row in fixed blocks, added in block order: the same bits on any
// number of threads.
TEST(CompiledOps, NormGradientsDoNotDependOnTheThreadCount) {
    ir::Function f;
    f.name = "ln_grad";
    ir::Builder b(f);
    const Schema xs = ragged(DType::f32, "~N, ~N, 32");
    int x = b.input(xs, "x"), g = b.input(dense(DType::f32, "32"), "g");
    int bb = b.input(dense(DType::f32, "32"), "b"), dy = b.input(xs, "dy");
    for (std::int64_t k = 0; k < 3; ++k)
        f.outputs.push_back(b.op("layernorm_grad", {x, g, bb, dy}, {{"wrt", k}}));
    auto in = inputs_for(f, {60, 0, 1, 45, 30});
    auto cpu = jit::compile_cpu(f);
    set_num_threads(1);
    auto one = cpu->run(in);
    set_num_threads(3);
    auto three = cpu->run(in);
    set_num_threads(0);
    for (std::size_t k = 0; k < one.size(); ++k) EXPECT_EQ(one[k].to_f64(), three[k].to_f64());
}

TEST(CompiledOps, GlobalReductionsAndTheirGradientsAreSegmented) {
    for (DType t : {DType::f32, DType::f64})
        for (const char* axes : {"~N, ~N, 7", "~N, ~M, 3", "5, ~N, ~N", "~N"})
            for (const char* op : {"sum", "mean"}) {
                SCOPED_TRACE(std::string(op) + " " + std::string(dtype_name(t)) + " " + axes);
                ir::Function f;
                f.name = op;
                ir::Builder b(f);
                int x = b.input(ragged(t, axes), "x");
                int y = b.op(op, {x});
                int g = b.input(f.type(y), "g");
                f.outputs = {y, b.op("reduce_grad", {x, y, g}, {{"kind", std::string(op)}})};
                EXPECT_EQ(kinds(f), "segmented segmented");
                for (auto lengths : {with_0_and_1, std::vector<std::int64_t>{0, 0},
                                     std::vector<std::int64_t>{}, std::vector<std::int64_t>{300}})
                    expect_tiers_agree(f, inputs_for(f, lengths));
            }
}

// An unbatched tensor (a parameter's clip_norm) is summed as rows of its last axis, in blocks
// of rows spread over threads: the same value as the interpreter, bitwise at any thread count.
TEST(CompiledOps, UnbatchedGlobalSumsAreBlockedAndDoNotDependOnTheThreadCount) {
    for (DType t : {DType::f32, DType::f64})
        for (const char* axes : {"3000, 37", "2, 3, 1", "5, 0", "40", "1, 1"}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " " + axes);
            ir::Function f;
            f.name = "sum";
            ir::Builder b(f);
            int x = b.input(dense(t, axes), "x");
            f.outputs = {b.op("sum", {x}), b.op("mean", {x})};
            EXPECT_EQ(kinds(f), "segmented segmented");
            auto in = inputs_for(f, {});
            expect_tiers_agree(f, in);
            auto cpu = jit::compile_cpu(f);
            set_num_threads(1);
            auto one = cpu->run(in);
            set_num_threads(3);
            auto three = cpu->run(in);
            set_num_threads(0);
            for (std::size_t k = 0; k < one.size(); ++k)
                EXPECT_EQ(one[k].to_f64(), three[k].to_f64());
        }
}

// g and a `like` whose extents are g's except along its broadcast (extent-1) axes.
std::vector<RaggedTensor> sum_to_inputs(const ir::Function& f,
                                        const std::vector<std::int64_t>& lengths) {
    const Schema& ls = f.type(f.inputs[1]);
    RaggedTensor g = random_for(f.type(f.inputs[0]), lengths);
    if (!ls.shape.batched) return {g, random_for(ls, {})};
    std::vector<Shape_> shapes;
    for (std::int64_t i = 0; i < g.batch(); ++i) {
        auto s = g.structure().sample_shape(i);
        shapes.emplace_back(s.begin(), s.end());
        for (std::size_t a = 0; a < ls.shape.axes.size(); ++a)
            if (ls.shape.axes[a] == Axis::fixed_of(1)) shapes.back()[a] = 1;
    }
    std::string axes;
    for (const Axis& a : ls.shape.axes)
        axes +=
            (axes.empty() ? "" : ", ") + (a.is_ragged() ? "~" + a.name : std::to_string(a.extent));
    return {g, random_batch(ls.dtype, axes, shapes)};
}

// sum_to is the gradient of a broadcast: over the pair axis a single was broadcast along
// (square, rectangular, non-leading), or over every row for an unbatched bias.
TEST(CompiledOps, SumToOverOneAxisOrAllRowsIsSegmented) {
    const std::pair<const char*, Schema> cases[] = {
        {"~N, ~N, 4", ragged(DType::f32, "~N, 1, 4")},
        {"~N, ~N, 4", ragged(DType::f32, "1, ~N, 4")},
        {"~N, ~M, 4", ragged(DType::f32, "~N, 1, 4")},
        {"~N, ~M, 4", ragged(DType::f32, "1, ~M, 4")},
        {"4, ~N, ~N", ragged(DType::f32, "4, ~N, 1")},
        {"4, ~N, ~N", ragged(DType::f32, "4, 1, ~N")},
        {"~N, ~N, 4", dense(DType::f32, "4")},
        {"~N, 6, 4", dense(DType::f32, "1, 6, 4")},
        {"~N, 4", dense(DType::f32, "")},
    };
    for (const auto& [g_axes, like] : cases) {
        SCOPED_TRACE(std::string(g_axes) + " to " + like.str());
        ir::Function f;
        f.name = "sum_to";
        ir::Builder b(f);
        int g = b.input(ragged(DType::f32, g_axes), "g");
        f.outputs = {b.op("sum_to", {g, b.input(like, "like")})};
        EXPECT_EQ(kinds(f), "segmented");
        for (auto lengths : {with_0_and_1, std::vector<std::int64_t>{700, 2}})
            expect_tiers_agree(f, sum_to_inputs(f, lengths));
    }
    // An unbatched g (a relation table's gradient rows summed to its bias): row-major, so
    // its rows are summed the same way.
    for (const char* like : {"4, 16", "1, 4, 16", ""}) {
        SCOPED_TRACE(std::string("7, 4, 16 to ") + like);
        ir::Function f;
        f.name = "sum_to";
        ir::Builder b(f);
        int g = b.input(dense(DType::f32, "7, 4, 16"), "g");
        f.outputs = {b.op("sum_to", {g, b.input(dense(DType::f32, like), "like")})};
        EXPECT_EQ(kinds(f), "segmented");
        expect_tiers_agree(f, sum_to_inputs(f, with_0_and_1));
    }
    // Two broadcast axes: the reference kernel, with the same results.
    ir::Function f;
    f.name = "sum_to";
    ir::Builder b(f);
    int g = b.input(ragged(DType::f32, "~N, ~N, 4"), "g");
    f.outputs = {b.op("sum_to", {g, b.input(ragged(DType::f32, "1, 1, 4"), "like")})};
    EXPECT_EQ(kinds(f), "reference");
    expect_tiers_agree(f, sum_to_inputs(f, with_0_and_1));
}

TEST(CompiledOps, ShapeOpsAreViewsOrRowCopies) {
    struct Case {
        const char* axes;
        const char* op;
        Attrs at;
        const char* kind;
    };
    const Case cases[] = {
        {"~N, 8", "index", {{"spec", std::string(":, :, new, :")}}, "view"},
        {"~N, 8", "index", {{"spec", std::string(":, new")}}, "view"},
        {"~N, 8", "index", {{"spec", std::string(":, :, 2:5")}}, "reference"},
        {"~N, 8", "transpose", {{"a", std::int64_t(1)}, {"b", std::int64_t(2)}}, "view"},
        {"8, ~N, ~N", "transpose", {{"a", std::int64_t(1)}, {"b", std::int64_t(3)}}, "permute"},
        {"~N, ~M, 8", "transpose", {{"a", std::int64_t(1)}, {"b", std::int64_t(2)}}, "permute"},
        {"~N, 3, 8", "transpose", {{"a", std::int64_t(2)}, {"b", std::int64_t(3)}}, "permute"},
    };
    for (DType t : {DType::f32, DType::f64})
        for (const Case& c : cases) {
            SCOPED_TRACE(std::string(c.op) + " " + c.at.str() + " of " + c.axes);
            ir::Function f;
            f.name = c.op;
            ir::Builder b(f);
            int x = b.input(ragged(t, c.axes), "x");
            int y = b.op(c.op, {x}, c.at);
            f.outputs = {y};
            if (std::string(c.op) == "index")
                f.outputs.push_back(b.op("index_grad", {b.input(f.type(y), "g"), x}, c.at));
            const std::string k = kinds(f);
            EXPECT_EQ(k.substr(0, k.find(' ')), c.kind);
            for (auto lengths : {with_0_and_1, std::vector<std::int64_t>{1, 9}})
                expect_tiers_agree(f, inputs_for(f, lengths));
        }
    // A view shares its operand's storage.
    ir::Function f;
    f.name = "view";
    ir::Builder b(f);
    f.outputs = {b.op("transpose", {b.input(ragged(DType::f32, "~N, 8"), "x")},
                      {{"a", std::int64_t(1)}, {"b", std::int64_t(2)}})};
    auto x = random_for(f.type(0), with_0_and_1);
    EXPECT_EQ(jit::compile_cpu(f)->run({x})[0].data(), x.data());
}

// `a[:, :, new] + b[:, new, :]` and friends: one fused loop over the pair rows reading both
// singles through row maps; nothing of the broadcast operands is materialised.
TEST(CompiledOps, PairCreatingBroadcastsReadTheirOperandsThroughIndexMaps) {
    struct Case {
        const char *a_axes, *b_axes, *a_spec, *b_spec;
    };
    const Case cases[] = {
        {"~N, 16", "~N, 16", ":, :, new, :", ":, new, :, :"}, // square
        {"~N, 16", "~M, 16", ":, :, new, :", ":, new, :, :"}, // rectangular
        {"16, ~N", "16, ~N", ":, :, :, new", ":, :, new, :"}, // non-leading
        {"~N, 16", "~N, 1", ":, :, new, :", ":, new, :, :"},  // one element per row
    };
    for (DType t : {DType::f32, DType::f64})
        for (const Case& c : cases) {
            SCOPED_TRACE(std::string(c.a_axes) + " + " + c.b_axes);
            ir::Function f;
            f.name = "pair";
            ir::Builder b(f);
            int x = b.input(ragged(t, c.a_axes), "a");
            int y = b.input(ragged(t, c.b_axes), "b");
            int xa = b.op("index", {x}, {{"spec", std::string(c.a_spec)}});
            int yb = b.op("index", {y}, {{"spec", std::string(c.b_spec)}});
            int pair = b.op("mul", {b.op("add", {xa, yb}), yb});
            f.outputs = {b.op("exp", {pair})};
            auto cpu = jit::compile_cpu(f);
            const std::string plan = jit::print(cpu->plan(), f);
            EXPECT_NE(plan.find("fused     add mul exp  in: %2(gather) %3(gather"),
                      std::string::npos)
                << plan;
            if (std::string(c.b_axes) != "~N, 1" && t == DType::f32) {
                EXPECT_NE(cpu->llvm_ir().find("x float>"), std::string::npos);
            }
            for (auto lengths : {with_0_and_1, std::vector<std::int64_t>{0},
                                 std::vector<std::int64_t>{1, 1}, std::vector<std::int64_t>{40, 7}})
                expect_tiers_agree(f, inputs_for(f, lengths));
        }
}

// Packed attention and its three cotangents (one pass): self and cross attention, causal or
// not, with empty and one-row samples.
TEST(CompiledOps, AttentionAndItsGradientsArePerSampleGemms) {
    for (DType t : {DType::f32, DType::f64})
        for (const char* kv : {"~N", "~M"})
            for (bool causal : {false, true}) {
                SCOPED_TRACE(std::string(dtype_name(t)) + " keys " + kv +
                             (causal ? " causal" : ""));
                ir::Function f;
                f.name = "attention";
                ir::Builder b(f);
                int q = b.input(ragged(t, "~N, 3, 8"), "q");
                int k = b.input(ragged(t, std::string(kv) + ", 3, 8"), "k");
                int v = b.input(ragged(t, std::string(kv) + ", 3, 5"), "v");
                Attrs at{{"causal", causal}};
                int o = b.op("attention", {q, k, v}, at);
                int g = b.input(f.type(o), "g");
                f.outputs = {o};
                for (std::int64_t w = 0; w < 3; ++w) {
                    Attrs a = at;
                    f.outputs.push_back(b.op("attention_grad", {q, k, v, g}, a.set("wrt", w)));
                }
                EXPECT_EQ(jit::print(jit::compile_cpu(f)->plan(), f),
                          "attention %3 = attention\nattention %5 %6 %7 = attention_grad\n");
                for (auto lengths : {with_0_and_1, std::vector<std::int64_t>{40, 17, 1}})
                    expect_tiers_agree(f, inputs_for(f, lengths));
            }
}

// Random values with t's structure (a cotangent for a value the function computes).
RaggedTensor like(const RaggedTensor& t, double lo = -1.0, double hi = 1.0) {
    std::vector<double> v(static_cast<std::size_t>(t.numel()));
    for (double& e : v) e = uniform(lo, hi);
    return RaggedTensor::from_f64(t.dtype(), t.structure_ptr(), v);
}

// max, min, softmax and logsumexp over one axis (ragged, static, or a whole sample or every
// stored entry for max and min; also an unbatched array's axis, as the padded baseline runs them)
// and the gradient ops autodiff emits for them run as segmented line loops, agreeing with the
// interpreter on lengths with 0, 1, all-equal and long lines (more than a vector of lanes, plus a
// tail); max/min also on inputs full of ties (the gradient goes to the first).
TEST(CompiledOps, MaxMinSoftmaxLogsumexpAndTheirGradientsAreSegmented) {
    struct Layout {
        bool batched;
        const char* axes;
        std::vector<std::int64_t> over;
    };
    const std::int64_t global = 99; // no axis=: max/min over every stored entry
    const Layout layouts[] = {{true, "~N", {1, 0, global}},
                              {true, "~N, 4", {1, 2, -1, global}},
                              {true, "~N, ~N, 3", {1, 2, 3, 0}},
                              {true, "~N, ~M, 2", {1, 2}},
                              {true, "3, ~H, ~W", {0, 1, 2, 3, global}},
                              {true, "5", {1}},
                              {false, "6, 19", {0, 1, -1, global}},
                              {false, "4, 0", {0, 1, global}}};
    const std::vector<std::vector<std::int64_t>> batches = {
        {3, 0, 5, 1, 19}, {4, 4, 4}, {1}, {0, 0}};
    for (DType t : {DType::f32, DType::f64})
        for (const auto& [batched, axes, over] : layouts)
            for (std::int64_t axis : over)
                for (const char* op : {"max", "min", "softmax", "logsumexp"}) {
                    const bool extreme = op[0] == 'm';
                    if (!extreme && ((batched && axis == 0) || axis == global))
                        continue; // softmax over the batch axis or globally: an error
                    const Schema xt = batched ? ragged(t, axes) : dense(t, axes);
                    SCOPED_TRACE(std::string(dtype_name(t)) + " " + op + " over axis " +
                                 std::to_string(axis) + " of " + axes);
                    ir::Function f;
                    f.name = op;
                    ir::Builder b(f);
                    const int x = b.input(xt, "x");
                    Attrs at = axis == global ? Attrs{} : Attrs{{"axis", axis}};
                    const int y = b.op(op, {x}, at);
                    const std::string sop = op;
                    const int g = b.input(sop == "softmax" ? f.type(x) : f.type(y), "g");
                    int dx;
                    if (extreme) {
                        Attrs gat = at;
                        dx = b.op("reduce_grad", {x, y, g}, gat.set("kind", sop));
                    } else if (sop == "softmax") {
                        dx = b.op("softmax_grad", {y, g}, at);
                    } else {
                        dx = b.op("logsumexp_grad", {x, y, g}, at);
                    }
                    f.outputs = {y, dx};
                    EXPECT_EQ(kinds(f), "segmented segmented");
                    ir::Function fwd = f;
                    fwd.outputs = {y};
                    fwd.inputs = {x};
                    fwd = ir::eliminate_dead_code(fwd);
                    for (const auto& lengths : batches)
                        for (bool ties : {false, true}) {
                            if (ties && !extreme) continue;
                            RaggedTensor xs = random_for(xt, lengths);
                            if (ties) { // values in {-1, -0.5, 0, 0.5, 1}: many equal maxima
                                auto v = xs.to_f64();
                                for (double& e : v) e = std::round(2 * e) / 2;
                                xs = RaggedTensor::from_f64(t, xs.structure_ptr(), v);
                            }
                            const RaggedTensor ys = ir::interpret(fwd, {xs})[0];
                            expect_tiers_agree(f, {xs, like(sop == "softmax" ? xs : ys)},
                                               t == DType::f32 ? 1e-5 : 1e-12);
                        }
                }
}

// Each line is reduced by one thread, so the bits do not depend on the thread count, also when
// long samples are cut into pieces spread over threads.
TEST(CompiledOps, LineReductionsDoNotDependOnTheThreadCount) {
    for (const char* axes : {"~N, ~N", "~N, ~N, 8"}) {
        SCOPED_TRACE(axes);
        ir::Function f;
        f.name = "softmax_max";
        ir::Builder b(f);
        const int x = b.input(ragged(DType::f32, axes), "x");
        const int dy = b.input(ragged(DType::f32, axes), "dy");
        const int y = b.op("softmax", {x}, {{"axis", std::int64_t(2)}});
        f.outputs = {y, b.op("softmax_grad", {y, dy}, {{"axis", std::int64_t(2)}}),
                     b.op("logsumexp", {x}, {{"axis", std::int64_t(1)}}),
                     b.op("max", {x}, {{"axis", std::int64_t(1)}})};
        auto in = inputs_for(f, {300, 0, 1, 45, 200});
        auto cpu = jit::compile_cpu(f);
        set_num_threads(1);
        auto one = cpu->run(in);
        set_num_threads(3);
        auto three = cpu->run(in);
        set_num_threads(0);
        for (std::size_t k = 0; k < one.size(); ++k) EXPECT_EQ(one[k].to_f64(), three[k].to_f64());
        expect_tiers_agree(f, in);
    }
}

// Global max/min over more entries than one block (blocks reduced in parallel, then combined):
// ties (the gradient goes to the first), and a NaN in a later block.
TEST(CompiledOps, GlobalMaxMinCombineBlocks) {
    for (DType t : {DType::f32, DType::f64})
        for (const char* op : {"max", "min"})
            for (bool nan : {false, true}) {
                SCOPED_TRACE(std::string(dtype_name(t)) + " " + op + (nan ? " with NaN" : ""));
                ir::Function f;
                f.name = op;
                ir::Builder b(f);
                const int x = b.input(ragged(t, "~N, 64"), "x");
                const int y = b.op(op, {x});
                const int g = b.input(f.type(y), "g");
                f.outputs = {y, b.op("reduce_grad", {x, y, g}, {{"kind", std::string(op)}})};
                EXPECT_EQ(kinds(f), "segmented segmented");
                RaggedTensor xs = random_for(ragged(t, "~N, 64"), {300, 0, 200});
                auto v = xs.to_f64();
                for (double& e : v) e = std::round(4 * e) / 4; // ties
                if (nan) v[v.size() - 100] = v[v.size() - 7] = std::nan("");
                xs = RaggedTensor::from_f64(t, xs.structure_ptr(), v);
                const RaggedTensor gs =
                    RaggedTensor::from_f64(t, Structure::make(Shape{false, {}}, 1, {}), {0.75});
                auto want = ir::interpret(f, {xs, gs});
                auto got = jit::compile_cpu(f)->run({xs, gs});
                EXPECT_EQ(std::isnan(got[0].item()), nan);
                if (!nan) {
                    EXPECT_EQ(got[0].item(), want[0].item());
                }
                EXPECT_EQ(got[1].to_f64(), want[1].to_f64());
            }
}

// The line kernels' inner loops are vectorised: explicit lanes for max/min, the loop vectoriser
// (with libmvec's SIMD exp and log, as the fused loops) for the others.
TEST(CompiledOps, LineKernelsAreVectorised) {
    for (const char* op :
         {"max", "min", "softmax", "logsumexp", "softmax_grad", "logsumexp_grad", "extreme_grad"}) {
        const std::string ir = jit::line_kernel_ir(op, DType::f32);
        ASSERT_FALSE(ir.empty()) << op;
        // 8 lanes (AVX2), or 16 should the host pipeline prefer 512-bit vectors.
        EXPECT_TRUE(ir.find("<8 x float>") != std::string::npos ||
                    ir.find("<16 x float>") != std::string::npos)
            << op << "\n"
            << ir;
        const std::string sop = op;
        if (sop == "softmax" || sop == "logsumexp" || sop == "logsumexp_grad") {
            EXPECT_TRUE(ir.find("@_ZGVdN8v_expf") != std::string::npos ||
                        ir.find("@_ZGVeN16v_expf") != std::string::npos)
                << op << "\n"
                << ir;
        }
        const std::string ir64 = jit::line_kernel_ir(op, DType::f64);
        EXPECT_TRUE(ir64.find("<4 x double>") != std::string::npos ||
                    ir64.find("<8 x double>") != std::string::npos)
            << op;
    }
}

// NaN propagates through max and min, an empty max is -inf and an empty logsumexp -inf, as in
// the reference kernels; the gradients of a NaN maximum go to the first NaN.
TEST(CompiledOps, LineReductionsKeepTheReferenceNaNAndEmptyRules) {
    for (DType t : {DType::f32, DType::f64})
        for (const char* op : {"max", "min", "logsumexp"}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " " + op);
            ir::Function f;
            f.name = op;
            ir::Builder b(f);
            const int x = b.input(ragged(t, "~N, 2"), "x");
            Attrs at{{"axis", std::int64_t(1)}};
            const int y = b.op(op, {x}, at);
            const int g = b.input(f.type(y), "g");
            Attrs gat = at;
            const std::string sop = op;
            f.outputs = {y, sop == "logsumexp"
                                ? b.op("logsumexp_grad", {x, y, g}, at)
                                : b.op("reduce_grad", {x, y, g}, gat.set("kind", sop))};
            // Sample 0: 11 rows with NaN in column 0 at rows 3 and 9 (and +inf at row 5 of
            // column 1); sample 1 is empty; sample 2 one row.
            RaggedTensor xs = random_batch(t, "~N, 2", {{11, 2}, {0, 2}, {1, 2}});
            auto v = xs.to_f64();
            v[3 * 2] = v[9 * 2] = std::nan("");
            v[5 * 2 + 1] = std::numeric_limits<double>::infinity();
            xs = RaggedTensor::from_f64(t, xs.structure_ptr(), v);
            ir::Function fwd = f;
            fwd.outputs = {y};
            fwd.inputs = {x};
            const RaggedTensor ys = ir::interpret(ir::eliminate_dead_code(fwd), {xs})[0];
            const std::vector<RaggedTensor> in = {xs, like(ys)};
            auto want = ir::interpret(f, in);
            auto got = jit::compile_cpu(f)->run(in);
            ASSERT_EQ(got.size(), 2u);
            for (std::size_t k = 0; k < 2; ++k) {
                auto a = got[k].to_f64(), w = want[k].to_f64();
                ASSERT_EQ(a.size(), w.size());
                for (std::size_t e = 0; e < a.size(); ++e)
                    if (a[e] == w[e]) // infinities included
                        continue;
                    else if (std::isnan(w[e]))
                        EXPECT_TRUE(std::isnan(a[e])) << "output " << k << " element " << e;
                    else
                        EXPECT_NEAR(a[e], w[e], 1e-6 * (1 + std::abs(w[e])))
                            << "output " << k << " element " << e;
            }
        }
}

// A train_step derived by the language: softmax, logsumexp, max and min over a ragged axis (the
// (r, j) plane loops) and over the static last axis (the register line loops), and the gradient
// ops autodiff emits for them, all run compiled, agree with the interpreter and compile once
// across length vectors with 0, 1 and all-equal lengths.
TEST(CompiledOps, DerivedTrainStepWithSoftmaxMaxMinLogsumexpRunsCompiledOnce) {
    const char* src = R"(
        fn loss(x: f32[B, ~N, 8], w: f32[8, 8]) -> f32[] {
            let s = x @ w
            return sum(softmax(s, axis=1) * x) + sum(softmax(s, axis=2) * s)
                + sum(logsumexp(s, axis=1)) + sum(logsumexp(s * x, axis=2))
                + sum(max(s, axis=1)) - sum(min(s, axis=2)) + sum(max(s, axis=0))
        }
        fn train_step(x: f32[B, ~N, 8], w: f32[8, 8]) -> (f32[], f32[8, 8]) {
            let (l, g) = value_and_grad(loss, wrt=w)(x, w)
            return (l, g)
        })";
    auto m = Module::compile(src);
    Diagnostics diags(*m->program().units[0].src);
    auto lowered = frontend::lower(m->program(), "train_step", std::nullopt, diags);
    ASSERT_TRUE(lowered) << diags.str();
    const ir::Function& f = lowered->fn;
    const jit::Plan plan = jit::compile_cpu(f)->plan();
    int lines = 0;
    for (const jit::Step& st : plan.steps) {
        if (st.kind == jit::Step::Kind::fused) continue;
        const ir::Node& n = f.nodes[std::size_t(st.index)];
        const bool line_op = n.op == "softmax" || n.op == "softmax_grad" || n.op == "logsumexp" ||
                             n.op == "logsumexp_grad" || n.op == "max" || n.op == "min" ||
                             (n.op == "reduce_grad" && (n.attrs.get_str("kind") == "max" ||
                                                        n.attrs.get_str("kind") == "min"));
        if (!line_op) continue;
        ++lines;
        EXPECT_EQ(st.kind, jit::Step::Kind::segmented) << "%" << st.index << " = " << n.op;
    }
    EXPECT_EQ(lines, 14); // 7 forward ops and their 7 gradients
    const std::vector<std::vector<std::int64_t>> batches = {
        {5, 17, 9}, {4, 4, 4}, {0, 3, 1}, {1}, {2, 2}, {7, 0, 0, 2}, {3, 1, 4, 1}, {6, 40}};
    const RaggedTensor w = random_for(dense(DType::f32, "8, 8"), {});
    for (const auto& lengths : batches) {
        const RaggedTensor x = random_for(ragged(DType::f32, "~N, 8"), lengths);
        expect_tiers_agree(f, {x, w});
        m->call("train_step", {x, w});
    }
    EXPECT_EQ(m->stats().at("train_step").compilations, 1);
    EXPECT_EQ(m->stats().at("train_step").cache_hits, int(batches.size()) - 1);
}

// Operands whose runtime extents disagree get the reference kernel's error naming the sample.
TEST(CompiledOps, BroadcastExtentMismatchNamesTheSample) {
    ir::Function f;
    f.name = "pair";
    ir::Builder b(f);
    Schema s = ragged(DType::f32, "~N, 1, 4");
    f.outputs = {b.op("add", {b.input(s, "a"), b.input(ragged(DType::f32, "~N, ~N, 4"), "b")})};
    auto a = random_batch(DType::f32, "~N, 1, 4", {{2, 1, 4}, {3, 1, 4}});
    auto p = random_batch(DType::f32, "~N, ~N, 4", {{2, 2, 4}, {4, 4, 4}});
    auto msg = error_of([&] { jit::compile_cpu(f)->run({a, p}); });
    EXPECT_NE(msg.find("sample 1"), std::string::npos) << msg;
}

} // namespace
} // namespace rag
