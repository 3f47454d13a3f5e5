// `rag repl`: printing values, session-wide ragged names, the randn/init helpers' syntax.
#include "dsl/repl_session.hpp"
#include "runtime/random.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

namespace rag::repl {

// ---- ragged names -------------------------------------------------------------------------

RaggedTensor RaggedNames::canon(const RaggedTensor& t) {
    if (!t.shape().batched || t.shape().ragged_count() == 0) return t;
    std::map<std::string, std::string> rename;
    std::set<std::string> used;
    Shape shape = t.shape();
    for (int a = 0; a < t.structure().rank(); ++a) {
        Axis& ax = shape.axes[std::size_t(a)];
        if (!ax.is_ragged()) continue;
        if (auto it = rename.find(ax.name); it != rename.end()) {
            ax.name = it->second;
            continue;
        }
        auto lengths = t.structure().lengths(a);
        std::string name;
        for (const auto& [l, n] : names_)
            if (l == lengths && !used.count(n)) {
                name = n;
                break;
            }
        if (name.empty()) {
            for (std::size_t k = 0;; ++k) {
                std::string cand = ragged_name(k);
                bool taken = false;
                for (const auto& [_, n] : names_) taken |= n == cand;
                if (!taken) {
                    name = cand;
                    break;
                }
            }
            names_.push_back({lengths, name});
        }
        used.insert(name);
        rename[ax.name] = name;
        ax.name = name;
    }
    if (shape == t.shape()) return t;
    auto st = Structure::make(shape, t.batch(), t.structure().sizes());
    return RaggedTensor(t.dtype(), st, t.buffer());
}

Value RaggedNames::canon(const Value& v) {
    if (v.kind == Value::Kind::tensor) return Value(canon(v.tensor));
    Value out = v;
    for (auto& e : out.elems) e = canon(e);
    return out;
}

// ---- printing -----------------------------------------------------------------------------

namespace {

std::string number(double x, DType t, int digits) {
    if (t == DType::boolean) return x != 0 ? "true" : "false";
    char buf[64];
    if (!is_floating(t))
        std::snprintf(buf, sizeof buf, "%.0f", x);
    else
        std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    return buf;
}

} // namespace

std::string show_tensor(const RaggedTensor& t, bool values) {
    if (!t.shape().batched && t.shape().axes.empty()) {
        std::string n = number(t.item(), t.dtype(), 6);
        return values ? n : t.schema().str() + " = " + n;
    }
    std::string out = describe(t);
    for (int a = 0; a < t.structure().rank(); ++a) { // symbolic extents, one per value
        const Axis& ax = t.shape().axes[std::size_t(a)];
        if (ax.kind == AxisKind::symbolic && t.batch() > 0 &&
            out.find(" " + ax.name + "=") == std::string::npos)
            out += " " + ax.name + "=" + std::to_string(t.structure().size(0, a));
    }
    if (!values) return out;
    auto x = t.to_f64();
    out += "  [";
    const std::size_t shown = std::min<std::size_t>(x.size(), 6);
    for (std::size_t k = 0; k < shown; ++k) out += (k ? ", " : "") + number(x[k], t.dtype(), 4);
    if (x.size() > shown) out += ", ...";
    out += "]";
    if (x.size() > shown) out += " (" + std::to_string(x.size()) + " values)";
    return out;
}

std::vector<std::string> show_value(const Value& v, const std::string& name, bool values) {
    const std::string lead = name.empty() ? "" : name + ": ";
    switch (v.kind) {
    case Value::Kind::tensor:
        return {lead + show_tensor(v.tensor, values)};
    case Value::Kind::record: {
        std::string s = lead + v.record + " {";
        for (std::size_t k = 0; k < v.fields.size(); ++k)
            s += (k ? ", " : "") + v.fields[k].first + ": " + v.fields[k].second.schema().str();
        return {s + "}"};
    }
    case Value::Kind::tuple:
        break;
    }
    if (v.elems.empty()) return {lead + "()"};
    std::vector<std::string> out; // one line per element: "name.0: ...", "name.1.0: ..."
    for (std::size_t k = 0; k < v.elems.size(); ++k) {
        auto lines = show_value(v.elems[k], name + "." + std::to_string(k), values);
        out.insert(out.end(), lines.begin(), lines.end());
    }
    return out;
}

std::string ragged_name(std::size_t k) {
    static const char* letters[] = {"N", "M", "L", "K"};
    return letters[k % 4] + (k >= 4 ? std::to_string(k / 4 + 1) : "");
}

std::string type_decl(const Value& v, std::map<std::string, std::string>& ragged) {
    switch (v.kind) {
    case Value::Kind::tensor: {
        Schema s = v.tensor.schema();
        for (auto& a : s.shape.axes)
            if (a.is_ragged())
                a.name = ragged.try_emplace(a.name, ragged_name(ragged.size())).first->second;
        return s.str();
    }
    case Value::Kind::record:
        return v.record;
    case Value::Kind::tuple:
        break;
    }
    std::string s = "(";
    for (std::size_t k = 0; k < v.elems.size(); ++k)
        s += (k ? ", " : "") + type_decl(v.elems[k], ragged);
    return s + ")";
}

Value rename_ragged(const Value& v, const std::map<std::string, std::string>& names) {
    if (v.kind == Value::Kind::tensor) {
        const RaggedTensor& t = v.tensor;
        Shape shape = t.shape();
        for (auto& a : shape.axes)
            if (auto it = names.find(a.name); a.is_ragged() && it != names.end())
                a.name = it->second;
        if (shape == t.shape()) return v;
        return Value(RaggedTensor(
            t.dtype(), Structure::make(shape, t.batch(), t.structure().sizes()), t.buffer()));
    }
    Value out = v;
    for (auto& e : out.elems) e = rename_ragged(e, names);
    return out;
}

std::string type_decl(const Value& v) {
    std::map<std::string, std::string> ragged;
    return type_decl(v, ragged);
}

bool has_ragged(const Value& v) {
    if (v.kind == Value::Kind::tensor) return v.tensor.shape().ragged_count() > 0;
    for (const auto& e : v.elems)
        if (has_ragged(e)) return true;
    return false;
}

bool has_batched_dense(const Value& v, std::int64_t& batch) {
    if (v.kind == Value::Kind::tensor && v.tensor.shape().batched &&
        v.tensor.shape().ragged_count() == 0) {
        batch = v.tensor.batch();
        return true;
    }
    for (const auto& e : v.elems)
        if (has_batched_dense(e, batch)) return true;
    return false;
}

// ---- helpers ------------------------------------------------------------------------------

namespace {

bool ident_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// Index of the ')' matching the '(' at `open`, skipping comments; npos if unbalanced.
std::size_t closing(const std::string& s, std::size_t open) {
    int depth = 0;
    for (std::size_t i = open; i < s.size(); ++i) {
        char c = s[i];
        if (c == '#') {
            while (i < s.size() && s[i] != '\n') ++i;
            continue;
        }
        if (c == '(' || c == '[' || c == '{') ++depth;
        if (c == ')' || c == ']' || c == '}')
            if (--depth == 0) return c == ')' ? i : std::string::npos;
    }
    return std::string::npos;
}

} // namespace

std::vector<HelperCall> find_helpers(const std::string& text, const std::set<std::string>& groups,
                                     const std::set<std::string>& shadow) {
    std::vector<HelperCall> out;
    for (std::size_t i = 0; i < text.size();) {
        char c = text[i];
        if (c == '#') {
            while (i < text.size() && text[i] != '\n') ++i;
            continue;
        }
        if (c == '"') {
            for (++i; i < text.size() && text[i] != '"' && text[i] != '\n'; ++i) {
            }
            ++i;
            continue;
        }
        if (!ident_char(c) || std::isdigit(static_cast<unsigned char>(c))) {
            ++i;
            continue;
        }
        std::size_t b = i;
        while (i < text.size() && ident_char(text[i])) ++i;
        std::string word = text.substr(b, i - b);
        std::size_t p = b;
        while (p > 0 && (text[p - 1] == ' ' || text[p - 1] == '\t')) --p;
        if (p > 0 && text[p - 1] == '.') continue; // a field
        if (!(word == "randn" || word == "init" || groups.count(word)) || shadow.count(word))
            continue;
        std::size_t q = i;
        while (q < text.size() && std::isspace(static_cast<unsigned char>(text[q]))) ++q;
        if (q >= text.size() || text[q] != '(') continue;
        std::size_t e = closing(text, q);
        if (e == std::string::npos) continue; // the parser reports it
        out.push_back({std::uint32_t(b), std::uint32_t(e + 1), word, text.substr(q + 1, e - q - 1),
                       std::uint32_t(q + 1)});
        i = e + 1;
    }
    return out;
}

std::vector<HelperArg> parse_helper_args(const std::string& text, std::uint32_t base) {
    std::vector<HelperArg> out;
    std::size_t i = 0;
    auto skip = [&] {
        while (i < text.size()) {
            if (std::isspace(static_cast<unsigned char>(text[i])))
                ++i;
            else if (text[i] == '#')
                while (i < text.size() && text[i] != '\n') ++i;
            else
                break;
        }
    };
    auto bad = [&](std::size_t at, const std::string& msg) -> HelperError {
        return {base + std::uint32_t(at), base + std::uint32_t(std::min(at + 1, text.size())), msg};
    };
    auto atom = [&]() -> std::string {
        std::size_t b = i;
        if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
        while (i < text.size() &&
               (ident_char(text[i]) || text[i] == '.' ||
                ((text[i] == '-' || text[i] == '+') && (text[i - 1] == 'e' || text[i - 1] == 'E'))))
            ++i;
        if (i == b) throw bad(b, "expected a number, a name or a list like [5, 17, 9]");
        // A generic type's arguments belong to its name: init(Adam[Model], 0), Linear[4, 8].
        if (i < text.size() && text[i] == '[' &&
            std::isalpha(static_cast<unsigned char>(text[b]))) {
            int depth = 0;
            for (; i < text.size(); ++i) {
                depth += text[i] == '[' ? 1 : text[i] == ']' ? -1 : 0;
                if (depth == 0) break;
            }
            if (i == text.size())
                throw bad(text.size(), "expected ']' to close the type's arguments");
            ++i;
        }
        return text.substr(b, i - b);
    };
    skip();
    while (i < text.size()) {
        HelperArg a;
        a.begin = base + std::uint32_t(i);
        // keyword=
        std::size_t save = i;
        if (i < text.size() &&
            (std::isalpha(static_cast<unsigned char>(text[i])) || text[i] == '_')) {
            std::size_t b = i;
            while (i < text.size() && ident_char(text[i])) ++i;
            std::string word = text.substr(b, i - b);
            skip();
            if (i < text.size() && text[i] == '=') {
                a.keyword = word;
                ++i;
                skip();
            } else {
                i = save;
            }
        }
        if (i < text.size() && text[i] == '[') {
            a.is_list = true;
            ++i;
            skip();
            while (i < text.size() && text[i] != ']') {
                std::size_t b = i;
                std::string n = atom();
                char* endp = nullptr;
                long long v = std::strtoll(n.c_str(), &endp, 10);
                if (*endp || v < 0)
                    throw bad(b, "'" + n + "' is not a length (a non-negative integer)");
                a.list.push_back(v);
                skip();
                if (i < text.size() && text[i] == ',') {
                    ++i;
                    skip();
                } else if (i < text.size() && text[i] != ']') {
                    throw bad(i, "expected ',' or ']' in the list of lengths");
                }
            }
            if (i >= text.size())
                throw bad(text.size(), "expected ']' to close the list of lengths");
            ++i;
        } else {
            a.atom = atom();
        }
        a.end = base + std::uint32_t(i);
        out.push_back(std::move(a));
        skip();
        if (i < text.size()) {
            if (text[i] != ',') throw bad(i, "expected ',' or ')' after an argument");
            ++i;
            skip();
            if (i >= text.size()) break; // a trailing comma
        }
    }
    return out;
}

RaggedTensor randn(const std::vector<RandnAxis>& axes, DType dtype, std::uint64_t seed) {
    if (!is_floating(dtype))
        fail("randn makes floating-point values; dtype ", dtype_name(dtype), " is not one");
    CounterRng rng(seed, "randn");
    std::vector<std::vector<std::int64_t>> lists;
    std::vector<Axis> decl;
    std::int64_t batch = -1;
    double total = 1;
    for (const auto& ax : axes) {
        if (!ax.ragged) {
            if (ax.extent < 0) fail("randn: extent ", ax.extent, " is negative");
            decl.push_back(Axis::fixed_of(ax.extent));
            total *= double(ax.extent);
            continue;
        }
        if (ax.lengths.empty()) fail("randn: a list of lengths needs at least one sample");
        if (batch >= 0 && std::int64_t(ax.lengths.size()) != batch)
            fail("randn: every list of lengths needs one entry per sample; got ", ax.lengths.size(),
                 " after ", batch);
        batch = std::int64_t(ax.lengths.size());
        auto it = std::find(lists.begin(), lists.end(), ax.lengths);
        if (it == lists.end()) lists.push_back(ax.lengths), it = lists.end() - 1;
        decl.push_back(Axis::ragged_of("r" + std::to_string(it - lists.begin())));
        total *= double(*std::max_element(ax.lengths.begin(), ax.lengths.end()) + 1);
    }
    if (total * double(std::max<std::int64_t>(batch, 1)) > 5e8) fail("randn: too many values");
    std::uint64_t k = 0;
    auto fill = [&](DenseArray& a) {
        for (std::int64_t e = 0; e < a.numel(); ++e)
            store_from_f64(a.bytes.data(), dtype, std::size_t(e), rng.normal(k++));
    };
    if (batch < 0) {
        std::vector<std::int64_t> shape;
        for (const auto& ax : axes) shape.push_back(ax.extent);
        DenseArray a = DenseArray::zeros(dtype, shape);
        fill(a);
        return RaggedTensor::dense(a);
    }
    std::vector<DenseArray> samples;
    for (std::int64_t i = 0; i < batch; ++i) {
        std::vector<std::int64_t> shape;
        for (const auto& ax : axes)
            shape.push_back(ax.ragged ? ax.lengths[std::size_t(i)] : ax.extent);
        samples.push_back(DenseArray::zeros(dtype, shape));
        fill(samples.back());
    }
    return RaggedTensor::from_list(samples, decl);
}

int open_brackets(const std::string& text) {
    int depth = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
        char c = text[i];
        if (c == '#') {
            while (i < text.size() && text[i] != '\n') ++i;
        } else if (c == '"') {
            for (++i; i < text.size() && text[i] != '"' && text[i] != '\n'; ++i) {
            }
        } else if (c == '(' || c == '[' || c == '{') {
            ++depth;
        } else if (c == ')' || c == ']' || c == '}') {
            --depth;
        }
    }
    return depth;
}

} // namespace rag::repl
