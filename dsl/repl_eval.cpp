// `rag repl`: evaluating expressions and `let` over REPL variables by synthesising a function.
#include "dsl/repl_session.hpp"
#include "dsl/value_type.hpp"
#include "frontend/lower.hpp"
#include "frontend/parser.hpp"

#include <algorithm>
#include <cctype>

namespace rag::repl {

namespace {

const std::set<std::string> keywords = {"fn",     "let", "return", "params",
                                        "import", "new", "true",   "false"};

void collect_names(const ast::Expr& e, std::vector<std::string>& out) {
    if (e.kind == ast::Expr::Kind::name && std::find(out.begin(), out.end(), e.name) == out.end())
        out.push_back(e.name);
    for (const auto& o : e.operands) collect_names(*o, out);
    for (const auto& a : e.args) collect_names(*a.value, out);
}

std::string one_line(const std::string& s) {
    std::string out;
    bool space = false;
    for (char c : s) {
        if (std::isspace(static_cast<unsigned char>(c))) {
            space = !out.empty();
            continue;
        }
        if (space) out += ' ';
        space = false;
        out += c;
    }
    return out;
}

std::uint32_t skip_space(const std::string& s, std::uint32_t i) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return i;
}

// `let` targets: a name or a parenthesised tuple of targets.
struct Target {
    std::string name;
    std::vector<Target> elems;
    std::uint32_t begin = 0, end = 0;
};

Target parse_target(const std::string& s, std::uint32_t& i) {
    i = skip_space(s, i);
    Target t;
    t.begin = i;
    if (i < s.size() && s[i] == '(') {
        ++i;
        for (;;) {
            t.elems.push_back(parse_target(s, i));
            i = skip_space(s, i);
            if (i < s.size() && s[i] == ',') {
                i = skip_space(s, i + 1);
                if (i < s.size() && s[i] == ')') break;
                continue;
            }
            break;
        }
        if (i >= s.size() || s[i] != ')')
            throw HelperError{i, i + 1, "expected ',' or ')' in the names of a let"};
        t.end = ++i;
        return t;
    }
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
    t.end = i;
    t.name = s.substr(t.begin, i - t.begin);
    if (t.name.empty() || std::isdigit(static_cast<unsigned char>(t.name[0])))
        throw HelperError{t.begin, t.begin + 1, "expected a name or '(' after let"};
    if (keywords.count(t.name))
        throw HelperError{t.begin, t.end, "'" + t.name + "' is a keyword, not a name"};
    if (t.name.rfind("__", 0) == 0)
        throw HelperError{t.begin, t.end, "names starting with __ are reserved for the REPL"};
    return t;
}

} // namespace

std::optional<Value> Session::helper_value(const HelperCall& h, bool for_type) {
    auto args = parse_helper_args(h.args, h.args_begin);
    auto integer = [](const HelperArg& a, const char* what) {
        char* end = nullptr;
        long long v = a.is_list || a.atom.empty() ? -1 : std::strtoll(a.atom.c_str(), &end, 10);
        if (v < 0 || (end && *end))
            throw HelperError{a.begin, a.end,
                              std::string(what) + " must be a non-negative integer"};
        return std::uint64_t(v);
    };
    const HelperError at_call{h.begin, h.end, ""};
    try {
        if (h.callee == "randn") {
            std::vector<RandnAxis> axes;
            DType dtype = DType::f32;
            std::optional<std::uint64_t> seed;
            for (const auto& a : args) {
                if (a.keyword == "seed")
                    seed = integer(a, "seed");
                else if (a.keyword == "dtype") {
                    auto d = parse_dtype(a.atom);
                    if (!d)
                        throw HelperError{a.begin, a.end, "dtype must be one of f16 bf16 f32 f64"};
                    dtype = *d;
                } else if (!a.keyword.empty()) {
                    throw HelperError{a.begin, a.end,
                                      "randn takes seed= and dtype=, not " + a.keyword + "="};
                } else if (a.is_list) {
                    axes.push_back({true, 0, a.list});
                } else {
                    axes.push_back({false, std::int64_t(integer(a, "an extent")), {}});
                }
            }
            if (!seed) seed = for_type ? randn_calls_ : randn_calls_++;
            return Value(randn(axes, dtype, *seed));
        }
        std::string group = h.callee;
        std::uint64_t seed = 0;
        std::size_t k = 0;
        if (h.callee == "init") {
            if (args.empty() || args[0].is_list || !args[0].keyword.empty())
                throw HelperError{h.begin, h.end,
                                  "init takes a params group name and a seed: init(PairBlock, 0)"};
            group = args[0].atom;
            k = 1;
        }
        for (std::size_t first = k; k < args.size(); ++k) {
            if (k > first || (!args[k].keyword.empty() && args[k].keyword != "seed"))
                throw HelperError{args[k].begin, args[k].end,
                                  "initialising " + group + " takes one argument, the seed"};
            seed = integer(args[k], "the seed");
        }
        return base_->init(group, seed);
    } catch (const Error& e) {
        throw HelperError{at_call.begin, at_call.end, e.what()};
    }
}

