// RaggedTensor construction from lists and padded arrays, round trips for every dtype, and
// the structure invariants after every construction.
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

DenseArray iota(DType t, Shape_ shape, double start = 0) {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    std::vector<double> v;
    for (std::int64_t k = 0; k < n; ++k) v.push_back(start + double(k));
    return DenseArray::from_f64(t, shape, v);
}

TEST(Tensor, FromListToListRoundTripsEveryDtype) {
    for (DType t : all_dtypes) {
        std::vector<DenseArray> list = {iota(t, {2, 3}), iota(t, {0, 3}), iota(t, {1, 3}, 10)};
        auto x = RaggedTensor::from_list(list, "~N, 3");
        EXPECT_EQ(x.schema().str(), std::string(dtype_name(t)) + "[B, ~N, 3]");
        x.structure().validate();
        auto back = x.to_list();
        ASSERT_EQ(back.size(), 3u);
        for (std::size_t i = 0; i < 3; ++i) {
            EXPECT_EQ(back[i].shape, list[i].shape);
            EXPECT_EQ(back[i].bytes, list[i].bytes) << dtype_name(t) << " sample " << i;
        }
    }
}

TEST(Tensor, HalfTypesAreStoredAsSixteenBits) {
    auto x = RaggedTensor::from_list({iota(DType::bf16, {4, 2})}, "~N, 2");
    EXPECT_EQ(x.buffer().nbytes, 4u * 2 * 2);
    EXPECT_EQ(x.to_f64()[7], 7.0);
}

TEST(Tensor, EqualLengthsKeepTheDeclaredRaggedSchema) {
    auto x = RaggedTensor::from_list({iota(DType::f32, {3, 2}), iota(DType::f32, {3, 2})}, "~N, 2");
    EXPECT_EQ(x.schema().str(), "f32[B, ~N, 2]");
    auto inferred = RaggedTensor::from_list({iota(DType::f32, {3, 2}), iota(DType::f32, {3, 2})});
    EXPECT_EQ(inferred.schema().str(), "f32[B, 3, 2]");
    auto varied = RaggedTensor::from_list({iota(DType::f32, {3, 2}), iota(DType::f32, {1, 2})});
    EXPECT_EQ(varied.schema().str(), "f32[B, ~N, 2]");
}

TEST(Tensor, SquareRectangularAndNonLeadingLayouts) {
    auto sq = RaggedTensor::from_list({iota(DType::f64, {2, 2, 3}), iota(DType::f64, {3, 3, 3})},
                                      "~N, ~N, 3");
    EXPECT_EQ(sq.structure().offsets(), (std::vector<std::int64_t>{0, 4, 13}));
    auto rect = RaggedTensor::from_list({iota(DType::f64, {2, 4, 1}), iota(DType::f64, {3, 1, 1})},
                                        "~N, ~M, 1");
    EXPECT_EQ(rect.structure().row_splits()[1], (std::vector<std::int64_t>{0, 4, 8, 9, 10, 11}));
    auto img = RaggedTensor::from_list({iota(DType::f64, {3, 2, 2}), iota(DType::f64, {3, 1, 3})},
                                       "3, ~H, ~W");
    EXPECT_EQ(img.schema().str(), "f64[B, 3, ~H, ~W]");
    EXPECT_EQ(img.structure().offsets(), (std::vector<std::int64_t>{0, 4, 7}));
    // Channel-last storage: element (c=1, h=0, w=1) of sample 0 is at row 1, column 1.
    EXPECT_EQ(img.to_f64()[1 * 3 + 1], 1 * 4 + 0 * 2 + 1);
    for (const auto* t : {&sq, &rect, &img}) {
        auto back = t->to_list();
        EXPECT_EQ(back[1].to_f64(), iota(DType::f64, back[1].shape).to_f64());
    }
}

