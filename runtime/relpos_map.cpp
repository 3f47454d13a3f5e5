#include "runtime/relpos_map.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <cmath>

namespace rag {
namespace {

// The bucket formulas truncate (T5) or round up (DeBERTa) a ratio of logarithms that is an
// exact integer at some offsets (T5 at n = 16, 32, 64; DeBERTa at |delta| = max_position - 1).
// Rounded logarithms can land just off it, which would move the offset to a neighbouring
// bucket, so values within 1e-9 of an integer are taken as that integer.
double snapped(double x) {
    double r = std::round(x);
    return std::fabs(x - r) < 1e-9 ? r : x;
}

std::string call(std::string_view name, std::int64_t a) {
    return std::string(name) + "(" + std::to_string(a) + ")";
}
std::string call(std::string_view name, std::int64_t a, std::int64_t b) {
    return std::string(name) + "(" + std::to_string(a) + ", " + std::to_string(b) + ")";
}

// Rows for delta in [-D, D] from a function of delta.
template <class Fn> std::vector<std::int64_t> tabulate(std::int64_t D, Fn&& row_of) {
    std::vector<std::int64_t> t;
    for (std::int64_t delta = -D; delta <= D; ++delta) t.push_back(row_of(delta));
    return t;
}

} // namespace

RelposMap::RelposMap(std::string name, std::string str, std::vector<std::int64_t> table,
                     bool bounded)
    : name_(std::move(name)), str_(std::move(str)), bounded_(bounded), table_(std::move(table)) {
    if (table_.size() % 2 == 0)
        fail(str_, ": a map table needs 2D + 1 entries, got ", table_.size());
    for (auto r : table_)
        if (r < 0) fail(str_, ": rows must be non-negative, got ", r);
    rows_ = *std::max_element(table_.begin(), table_.end()) + 1;
    // One interval per row: once the row changes away from r, r may not come back.
    std::vector<bool> seen(std::size_t(rows_), false);
    for (std::size_t k = 0; k < table_.size(); ++k) {
        if (k > 0 && table_[k] == table_[k - 1]) continue;
        if (seen[std::size_t(table_[k])])
            fail(str_, ": row ", table_[k], " covers offsets that are not one interval (again at ",
                 std::int64_t(k) - std::int64_t(table_.size() / 2), ")");
        seen[std::size_t(table_[k])] = true;
    }
    // Shrink to the smallest saturation point: both ends constant beyond it.
    if (!bounded_)
        while (table_.size() > 1 && table_[0] == table_[1] &&
               table_[table_.size() - 1] == table_[table_.size() - 2]) {
            table_.pop_back();
            table_.erase(table_.begin());
        }
    sat_ = std::int64_t(table_.size() / 2);
}

RelposMap RelposMap::identity(std::int64_t L) {
    if (L < 1) fail("identity: L must be at least 1, got ", L);
    return {"identity", call("identity", L),
            tabulate(L - 1, [&](std::int64_t d) { return d + L - 1; }), true};
}

RelposMap RelposMap::clip(std::int64_t D) {
    if (D < 0) fail("clip: the distance must be non-negative, got ", D);
    return {"clip", call("clip", D), tabulate(D, [&](std::int64_t d) { return d + D; }), false};
}

RelposMap RelposMap::t5_buckets(std::int64_t num, std::int64_t max_distance) {
    auto str = call("t5_buckets", num, max_distance);
    const std::int64_t half = num / 2, exact = half / 2;
    if (num < 4 || num % 2) fail(str, ": num must be even and at least 4, got ", num);
    if (max_distance <= exact)
        fail(str, ": max_distance must exceed the ", exact, " exact buckets, got ", max_distance);
    // Public T5 code, bidirectional, on rel = j - i: the first half of the buckets takes
    // rel <= 0, the second rel > 0; `exact` distances get their own bucket, larger ones share
    // log-spaced buckets up to max_distance, beyond which the last bucket of each half is used.
    auto bucket = [&](std::int64_t rel) {
        const std::int64_t base = rel > 0 ? half : 0, n = std::abs(rel);
        if (n < exact) return base + n;
        double x = std::log(double(n) / double(exact)) /
                   std::log(double(max_distance) / double(exact)) * double(half - exact);
        return base + std::min(half - 1, exact + std::int64_t(std::floor(snapped(x))));
    };
    // From n = max_distance on, x >= half - exact: both halves have saturated.
    return {"t5_buckets", str, tabulate(max_distance, [&](std::int64_t d) { return bucket(-d); }),
            false};
}

RelposMap RelposMap::log_buckets(std::int64_t size, std::int64_t max_position) {
    auto str = call("log_buckets", size, max_position);
    const std::int64_t mid = size / 2;
    if (size < 4) fail(str, ": size must be at least 4, got ", size);
    if (max_position - 1 <= mid)
        fail(str, ": max_position must exceed size / 2 + 1 = ", mid + 1, ", got ", max_position);
    // DeBERTa's make_log_bucket_position on delta = i - j: offsets within mid keep their own
    // bucket, larger ones are log-spaced, then shifted by size and clamped to [0, 2 size).
    auto logpos = [&](std::int64_t a) {
        double x = std::log(double(a) / double(mid)) /
                   std::log(double(max_position - 1) / double(mid)) * double(mid - 1);
        return std::int64_t(std::ceil(snapped(x))) + mid;
    };
    auto row = [&](std::int64_t delta) {
        const std::int64_t a = std::abs(delta);
        const std::int64_t b = a <= mid ? delta : (delta < 0 ? -logpos(a) : logpos(a));
        return std::clamp(b + size, std::int64_t(0), 2 * size - 1);
    };
    // logpos grows without bound: once it reaches size both clamps hold (row 0 and 2 size - 1).
    std::int64_t D = mid + 1;
    while (logpos(D) < size) ++D;
    return {"log_buckets", str, tabulate(D, row), false};
}

RelposMap RelposMap::buckets(std::vector<std::int64_t> table, std::int64_t D) {
    auto str = call("buckets", D);
    if (D < 0 || std::int64_t(table.size()) != 2 * D + 1)
        fail(str, ": the table needs 2D + 1 rows for delta in [-D, D], got ", table.size());
    return {"buckets", str, std::move(table), false};
}

std::int64_t RelposMap::row(std::int64_t delta) const {
    if (bounded_ && std::abs(delta) > sat_)
        fail(str_, ": offset delta = ", delta, " is outside |delta| < L = ", sat_ + 1);
    return table_[std::size_t(std::clamp(delta, -sat_, sat_) + sat_)];
}

std::vector<std::int64_t> RelposMap::expand(std::int64_t D) const {
    if (D < 0) fail(str_, ": expand needs D >= 0, got ", D);
    return tabulate(D, [&](std::int64_t d) { return row(d); });
}

} // namespace rag