std::optional<Session::Prepared> Session::prepare(const std::shared_ptr<SourceFile>& entry,
                                                  std::uint32_t begin, std::uint32_t end,
                                                  bool for_type) {
    const std::string text = entry->text().substr(begin, end - begin);
    if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
        diag(*entry, end, end, "expected an expression");
        return std::nullopt;
    }
    std::set<std::string> groups, fns;
    for (const auto& c : chunks_) {
        if (c.key.rfind("params ", 0) == 0) groups.insert(c.key.substr(7));
        if (c.key.rfind("fn ", 0) == 0) fns.insert(c.key.substr(3));
    }
    // Host helpers become temporaries named as long as the call, so columns stay put.
    std::string mod = text;
    std::map<std::string, Value> temps;
    auto calls = find_helpers(text, groups, fns);
    for (std::size_t k = 0; k < calls.size(); ++k) {
        HelperCall h = calls[k];
        std::uint32_t b = h.begin, e = h.end;
        h.begin += begin, h.end += begin, h.args_begin += begin;
        std::optional<Value> v;
        try {
            v = helper_value(h, for_type);
        } catch (const HelperError& err) {
            diag(*entry, err.begin, err.end, err.message);
            return std::nullopt;
        }
        std::string name = "__h" + std::to_string(k);
        std::size_t line_end = text.find('\n', b);
        if (line_end == std::string::npos || line_end > e) line_end = e;
        if (line_end - b >= name.size()) name.append(line_end - b - name.size(), '_');
        std::string rep = name;
        for (std::size_t i = b + std::min<std::size_t>(name.size(), e - b); i < e; ++i)
            rep += text[i] == '\n' ? '\n' : ' ';
        mod.replace(b, e - b, rep);
        temps[name] = names_.canon(*v);
    }
    SourceFile msrc("<input>", mod);
    Diagnostics pd(msrc);
    auto ast = frontend::parse_expr(msrc, pd);
    if (!ast || !pd.empty()) {
        for (const auto& d : pd.items())
            diag(*entry, begin + d.span.begin, begin + d.span.end, d.message);
        if (pd.empty()) error("cannot parse the expression");
        return std::nullopt;
    }
    Prepared p;
    if (ast->kind == ast::Expr::Kind::name) {
        if (auto it = temps.find(ast->name); it != temps.end()) p.direct = it->second;
        if (auto it = vars_.find(ast->name); it != vars_.end()) p.direct = it->second;
        if (p.direct) return p;
    }
    std::vector<std::string> used;
    collect_names(*ast, used);
    std::string sig;
    std::map<std::string, std::string> sig_names;
    bool ragged = false;
    std::int64_t dense_batch = -1;
    for (const auto& n : used) {
        const Value* v = nullptr;
        if (auto it = temps.find(n); it != temps.end())
            v = &it->second;
        else if (auto jt = vars_.find(n); jt != vars_.end())
            v = &jt->second;
        if (!v) continue;
        if (v->kind == Value::Kind::record) {
            bool same = false;
            try {
                auto leaves = base_->program().record_type(v->record).leaves();
                same = leaves.size() == v->fields.size();
                for (std::size_t f = 0; same && f < v->fields.size(); ++f)
                    same = leaves[f].first == v->fields[f].first &&
                           leaves[f].second == v->fields[f].second.schema();
            } catch (const Error&) {
            }
            if (!same) {
                error(n + " holds a " + v->record + " made for an earlier definition of " +
                      v->record + "; make it again, e.g. let " + n + " = init(" + v->record +
                      ", 0)");
                return std::nullopt;
            }
        }
        sig += (sig.empty() ? "" : ", ") + n + ": " + type_decl(*v, sig_names);
        p.args.push_back(rename_ragged(*v, sig_names));
        ragged |= has_ragged(*v);
        if (std::int64_t b = -1; dense_batch < 0 && has_batched_dense(*v, b)) dense_batch = b;
    }
    // A batched value without ragged axes is batched only next to a ragged parameter on B.
    if (!ragged && dense_batch >= 0) {
        std::vector<DenseArray> samples(std::size_t(dense_batch),
                                        DenseArray::zeros(DType::f32, {0}));
        p.args.push_back(Value(RaggedTensor::from_list(samples, "~__R")));
        sig += std::string(sig.empty() ? "" : ", ") + "__batch: f32[B, ~__R]";
    }
    const std::string key = sig + "\n" + mod;
    auto it = cache_.find(key);
    if (it == cache_.end()) {
        Compiled c;
        c.fn = "__repl_" + std::to_string(next_fn_++);
        c.label = one_line(text);
        std::vector<Chunk> chunks = chunks_;
        std::string defs = combine(chunks);
        c.source = defs + (defs.empty() ? "" : "\n\n") + "fn " + c.fn + "(" + sig +
                   ") {\nreturn\n" + mod + "\n}\n";
        ExprSite site{std::uint32_t(c.source.size() - 3 - mod.size()),
                      std::uint32_t(c.source.size() - 3), entry.get(), begin};
        try {
            c.module = Module::compile(c.source, "<repl>");
        } catch (const CompileError& e) {
            std::string why = remap(c.source, chunks, &site, {});
            complain(why.empty() ? e.what() : why);
            return std::nullopt;
        }
        labels_[c.fn] = c.label;
        it = cache_.emplace(key, std::move(c)).first;
    }
    p.module = it->second.module;
    p.fn = it->second.fn;
    p.source = it->second.source;
    p.site = {std::uint32_t(p.source.size() - 3 - mod.size()), std::uint32_t(p.source.size() - 3),
              entry.get(), begin};
    return p;
}

