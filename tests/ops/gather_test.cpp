// gather, gather_grad and positions against per-sample dense loops: i32/i64 ids of ragged,
// dense, unbatched and scalar schemas, f32/f64/bf16 tables with one or two trailing axes; the
// table gradient against float64 central differences; the out-of-range message.
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

// Ids uniform in [0, V) with the given axes and sample shapes.
RaggedTensor random_ids(DType t, std::string_view axes, const std::vector<Shape_>& shapes,
                        std::int64_t V) {
    return random_batch(t, axes, shapes, 0.0, double(V) - 0.01);
}

// The dense reference: out[idx..., tail...] = table[ids[idx...], tail...] per sample.
std::vector<Nd> gather_reference(const Nd& table, const RaggedTensor& ids) {
    std::int64_t d = 1;
    Shape_ tail(table.shape.begin() + 1, table.shape.end());
    for (auto e : tail) d *= e;
    std::vector<Nd> want;
    for (const Nd& s : samples(ids)) {
        Shape_ shape = s.shape;
        shape.insert(shape.end(), tail.begin(), tail.end());
        Nd o(shape);
        for (std::int64_t k = 0; k < s.numel(); ++k)
            for (std::int64_t j = 0; j < d; ++j)
                o.v[std::size_t(k * d + j)] =
                    table.v[std::size_t(std::int64_t(s.v[std::size_t(k)]) * d + j)];
        want.push_back(o);
    }
    return want;
}

struct IdsCase {
    const char* axes;
    std::vector<Shape_> shapes;
    bool batched = true;
};

const std::vector<IdsCase> ids_cases = {
    {"~N", {{3}, {0}, {5}, {1}}},
    {"~N, 2", {{2, 2}, {0, 2}, {4, 2}}},
    {"3", {{3}, {3}}},
    {"~N, ~M", {{2, 3}, {0, 1}, {1, 0}, {2, 2}}},
    {"4", {{4}}, false},
    {"", {{}}, false},
};

RaggedTensor ids_for(DType t, const IdsCase& c, std::int64_t V) {
    if (c.batched) return random_ids(t, c.axes, c.shapes, V);
    return RaggedTensor::dense(random_ids(t, c.axes, c.shapes, V).to_list()[0]);
}

TEST(Gather, EveryIdsSchemaAndTableDtype) {
    const std::int64_t V = 7;
    for (DType it : {DType::i32, DType::i64})
        for (DType tt : {DType::f32, DType::f64, DType::bf16})
            for (const Shape_& tshape : {Shape_{V, 4}, Shape_{V, 2, 3}, Shape_{V}})
                for (const IdsCase& c : ids_cases) {
                    SCOPED_TRACE(std::string(dtype_name(it)) + " " + std::string(dtype_name(tt)) +
                                 " ids [" + c.axes + "]");
                    auto table = random_dense(tt, tshape);
                    auto ids = ids_for(it, c, V);
                    auto y = evaluate("gather", {table, ids});
                    Schema want{tt, ids.shape()};
                    for (std::size_t a = 1; a < tshape.size(); ++a)
                        want.shape.axes.push_back(Axis::fixed_of(tshape[a]));
                    EXPECT_EQ(y.schema(), want);
                    // Copies are exact in every dtype.
                    EXPECT_TRUE(samples_close(y, gather_reference(Nd::of(table.to_dense()), ids),
                                              0.0, 0.0));
                }
}

TEST(Gather, SchemaOfTheSpecExample) {
    Schema emb{DType::f32, Shape{false, parse_axes("30522, 128")}};
    Schema ids{DType::i32, Shape{true, parse_axes("~N")}};
    EXPECT_EQ(infer_schema(OpTable::builtin().at("gather"), std::vector{emb, ids}, {}).str(),
              "f32[B, ~N, 128]");
}

TEST(Gather, TableGradientMatchesCentralDifferences) {
    const std::int64_t V = 5;
    for (DType it : {DType::i32, DType::i64})
        for (const IdsCase& c : ids_cases) {
            SCOPED_TRACE(std::string("ids [") + c.axes + "]");
            auto table = random_dense(DType::f64, {V, 3});
            auto ids = ids_for(it, c, V);
            check_vjp("gather", {table, ids});
            auto g = evaluate("gather", {table, ids});
            auto gg = RaggedTensor::from_f64(DType::f64, g.structure_ptr(), g.to_f64());
            check_vjp("gather_grad", {gg, ids, table});
        }
}

