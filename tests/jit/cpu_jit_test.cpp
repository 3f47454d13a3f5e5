// The CPU tier: plans, vectorised LLVM loops, BLAS GEMMs, and agreement with the reference
// interpreter (f32 relative l2 <= 1e-5) on every op it fuses and on every example program.
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "ir/interpreter.hpp"
#include "jit/blas.hpp"
#include "jit/cpu_jit.hpp"
#include "runtime/memory.hpp"
#include "tests/jit/tiers.hpp"
#include "tests/support/testing.hpp"

#include <cmath>
#include <filesystem>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;
const fs::path root = RAG_SOURCE_DIR;

Schema ragged(DType t, std::string_view axes) {
    return {t, Shape{true, parse_axes(axes)}};
}

// OpenBLAS's generic kernels are several times slower; rag must not run them on a CPU that
// has AVX2 (jit/blas.cpp chooses a kernel set where OpenBLAS's detection does not know the CPU).
TEST(Blas, RunsKernelsForThisCpuNotGenericOnes) {
    const std::string core = jit::blas_core();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        GTEST_SKIP() << "no AVX2: OpenBLAS's " << core << " kernels are what this CPU runs";
    for (const char* generic :
         {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge"})
        EXPECT_NE(core, generic) << "OpenBLAS runs its generic " << core << " kernels";
}

// A GEMM is split over rag's threads into single-threaded BLAS calls, each of which packs the
// other operand's whole panel: 32-row calls (the old split) ran a 2048^3 GEMM at half the rate.
// Blocks are multiples of 32, at least 128 long unless that would leave one block, and a
// long dimension gives about 8 of them.
TEST(Blas, SplitBlocksAmortisePackingAndStillGiveTwoThreadsWork) {
    for (std::int64_t len : {1, 31, 64, 100, 128, 256, 300, 512, 1000, 2048, 8300, 100000}) {
        const std::int64_t rows = jit::gemm_block_rows(len);
        const std::int64_t blocks = (len + rows - 1) / rows;
        EXPECT_EQ(rows % 32, 0) << len;
        if (len >= 64) {
            EXPECT_GE(blocks, 2) << len;
        }
        if (len >= 256) {
            EXPECT_GE(rows, 128) << len;
        }
        EXPECT_LE(blocks, 9) << len;
    }
    EXPECT_EQ(jit::gemm_block_rows(2048), 256);
}

TEST(CpuJit, EveryFusedOpAgreesWithTheInterpreter) {
    const char* unary[] = {"neg",  "exp",     "log",  "sqrt", "rsqrt", "abs",
                           "tanh", "sigmoid", "relu", "gelu", "silu"};
    const char* binary[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};
    for (DType t : {DType::f32, DType::f64}) {
        auto shapes = shapes_for("~N, ~N, 5", {{0}, {1}, {7}, {3}});
        auto x = random_batch(t, "~N, ~N, 5", shapes, 0.1, 2.0);
        auto y = random_batch(t, "~N, ~N, 5", shapes, 0.1, 2.0);
        auto row = random_dense(t, {5}, 0.1, 2.0);
        auto scalar = random_dense(t, {}, 0.1, 2.0);
        for (const char* op : unary) {
            ir::Function f;
            f.name = op;
            ir::Builder b(f);
            f.outputs = {b.op(op, {b.input(x.schema(), "x")})};
            expect_tiers_agree(f, {x});
            // Its derivative, as autodiff emits it: unary_grad(x, op(x), g) in the same loop.
            ir::Function df;
            df.name = std::string(op) + "_grad";
            ir::Builder db(df);
            int dx = db.input(x.schema(), "x");
            int dy = db.op(op, {dx});
            df.outputs = {db.op("unary_grad", {dx, dy, db.input(y.schema(), "g")}, {{"fn", op}})};
            EXPECT_EQ(jit::compile_cpu(df)->plan().groups.size(), 1u) << op;
            expect_tiers_agree(df, {x, y});
        }
        for (const char* op : binary)
            for (const RaggedTensor* other : {&y, &row, &scalar}) {
                ir::Function f;
                f.name = op;
                ir::Builder b(f);
                f.outputs = {b.op(op, {b.input(x.schema(), "x"), b.input(other->schema(), "y")})};
                expect_tiers_agree(f, {x, *other});
            }
    }
}

TEST(CpuJit, ChainsFuseIntoOneVectorisedLoop) {
    ir::Function f;
    f.name = "chain";
    ir::Builder b(f);
    Schema s = ragged(DType::f32, "~N, 64");
    int x = b.input(s, "x");
    int y = b.input(s, "y");
    int h = b.op("relu", {b.op("add", {x, y})});
    f.outputs = {b.op("maximum", {b.op("scale", {h}, {{"c", 0.5}}), b.op("exp", {y})})};
    auto cpu = jit::compile_cpu(f);
    ASSERT_EQ(cpu->plan().groups.size(), 1u);
    EXPECT_EQ(cpu->plan().groups[0].nodes.size(), 5u);
    EXPECT_EQ(jit::print(cpu->plan(), f),
              "fused     add relu scale exp maximum  in: %0 %1  out: %6\n");
    // The loop vectoriser turned the loop into SIMD code over packed rows.
    EXPECT_NE(cpu->llvm_ir().find("x float>"), std::string::npos) << cpu->llvm_ir();
    auto in = random_batch(DType::f32, "~N, 64", shapes_for("~N, 64", {{0}, {1}, {300}, {1200}}));
    expect_tiers_agree(f, {in, random_batch(DType::f32, "~N, 64",
                                            shapes_for("~N, 64", {{0}, {1}, {300}, {1200}}))});
}

TEST(CpuJit, GeluAndTanhLoopsCallSimdMath) {
    // erfc (gelu) and tanh have SIMD variants in glibc's libmvec; the vectoriser must use them,
    // also in row loops (a bias row added first, the MLP's gelu(x @ w1 + b1)).
    for (const char* op : {"gelu", "tanh"})
        for (bool bias : {false, true}) {
            ir::Function f;
            f.name = op;
            ir::Builder b(f);
            int x = b.input(ragged(DType::f32, "~N, 64"), "x");
            if (bias)
                x = b.op("add",
                         {x, b.input(Schema{DType::f32, Shape{false, parse_axes("64")}}, "b")});
            f.outputs = {b.op(op, {x})};
            const std::string ir = jit::compile_cpu(f)->llvm_ir();
            EXPECT_NE(ir.find("call <8 x float> @_ZGVdN8v_"), std::string::npos)
                << op << (bias ? " + bias\n" : "\n") << ir;
        }
}

TEST(CpuJit, PairBroadcastsAreVectorisedRowLoops) {
    // The pair state made from two token arrays: each row of the pair reads one row of a and
    // one of b through the row maps. The maps are read once per row, so the loop over a row's
    // 128 channels is SIMD code.
    auto m = Module::compile("fn pair(a: f32[B, ~N, 128], b: f32[B, ~N, 128]) -> "
                             "f32[B, ~N, ~N, 128] {\n"
                             "    return a[:, :, new, :] + b[:, new, :, :]\n}\n",
                             "pair.rag");
    Diagnostics diags(*m->program().units[0].src);
    auto lowered = frontend::lower(m->program(), "pair", std::nullopt, diags);
    ASSERT_TRUE(lowered) << diags.str();
    auto cpu = jit::compile_cpu(lowered->fn);
    ASSERT_EQ(cpu->plan().groups.size(), 1u) << jit::print(cpu->plan(), lowered->fn);
    EXPECT_NE(cpu->llvm_ir().find("x float>"), std::string::npos) << cpu->llvm_ir();
    auto shapes = shapes_for("~N, 128", {{0}, {1}, {7}, {33}});
    expect_tiers_agree(lowered->fn, {random_batch(DType::f32, "~N, 128", shapes),
                                     random_batch(DType::f32, "~N, 128", shapes)});
}

TEST(CpuJit, MatmulOverPackedRowsIsOneGemm) {
    ir::Function f;
    f.name = "linear";
    ir::Builder b(f);
    int x = b.input(ragged(DType::f32, "~N, ~N, 16"), "x");
    int w = b.input({DType::f32, Shape{false, parse_axes("16, 8")}}, "w");
    f.outputs = {b.op("relu", {b.op("matmul", {x, w})})};
    auto cpu = jit::compile_cpu(f);
    EXPECT_EQ(jit::print(cpu->plan(), f),
              "gemm      %2 = matmul\nfused     relu  in: %2  out: %3\n");
    for (DType t : {DType::f32, DType::f64}) {
        ir::Function g = f;
        for (auto& n : g.nodes) n.type.dtype = t;
        auto xs = random_batch(t, "~N, ~N, 16", shapes_for("~N, ~N, 16", {{0}, {5}, {1}, {9}}));
        expect_tiers_agree(g, {xs, random_dense(t, {16, 8})});
    }
}

TEST(CpuJit, BatchedMatmulsAreGemmsWhateverTheStorageOrder) {
    // a @ b per sample over the last two axes, and the products its gradient takes
    // (g b^T, a^T g, through transposed views). Ragged scores [4, ~N, ~M] keep the static axis
    // innermost in storage, so BLAS writes them through a copy; the padded form is all static.
    struct Case {
        const char *a, *b;
    };
    for (DType t : {DType::f32, DType::f64})
        for (Case c : {Case{"4, ~N, 8", "4, 8, ~N"}, Case{"~N, 3, 5", "~N, 5, 2"},
                       Case{"2, 6, 5", "2, 5, 7"}, Case{"~N, 4", "4, ~N"}}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " [" + c.a + "] @ [" + c.b + "]");
            ir::Function f;
            f.name = "bmm";
            ir::Builder b(f);
            int x = b.input(ragged(t, c.a), "a");
            int y = b.input(ragged(t, c.b), "b");
            int o = b.op("matmul", {x, y});
            int g = b.input(f.type(o), "g");
            auto T = [&](int v) { return b.op("transpose", {v}, {{"a", -1}, {"b", -2}}); };
            f.outputs = {o, b.op("matmul", {g, T(y)}), b.op("matmul", {T(x), g})};
            const std::string plan = jit::print(jit::compile_cpu(f)->plan(), f);
            std::size_t gemms = 0;
            for (std::size_t at = plan.find("gemm"); at != std::string::npos;
                 at = plan.find("gemm", at + 1))
                ++gemms;
            EXPECT_EQ(gemms, 3u) << plan;
            for (auto lengths : {std::vector<std::int64_t>{0, 1, 7, 3}, {12, 12}}) {
                std::vector<RaggedTensor> in;
                for (int v : f.inputs) in.push_back(random_for(f.type(v), lengths, -1.0, 1.0));
                expect_tiers_agree(f, in);
            }
        }
}

TEST(CpuJit, TransposesThatMoveStaticAxesCopyTiles) {
    // Static axes that move inside rows (a weight's transpose, heads and features swapped, a
    // static axis swapped past a ragged one): element copies in tiles, not the reference walk.
    struct Case {
        bool batched;
        const char* axes;
        int a, b;
    };
    for (DType t : {DType::f32, DType::f64, DType::i64})
        for (Case c : {Case{false, "37, 70", 0, 1}, Case{true, "~N, 4, 6", -1, -2},
                       Case{true, "3, ~N, 5", 1, 3}, Case{true, "~N, 2, ~N, 40", 2, 4}}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " [" + c.axes + "]");
            ir::Function f;
            f.name = "transpose";
            ir::Builder b(f);
            int x = b.input(Schema{t, Shape{c.batched, parse_axes(c.axes)}}, "x");
            f.outputs = {b.op("transpose", {x}, {{"a", c.a}, {"b", c.b}})};
            EXPECT_EQ(jit::print(jit::compile_cpu(f)->plan(), f), "permute   %1 = transpose\n");
            for (auto lengths : {std::vector<std::int64_t>{0, 1, 7, 3}, {40, 33}})
                expect_tiers_agree(f, {random_for(f.type(x), lengths, -1.0, 1.0)});
        }
}