std::optional<Value> Session::evaluate(const std::shared_ptr<SourceFile>& entry,
                                       std::uint32_t begin, std::uint32_t end) {
    auto p = prepare(entry, begin, end, false);
    if (!p) return std::nullopt;
    if (p->direct) return p->direct;
    try {
        return names_.canon(p->module->call(p->fn, p->args));
    } catch (const CompileError& e) {
        std::vector<Chunk> chunks = chunks_;
        combine(chunks);
        std::string why =
            remap(p->source, chunks, &p->site, [&](const frontend::Program& prog, Diagnostics& d) {
                std::vector<frontend::VType> types;
                for (const auto& a : p->args) types.push_back(vtype_of(prog, a));
                frontend::lower(prog, p->fn, types, d);
            });
        complain(why.empty() ? e.what() : why);
    } catch (const Error& e) {
        std::string msg = e.what();
        if (msg.rfind(p->fn + ": ", 0) == 0) msg.erase(0, p->fn.size() + 2);
        error(msg);
    }
    return std::nullopt;
}

void Session::let(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin) {
    const std::string& s = entry->text();
    std::uint32_t i = begin;
    Target target;
    try {
        target = parse_target(s, i);
        i = skip_space(s, i);
        if (i >= s.size() || s[i] != '=' || (i + 1 < s.size() && s[i + 1] == '='))
            throw HelperError{i, i + 1, "expected '=' after the names of a let"};
    } catch (const HelperError& e) {
        diag(*entry, e.begin, e.end, e.message);
        return;
    }
    auto v = evaluate(entry, i + 1, std::uint32_t(s.size()));
    if (!v) return;
    // Check the shape of the whole pattern before binding anything.
    std::function<std::string(const Target&, const Value&)> fits =
        [&](const Target& t, const Value& x) -> std::string {
        if (t.elems.empty()) return "";
        if (x.kind != Value::Kind::tuple || x.elems.size() != t.elems.size())
            return "cannot destructure " + x.type_str() + " into " +
                   std::to_string(t.elems.size()) + " names";
        for (std::size_t k = 0; k < t.elems.size(); ++k)
            if (auto m = fits(t.elems[k], x.elems[k]); !m.empty()) return m;
        return "";
    };
    if (auto m = fits(target, *v); !m.empty()) {
        diag(*entry, target.begin, target.end, m);
        return;
    }
    std::function<void(const Target&, const Value&)> bind = [&](const Target& t, const Value& x) {
        if (t.elems.empty()) {
            vars_[t.name] = x;
            for (const auto& line : show_value(x, t.name, false)) say(line + "\n");
            return;
        }
        for (std::size_t k = 0; k < t.elems.size(); ++k) bind(t.elems[k], x.elems[k]);
    };
    bind(target, *v);
}

void Session::expression(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin) {
    auto v = evaluate(entry, begin, std::uint32_t(entry->text().size()));
    if (!v) return;
    for (const auto& line : show_value(*v, "", true)) say(line + "\n");
}

std::string
Session::remap(const std::string& source, const std::vector<Chunk>& chunks, const ExprSite* site,
               const std::function<void(const frontend::Program&, Diagnostics&)>& extra) const {
    auto src = std::make_shared<SourceFile>("<repl>", source);
    Diagnostics d(*src);
    auto prog = frontend::load_program(src, d);
    if (d.empty()) frontend::check(prog, d);
    if (d.empty() && extra) extra(prog, d);
    auto items = d.items();
    std::stable_sort(items.begin(), items.end(), [&](const Diagnostic& a, const Diagnostic& b) {
        return a.span.begin < b.span.begin;
    });
    std::string out;
    for (Diagnostic item : items) {
        const SourceFile* f = item.file ? item.file : src.get();
        if (f != src.get()) {
            out += f->format(item);
            continue;
        }
        const std::uint32_t b = item.span.begin, e = std::max(item.span.end, item.span.begin);
        auto shift = [&](std::uint32_t from, std::uint32_t to, std::uint32_t size) {
            item.span = {b - from + to, std::min(e, from + size) - from + to};
        };
        if (site && b >= site->begin && b <= site->end) {
            shift(site->begin, site->entry_begin, site->end - site->begin);
            out += site->entry->format(item);
            continue;
        }
        const Chunk* c = nullptr;
        for (const auto& ch : chunks)
            if (b >= ch.begin && b <= ch.begin + ch.text.size()) c = &ch;
        if (c) {
            shift(c->begin, c->origin_begin, std::uint32_t(c->text.size()));
            out += c->origin->format(item);
        } else {
            out += src->format(item);
        }
    }
    return out;
}

} // namespace rag::repl
