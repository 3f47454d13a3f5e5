// Ragged structure: offsets, row splits, dim order and the paper's examples.
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using testing::error_of;

StructurePtr make(std::string_view axes, std::int64_t B, std::vector<std::int64_t> sizes) {
    return Structure::make(Shape{true, parse_axes(axes)}, B, std::move(sizes));
}

TEST(Structure, SquarePairOffsetsFromThePaper) {
    // Lengths [2, 3] broadcast to pairs: element sizes 4 and 9, offsets [0, 4, 13].
    auto st = make("~N, ~N, 8", 2, {2, 2, 8, 3, 3, 8});
    EXPECT_EQ(st->offsets(), (std::vector<std::int64_t>{0, 4, 13}));
    EXPECT_EQ(st->row_width(), 8);
    EXPECT_EQ(st->numel(), 13 * 8);
    ASSERT_EQ(st->row_splits().size(), 2u);
    EXPECT_EQ(st->row_splits()[0], st->offsets());
    EXPECT_EQ(st->row_splits()[1], (std::vector<std::int64_t>{0, 2, 4, 7, 10, 13}));
}

TEST(Structure, RectangularPairInnerSplitsHaveOnePlusSumNEntries) {
    auto st = make("~N, ~M, 2", 3, {2, 5, 2, 1, 3, 2, 3, 0, 2});
    EXPECT_EQ(st->offsets(), (std::vector<std::int64_t>{0, 10, 13, 13}));
    // 1 + (2 + 1 + 3) entries, each segment holding M_i rows.
    EXPECT_EQ(st->row_splits()[1], (std::vector<std::int64_t>{0, 5, 10, 13, 13, 13, 13}));
}

TEST(Structure, NonLeadingRaggedAxesAreStoredFirst) {
    auto st = make("3, ~H, ~W", 2, {3, 2, 4, 3, 1, 5});
    EXPECT_EQ(st->dim_order(), (std::vector<int>{2, 0, 1}));
    EXPECT_EQ(st->row_width(), 3);
    EXPECT_EQ(st->offsets(), (std::vector<std::int64_t>{0, 8, 13}));
    // Logical strides of sample 0 (3, 2, 4) stored as (2, 4, 3).
    EXPECT_EQ(st->sample_strides(0), (std::vector<std::int64_t>{1, 12, 3}));
}

TEST(Structure, ZeroVolumeSamplesStayDistinct) {
    auto a = make("~N, ~M", 1, {0, 3});
    auto b = make("~N, ~M", 1, {0, 7});
    EXPECT_EQ(a->offsets(), b->offsets());
    EXPECT_FALSE(a->same_as(*b));
    EXPECT_EQ(a->size(0, 1), 3);
    EXPECT_EQ(b->size(0, 1), 7);
}

TEST(Structure, NoRaggedAxesIsDenseBatch) {
    auto st = make("4", 3, {4, 4, 4});
    EXPECT_EQ(st->offsets(), (std::vector<std::int64_t>{0, 1, 2, 3}));
    EXPECT_TRUE(st->row_splits().empty());
}

TEST(Structure, EmptyBatch) {
    auto st = make("~N, 4", 0, {});
    EXPECT_EQ(st->rows(), 0);
    EXPECT_EQ(st->offsets(), (std::vector<std::int64_t>{0}));
}

TEST(Structure, SharedRaggedNameMustAgreePerSample) {
    auto msg = error_of([] { make("~N, ~N", 2, {2, 2, 3, 4}); });
    EXPECT_NE(msg.find("sample 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 and 4"), std::string::npos) << msg;
}

TEST(Structure, StaticExtentIsChecked) {
    auto msg = error_of([] { make("~N, 4", 2, {2, 4, 3, 5}); });
    EXPECT_NE(msg.find("sample 1 has shape (3, 5)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("static extent 4"), std::string::npos) << msg;
}

TEST(Structure, ExtentProductsCannotOverflow) {
    const std::int64_t big = std::int64_t(1) << 32;
    EXPECT_NE(error_of([&] {
                  make("~N, ~M", 1, {big, big});
              }).find("more than a tensor can address"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  make("~N, ~M, 0", 1, {big, big, 0});
              }).find("more than a tensor can address"),
              std::string::npos);
}

TEST(Structure, ParseAxes) {
    auto a = parse_axes(" ~N,~N , 128, C");
    ASSERT_EQ(a.size(), 4u);
    EXPECT_EQ(a[0], Axis::ragged_of("N"));
    EXPECT_EQ(a[2], Axis::fixed_of(128));
    EXPECT_EQ(a[3], Axis::symbolic_of("C"));
    EXPECT_TRUE(parse_axes("").empty());
    EXPECT_NE(error_of([] { parse_axes("~3"); }), "");
    EXPECT_NE(error_of([] { parse_axes("N,,M"); }), "");
    EXPECT_NE(error_of([] { parse_axes("3x"); }), "");
}

TEST(Schema, PrintsLikeTheLanguage) {
    Schema s{DType::f32, Shape{true, parse_axes("~N, ~N, 128")}};
    EXPECT_EQ(s.str(), "f32[B, ~N, ~N, 128]");
    EXPECT_EQ((Schema{DType::bf16, Shape{false, {}}}).str(), "bf16[]");
    // Lengths are not part of the schema.
    auto a = make("~N, 2", 2, {1, 2, 5, 2});
    auto b = make("~N, 2", 3, {4, 2, 4, 2, 4, 2});
    EXPECT_EQ(a->shape(), b->shape());
}

} // namespace
} // namespace rag
