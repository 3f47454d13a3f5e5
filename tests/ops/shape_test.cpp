// Shape ops against per-sample dense loops: transpose of ragged/static and static/static
// axes, index with new/integer/slice/negative items, reshape of the static tail, concat along
// a static axis; every VJP against float64 central differences; the type and runtime errors.
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

Attrs spec(const char* s) {
    return {{"spec", std::string(s)}};
}
Attrs axes(std::int64_t a, std::int64_t b) {
    return {{"a", a}, {"b", b}};
}
Attrs on_axis(std::int64_t a) {
    return {{"axis", a}};
}

const std::vector<Shape_> lengths = {{0}, {1}, {4}, {2}};

TEST(ShapeTranspose, RaggedAndStaticAxes) {
    auto x = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", lengths));
    for (Attrs at : {axes(1, 2), axes(-1, -2)}) {
        auto y = evaluate("transpose", {x}, at);
        EXPECT_EQ(y.schema().str(), "f64[B, 3, ~N]");
        std::vector<Nd> want;
        for (const Nd& s : samples(x)) {
            Nd t({3, s.shape[0]});
            for (std::int64_t n = 0; n < s.shape[0]; ++n)
                for (std::int64_t c = 0; c < 3; ++c) t({c, n}) = s({n, c});
            want.push_back(t);
        }
        EXPECT_TRUE(samples_close(y, want));
        check_vjp("transpose", {x}, at);
    }
}

TEST(ShapeTranspose, StaticAxesAndRaggedPairs) {
    auto x = random_batch(DType::f64, "~N, 2, 3", shapes_for("~N, 2, 3", lengths));
    auto y = evaluate("transpose", {x}, axes(2, 3));
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, 3, 2]");
    std::vector<Nd> want;
    for (const Nd& s : samples(x)) {
        Nd t({s.shape[0], 3, 2});
        for (std::int64_t n = 0; n < s.shape[0]; ++n)
            for (std::int64_t p = 0; p < 2; ++p)
                for (std::int64_t q = 0; q < 3; ++q) t({n, q, p}) = s({n, p, q});
        want.push_back(t);
    }
    EXPECT_TRUE(samples_close(y, want));
    check_vjp("transpose", {x}, axes(2, 3));

    std::vector<Shape_> nm = {{0, 2}, {1, 1}, {3, 2}};
    auto pair = random_batch(DType::f64, "~N, ~M", shapes_for("~N, ~M", nm));
    auto pt = evaluate("transpose", {pair}, axes(1, 2));
    EXPECT_EQ(pt.schema().str(), "f64[B, ~M, ~N]");
    auto ps = samples(pair), pts = samples(pt);
    for (std::size_t i = 0; i < nm.size(); ++i)
        for (std::int64_t n = 0; n < nm[i][0]; ++n)
            for (std::int64_t m = 0; m < nm[i][1]; ++m) EXPECT_EQ(pts[i]({m, n}), ps[i]({n, m}));
    check_vjp("transpose", {pair}, axes(1, 2));

    auto w = random_dense(DType::f64, {2, 3});
    auto wt = evaluate("transpose", {w}, axes(0, 1));
    EXPECT_EQ(wt.schema().str(), "f64[3, 2]");
    EXPECT_EQ(Nd::of(wt.to_dense())({2, 1}), Nd::of(w.to_dense())({1, 2}));
    check_vjp("transpose", {w}, axes(0, 1));
}

TEST(ShapeTranspose, Errors) {
    auto x = random_batch(DType::f32, "~N, 3", {{2, 3}});
    EXPECT_EQ(error_of([&] { evaluate("transpose", {x}, axes(0, 1)); }),
              "transpose: axis 0 is the batch axis of [B, ~N, 3]");
    EXPECT_NE(error_of([&] { evaluate("transpose", {x}, axes(1, 3)); }).find("out of range"),
              std::string::npos);
}

// The per-sample reference of x[:, :, spec] on a [B, ~N, 4] batch: y(n, j) = x(n, cols[j]).
std::vector<Nd> select_columns(const RaggedTensor& x, const std::vector<std::int64_t>& cols) {
    std::vector<Nd> want;
    for (const Nd& s : samples(x)) {
        Nd t({s.shape[0], std::int64_t(cols.size())});
        for (std::int64_t n = 0; n < s.shape[0]; ++n)
            for (std::size_t j = 0; j < cols.size(); ++j) t({n, std::int64_t(j)}) = s({n, cols[j]});
        want.push_back(t);
    }
    return want;
}

