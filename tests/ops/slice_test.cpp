// Slicing ragged (and symbolic) axes with index: every spec form on lengths 0, 1, 2 and 5
// against Python's slice rules written out per sample, the canonical derived names (slices
// with one length function share a name and combine), steps on static axes, gradients
// against float64 central differences, and the errors.
#include "tests/support/testing.hpp"

#include <optional>

namespace rag {
namespace {

using namespace rag::testing;

Attrs spec(const std::string& s) {
    return {{"spec", s}};
}

// The positions Python's range(n)[lo:hi:step] holds, written from the language reference:
// a negative bound counts from the end, then clamps to [0, n].
std::vector<std::int64_t> python_slice(std::int64_t n, std::optional<std::int64_t> lo,
                                       std::optional<std::int64_t> hi, std::int64_t step) {
    auto bound = [n](std::optional<std::int64_t> b, std::int64_t dflt) {
        if (!b) return dflt;
        std::int64_t v = *b < 0 ? *b + n : *b;
        return v < 0 ? 0 : v > n ? n : v;
    };
    std::vector<std::int64_t> out;
    for (std::int64_t i = bound(lo, 0); i < bound(hi, n); i += step) out.push_back(i);
    return out;
}

struct Case {
    const char* item;
    std::optional<std::int64_t> lo, hi;
    std::int64_t step;
    const char* name; // the result axis
};

const std::vector<Case> cases = {
    {":", {}, {}, 1, "~N"},
    {"0:", 0, {}, 1, "~N"},
    {"::1", {}, {}, 1, "~N"},
    {"1:", 1, {}, 1, "~N[1:]"},
    {":-1", {}, -1, 1, "~N[1:]"},
    {"0:-1", 0, -1, 1, "~N[1:]"},
    {"1:-1", 1, -1, 1, "~N[2:]"},
    {"2:", 2, {}, 1, "~N[2:]"},
    {":-2", {}, -2, 1, "~N[2:]"},
    {"-2:", -2, {}, 1, "~N[:2]"},
    {":2", {}, 2, 1, "~N[:2]"},
    {"0:2", 0, 2, 1, "~N[:2]"},
    {"1:3", 1, 3, 1, "~N[1:3]"},
    {"3:1", 3, 1, 1, "~N[3:1]"},
    {"-3:-1", -3, -1, 1, "~N[-3:-1]"},
    {"-3:2", -3, 2, 1, "~N[-3:2]"},
    {"10:", 10, {}, 1, "~N[10:]"},
    {":-10", {}, -10, 1, "~N[10:]"},
    {"-10:", -10, {}, 1, "~N[:10]"},
    {":0", {}, 0, 1, "~N[:0]"},
    {"::2", {}, {}, 2, "~N[::2]"},
    {"1::2", 1, {}, 2, "~N[1::2]"},
    {":-1:2", {}, -1, 2, "~N[1::2]"},
    {"1:-1:3", 1, -1, 3, "~N[2::3]"},
    {"-3::2", -3, {}, 2, "~N[:3:2]"},
    {":3:2", {}, 3, 2, "~N[:3:2]"},
    {"1:4:2", 1, 4, 2, "~N[1:4:2]"},
    {" 1 : -1 ", 1, -1, 1, "~N[2:]"},
};

const std::vector<Shape_> lengths = {{0}, {1}, {2}, {5}};

TEST(SliceRagged, EverySpecFormAgainstPythonPerSample) {
    auto x = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", lengths));
    for (const Case& c : cases) {
        SCOPED_TRACE(c.item);
        auto y = evaluate("index", {x}, spec(std::string(":, ") + c.item));
        EXPECT_EQ(y.schema().str(), std::string("f64[B, ") + c.name + ", 3]");
        std::vector<Nd> want;
        for (const Nd& s : samples(x)) {
            auto rows = python_slice(s.shape[0], c.lo, c.hi, c.step);
            Nd o({std::int64_t(rows.size()), 3});
            for (std::size_t r = 0; r < rows.size(); ++r)
                for (std::int64_t j = 0; j < 3; ++j) o({std::int64_t(r), j}) = s({rows[r], j});
            want.push_back(o);
        }
        EXPECT_TRUE(samples_close(y, want, 0.0, 0.0));
        check_vjp("index", {x}, spec(std::string(":, ") + c.item));
    }
}

TEST(SliceRagged, HandWrittenSamples) {
    auto x = RaggedTensor::from_list({DenseArray::from_f64(DType::f32, {5}, {0, 1, 2, 3, 4}),
                                      DenseArray::from_f64(DType::f32, {1}, {7}),
                                      DenseArray::from_f64(DType::f32, {0}, {})},
                                     "~N");
    auto vals = [&](const char* s) { return evaluate("index", {x}, spec(s)).to_f64(); };
    EXPECT_EQ(vals(":, 1:-1"), (std::vector<double>{1, 2, 3}));
    EXPECT_EQ(vals(":, ::2"), (std::vector<double>{0, 2, 4, 7}));
    EXPECT_EQ(vals(":, -2:"), (std::vector<double>{3, 4, 7}));
    EXPECT_EQ(vals(":, :-1"), (std::vector<double>{0, 1, 2, 3}));
    EXPECT_EQ(evaluate("index", {x}, spec(":, 1:")).structure().lengths(0),
              (std::vector<std::int64_t>{4, 0, 0}));
}

TEST(SliceRagged, StepsOnStaticAxesAndSlicesOfSymbolicAxes) {
    auto x = random_batch(DType::f64, "~N, 7", shapes_for("~N, 7", lengths));
    for (auto [item, cols] : {std::pair{"::2", std::vector<std::int64_t>{0, 2, 4, 6}},
                              std::pair{"1::3", std::vector<std::int64_t>{1, 4}},
                              std::pair{"-3::2", std::vector<std::int64_t>{4, 6}},
                              std::pair{"5:1:2", std::vector<std::int64_t>{}}}) {
        auto y = evaluate("index", {x}, spec(std::string(":, :, ") + item));
        EXPECT_EQ(y.schema().str(), "f64[B, ~N, " + std::to_string(cols.size()) + "]");
        std::vector<Nd> want;
        for (const Nd& s : samples(x)) {
            Nd o({s.shape[0], std::int64_t(cols.size())});
            for (std::int64_t n = 0; n < s.shape[0]; ++n)
                for (std::size_t j = 0; j < cols.size(); ++j)
                    o({n, std::int64_t(j)}) = s({n, cols[j]});
            want.push_back(o);
        }
        EXPECT_TRUE(samples_close(y, want, 0.0, 0.0)) << item;
        check_vjp("index", {x}, spec(std::string(":, :, ") + item));
    }
    auto s = random_batch(DType::f64, "L, 2", {{5, 2}, {5, 2}});
    auto y = evaluate("index", {s}, spec(":, 1:-1:2"));
    EXPECT_EQ(y.schema().str(), "f64[B, L[2::2], 2]");
    EXPECT_EQ(y.structure().lengths(0), (std::vector<std::int64_t>{2, 2}));
    check_vjp("index", {s}, spec(":, 1:-1:2"));
    auto w = random_dense(DType::f64, {6, 2});
    EXPECT_EQ(evaluate("index", {w}, spec("::4")).schema().str(), "f64[2, 2]");
}

TEST(SliceRagged, EqualDerivedNamesCombine) {
    // Teacher forcing: inputs x[:, :-1] and targets x[:, 1:] of the same ~N.
    auto x = random_batch(DType::f64, "~N, 2", shapes_for("~N, 2", lengths));
    auto a = evaluate("index", {x}, spec(":, 1:"));
    auto b = evaluate("index", {x}, spec(":, :-1"));
    auto sum = evaluate("add", {a, b});
    EXPECT_EQ(sum.schema().str(), "f64[B, ~N[1:], 2]");
    std::vector<Nd> want;
    for (const Nd& s : samples(x)) {
        const std::int64_t n = std::max<std::int64_t>(s.shape[0] - 1, 0);
        Nd o({n, 2});
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t j = 0; j < 2; ++j) o({i, j}) = s({i + 1, j}) + s({i, j});
        want.push_back(o);
    }
    EXPECT_TRUE(samples_close(sum, want));
    // Through the type rule alone, as the frontend checks a program.
    Schema xs{DType::f32, Shape{true, parse_axes("~N, 4")}};
    const OpDef& index = OpTable::builtin().at("index");
    Schema l = infer_schema(index, std::vector{xs}, spec(":, 1:-1"));
    Schema r = infer_schema(index, std::vector{xs}, spec(":, 2:"));
    EXPECT_EQ(infer_schema(OpTable::builtin().at("add"), std::vector{l, r}, {}).str(),
              "f32[B, ~N[2:], 4]");
    Schema other = infer_schema(index, std::vector{xs}, spec(":, 1:"));
    EXPECT_NE(error_of([&] {
                  infer_schema(OpTable::builtin().at("add"), std::vector{l, other}, {});
              }),
              "");
    // Derived names print and parse back.
    EXPECT_EQ(
        Shape(true, parse_axes("~N[2:], ~N[1::2], 4")),
        (Shape{true, {Axis::ragged_of("N[2:]"), Axis::ragged_of("N[1::2]"), Axis::fixed_of(4)}}));
    // A slice of a slice composes into one slice when the length rule is one (derived_names.hpp).
    EXPECT_EQ(evaluate("index", {a}, spec(":, 1:")).schema().str(), "f64[B, ~N[2:], 2]");
    EXPECT_EQ(parse_axes("~H[+2][::2], ~H[*4]")[1], Axis::ragged_of("H[*4]"));
    EXPECT_EQ(parse_axes("~N[1:][1:]")[0], Axis::ragged_of("N[1:][1:]"));
    EXPECT_EQ(parse_axes("L[:3:2]")[0], Axis::symbolic_of("L[:3:2]"));
    EXPECT_NE(error_of([] { parse_axes("~N[a]"); }).find("bad derived axis name"),
              std::string::npos);
    EXPECT_NE(error_of([] { parse_axes("~N[1:"); }).find("bad derived axis name"),
              std::string::npos);
    EXPECT_NE(error_of([] { parse_axes("3[1:]"); }), "");
}

TEST(SliceRagged, PairStateSliceIsARectangularPair) {
    std::vector<Shape_> nn = {{0}, {1}, {3}, {2}};
    auto z = random_batch(DType::f64, "~N, ~N, 2", shapes_for("~N, ~N, 2", nn));
    auto a = evaluate("index", {z}, spec(":, 1:"));
    EXPECT_EQ(a.schema().str(), "f64[B, ~N[1:], ~N, 2]");
    auto b = evaluate("index", {z}, spec(":, :-1, :"));
    auto c = evaluate("mul", {a, b});
    auto zs = samples(z);
    std::vector<Nd> want;
    for (const Nd& s : zs) {
        const std::int64_t n = s.shape[0], m = std::max<std::int64_t>(n - 1, 0);
        Nd o({m, n, 2});
        for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j)
                for (std::int64_t k = 0; k < 2; ++k) o({i, j, k}) = s({i + 1, j, k}) * s({i, j, k});
        want.push_back(o);
    }
    EXPECT_TRUE(samples_close(c, want));
    EXPECT_EQ(evaluate("sum", {c}, {{"axis", 2}}).schema().str(), "f64[B, ~N[1:], 2]");
    EXPECT_EQ(evaluate("transpose", {c}, {{"a", 1}, {"b", 2}}).schema().str(),
              "f64[B, ~N, ~N[1:], 2]");
    check_vjp("index", {z}, spec(":, 1:"));
    check_vjp("index", {z}, spec(":, :, -2::2, 1"));
}

