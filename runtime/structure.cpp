#include "runtime/structure.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <cctype>
#include <string>

namespace rag {
namespace {

// Extent products are checked, so a sample can neither wrap around 2^63 nor ask for more rows
// (or row-split entries) than any machine holds.
constexpr std::int64_t max_rows = std::int64_t(1) << 40;

std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::int64_t sample) {
    std::int64_t r;
    if (__builtin_mul_overflow(a, b, &r) || r > max_rows)
        fail("sample ", sample, ": extents multiply to more than a tensor can address");
    return r;
}

std::int64_t checked_add(std::int64_t a, std::int64_t b, std::int64_t sample) {
    std::int64_t r;
    if (__builtin_add_overflow(a, b, &r) || r > max_rows)
        fail("sample ", sample, ": the batch holds more rows than a tensor can address");
    return r;
}

std::string sample_shape_str(std::span<const std::int64_t> s) {
    std::string out = "(";
    for (std::size_t a = 0; a < s.size(); ++a) out += (a ? ", " : "") + std::to_string(s[a]);
    return out + (s.size() == 1 ? ",)" : ")");
}

} // namespace

StructurePtr Structure::make(Shape shape, std::int64_t batch, std::vector<std::int64_t> sizes) {
    auto st = std::shared_ptr<Structure>(new Structure());
    const int d = shape.sample_rank();
    if (!shape.batched && batch != 1)
        fail("an unbatched value has exactly one sample, got ", batch);
    if (batch < 0) fail("batch size must be >= 0, got ", batch);
    if (std::int64_t(sizes.size()) != batch * d)
        fail("sizes hold ", sizes.size(), " entries; expected B * rank = ", batch, " * ", d);
    for (std::int64_t i = 0; i < batch; ++i) {
        std::span<const std::int64_t> s(sizes.data() + i * d, std::size_t(d));
        for (int a = 0; a < d; ++a) {
            const Axis& ax = shape.axes[a];
            if (s[a] < 0) fail("sample ", i, ": axis ", a + shape.batched, " has extent ", s[a]);
            if (ax.kind == AxisKind::fixed && s[a] != ax.extent)
                fail("sample ", i, " has shape ", sample_shape_str(s), ": axis ", a + shape.batched,
                     " must have the static extent ", ax.extent);
            for (int b = 0; b < a; ++b) {
                const Axis& bx = shape.axes[b];
                if (bx.kind == ax.kind && ax.kind != AxisKind::fixed && bx.name == ax.name &&
                    s[a] != s[b])
                    fail("sample ", i, " has shape ", sample_shape_str(s), ": axes ",
                         b + shape.batched, " and ", a + shape.batched, " share the name ", ax.name,
                         " but have extents ", s[b], " and ", s[a]);
            }
            if (ax.kind == AxisKind::symbolic && i > 0 && s[a] != sizes[a])
                fail("sample ", i, " has shape ", sample_shape_str(s), ": symbolic axis ", ax.name,
                     " is ", s[a], " but ", sizes[a], " in sample 0");
        }
    }
    // Storage order: ragged axes first, then the rest, each in logical order.
    st->dim_order_.assign(d, 0);
    int pos = 0;
    for (int a = 0; a < d; ++a)
        if (shape.axes[a].is_ragged()) st->dim_order_[a] = pos++;
    for (int a = 0; a < d; ++a)
        if (!shape.axes[a].is_ragged()) st->dim_order_[a] = pos++;
    // Row width from the non-ragged extents (equal across samples for fixed and symbolic).
    st->row_width_ = 1;
    for (int a = 0; a < d; ++a)
        if (!shape.axes[a].is_ragged())
            st->row_width_ = checked_mul(
                st->row_width_,
                batch > 0 ? sizes[a] : std::max<std::int64_t>(shape.axes[a].extent, 0), 0);
    std::vector<int> ragged;
    for (int a = 0; a < d; ++a)
        if (shape.axes[a].is_ragged()) ragged.push_back(a);
    st->offsets_.assign(std::size_t(batch + 1), 0);
    st->row_splits_.assign(ragged.size(), std::vector<std::int64_t>{0});
    for (std::int64_t i = 0; i < batch; ++i) {
        const std::int64_t* s = sizes.data() + i * d;
        std::int64_t p = 1;
        for (int a : ragged) p = checked_mul(p, s[a], i);
        st->offsets_[i + 1] = checked_add(st->offsets_[i], p, i);
        // Level k: one segment per index tuple of the first k ragged axes of this sample.
        std::int64_t segments = 1;
        for (std::size_t k = 0; k < ragged.size(); ++k) {
            std::int64_t seg_rows = 1;
            for (std::size_t l = k; l < ragged.size(); ++l) seg_rows *= s[ragged[l]];
            auto& splits = st->row_splits_[k];
            for (std::int64_t g = 0; g < segments; ++g) splits.push_back(splits.back() + seg_rows);
            segments = checked_mul(segments, s[ragged[k]], i);
        }
    }
    st->shape_ = std::move(shape);
    st->batch_ = batch;
    st->sizes_ = std::move(sizes);
    st->validate();
    return st;
}

