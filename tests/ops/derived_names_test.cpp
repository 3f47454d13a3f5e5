// Derived ragged names (ir/ops/derived_names.hpp): every chain of up to three steps (slices,
// growths, scales, windows) against its length rule evaluated directly for every length
// 0..120: chains with one name must have one length rule (equal names are equal axes), and the
// merges the language reference shows happen.
#include "ir/ops/derived_names.hpp"
#include "ir/ops/image_plan.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <map>

namespace rag {
namespace {

struct Step {
    std::function<std::string(const std::string&)> name;
    std::function<std::int64_t(std::int64_t)> len;
    std::string what;
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
    return a <= 0 ? 0 : (a + b - 1) / b;
}

std::vector<Step> steps() {
    std::vector<Step> out;
    for (std::int64_t e : {0, 1, 2, 3})
        for (std::int64_t s : {1, 2, 3})
            out.push_back({[=](const std::string& b) { return slice_axis_name(b, e, s); },
                           [=](std::int64_t n) { return ceil_div(n - e, s); },
                           "slice " + std::to_string(e) + "::" + std::to_string(s)});
    for (std::int64_t g : {1, 2})
        out.push_back({[=](const std::string& b) { return grow_axis_name(b, g); },
                       [=](std::int64_t n) { return n + g; }, "grow " + std::to_string(g)});
    for (std::int64_t m : {2, 3})
        out.push_back({[=](const std::string& b) { return scale_axis_name(b, m); },
                       [=](std::int64_t n) { return n * m; }, "scale " + std::to_string(m)});
    // Windows: (k, s, lo, hi, d) as conv2d and the pools use them.
    for (auto w : std::vector<Window>{{3, 2, 1, 1, 1},
                                      {1, 2, 0, 0, 1},
                                      {2, 2, 0, 0, 1},
                                      {1, 1, 1, 1, 1},
                                      {3, 1, 2, 2, 2},
                                      {5, 3, 0, 0, 1}})
        out.push_back(
            {[=](const std::string& b) { return window_axis_name(b, w.k, w.s, w.lo, w.hi, w.d); },
             [=](std::int64_t n) { return w.out(n); },
             "window k" + std::to_string(w.k) + " s" + std::to_string(w.s)});
    return out;
}

TEST(DerivedNames, EqualNamesHaveEqualLengthsForEveryLength) {
    const auto all = steps();
    std::map<std::string, std::pair<std::string, std::vector<std::int64_t>>> seen;
    std::function<void(const std::string&, std::function<std::int64_t(std::int64_t)>, std::string,
                       int)>
        walk = [&](const std::string& name, std::function<std::int64_t(std::int64_t)> len,
                   std::string what, int depth) {
            std::vector<std::int64_t> lens;
            for (std::int64_t n = 0; n <= 120; ++n) lens.push_back(len(n));
            auto [it, fresh] = seen.try_emplace(name, what, lens);
            EXPECT_TRUE(fresh || it->second.second == lens)
                << name << ": " << it->second.first << " and " << what << " differ";
            if (depth == 3) return;
            for (const Step& s : all)
                walk(
                    s.name(name), [len, f = s.len](std::int64_t n) { return f(len(n)); },
                    what + ", " + s.what, depth + 1);
        };
    walk(
        "H", [](std::int64_t n) { return n; }, "H", 0);
    EXPECT_GT(seen.size(), 1000u);
}

TEST(DerivedNames, MergesAsTheReferenceSays) {
    EXPECT_EQ(window_axis_name("H", 3, 1, 1, 1, 1), "H");       // "same"
    EXPECT_EQ(window_axis_name("H", 3, 2, 1, 1, 1), "H[::2]");  // ceil(H / 2)
    EXPECT_EQ(window_axis_name("H", 2, 2, 0, 0, 1), "H[1::2]"); // floor(H / 2)
    EXPECT_EQ(window_axis_name("H", 3, 1, 0, 0, 1), "H[2:]");
    EXPECT_EQ(window_axis_name("H", 1, 1, 1, 1, 1), "H[+2]");
    EXPECT_EQ(window_axis_name("H", 1, 2, 1, 1, 1), "H[+2][::2]");
    EXPECT_EQ(slice_axis_name("H[::2]", 0, 2), "H[::4]");
    EXPECT_EQ(slice_axis_name("N[1:]", 1, 1), "N[2:]");
    EXPECT_EQ(slice_axis_name("N[1::2]", 1, 2), "N[3::4]");
    EXPECT_EQ(slice_axis_name("H[+2]", 2, 1), "H");
    EXPECT_EQ(slice_axis_name("H[+2]", 3, 2), "H[1::2]");
    EXPECT_EQ(grow_axis_name("H[+2]", 2), "H[+4]");
    EXPECT_EQ(scale_axis_name("H[::4][*2]", 2), "H[::4][*4]");
    EXPECT_EQ(slice_axis_name("N[:3]", 1, 1), "N[:3][1:]"); // an upper bound: not merged
}

} // namespace
} // namespace rag