TEST(CpuJit, WeightGradientIsOneGemm) {
    for (DType t : {DType::f32, DType::f64}) {
        ir::Function f;
        f.name = "wgrad";
        ir::Builder b(f);
        int x = b.input(ragged(t, "3, ~N, 6"), "x");
        int g = b.input(ragged(t, "3, ~N, 5"), "g");
        f.outputs = {b.op("matmul_weight_grad", {x, g})};
        EXPECT_EQ(jit::print(jit::compile_cpu(f)->plan(), f),
                  "gemm      %2 = matmul_weight_grad\n");
        auto lengths = std::vector<Shape_>{{3, 0, 6}, {3, 4, 6}, {3, 1, 6}};
        auto glengths = std::vector<Shape_>{{3, 0, 5}, {3, 4, 5}, {3, 1, 5}};
        expect_tiers_agree(
            f, {random_batch(t, "3, ~N, 6", lengths), random_batch(t, "3, ~N, 5", glengths)});
    }
}

TEST(CpuJit, SegmentedReductionsAndTheirGradientsAgree) {
    const std::pair<const char*, std::vector<std::int64_t>> layouts[] = {
        {"~N, 4", {0, 1, 2, -1}},
        {"~N, ~N, 3", {0, 1, 2, 3}},
        {"~N, ~M, 2", {0, 1, 2, 3}},
        {"3, ~H, ~W", {0, 1, 2, 3}}};
    for (DType t : {DType::f32, DType::f64})
        for (const auto& [axes, reduce_over] : layouts)
            for (std::int64_t axis : reduce_over)
                for (const char* op : {"sum", "mean"}) {
                    ir::Function f;
                    f.name = op;
                    ir::Builder b(f);
                    int x = b.input(ragged(t, axes), "x");
                    Attrs at{{"axis", axis}};
                    int y = b.op(op, {x}, at);
                    int g = b.input(f.type(y), "g");
                    Attrs gat = at;
                    gat.set("kind", std::string(op));
                    f.outputs = {y, b.op("reduce_grad", {x, y, g}, gat)};
                    auto cpu = jit::compile_cpu(f);
                    ASSERT_EQ(cpu->plan().steps.size(), 2u);
                    EXPECT_EQ(cpu->plan().steps[0].kind, jit::Step::Kind::segmented)
                        << axes << " " << axis;
                    const std::vector<std::int64_t> lengths = {3, 0, 5, 1};
                    auto xs = random_for(ragged(t, axes), lengths);
                    // The cotangent has the reduction's structure.
                    ir::Function fwd = f;
                    fwd.outputs = {y};
                    fwd.inputs = {x};
                    auto y0 = ir::interpret(ir::eliminate_dead_code(fwd), {xs})[0];
                    std::vector<double> gv(static_cast<std::size_t>(y0.numel()));
                    for (double& v : gv) v = uniform();
                    SCOPED_TRACE(std::string(op) + " over axis " + std::to_string(axis) + " of " +
                                 axes);
                    expect_tiers_agree(f, {xs, RaggedTensor::from_f64(t, y0.structure_ptr(), gv)});
                }
}