TEST(ShapeIndex, NewAxesMakeBroadcastablePairOperands) {
    auto x = random_batch(DType::f64, "~N, 4", shapes_for("~N, 4", lengths));
    auto a = evaluate("index", {x}, spec(":, :, new, :"));
    auto b = evaluate("index", {x}, spec(":, new, :, :"));
    EXPECT_EQ(a.schema().str(), "f64[B, ~N, 1, 4]");
    EXPECT_EQ(b.schema().str(), "f64[B, 1, ~N, 4]");
    std::vector<Nd> wa, wb;
    for (const Nd& s : samples(x)) {
        wa.push_back(Nd({s.shape[0], 1, 4}, s.v));
        wb.push_back(Nd({1, s.shape[0], 4}, s.v));
    }
    EXPECT_TRUE(samples_close(a, wa));
    EXPECT_TRUE(samples_close(b, wb));
    EXPECT_EQ(evaluate("add", {a, b}).schema().str(), "f64[B, ~N, ~N, 4]");
    EXPECT_EQ(evaluate("index", {x}, spec(":, :, :, new")).schema().str(), "f64[B, ~N, 4, 1]");
    EXPECT_EQ(evaluate("index", {x}, spec("")).schema().str(), "f64[B, ~N, 4]");
    check_vjp("index", {x}, spec(":, new, :, :"));
}

TEST(ShapeIndex, IntegersAndSlices) {
    auto x = random_batch(DType::f64, "~N, 4", shapes_for("~N, 4", lengths));
    struct Case {
        const char* spec;
        std::vector<std::int64_t> cols;
    };
    for (const Case& c : {Case{":, :, 1:3", {1, 2}}, Case{":, :, -3:", {1, 2, 3}},
                          Case{":, :, :-1", {0, 1, 2}}, Case{":, :, -10:10", {0, 1, 2, 3}},
                          Case{":, :, 3:1", {}}, Case{":, :, :", {0, 1, 2, 3}}}) {
        auto y = evaluate("index", {x}, spec(c.spec));
        EXPECT_EQ(y.schema().str(), "f64[B, ~N, " + std::to_string(c.cols.size()) + "]") << c.spec;
        EXPECT_TRUE(samples_close(y, select_columns(x, c.cols))) << c.spec;
        check_vjp("index", {x}, spec(c.spec));
    }
    for (auto [s, col] : {std::pair{":, :, 2", 2}, std::pair{":, :, -1", 3}}) {
        auto y = evaluate("index", {x}, spec(s));
        EXPECT_EQ(y.schema().str(), "f64[B, ~N]");
        std::vector<Nd> want;
        for (const Nd& w : select_columns(x, {col})) want.push_back(Nd({w.shape[0]}, w.v));
        EXPECT_TRUE(samples_close(y, want)) << s;
        check_vjp("index", {x}, spec(s));
    }
}

TEST(ShapeIndex, PairAndUnbatched) {
    auto x = random_batch(DType::f64, "~N, ~N, 3", shapes_for("~N, ~N, 3", lengths));
    auto y = evaluate("index", {x}, spec(":, :, :, 1, new"));
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, ~N, 1]");
    std::vector<Nd> want;
    for (const Nd& s : samples(x)) {
        const std::int64_t n = s.shape[0];
        Nd t({n, n, 1});
        for (std::int64_t p = 0; p < n; ++p)
            for (std::int64_t q = 0; q < n; ++q) t({p, q, 0}) = s({p, q, 1});
        want.push_back(t);
    }
    EXPECT_TRUE(samples_close(y, want));
    check_vjp("index", {x}, spec(":, :, :, 1, new"));

    auto w = random_dense(DType::f64, {3, 4});
    auto r = evaluate("index", {w}, spec("new, -2, 1:3"));
    EXPECT_EQ(r.schema().str(), "f64[1, 2]");
    Nd wd = Nd::of(w.to_dense());
    EXPECT_TRUE(close(Nd::of(r.to_dense()), Nd({1, 2}, {wd({1, 1}), wd({1, 2})})));
    check_vjp("index", {w}, spec("new, -2, 1:3"));
}

