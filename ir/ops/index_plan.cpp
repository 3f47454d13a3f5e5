#include "ir/ops/index_plan.hpp"

#include "ir/ops/derived_names.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <charconv>
#include <string>

namespace rag {
namespace {

std::string axis_str(const Axis& a) {
    if (a.kind == AxisKind::fixed) return std::to_string(a.extent);
    return (a.is_ragged() ? "~" : "") + a.name;
}

std::string trim(std::string_view s) {
    auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string_view::npos ? "" : std::string(s.substr(b, e - b + 1));
}

std::vector<std::string> split(std::string_view s, char sep) {
    std::vector<std::string> items;
    for (std::size_t start = 0;;) {
        auto at = s.find(sep, start);
        items.push_back(trim(s.substr(start, at - start)));
        if (at == std::string_view::npos) return items;
        start = at + 1;
    }
}

// An optional integer: "" gives nullopt; anything but an integer is an error.
std::optional<std::int64_t> parse_int(const std::string& s, std::string_view item,
                                      std::string_view spec) {
    if (s.empty()) return std::nullopt;
    std::int64_t v = 0;
    const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
    auto [end, ec] = std::from_chars(begin, s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || begin == end ||
        (begin != s.data() && *begin == '-'))
        fail("index: bad item '", item, "' in spec '", spec, "'");
    return v;
}

// A Python slice bound: negative counts from the end, then clamped to [0, n].
std::int64_t clamp_bound(std::int64_t b, std::int64_t n) {
    if (b < 0) b = b < -n ? 0 : b + n;
    return std::clamp<std::int64_t>(b, 0, n);
}

AxisSelect parse_slice(const std::string& item, std::string_view spec) {
    auto parts = split(item, ':');
    if (parts.size() > 3) fail("index: bad item '", item, "' in spec '", spec, "'");
    AxisSelect s;
    s.lo = parse_int(parts[0], item, spec);
    s.hi = parse_int(parts[1], item, spec);
    if (parts.size() == 3) {
        s.step = parse_int(parts[2], item, spec).value_or(1);
        if (s.step < 1)
            fail("index: the step of '", item, "' must be >= 1, got ", s.step,
                 " (negative and zero steps are not supported)");
    }
    return s;
}

} // namespace

std::pair<std::int64_t, std::int64_t> AxisSelect::resolve(std::int64_t n) const {
    if (!slice) return {index, 1};
    const std::int64_t start = lo ? clamp_bound(*lo, n) : 0;
    const std::int64_t stop = hi ? clamp_bound(*hi, n) : n;
    return {start, stop > start ? (stop - start + step - 1) / step : 0};
}

std::string derived_axis_name(const std::string& base, const AxisSelect& s) {
    // Canonical forms by length function: "k:" -> N - k, ":k" -> min(N, k). Omitted bounds and
    // a zero start are the same; anything else is written literally.
    const std::int64_t lo = s.lo.value_or(0);
    // "k:" and "k::s" compose with the derivations before them (derived_names.hpp).
    if (!s.hi && lo >= 0) return slice_axis_name(base, lo, s.step);
    std::string body;
    if (!s.hi) {
        if (lo >= 0)
            body = lo == 0 ? ":" : std::to_string(lo) + ":"; // N - lo
        else
            body = ":" + std::to_string(-lo); // min(N, k)
    } else if (*s.hi < 0 && lo >= 0) {
        body = std::to_string(lo - *s.hi) + ":"; // N - lo - k
    } else if (*s.hi >= 0 && lo == 0) {
        body = ":" + std::to_string(*s.hi);
    } else {
        body = std::to_string(lo) + ":" + std::to_string(*s.hi);
    }
    if (s.step != 1) body += ":" + std::to_string(s.step);
    return base + "[" + body + "]";
}

IndexPlan::Sample IndexPlan::sample(const Structure& x, std::int64_t i) const {
    Sample s;
    const std::size_t rank = sel.size();
    s.start.resize(rank);
    s.step.resize(rank);
    std::vector<std::int64_t> extent(rank);
    for (std::size_t a = 0; a < rank; ++a) {
        auto [start, len] = sel[a].resolve(x.size(i, int(a)));
        s.start[a] = start;
        s.step[a] = sel[a].slice ? sel[a].step : 0;
        extent[a] = len;
    }
    for (std::size_t o = 0; o < out.axes.size(); ++o)
        s.shape.push_back(out_src[o] < 0 ? 1 : extent[std::size_t(out_src[o])]);
    return s;
}

bool IndexPlan::whole_rows(const Shape& x) const {
    for (std::size_t a = 0; a < sel.size(); ++a)
        if (!x.axes[a].is_ragged() && !sel[a].keeps_all()) return false;
    return true;
}

IndexPlan plan_index(const Shape& x, std::string_view spec) {
    const int rank = x.sample_rank();
    IndexPlan p;
    p.out.batched = x.batched;
    p.x_out.assign(std::size_t(rank), -1);
    p.sel.assign(std::size_t(rank), AxisSelect{});
    std::vector<std::string> items;
    if (!trim(spec).empty()) items = split(spec, ',');
    std::size_t k = 0;
    if (x.batched && !items.empty()) {
        if (items[0] != ":")
            fail("index: the first item must be ':' (the batch axis of ", shape_str(x), "), got '",
                 items[0], "'");
        k = 1;
    }
    auto keep = [&](int s, Axis ax, AxisSelect sel) {
        p.x_out[std::size_t(s)] = p.out.sample_rank();
        p.sel[std::size_t(s)] = sel;
        p.out.axes.push_back(std::move(ax));
        p.out_src.push_back(s);
    };
    int s = 0; // next axis of x
    for (; k < items.size(); ++k) {
        const std::string& it = items[k];
        if (it.empty()) fail("index: empty item in spec '", spec, "'");
        if (it == "new") {
            p.out.axes.push_back(Axis::fixed_of(1));
            p.out_src.push_back(-1);
            continue;
        }
        if (s == rank) fail("index: too many items in '", spec, "' for ", shape_str(x));
        const Axis& ax = x.axes[std::size_t(s)];
        const int logical = s + (x.batched ? 1 : 0);
        if (it.find(':') == std::string::npos) {
            if (ax.kind != AxisKind::fixed)
                fail("index: axis ", logical, " is ", ax.is_ragged() ? "ragged " : "symbolic ",
                     axis_str(ax), " and accepts only slices, got '", it, "'");
            const std::int64_t n = ax.extent;
            std::int64_t i = *parse_int(it, it, spec);
            if (i < -n || i >= n)
                fail("index: index ", i, " is out of range for axis ", logical, " of extent ", n);
            AxisSelect sel;
            sel.slice = false;
            sel.index = i < 0 ? i + n : i;
            p.sel[std::size_t(s++)] = sel;
            continue;
        }
        AxisSelect sel = parse_slice(it, spec);
        if (ax.kind == AxisKind::fixed)
            keep(s, Axis::fixed_of(sel.resolve(ax.extent).second), sel);
        else if (sel.keeps_all())
            keep(s, ax, sel);
        else
            keep(s, Axis{ax.kind, 0, derived_axis_name(ax.name, sel)}, sel);
        ++s;
    }
    for (; s < rank; ++s) keep(s, x.axes[std::size_t(s)], AxisSelect{});
    return p;
}

} // namespace rag
