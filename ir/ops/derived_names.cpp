#include "ir/ops/derived_names.hpp"

#include <charconv>
#include <optional>
#include <string_view>

namespace rag {
namespace {

// The last token of a derived name, when it is one of ours.
struct Token {
    enum class Kind { slice, grow, scale } kind;
    std::int64_t a = 0, s = 1; // slice: e, s; grow: g; scale: m
    std::size_t at = 0;        // where the token starts in the name
};

std::optional<std::int64_t> number(std::string_view t) {
    if (t.empty()) return std::nullopt;
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || end != t.data() + t.size() || v < 0) return std::nullopt;
    return v;
}

std::optional<Token> last_token(const std::string& name) {
    if (name.empty() || name.back() != ']') return std::nullopt;
    const std::size_t open = name.rfind('[');
    if (open == std::string::npos || open == 0) return std::nullopt;
    const std::string_view body(name.data() + open + 1, name.size() - open - 2);
    if (!body.empty() && (body[0] == '+' || body[0] == '*')) {
        auto v = number(body.substr(1));
        if (!v) return std::nullopt;
        return Token{body[0] == '+' ? Token::Kind::grow : Token::Kind::scale, *v, 1, open};
    }
    // e: | : | e::s | ::s (no upper bound)
    const std::size_t c = body.find(':');
    if (c == std::string_view::npos) return std::nullopt;
    std::int64_t e = 0, s = 1;
    if (c > 0) {
        auto v = number(body.substr(0, c));
        if (!v) return std::nullopt;
        e = *v;
    }
    std::string_view rest = body.substr(c + 1);
    if (!rest.empty()) {
        if (rest[0] != ':') return std::nullopt; // an upper bound: not ours to merge
        auto v = number(rest.substr(1));
        if (!v || *v < 1) return std::nullopt;
        s = *v;
    }
    return Token{Token::Kind::slice, e, s, open};
}

std::string slice_token(std::int64_t e, std::int64_t s) {
    std::string body = e == 0 ? ":" : std::to_string(e) + ":";
    if (s != 1) body += ":" + std::to_string(s);
    return "[" + body + "]";
}

} // namespace

std::string slice_axis_name(const std::string& base, std::int64_t e, std::int64_t s) {
    if (e == 0 && s == 1) return base;
    if (auto t = last_token(base)) {
        const std::string head = base.substr(0, t->at);
        // ceil((ceil((L - e1) / s1) - e2) / s2) = ceil((L - e1 - e2 s1) / (s1 s2)); the clamp
        // at 0 in between changes nothing, as the second step only shrinks.
        if (t->kind == Token::Kind::slice) return slice_axis_name(head, t->a + e * t->s, t->s * s);
        // (L + g) then [e::s]: no clamp after a growth, so fold g into the slice.
        if (t->kind == Token::Kind::grow) {
            if (t->a > e) { // (L + g - e) then [::s], as two tokens
                const std::string grown = grow_axis_name(head, t->a - e);
                return s == 1 ? grown : grown + slice_token(0, s);
            }
            return slice_axis_name(head, e - t->a, s);
        }
    }
    return base + slice_token(e, s);
}

std::string grow_axis_name(const std::string& base, std::int64_t g) {
    if (g == 0) return base;
    if (auto t = last_token(base); t && t->kind == Token::Kind::grow)
        return grow_axis_name(base.substr(0, t->at), t->a + g);
    return base + "[+" + std::to_string(g) + "]";
}

std::string scale_axis_name(const std::string& base, std::int64_t m) {
    if (m == 1) return base;
    if (auto t = last_token(base); t && t->kind == Token::Kind::scale)
        return scale_axis_name(base.substr(0, t->at), t->a * m);
    return base + "[*" + std::to_string(m) + "]";
}

std::string window_axis_name(const std::string& base, std::int64_t k, std::int64_t s,
                             std::int64_t lo, std::int64_t hi, std::int64_t d) {
    const std::int64_t e = d * (k - 1) - lo - hi;
    if (e >= 0) return slice_axis_name(base, e, s);
    return slice_axis_name(grow_axis_name(base, -e), 0, s);
}

std::optional<DerivedStep> last_step(const std::string& name) {
    auto t = last_token(name);
    if (!t) return std::nullopt;
    const auto kind = t->kind == Token::Kind::slice  ? DerivedStep::Kind::slice
                      : t->kind == Token::Kind::grow ? DerivedStep::Kind::grow
                                                     : DerivedStep::Kind::scale;
    return DerivedStep{kind, name.substr(0, t->at), t->a, t->s};
}

std::optional<std::string> derived_base(const std::string& name) {
    auto step = last_step(name);
    if (!step) return std::nullopt;
    return derived_base(step->base).value_or(step->base);
}

std::int64_t derived_length(const std::string& name, std::int64_t base_length) {
    auto step = last_step(name);
    if (!step) return base_length;
    const std::int64_t L = derived_length(step->base, base_length);
    switch (step->kind) {
    case DerivedStep::Kind::slice:
        return L <= step->a ? 0 : (L - step->a + step->s - 1) / step->s;
    case DerivedStep::Kind::grow:
        return L + step->a;
    case DerivedStep::Kind::scale:
        return L * step->a;
    }
    return L;
}

std::string product_axis_name(const std::string& a, const std::string& b) {
    return "(" + a + "*" + b + ")";
}

std::optional<std::pair<std::string, std::string>> product_factors(const std::string& name) {
    if (name.size() < 3 || name.front() != '(' || name.back() != ')') return std::nullopt;
    int depth = 0;
    for (std::size_t k = 1; k + 1 < name.size(); ++k) {
        const char c = name[k];
        depth += (c == '(' || c == '[') - (c == ')' || c == ']');
        if (c == '*' && depth == 0)
            return std::pair{name.substr(1, k - 1), name.substr(k + 1, name.size() - k - 2)};
    }
    return std::nullopt;
}

} // namespace rag