TEST(SliceRagged, BadSpecs) {
    auto x = random_batch(DType::f32, "~N, 4", {{2, 4}});
    auto err = [&](const char* s) { return error_of([&] { evaluate("index", {x}, spec(s)); }); };
    EXPECT_NE(err(":, +-1:").find("bad item '+-1:'"), std::string::npos);
    // Python's empty step is 1.
    EXPECT_EQ(evaluate("index", {x}, spec(":, 1:2:")).schema().str(), "f32[B, ~N[1:2], 4]");
    EXPECT_EQ(evaluate("index", {x}, spec(":, +1:")).schema().str(), "f32[B, ~N[1:], 4]");
}

TEST(SliceRagged, UnequalExtentsOfOneDerivedNameNameTheSample) {
    auto x = random_batch(DType::f64, "~N", {{3}, {4}});
    auto y = random_batch(DType::f64, "~N", {{3}, {2}});
    auto a = evaluate("index", {x}, spec(":, 1:"));
    auto b = evaluate("index", {y}, spec(":, :-1"));
    EXPECT_NE(error_of([&] { evaluate("add", {a, b}); }).find("sample 1"), std::string::npos);
    auto g = random_batch(DType::f64, "~N", {{2}, {2}}); // the second sample should hold 3
    EXPECT_NE(
        error_of([&] {
            evaluate(
                "index_grad",
                {RaggedTensor(DType::f64, Structure::make(a.shape(), 2, {2, 2}), g.buffer()), x},
                spec(":, 1:"));
        }).find("sample 1"),
        std::string::npos);
}

} // namespace
} // namespace rag
