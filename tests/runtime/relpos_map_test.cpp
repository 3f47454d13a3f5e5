// Relative-position maps against REFERENCE.md section 2's exact values, their saturation and
// the one-interval-per-row property the fused kernels rely on.
#include "runtime/relpos_map.hpp"

#include "tests/support/testing.hpp"

#include <map>

namespace rag {
namespace {

using testing::error_of;

// Every row's offsets in [-(D + 1), D + 1] form one interval (one step past saturation on
// each side, so the saturated rows are included).
::testing::AssertionResult rows_contiguous(const RelposMap& m, std::int64_t D) {
    std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> span; // row -> first, last
    std::map<std::int64_t, std::int64_t> count;
    for (std::int64_t d = -D; d <= D; ++d) {
        auto r = m.row(d);
        if (!span.count(r)) span[r] = {d, d};
        span[r].second = d;
        ++count[r];
    }
    for (auto [r, s] : span)
        if (s.second - s.first + 1 != count[r])
            return ::testing::AssertionFailure() << m.str() << ": row " << r << " spans " << s.first
                                                 << ".." << s.second << " with gaps";
    return ::testing::AssertionSuccess();
}

TEST(RelposMap, T5ReferenceBuckets) {
    // rel = j - i -> bucket; the map takes delta = i - j = -rel.
    const std::pair<int, int> ref[] = {{-200, 15}, {-91, 15}, {-90, 14}, {-64, 14}, {-63, 13},
                                       {-32, 12},  {-31, 11}, {-16, 10}, {-15, 9},  {-8, 8},
                                       {-7, 7},    {-1, 1},   {0, 0},    {1, 17},   {7, 23},
                                       {8, 24},    {15, 25},  {16, 26},  {31, 27},  {32, 28},
                                       {63, 29},   {64, 30},  {90, 30},  {91, 31},  {200, 31}};
    auto m = RelposMap::t5_buckets();
    EXPECT_EQ(m.rows(), 32);
    EXPECT_EQ(m.str(), "t5_buckets(32, 128)");
    for (auto [rel, bucket] : ref) EXPECT_EQ(m.row(-rel), bucket) << "rel = " << rel;
}

TEST(RelposMap, T5NeverUsesBucket16AndSaturates) {
    auto m = RelposMap::t5_buckets();
    EXPECT_EQ(m.saturation(), 91);
    for (std::int64_t d = -300; d <= 300; ++d) EXPECT_NE(m.row(d), 16) << d;
    EXPECT_EQ(m.row(91), 15);
    EXPECT_EQ(m.row(-91), 31);
    EXPECT_EQ(m.row(100000), 15);
    EXPECT_EQ(m.row(-100000), 31);
    // A small configuration: 8 buckets, 2 exact per half, saturated from |rel| = 6.
    auto s = RelposMap::t5_buckets(8, 16);
    EXPECT_EQ(s.rows(), 8);
    EXPECT_EQ(s.saturation(), 6);
    EXPECT_EQ(s.expand(7),
              (std::vector<std::int64_t>{7, 7, 6, 6, 6, 6, 5, 0, 1, 2, 2, 2, 2, 3, 3}));
}

TEST(RelposMap, DebertaReferenceRows) {
    const std::pair<int, int> ref[] = {{-5000, 0},  {-512, 0},   {-511, 1},  {-300, 49}, {-200, 87},
                                       {-129, 127}, {-128, 128}, {-1, 255},  {0, 256},   {1, 257},
                                       {128, 384},  {129, 385},  {200, 425}, {300, 463}, {510, 511},
                                       {511, 511},  {5000, 511}};
    auto m = RelposMap::log_buckets();
    EXPECT_EQ(m.rows(), 512);
    EXPECT_EQ(m.str(), "log_buckets(256, 512)");
    for (auto [delta, row] : ref) EXPECT_EQ(m.row(delta), row) << "delta = " << delta;
    EXPECT_EQ(m.saturation(), 512);
}

TEST(RelposMap, IdentityAndClipRows) {
    auto id = RelposMap::identity(4);
    EXPECT_EQ(id.rows(), 7);
    EXPECT_EQ(id.saturation(), 3);
    EXPECT_EQ(id.expand(3), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6}));
    auto c = RelposMap::clip(2);
    EXPECT_EQ(c.rows(), 5);
    EXPECT_EQ(c.saturation(), 2);
    EXPECT_EQ(c.str(), "clip(2)");
    EXPECT_EQ(c.name(), "clip");
    EXPECT_EQ(c.expand(4), (std::vector<std::int64_t>{0, 0, 0, 1, 2, 3, 4, 4, 4}));
    auto c0 = RelposMap::clip(0);
    EXPECT_EQ(c0.rows(), 1);
    EXPECT_EQ(c0.row(-9), 0);
    EXPECT_EQ(c0.row(9), 0);
}

