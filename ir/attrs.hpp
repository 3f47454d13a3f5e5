// Attributes of an op application: compile-time keyword arguments (axis=2, eps=1e-5,
// map="clip", causal=true). Part of the schema-level meaning of an op, never runtime data.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace rag {

using AttrValue = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>>;

class Attrs {
  public:
    Attrs() = default;
    Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> init) : m_(init) {}

    Attrs& set(const std::string& k, AttrValue v) {
        m_[k] = std::move(v);
        return *this;
    }
    bool has(std::string_view k) const { return m_.find(k) != m_.end(); }
    std::int64_t get_int(std::string_view k) const;
    std::int64_t get_int(std::string_view k, std::int64_t dflt) const;
    double get_float(std::string_view k) const; // accepts an int too
    double get_float(std::string_view k, double dflt) const;
    bool get_bool(std::string_view k, bool dflt) const;
    std::string get_str(std::string_view k) const;
    std::string get_str(std::string_view k, std::string_view dflt) const;
    std::vector<std::int64_t> get_ints(std::string_view k) const;
    const std::map<std::string, AttrValue, std::less<>>& entries() const { return m_; }
    std::string str() const; // "axis=2, eps=1e-05": stable, for printers and messages

  private:
    std::map<std::string, AttrValue, std::less<>> m_;
};

} // namespace rag