std::vector<std::int64_t> Structure::sample_strides(std::int64_t i) const {
    const int d = rank();
    std::vector<int> storage_to_logical(d);
    for (int a = 0; a < d; ++a) storage_to_logical[dim_order_[a]] = a;
    std::vector<std::int64_t> strides(d);
    std::int64_t stride = 1;
    for (int p = d - 1; p >= 0; --p) {
        int a = storage_to_logical[p];
        strides[a] = stride;
        stride *= size(i, a);
    }
    return strides;
}

std::vector<std::int64_t> Structure::lengths(int axis) const {
    if (axis < 0 || axis >= rank()) fail("lengths: axis ", axis + shape_.batched, " out of range");
    std::vector<std::int64_t> out(static_cast<std::size_t>(batch_));
    for (std::int64_t i = 0; i < batch_; ++i) out[i] = size(i, axis);
    return out;
}

std::vector<std::int64_t> Structure::envelope() const {
    std::vector<std::int64_t> env(std::size_t(rank()), 0);
    for (int a = 0; a < rank(); ++a) {
        if (shape_.axes[a].kind == AxisKind::fixed) env[a] = shape_.axes[a].extent;
        for (std::int64_t i = 0; i < batch_; ++i) env[a] = std::max(env[a], size(i, a));
    }
    return env;
}

void Structure::validate() const {
    const int d = rank();
    auto check = [](bool ok, const char* what) {
        if (!ok) fail("ragged structure invariant broken: ", what);
    };
    check(std::int64_t(sizes_.size()) == batch_ * d, "sizes is [B, D]");
    check(std::int64_t(offsets_.size()) == batch_ + 1 && offsets_[0] == 0, "o_0 = 0");
    check(int(dim_order_.size()) == d, "dim_order covers every axis");
    std::int64_t width = 1;
    for (int a = 0; a < d; ++a)
        if (!shape_.axes[a].is_ragged() && batch_ > 0) width *= sizes_[a];
    check(batch_ == 0 || width == row_width_, "row width is the product of static extents");
    for (std::int64_t i = 0; i < batch_; ++i) {
        std::int64_t p = 1;
        for (int a = 0; a < d; ++a)
            if (shape_.axes[a].is_ragged()) p *= size(i, a);
        check(offsets_[i + 1] - offsets_[i] == p, "o_{i+1} - o_i = p_i");
    }
    check(int(row_splits_.size()) == shape_.ragged_count(), "one row split per ragged level");
    if (!row_splits_.empty()) check(row_splits_[0] == offsets_, "level 0 splits are the offsets");
    for (const auto& s : row_splits_) {
        check(s.front() == 0 && s.back() == rows(), "splits span all rows");
        check(std::is_sorted(s.begin(), s.end()), "splits are monotone");
    }
}

std::vector<Axis> parse_axes(std::string_view spec) {
    std::vector<Axis> axes;
    std::size_t i = 0;
    auto skip = [&] {
        while (i < spec.size() && std::isspace(static_cast<unsigned char>(spec[i]))) ++i;
    };
    skip();
    if (i == spec.size()) return axes;
    while (true) {
        skip();
        bool ragged = i < spec.size() && spec[i] == '~';
        if (ragged) ++i;
        std::size_t start = i;
        while (i < spec.size() &&
               (std::isalnum(static_cast<unsigned char>(spec[i])) || spec[i] == '_'))
            ++i;
        std::string tok(spec.substr(start, i - start));
        if (tok.empty()) fail("axis spec '", spec, "': expected an axis at column ", start + 1);
        // Derived names: N[1:], N[:3], N[1::2], N[:3][1:]; H[+2] and H[*2] (image ops).
        while (i < spec.size() && spec[i] == '[' &&
               !std::isdigit(static_cast<unsigned char>(tok[0]))) {
            auto close = spec.find(']', i);
            auto body = spec.substr(i + 1, close == std::string_view::npos ? 0 : close - i - 1);
            if (close == std::string_view::npos ||
                body.find_first_not_of("0123456789:-+*") != std::string_view::npos)
                fail("axis spec '", spec, "': bad derived axis name at column ", i + 1);
            tok += spec.substr(i, close - i + 1);
            i = close + 1;
        }
        bool digits = std::all_of(tok.begin(), tok.end(), [](char c) { return std::isdigit(c); });
        if (ragged && digits)
            fail("axis spec '", spec, "': a ragged axis needs a name, got ~", tok);
        if (ragged)
            axes.push_back(Axis::ragged_of(tok));
        else if (digits)
            axes.push_back(Axis::fixed_of(std::stoll(tok)));
        else if (std::isdigit(static_cast<unsigned char>(tok[0])))
            fail("axis spec '", spec, "': bad axis '", tok, "'");
        else
            axes.push_back(Axis::symbolic_of(tok));
        skip();
        if (i == spec.size()) break;
        if (spec[i] != ',') fail("axis spec '", spec, "': expected ',' at column ", i + 1);
        ++i;
    }
    return axes;
}

} // namespace rag