TEST(Tensor, PaddedAndMask) {
    auto x = RaggedTensor::from_list(
        {iota(DType::f32, {2, 2}), iota(DType::f32, {0, 2}), iota(DType::f32, {3, 2}, 100)},
        "~N, 2");
    DenseArray p = x.to_padded(-1);
    EXPECT_EQ(p.shape, (std::vector<std::int64_t>{3, 3, 2}));
    EXPECT_EQ(p.to_f64(), (std::vector<double>{0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1, 100, 101,
                                               102, 103, 104, 105}));
    DenseArray m = x.mask();
    EXPECT_EQ(m.dtype, DType::boolean);
    EXPECT_EQ(m.to_f64(),
              (std::vector<double>{1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1}));
    auto back = RaggedTensor::from_padded(p, parse_axes("~N, 2"), {{2, 0, 3}});
    EXPECT_EQ(back.to_f64(), x.to_f64());
    EXPECT_TRUE(back.structure().same_as(x.structure()));
}

TEST(Tensor, PaddedPairRoundTrip) {
    auto x = random_batch(DType::f64, "~N, ~N, 2", shapes_for("~N, ~N, 2", {{2}, {0}, {1}, {4}}));
    auto p = x.to_padded(0);
    EXPECT_EQ(p.shape, (std::vector<std::int64_t>{4, 4, 4, 2}));
    auto back = RaggedTensor::from_padded(p, parse_axes("~N, ~N, 2"), {{2, 0, 1, 4}, {2, 0, 1, 4}});
    EXPECT_EQ(back.to_f64(), x.to_f64());
}

TEST(Tensor, DenseAndScalarValues) {
    auto w = RaggedTensor::dense(iota(DType::f32, {2, 3}));
    EXPECT_EQ(w.schema().str(), "f32[2, 3]");
    EXPECT_EQ(w.to_dense().to_f64(), iota(DType::f32, {2, 3}).to_f64());
    auto s = RaggedTensor::dense(DenseArray::from_f64(DType::f64, {}, {2.5}));
    EXPECT_EQ(s.schema().str(), "f64[]");
    EXPECT_EQ(s.item(), 2.5);
    EXPECT_NE(error_of([&] { w.item(); }).find("holds 6 values"), std::string::npos);
}

TEST(Tensor, BadInputNamesTheSample) {
    auto msg = error_of([] {
        RaggedTensor::from_list({iota(DType::f32, {2, 3}), iota(DType::f32, {2, 4})}, "~N, 3");
    });
    EXPECT_NE(msg.find("sample 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(2, 4)"), std::string::npos) << msg;
    msg = error_of([] {
        RaggedTensor::from_list({iota(DType::f32, {2, 3}), iota(DType::f64, {2, 3})}, "~N, 3");
    });
    EXPECT_NE(msg.find("sample 1 has dtype f64"), std::string::npos) << msg;
    msg = error_of([] { RaggedTensor::from_list({iota(DType::f32, {2})}, "~N, 3"); });
    EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
    msg = error_of([] {
        RaggedTensor::from_padded(iota(DType::f32, {2, 3}), parse_axes("~N"), {{1, 4}});
    });
    EXPECT_NE(msg.find("sample 1 has length 4"), std::string::npos) << msg;
}

TEST(Tensor, FromPaddedChecksTheArraySize) {
    DenseArray a{DType::f32, {1, 1 << 20, 4}, {}};
    EXPECT_NE(error_of([&] {
                  RaggedTensor::from_padded(a, parse_axes("~N, 4"), {{1 << 20}});
              }).find("holds 0 bytes"),
              std::string::npos);
}

TEST(Tensor, EmptyBatchesTakeTheirDtype) {
    auto t = RaggedTensor::from_list({}, parse_axes("~N"), DType::i64);
    EXPECT_EQ(t.schema().str(), "i64[B, ~N]");
    EXPECT_EQ(t.batch(), 0);
}

TEST(Tensor, AstypeRoundsThroughTheTargetType) {
    auto x = RaggedTensor::from_list({DenseArray::from_f64(DType::f64, {2}, {1.0 / 3, 1e6})}, "~N");
    auto h = x.astype(DType::f16);
    EXPECT_EQ(h.to_f64()[0], double(half_to_float(float_to_half(float(1.0 / 3)))));
    EXPECT_TRUE(std::isinf(h.to_f64()[1]));
    EXPECT_EQ(describe(x), "f64[B, ~N] B=1 N=[2]");
}

} // namespace
} // namespace rag