TEST(ShapeIndex, Errors) {
    auto x = random_batch(DType::f32, "~N, 4", {{2, 4}});
    auto err = [&](const char* s) { return error_of([&] { evaluate("index", {x}, spec(s)); }); };
    EXPECT_EQ(err(":, 0, :"), "index: axis 1 is ragged ~N and accepts only slices, got '0'");
    EXPECT_EQ(err(":, :, 4"), "index: index 4 is out of range for axis 2 of extent 4");
    EXPECT_EQ(err(":, :, -5"), "index: index -5 is out of range for axis 2 of extent 4");
    EXPECT_NE(err("new, :, :").find("the first item must be ':'"), std::string::npos);
    EXPECT_NE(err("0").find("the first item must be ':'"), std::string::npos);
    EXPECT_NE(err(":, :, :, :").find("too many items"), std::string::npos);
    EXPECT_NE(err(":, :, x").find("bad item 'x'"), std::string::npos);
    EXPECT_EQ(err(":, 1::0"), "index: the step of '1::0' must be >= 1, got 0 (negative and zero "
                              "steps are not supported)");
    EXPECT_NE(err(":, ::-1").find("must be >= 1, got -1"), std::string::npos);
    EXPECT_NE(err(":, 1:2:3:4").find("bad item '1:2:3:4'"), std::string::npos);
    EXPECT_NE(err(":, 1:x").find("bad item '1:x'"), std::string::npos);
    EXPECT_NE(err(":, , :").find("empty item"), std::string::npos);
    auto s = random_batch(DType::f32, "L, 2", {{3, 2}});
    EXPECT_EQ(error_of([&] { evaluate("index", {s}, spec(":, 1")); }),
              "index: axis 1 is symbolic L and accepts only slices, got '1'");
}

TEST(ShapeReshape, StaticTailSharesStorage) {
    auto x = random_batch(DType::f64, "~N, 2, 6", shapes_for("~N, 2, 6", lengths));
    auto y = evaluate("reshape", {x}, {{"shape", std::vector<std::int64_t>{3, 4}}});
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, 3, 4]");
    EXPECT_EQ(y.data(), x.data());
    std::vector<Nd> want;
    for (const Nd& s : samples(x)) want.push_back(Nd({s.shape[0], 3, 4}, s.v));
    EXPECT_TRUE(samples_close(y, want));
    check_vjp("reshape", {x}, {{"shape", std::vector<std::int64_t>{12}}});

    // Only the axes after the last ragged one: [B, 3, ~H, 4, 2] -> [B, 3, ~H, 8].
    auto img = random_batch(DType::f64, "3, ~H, 4, 2", shapes_for("3, ~H, 4, 2", lengths));
    auto flat = evaluate("reshape", {img}, {{"shape", std::vector<std::int64_t>{8}}});
    EXPECT_EQ(flat.schema().str(), "f64[B, 3, ~H, 8]");
    std::vector<Nd> wimg;
    for (const Nd& s : samples(img)) wimg.push_back(Nd({3, s.shape[1], 8}, s.v));
    EXPECT_TRUE(samples_close(flat, wimg));
    check_vjp("reshape", {img}, {{"shape", std::vector<std::int64_t>{2, 2, 2}}});

    auto w = random_dense(DType::f64, {2, 3});
    auto wf = evaluate("reshape", {w}, {{"shape", std::vector<std::int64_t>{3, 1, 2}}});
    EXPECT_EQ(wf.schema().str(), "f64[3, 1, 2]");
    EXPECT_EQ(wf.to_f64(), w.to_f64());
    check_vjp("reshape", {w}, {{"shape", std::vector<std::int64_t>{6}}});
}

TEST(ShapeReshape, ProductMustMatch) {
    auto x = random_batch(DType::f32, "~N, 4, 6", {{2, 4, 6}});
    EXPECT_EQ(error_of([&] {
                  evaluate("reshape", {x}, {{"shape", std::vector<std::int64_t>{5, 5}}});
              }),
              "reshape: the static tail [4, 6] of [B, ~N, 4, 6] holds 24 elements, not 25");
    EXPECT_NE(error_of([&] {
                  evaluate("reshape", {x}, {{"shape", std::vector<std::int64_t>{-1, 24}}});
              }).find(">= 0"),
              std::string::npos);
}

