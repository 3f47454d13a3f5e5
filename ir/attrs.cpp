#include "ir/attrs.hpp"

#include "runtime/error.hpp"

#include <sstream>

namespace rag {
namespace {

template <class T> const T* find_as(const Attrs& a, std::string_view k, const char* want) {
    auto it = a.entries().find(k);
    if (it == a.entries().end()) return nullptr;
    if (auto* v = std::get_if<T>(&it->second)) return v;
    fail("attribute ", k, " must be ", want);
}

} // namespace

std::int64_t Attrs::get_int(std::string_view k) const {
    if (auto* v = find_as<std::int64_t>(*this, k, "an integer")) return *v;
    fail("missing attribute ", k);
}
std::int64_t Attrs::get_int(std::string_view k, std::int64_t dflt) const {
    auto* v = find_as<std::int64_t>(*this, k, "an integer");
    return v ? *v : dflt;
}
double Attrs::get_float(std::string_view k) const {
    if (!has(k)) fail("missing attribute ", k);
    return get_float(k, 0.0);
}
double Attrs::get_float(std::string_view k, double dflt) const {
    auto it = m_.find(k);
    if (it == m_.end()) return dflt;
    if (auto* i = std::get_if<std::int64_t>(&it->second)) return double(*i);
    if (auto* d = std::get_if<double>(&it->second)) return *d;
    fail("attribute ", k, " must be a number");
}
bool Attrs::get_bool(std::string_view k, bool dflt) const {
    auto* v = find_as<bool>(*this, k, "true or false");
    return v ? *v : dflt;
}
std::string Attrs::get_str(std::string_view k) const {
    if (auto* v = find_as<std::string>(*this, k, "a name")) return *v;
    fail("missing attribute ", k);
}
std::string Attrs::get_str(std::string_view k, std::string_view dflt) const {
    auto* v = find_as<std::string>(*this, k, "a name");
    return v ? *v : std::string(dflt);
}
std::vector<std::int64_t> Attrs::get_ints(std::string_view k) const {
    if (auto* v = find_as<std::vector<std::int64_t>>(*this, k, "a list of integers")) return *v;
    fail("missing attribute ", k);
}

std::string Attrs::str() const {
    std::ostringstream os;
    bool first = true;
    for (const auto& [k, v] : m_) {
        os << (first ? "" : ", ") << k << "=";
        first = false;
        std::visit(
            [&](const auto& x) {
                using T = std::decay_t<decltype(x)>;
                if constexpr (std::is_same_v<T, bool>)
                    os << (x ? "true" : "false");
                else if constexpr (std::is_same_v<T, std::vector<std::int64_t>>) {
                    os << "[";
                    for (std::size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << x[i];
                    os << "]";
                } else if constexpr (std::is_same_v<T, std::string>)
                    os << '"' << x << '"';
                else
                    os << x;
            },
            v);
    }
    return os.str();
}

} // namespace rag
