// The CPU tier's gather, gather_grad, positions and ragged slices: compiled steps (never
// reference steps in the plan), bitwise equal to the reference interpreter, gather_grad
// bitwise equal across thread counts, and the same out-of-range message; a derived program
// through them checked against float64 central differences.
#include "ir/autodiff.hpp"
#include "jit/cpu_jit.hpp"
#include "runtime/parallel.hpp"
#include "tests/jit/tiers.hpp"
#include "tests/support/program.hpp"
#include "tests/support/testing.hpp"

#include <cstring>
#include <sstream>

namespace rag {
namespace {

using namespace rag::testing;

Schema batched(DType t, std::string_view axes) {
    return {t, Shape{true, parse_axes(axes)}};
}
Schema unbatched(DType t, std::string_view axes) {
    return {t, Shape{false, parse_axes(axes)}};
}

std::string kinds(const ir::Function& f) {
    std::istringstream in(jit::print(jit::compile_cpu(f)->plan(), f));
    std::string line, out;
    while (std::getline(in, line)) out += (out.empty() ? "" : " ") + line.substr(0, line.find(' '));
    return out;
}

bool same_bits(const RaggedTensor& a, const RaggedTensor& b) {
    return a.schema() == b.schema() && a.structure().same_as(b.structure()) &&
           std::memcmp(a.data(), b.data(), std::size_t(a.numel()) * dtype_size(a.dtype())) == 0;
}

void expect_bitwise(const ir::Function& f, const std::vector<RaggedTensor>& in) {
    auto want = ir::interpret(f, in);
    auto got = jit::compile_cpu(f)->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k)
        EXPECT_TRUE(same_bits(got[k], want[k])) << f.name << " output " << k;
}

// Ids in [0, V) for a schema: batched ones with one sample per length (every ragged axis
// takes it), unbatched ones from the schema's static extents.
RaggedTensor ids_for(const Schema& s, const std::vector<std::int64_t>& lengths, std::int64_t V) {
    std::vector<Shape_> shapes;
    for (std::int64_t n : s.shape.batched ? lengths : std::vector<std::int64_t>{0}) {
        Shape_ shape;
        for (const Axis& a : s.shape.axes)
            shape.push_back(a.kind == AxisKind::fixed ? a.extent : n);
        shapes.push_back(shape);
    }
    std::string axes;
    for (const Axis& a : s.shape.axes)
        axes += (axes.empty() ? "" : ", ") +
                (a.kind == AxisKind::fixed ? std::to_string(a.extent) : "~" + a.name);
    auto r = random_batch(s.dtype, axes, shapes, 0.0, double(V) - 0.01);
    return s.shape.batched ? r : RaggedTensor::dense(r.to_list()[0]);
}

const std::vector<std::int64_t> lengths = {3, 0, 40, 1, 17};

TEST(CompiledGather, ForwardAndTableGradientAreCompiledAndBitwiseTheReference) {
    const std::int64_t V = 11;
    for (DType it : {DType::i32, DType::i64})
        for (DType tt : {DType::f32, DType::f64, DType::bf16})
            for (const char* ids_axes : {"~N", "~N, 2", "~N, ~M"})
                for (bool is_batched : {true, false}) {
                    if (!is_batched && std::string(ids_axes) != "~N, 2") continue;
                    SCOPED_TRACE(std::string(dtype_name(it)) + " " + std::string(dtype_name(tt)) +
                                 " " + ids_axes);
                    const Schema ids_s = is_batched ? batched(it, ids_axes) : unbatched(it, "5, 2");
                    ir::Function f;
                    f.name = "gather";
                    ir::Builder b(f);
                    int table = b.input(unbatched(tt, std::to_string(V) + ", 6"), "table");
                    int ids = b.input(ids_s, "ids");
                    int y = b.op("gather", {table, ids});
                    int g = b.input(f.type(y), "g");
                    f.outputs = {y, b.op("gather_grad", {g, ids, table})};
                    EXPECT_EQ(jit::print(jit::compile_cpu(f)->plan(), f),
                              "gather    %2 = gather\ngather    %4 = gather_grad\n");
                    auto id = ids_for(ids_s, lengths, V);
                    auto tab = random_dense(tt, {V, 6});
                    auto gy = evaluate("gather", {tab, id});
                    auto gg = RaggedTensor::from_f64(
                        tt, gy.structure_ptr(),
                        random_batch(DType::f64, "~K", {{gy.numel()}}).to_f64());
                    expect_bitwise(f, {tab, id, gg});
                }
}

// A large table read by few tokens: most rows are read by none or by one (their fast paths),
// and a -0 cotangent on a row read once must come out +0, as the reference's 0 + x gives.
TEST(CompiledGather, RowsReadByNoneOrOneTokenAreTheReferenceBits) {
    for (DType tt : {DType::f32, DType::f64, DType::bf16}) {
        SCOPED_TRACE(dtype_name(tt));
        const std::int64_t V = 64;
        ir::Function f;
        f.name = "gather_grad";
        ir::Builder b(f);
        int table = b.input(unbatched(tt, std::to_string(V) + ", 5"), "table");
        int ids = b.input(batched(DType::i32, "~N"), "ids");
        int g = b.input(batched(tt, "~N, 5"), "g");
        f.outputs = {b.op("gather_grad", {g, ids, table})};
        auto id = ids_for(batched(DType::i32, "~N"), {3, 0, 5, 1}, V);
        auto gy = evaluate("gather", {random_dense(tt, {V, 5}), id});
        std::vector<double> gv = random_batch(DType::f64, "~K", {{gy.numel()}}).to_f64();
        for (std::size_t k = 0; k < gv.size(); k += 3) gv[k] = -0.0;
        expect_bitwise(
            f, {random_dense(tt, {V, 5}), id, RaggedTensor::from_f64(tt, gy.structure_ptr(), gv)});
    }
}

TEST(CompiledGather, TableGradientDoesNotDependOnTheThreadCount) {
    ir::Function f;
    f.name = "gather_grad";
    ir::Builder b(f);
    const std::int64_t V = 37;
    int table = b.input(unbatched(DType::f32, std::to_string(V) + ", 64"), "table");
    int ids = b.input(batched(DType::i64, "~N"), "ids");
    int g = b.input(batched(DType::f32, "~N, 64"), "g");
    f.outputs = {b.op("gather_grad", {g, ids, table})};
    // Many repeats of few ids, so rows sum hundreds of terms in an order that matters.
    auto id = ids_for(batched(DType::i64, "~N"), {500, 0, 1, 900, 333}, V);
    auto tab = random_dense(DType::f32, {V, 64});
    auto gy = evaluate("gather", {tab, id});
    auto gv =
        RaggedTensor::from_f64(DType::f32, gy.structure_ptr(),
                               random_batch(DType::f64, "~K", {{gy.numel()}}, -1e3, 1e3).to_f64());
    auto cpu = jit::compile_cpu(f);
    std::vector<RaggedTensor> runs;
    for (int t : {1, 2, 3, 1}) {
        set_num_threads(t);
        runs.push_back(cpu->run({tab, id, gv})[0]);
    }
    set_num_threads(0);
    for (const auto& r : runs) EXPECT_TRUE(same_bits(r, runs[0]));
    EXPECT_TRUE(same_bits(runs[0], ir::interpret(f, {tab, id, gv})[0]));
}

TEST(CompiledGather, OutOfRangeIdsGiveTheReferenceMessage) {
    ir::Function f;
    f.name = "bad_ids";
    ir::Builder b(f);
    int table = b.input(unbatched(DType::f32, "5, 4"), "table");
    int ids = b.input(batched(DType::i32, "~N"), "ids");
    int y = b.op("gather", {table, ids});
    f.outputs = {y};
    auto id = RaggedTensor::from_list({DenseArray::from_f64(DType::i32, {2}, {0, 4}),
                                       DenseArray::from_f64(DType::i32, {3}, {1, 5, -2})},
                                      "~N");
    auto tab = random_dense(DType::f32, {5, 4});
    const std::string want =
        "gather: sample 1, position (1,): id 5 is outside [0, 5) for a table of V = 5 rows";
    EXPECT_EQ(error_of([&] { ir::interpret(f, {tab, id}); }), want);
    for (int t : {1, 3}) {
        set_num_threads(t);
        EXPECT_EQ(error_of([&] { jit::compile_cpu(f)->run({tab, id}); }), want);
    }
    set_num_threads(0);
    ir::Function gf;
    gf.name = "bad_ids_grad";
    ir::Builder gb(gf);
    table = gb.input(unbatched(DType::f32, "5, 4"), "table");
    ids = gb.input(batched(DType::i32, "~N"), "ids");
    int g = gb.input(batched(DType::f32, "~N, 4"), "g");
    gf.outputs = {gb.op("gather_grad", {g, ids, table})};
    auto gv = RaggedTensor::zeros(
        DType::f32,
        evaluate("gather",
                 {tab, RaggedTensor::from_list({DenseArray::from_f64(DType::i32, {2}, {0, 0}),
                                                DenseArray::from_f64(DType::i32, {3}, {0, 0, 0})},
                                               "~N")})
            .structure_ptr());
    EXPECT_EQ(error_of([&] {
                  jit::compile_cpu(gf)->run({tab, id, gv});
              }),
              "gather_grad: sample 1, position (1,): id 5 is outside [0, 5) for a table of V = 5 "
              "rows");
}

// Per-sample tables (T[B, ~N, D]): compiled, bitwise the reference forward and backward at
// every thread count (rows of one sample summed in packed order), the reference's message.
TEST(CompiledGather, BatchedTablesAreCompiledAndBitwiseTheReference) {
    ir::Function f;
    f.name = "per_sample";
    ir::Builder b(f);
    int table = b.input(batched(DType::f32, "~N, 16"), "table");
    int ids = b.input(batched(DType::i64, "~M"), "ids");
    int y = b.op("gather", {table, ids});
    int g = b.input(f.type(y), "g");
    f.outputs = {y, b.op("gather_grad", {g, ids, table})};
    EXPECT_EQ(kinds(f), "gather gather");
    const std::vector<std::int64_t> n = {7, 0, 300, 1}, m = {20, 0, 900, 3};
    std::vector<Shape_> rows, picks;
    std::vector<DenseArray> list;
    for (std::size_t k = 0; k < n.size(); ++k) {
        rows.push_back({n[k], 16});
        list.push_back(random_batch(DType::i64, "~M", {{m[k]}}, 0.0,
                                    double(std::max<std::int64_t>(n[k], 1)) - 0.01)
                           .to_list()[0]);
    }
    auto tab = random_batch(DType::f32, "~N, 16", rows);
    auto id = RaggedTensor::from_list(list, "~M");
    auto gy = evaluate("gather", {tab, id});
    auto gg =
        RaggedTensor::from_f64(DType::f32, gy.structure_ptr(),
                               random_batch(DType::f64, "~K", {{gy.numel()}}, -1e3, 1e3).to_f64());
    for (int t : {1, 2, 3}) {
        set_num_threads(t);
        expect_bitwise(f, {tab, id, gg});
    }
    set_num_threads(0);
    list[2] = DenseArray::from_f64(DType::i64, {2}, {299, 300});
    EXPECT_EQ(error_of([&] {
                  jit::compile_cpu(f)->run({tab, RaggedTensor::from_list(list, "~M"), gg});
              }),
              "gather: sample 2, position (1,): id 300 is outside [0, 300) for its sample's 300 "
              "table rows");
}

TEST(CompiledPositions, EveryAxisKindIsCompiledAndBitwiseTheReference) {
    for (auto [axes, axis] :
         {std::pair{"~N, 64", 1}, std::pair{"~N, 3, ~M", 2}, std::pair{"~N, 3, ~M", 3},
          std::pair{"~N, ~N, 2", 2}, std::pair{"L, ~N", 1}, std::pair{"4, 5", -1}}) {
        SCOPED_TRACE(std::string(axes) + " axis " + std::to_string(axis));
        ir::Function f;
        f.name = "positions";
        ir::Builder b(f);
        int x = b.input(batched(DType::f32, axes), "x");
        f.outputs = {b.op("positions", {x}, {{"axis", std::int64_t(axis)}})};
        EXPECT_EQ(kinds(f), "positions");
        std::vector<RaggedTensor> in;
        for (int v : f.inputs) in.push_back(random_for(f.type(v), {3, 0, 5, 1}));
        expect_bitwise(f, in);
    }
}

TEST(CompiledSlices, RaggedSlicesAndTheirGradientsAreRowCopies) {
    const char* specs[] = {":, 1:", ":, :-1", ":, 1:-1",  ":, -2:",     ":, ::2",  ":, 1::3",
                           ":, 5:", ":, :0",  ":, -3:-1", ":, 1:, new", ":, :, 1:"};
    for (DType t : {DType::f32, DType::f64, DType::bf16})
        for (const char* axes : {"~N, 8", "~N, ~N, 3", "~N, 4, ~M"})
            for (const char* s : specs) {
                SCOPED_TRACE(std::string(axes) + " [" + s + "]");
                const Schema xs = batched(t, axes);
                ir::Function f;
                f.name = "slice";
                ir::Builder b(f);
                int x = b.input(xs, "x");
                Attrs at{{"spec", std::string(s)}};
                Shape out;
                try {
                    out = infer_schema(OpTable::builtin().at("index"), std::vector{xs}, at).shape;
                } catch (const Error&) {
                    continue; // `:, :, 1:` on a static middle axis: not this test's
                }
                int y = b.op("index", {x}, at);
                f.outputs = {y, b.op("index_grad", {b.input(f.type(y), "g"), x}, at)};
                // `:, :, 1:` slices a static axis of [B, ~N, 8]: rows change inside (reference).
                const bool rows = std::string(s) != ":, :, 1:" || std::string(axes) == "~N, ~N, 3";
                if (!rows) continue;
                EXPECT_EQ(kinds(f), "slice slice");
                std::vector<RaggedTensor> in;
                in.push_back(random_for(xs, {3, 0, 5, 1, 2}));
                in.push_back(evaluate("index", {in[0]}, at)); // a cotangent of the right shape
                expect_bitwise(f, in);
            }
}

TEST(CompiledSlices, MismatchedCotangentNamesTheSample) {
    ir::Function f;
    f.name = "slice_grad";
    ir::Builder b(f);
    const Schema xs = batched(DType::f32, "~N, 2");
    int x = b.input(xs, "x");
    Attrs at{{"spec", std::string(":, 1:")}};
    Schema ys = infer_schema(OpTable::builtin().at("index"), std::vector{xs}, at);
    f.outputs = {b.op("index_grad", {b.input(ys, "g"), x}, at)};
    auto xv = random_batch(DType::f32, "~N, 2", {{3, 2}, {4, 2}});
    auto g = RaggedTensor::zeros(DType::f32, Structure::make(ys.shape, 2, {2, 2, 2, 2}));
    EXPECT_NE(error_of([&] {
                  jit::compile_cpu(f)->run({xv, g});
              }).find("sample 1"),
              std::string::npos);
}

// A next-token-style program: embed ids, take x[:, :-1] and x[:, 1:] (one derived axis), add
// positions, reduce. Its table gradient against float64 central differences, and the compiled
// gradient program without reference steps for gather_grad or index_grad.
TEST(CompiledGather, DerivedProgramThroughGatherAndSlices) {
    ir::Function f;
    f.name = "next_token";
    ir::Builder b(f);
    int table = b.input(unbatched(DType::f64, "7, 3"), "table");
    int ids = b.input(batched(DType::i64, "~N"), "ids");
    int e = b.op("gather", {table, ids});
    int pos = b.op("cast", {b.op("positions", {ids}, {{"axis", std::int64_t(1)}})},
                   {{"dtype", std::string("f64")}});
    int l = b.op("index", {e}, {{"spec", std::string(":, :-1")}});
    int r = b.op("index", {e}, {{"spec", std::string(":, 1:")}});
    int lp = b.op("index", {pos}, {{"spec", std::string(":, 1:")}});
    int prod = b.op(
        "mul", {b.op("mul", {l, r}), b.op("index", {lp}, {{"spec", std::string(":, :, new")}})});
    f.outputs = {b.op("sum", {prod})};
    auto id = ids_for(batched(DType::i64, "~N"), {4, 0, 1, 6}, 7);
    auto tab = random_dense(DType::f64, {7, 3});
    check_program_gradient(f, {tab, id}, {0});
    ir::Function g = ir::differentiate(f, 0, {0});
    // (cast and ones_like are reference steps of their own.)
    std::istringstream plan(jit::print(jit::compile_cpu(g)->plan(), g));
    for (std::string line; std::getline(plan, line);)
        if (line.rfind("reference", 0) == 0) {
            EXPECT_TRUE(line.ends_with("= cast") || line.ends_with("= ones_like")) << line;
        }
    expect_tiers_agree(g, {tab, id}, 1e-12);
}

} // namespace
} // namespace rag