TEST(ShapeConcat, StaticAxisWithGradients) {
    auto a = random_batch(DType::f64, "~N, 2", shapes_for("~N, 2", lengths));
    auto b = random_batch(DType::f64, "~N, 3", shapes_for("~N, 3", lengths));
    auto y = evaluate("concat", {a, b, a}, on_axis(-1));
    EXPECT_EQ(y.schema().str(), "f64[B, ~N, 7]");
    auto as = samples(a), bs = samples(b);
    std::vector<Nd> want;
    for (std::size_t i = 0; i < as.size(); ++i) {
        const std::int64_t n = as[i].shape[0];
        Nd t({n, 7});
        for (std::int64_t r = 0; r < n; ++r)
            for (std::int64_t c = 0; c < 7; ++c)
                t({r, c}) = c < 2 ? as[i]({r, c}) : c < 5 ? bs[i]({r, c - 2}) : as[i]({r, c - 5});
        want.push_back(t);
    }
    EXPECT_TRUE(samples_close(y, want));
    check_vjp("concat", {a, b, a}, on_axis(2));
    check_vjp("concat", {b}, on_axis(2));

    // A static axis before the ragged one: [B, 1, ~N] and [B, 2, ~N] along axis 1.
    auto c = random_batch(DType::f64, "1, ~N", shapes_for("1, ~N", lengths));
    auto d = random_batch(DType::f64, "2, ~N", shapes_for("2, ~N", lengths));
    auto cd = evaluate("concat", {c, d}, on_axis(1));
    EXPECT_EQ(cd.schema().str(), "f64[B, 3, ~N]");
    auto cs = samples(c), ds = samples(d);
    std::vector<Nd> wcd;
    for (std::size_t i = 0; i < cs.size(); ++i) {
        std::vector<double> v = cs[i].v;
        v.insert(v.end(), ds[i].v.begin(), ds[i].v.end());
        wcd.push_back(Nd({3, cs[i].shape[1]}, v));
    }
    EXPECT_TRUE(samples_close(cd, wcd));
    check_vjp("concat", {c, d}, on_axis(1));

    auto w = random_dense(DType::f64, {2, 3});
    auto u = random_dense(DType::f64, {1, 3});
    auto wu = evaluate("concat", {w, u}, on_axis(0));
    EXPECT_EQ(wu.schema().str(), "f64[3, 3]");
    std::vector<double> v = w.to_f64(), uv = u.to_f64();
    v.insert(v.end(), uv.begin(), uv.end());
    EXPECT_EQ(wu.to_f64(), v);
    check_vjp("concat", {w, u}, on_axis(0));
}

TEST(ShapeConcat, Errors) {
    auto a = random_batch(DType::f32, "~N, 2", {{2, 2}, {3, 2}});
    auto m = random_batch(DType::f32, "~M, 2", {{2, 2}, {3, 2}});
    EXPECT_NE(error_of([&] {
                  evaluate("concat", {a, m}, on_axis(2));
              }).find("differ outside axis 2"),
              std::string::npos);
    EXPECT_EQ(error_of([&] {
                  evaluate("concat", {a, a}, on_axis(1));
              }),
              "concat: the concatenation axis must be a static axis, got ragged ~N");
    auto b = random_batch(DType::f32, "~N, 2", {{2, 2}, {4, 2}});
    EXPECT_EQ(error_of([&] {
                  evaluate("concat", {a, b}, on_axis(2));
              }),
              "concat: sample 1: axis 1 is 4 in input 1 but 3 in input 0");
    auto one = random_batch(DType::f32, "~N, 2", {{2, 2}});
    EXPECT_NE(error_of([&] {
                  evaluate("concat", {a, one}, on_axis(2));
              }).find("batch sizes differ"),
              std::string::npos);
    auto d = random_batch(DType::f64, "~N, 2", {{2, 2}, {3, 2}});
    EXPECT_NE(error_of([&] {
                  evaluate("concat", {a, d}, on_axis(2));
              }).find("different dtypes"),
              std::string::npos);
}

TEST(ShapeOps, LowPrecisionForwardIsExact) {
    for (DType t : {DType::f32, DType::bf16}) {
        auto x = random_batch(t, "~N, 4", shapes_for("~N, 4", lengths));
        auto y = evaluate("transpose", {evaluate("index", {x}, spec(":, :, 1:3"))}, axes(1, 2));
        EXPECT_EQ(y.dtype(), t);
        auto ys = samples(y), want = select_columns(x, {1, 2});
        for (std::size_t i = 0; i < ys.size(); ++i)
            for (std::int64_t n = 0; n < want[i].shape[0]; ++n)
                for (std::int64_t j = 0; j < 2; ++j) EXPECT_EQ(ys[i]({j, n}), want[i]({n, j}));
        auto c = evaluate("concat", {x, x}, on_axis(2));
        auto r = evaluate("reshape", {c}, {{"shape", std::vector<std::int64_t>{2, 4}}});
        auto xs = samples(x), rs = samples(r);
        for (std::size_t i = 0; i < xs.size(); ++i)
            for (std::int64_t n = 0; n < xs[i].shape[0]; ++n)
                for (std::int64_t k = 0; k < 4; ++k) {
                    EXPECT_EQ(rs[i]({n, 0, k}), xs[i]({n, k}));
                    EXPECT_EQ(rs[i]({n, 1, k}), xs[i]({n, k}));
                }
    }
}

} // namespace
} // namespace rag