TEST(Gather, GradientSumsRowsOfRepeatedIdsAndZerosTheOthers) {
    auto table = random_dense(DType::f64, {4, 2});
    std::vector<DenseArray> list = {DenseArray::from_f64(DType::i64, {3}, {2, 0, 2}),
                                    DenseArray::from_f64(DType::i64, {1}, {2})};
    auto ids = RaggedTensor::from_list(list, "~N");
    auto y = evaluate("gather", {table, ids});
    std::vector<double> gv(std::size_t(y.numel()));
    for (std::size_t k = 0; k < gv.size(); ++k) gv[k] = double(k + 1);
    auto g = RaggedTensor::from_f64(DType::f64, y.structure_ptr(), gv);
    auto dt = evaluate("gather_grad", {g, ids, table});
    // rows: id 2 at packed 0, 2, 3 -> (1+5+7, 2+6+8); id 0 at packed 1 -> (3, 4).
    EXPECT_EQ(dt.to_f64(), (std::vector<double>{3, 4, 0, 0, 13, 16, 0, 0}));
}

TEST(Gather, OutOfRangeIdsNameTheSamplePositionIdAndV) {
    auto table = random_dense(DType::f32, {5, 2});
    std::vector<DenseArray> list = {DenseArray::from_f64(DType::i32, {2, 2}, {0, 1, 2, 3}),
                                    DenseArray::from_f64(DType::i32, {3, 2}, {4, 0, 1, 7, 1, 1})};
    auto ids = RaggedTensor::from_list(list, "~N, 2");
    const std::string want =
        "gather: sample 1, position (1, 1): id 7 is outside [0, 5) for a table of V = 5 rows";
    EXPECT_EQ(error_of([&] { evaluate("gather", {table, ids}); }), want);
    auto neg = RaggedTensor::dense(DenseArray::from_f64(DType::i64, {3}, {0, -1, 2}));
    EXPECT_EQ(error_of([&] {
                  evaluate("gather", {table, neg});
              }),
              "gather: position (1,): id -1 is outside [0, 5) for a table of V = 5 rows");
    auto g = RaggedTensor::zeros(
        DType::f32, Structure::make(Shape{true, parse_axes("~N, 2, 2")}, 2, {2, 2, 2, 3, 2, 2}));
    EXPECT_EQ(error_of([&] {
                  evaluate("gather_grad", {g, ids, table});
              }),
              "gather_grad: sample 1, position (1, 1): id 7 is outside [0, 5) for a table of V "
              "= 5 rows");
}

TEST(Gather, TypeErrors) {
    auto table = random_dense(DType::f32, {5, 2});
    auto ids = random_ids(DType::i32, "~N", {{2}}, 5);
    auto fids = random_batch(DType::f32, "~N", {{2}});
    auto batched = random_batch(DType::f32, "5", {{5}});
    auto itable = random_dense(DType::i32, {5, 2});
    EXPECT_EQ(error_of([&] {
                  evaluate("gather", {table, fids});
              }),
              "gather: ids must be i32 or i64, got f32[B, ~N]");
    EXPECT_EQ(error_of([&] {
                  evaluate("gather", {batched, RaggedTensor::dense(ids.to_list()[0])});
              }),
              "gather: a batched table T[B, ~N, ...] is gathered per sample, so ids must be "
              "batched too, got i32[2]");
    EXPECT_EQ(error_of([&] {
                  evaluate("gather", {random_batch(DType::f32, "~N, ~M", {{5, 2}}), ids});
              }),
              "gather: the table's rows must be dense (T[V, ...], or T[B, ~N, ...] gathered per "
              "sample), got f32[B, ~N, ~M]");
    EXPECT_EQ(error_of([&] {
                  evaluate("gather", {itable, ids});
              }),
              "gather: the table must be a floating-point array, got i32[5, 2]");
    auto scalar = RaggedTensor::dense(DenseArray::from_f64(DType::f32, {}, {1.0}));
    EXPECT_NE(error_of([&] {
                  evaluate("gather", {scalar, ids});
              }).find("T[V, ...]"),
              std::string::npos);
    auto g = random_batch(DType::f32, "~N, 3", {{2, 3}});
    EXPECT_NE(error_of([&] {
                  evaluate("gather_grad", {g, ids, table});
              }).find("does not match"),
              std::string::npos);
}