TEST(CpuJit, UnequalRuntimeExtentsGiveTheReferenceError) {
    ir::Function f;
    f.name = "add";
    ir::Builder b(f);
    Schema s = ragged(DType::f32, "~N, 4");
    f.outputs = {b.op("add", {b.input(s, "x"), b.input(s, "y")})};
    auto x = random_batch(DType::f32, "~N, 4", {{2, 4}, {3, 4}});
    auto y = random_batch(DType::f32, "~N, 4", {{2, 4}, {5, 4}});
    auto msg = error_of([&] { jit::compile_cpu(f)->run({x, y}); });
    EXPECT_NE(msg.find("sample 1"), std::string::npos) << msg;
}

// Every function of every example, on the interpreter and on the JIT.
TEST(CpuJit, ExamplesAgreeWithTheInterpreter) {
    for (const char* file : {"single_pair_single.rag", "encoder.rag"}) {
        auto m = Module::load((root / "examples" / file).string());
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
            SCOPED_TRACE(std::string(file) + " " + fn);
            expect_tiers_agree(lowered->fn, in);
        }
    }
}

// A call holds a value only until its last use: a chain of eight GEMMs needs its input, the
// GEMM's operand and its result at once, not all eight results (before, every intermediate
// stayed live to the end of the call; a four-block Pairformer's loss peaked at 2.7 GiB).
TEST(CpuJit, ValuesAreReleasedAfterTheirLastUse) {
    auto m = Module::compile("fn chain(x: f32[B, ~N, 256], w: f32[256, 256]) -> f32[B, ~N, 256] {\n"
                             "    let h = x @ w\n    h = h @ w\n    h = h @ w\n    h = h @ w\n"
                             "    h = h @ w\n    h = h @ w\n    h = h @ w\n    return h @ w\n}\n",
                             "chain.rag");
    const std::vector<Value> args = {
        random_for(ragged(DType::f32, "~N, 256"), {64, 64}),
        random_for(Schema{DType::f32, Shape{false, parse_axes("256, 256")}}, {})};
    const double result = 128.0 * 256 * 4; // one [B, ~N, 256] value
    m->call("chain", args);                // compile outside the measurement
    memory::reset_peak();
    const auto before = memory::stats().current;
    const Value out = m->call("chain", args);
    const double peak = double(memory::stats().peak - before);
    EXPECT_GE(peak, result);
    EXPECT_LE(peak, 2.5 * result) << "peak " << peak / result << " results live at once";
}

} // namespace
} // namespace rag