TEST(RelposMap, SaturationIsTheSmallestConstantPoint) {
    for (const auto& m : {RelposMap::clip(5), RelposMap::t5_buckets(), RelposMap::t5_buckets(8, 16),
                          RelposMap::log_buckets(), RelposMap::log_buckets(8, 16)}) {
        const auto D = m.saturation();
        for (std::int64_t d = D; d <= D + 50; ++d) {
            EXPECT_EQ(m.row(d), m.row(D)) << m.str() << " at " << d;
            EXPECT_EQ(m.row(-d), m.row(-D)) << m.str() << " at " << -d;
        }
        EXPECT_TRUE(m.row(D - 1) != m.row(D) || m.row(1 - D) != m.row(-D)) << m.str();
    }
}

TEST(RelposMap, GeneralBuckets) {
    // Saturation shrinks to the smallest point: offsets -3..3 -> 0 0 1 2 3 3 3.
    auto m = RelposMap::buckets({0, 0, 1, 2, 3, 3, 3}, 3);
    EXPECT_EQ(m.rows(), 4);
    EXPECT_EQ(m.saturation(), 2);
    EXPECT_EQ(m.row(-7), 0);
    EXPECT_EQ(m.row(7), 3);
    // T5-like order (not monotone in delta) is fine: every row is one interval.
    EXPECT_EQ(RelposMap::buckets({4, 3, 0, 1, 2}, 2).rows(), 5);
    auto msg = error_of([] { RelposMap::buckets({0, 1, 0}, 1); });
    EXPECT_NE(msg.find("row 0 covers offsets that are not one interval"), std::string::npos) << msg;
    EXPECT_NE(error_of([] { RelposMap::buckets({0, 1}, 1); }).find("2D + 1"), std::string::npos);
    EXPECT_NE(error_of([] {
                  RelposMap::buckets({0, -1, 2}, 1);
              }).find("non-negative"),
              std::string::npos);
}

TEST(RelposMap, EveryRowIsOneIntervalOfOffsets) {
    for (const auto& m :
         {RelposMap::identity(9), RelposMap::clip(0), RelposMap::clip(7), RelposMap::t5_buckets(),
          RelposMap::t5_buckets(8, 16), RelposMap::t5_buckets(6, 5), RelposMap::log_buckets(),
          RelposMap::log_buckets(8, 16)}) {
        const auto D = m.name() == "identity" ? m.saturation() : m.saturation() + 1;
        EXPECT_TRUE(rows_contiguous(m, D));
        auto e = m.expand(m.saturation());
        EXPECT_EQ(std::int64_t(e.size()), 2 * m.saturation() + 1) << m.str();
    }
}

TEST(RelposMap, Errors) {
    auto id = RelposMap::identity(5);
    EXPECT_EQ(id.row(4), 8);
    EXPECT_EQ(id.row(-4), 0);
    auto msg = error_of([&] { id.row(5); });
    EXPECT_NE(msg.find("identity(5)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("delta = 5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("L = 5"), std::string::npos) << msg;
    EXPECT_NE(error_of([&] { id.row(-6); }).find("delta = -6"), std::string::npos);
    EXPECT_NE(error_of([] { RelposMap::identity(0); }).find("at least 1"), std::string::npos);
    EXPECT_NE(error_of([] { RelposMap::clip(-1); }).find("non-negative"), std::string::npos);
    EXPECT_NE(error_of([] { RelposMap::t5_buckets(7, 128); }).find("even"), std::string::npos);
    EXPECT_NE(error_of([] { RelposMap::t5_buckets(32, 8); }).find("max_distance"),
              std::string::npos);
    EXPECT_NE(error_of([] { RelposMap::log_buckets(2, 512); }).find("size"), std::string::npos);
    EXPECT_NE(error_of([] { RelposMap::log_buckets(256, 100); }).find("max_position"),
              std::string::npos);
}

} // namespace
} // namespace rag