// A batched table T[B, ~N, ...] is gathered per sample: sample b's ids index its own N_b rows
// (the padded tier reorders patches this way). Forward against per-sample loops, the table
// gradient against central differences and against per-sample sums, the range per sample.
TEST(Gather, BatchedTablesAreGatheredPerSample) {
    const std::vector<Shape_> rows = {{3, 2}, {0, 2}, {5, 2}, {1, 2}};
    const std::vector<Shape_> picks = {{4}, {0}, {6}, {2}};
    for (DType it : {DType::i32, DType::i64}) {
        SCOPED_TRACE(dtype_name(it));
        auto table = random_batch(DType::f64, "~N, 2", rows);
        std::vector<DenseArray> list;
        for (std::size_t b = 0; b < rows.size(); ++b)
            list.push_back(random_ids(it, "~M", {picks[b]}, std::max<std::int64_t>(rows[b][0], 1))
                               .to_list()[0]);
        auto ids = RaggedTensor::from_list(list, "~M");
        auto y = evaluate("gather", {table, ids});
        EXPECT_EQ(y.schema().str(), "f64[B, ~M, 2]");
        const auto t = samples(table), i = samples(ids), got = samples(y);
        std::vector<Nd> sums;
        for (std::size_t b = 0; b < rows.size(); ++b) {
            std::vector<Nd> one = gather_reference(t[b], RaggedTensor::dense(ids.to_list()[b]));
            EXPECT_EQ(got[b].v, one[0].v) << "sample " << b;
            Nd sum(t[b].shape); // the gradient of sum(gather(table, ids) * 1)
            for (double id : i[b].v)
                for (std::int64_t j = 0; j < 2; ++j)
                    sum.v[std::size_t(std::int64_t(id) * 2 + j)] += 1;
            sums.push_back(sum);
        }
        check_vjp("gather", {table, ids});
        auto ones = RaggedTensor::from_f64(DType::f64, y.structure_ptr(),
                                           std::vector<double>(std::size_t(y.numel()), 1.0));
        EXPECT_TRUE(samples_close(evaluate("gather_grad", {ones, ids, table}), sums, 0.0, 0.0));
        check_vjp("gather_grad",
                  {RaggedTensor::from_f64(DType::f64, y.structure_ptr(), y.to_f64()), ids, table});
    }
    auto table = random_batch(DType::f32, "~N, 2", rows);
    auto bad = RaggedTensor::from_list(
        {DenseArray::from_f64(DType::i64, {1}, {2}), DenseArray::from_f64(DType::i64, {0}, {}),
         DenseArray::from_f64(DType::i64, {2}, {4, 5}), DenseArray::from_f64(DType::i64, {1}, {0})},
        "~M");
    EXPECT_EQ(error_of([&] {
                  evaluate("gather", {table, bad});
              }),
              "gather: sample 2, position (1,): id 5 is outside [0, 5) for its sample's 5 table "
              "rows");
}

TEST(Positions, IndexAlongTheAxisOnEveryAxisKind) {
    auto x = random_batch(DType::f32, "~N, 3, ~M", {{2, 3, 4}, {0, 3, 1}, {3, 3, 0}, {1, 3, 2}});
    struct Case {
        std::int64_t axis;
        const char* schema;
        int p;
    };
    for (const Case& c :
         {Case{1, "i64[B, ~N]", 0}, Case{2, "i64[B, ~N, 3]", 1}, Case{3, "i64[B, ~N, 3, ~M]", 2},
          Case{-1, "i64[B, ~N, 3, ~M]", 2}, Case{-3, "i64[B, ~N]", 0}}) {
        auto y = evaluate("positions", {x}, {{"axis", c.axis}});
        EXPECT_EQ(y.schema().str(), c.schema);
        std::vector<Nd> want;
        for (const Nd& s : samples(x)) {
            Shape_ shape(s.shape.begin(), s.shape.begin() + c.p + 1);
            Nd o(shape);
            Shape_ idx(shape.size(), 0);
            for (std::int64_t k = 0; k < o.numel(); ++k) {
                o.v[std::size_t(k)] = double(idx[std::size_t(c.p)]);
                for (int a = int(shape.size()) - 1; a >= 0; --a) {
                    if (++idx[std::size_t(a)] < shape[std::size_t(a)]) break;
                    idx[std::size_t(a)] = 0;
                }
            }
            want.push_back(o);
        }
        EXPECT_TRUE(samples_close(y, want, 0.0, 0.0)) << c.axis;
    }
    auto s = random_batch(DType::f64, "L, 2", {{3, 2}, {3, 2}});
    EXPECT_EQ(evaluate("positions", {s}, {{"axis", 1}}).to_f64(),
              (std::vector<double>{0, 1, 2, 0, 1, 2}));
    auto w = random_dense(DType::f32, {2, 3});
    EXPECT_EQ(evaluate("positions", {w}, {{"axis", 1}}).to_f64(),
              (std::vector<double>{0, 1, 2, 0, 1, 2}));
    EXPECT_EQ(evaluate("positions", {w}, {{"axis", 0}}).to_f64(), (std::vector<double>{0, 1}));
    EXPECT_EQ(error_of([&] {
                  evaluate("positions", {x}, {{"axis", 0}});
              }),
              "positions: axis 0 is the batch axis of [B, ~N, 3, ~M]");
    EXPECT_NE(error_of([&] {
                  evaluate("positions", {x}, {{"axis", 4}});
              }).find("out of range"),
              std::string::npos);
    EXPECT_FALSE(OpTable::builtin().at("positions").vjp); // an integer result: no gradient
}

} // namespace
} // namespace rag
