#include "frontend/validate.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <map>
#include <set>

namespace rag::frontend {
namespace {

// `zeros`, `ones`, `normal(std)`, `uniform(lo, hi)` with number arguments (Module::init).
std::string initialiser_problem(const ast::Expr& e) {
    const ast::Expr* callee = e.kind == ast::Expr::Kind::call ? e.operands[0].get() : &e;
    if (callee->kind != ast::Expr::Kind::name)
        return "an initialiser is zeros, ones, normal(std) or uniform(lo, hi)";
    const std::string& n = callee->name;
    std::size_t want = n == "zeros" || n == "ones" ? 0 : n == "normal" ? 1 : n == "uniform" ? 2 : 9;
    if (want == 9)
        return "unknown initialiser '" + n + "': use zeros, ones, normal(std) or uniform(lo, hi)";
    std::size_t got = e.kind == ast::Expr::Kind::call ? e.args.size() : 0;
    if (got != want || (want > 0 && e.kind != ast::Expr::Kind::call))
        return n + " takes " + std::to_string(want) + " argument" + (want == 1 ? "" : "s") +
               ", got " + std::to_string(got);
    for (const auto& a : e.args) {
        const ast::Expr* v = a.value.get();
        if (v->kind == ast::Expr::Kind::unary) v = v->operands[0].get();
        if (!a.keyword.empty() ||
            (v->kind != ast::Expr::Kind::integer && v->kind != ast::Expr::Kind::floating))
            return n + ": arguments must be numbers";
    }
    return "";
}

// Where a sized group is used: `Linear[384, 128]` or `Linear[I, O]` with the right number of
// sizes; a group without sizes takes one (`Layer[4]`, an array) and a sized group is never
// bare. "" when `t` is fine.
std::string sizes_problem(const Program& prog, const ast::TypeExpr& t) {
    for (const auto& e : t.elems)
        if (auto why = sizes_problem(prog, e); !why.empty()) return why;
    if (t.kind == ast::TypeExpr::Kind::named) {
        const ast::ParamsDecl* g = prog.find_params(t.name);
        if (g && !g->sizes.empty()) {
            std::string s;
            for (const auto& n : g->sizes) s += (s.empty() ? "" : ", ") + n;
            return "params " + t.name + " needs its sizes: " + t.name + "[" + s + "]";
        }
        return "";
    }
    if (t.kind != ast::TypeExpr::Kind::tensor || t.dtype == "Adam") return "";
    const ast::ParamsDecl* g = prog.find_params(t.dtype);
    if (!g) return "";
    for (const auto& d : t.dims)
        if (d.kind == ast::DimExpr::Kind::ragged)
            return "a params type takes integers or size names in brackets, got ~" + d.name;
    if (g->sizes.empty()) {
        if (t.dims.size() != 1)
            return "params " + g->name + " has no sizes: " + g->name +
                   "[n] is an array of n, got " + std::to_string(t.dims.size()) + " extents";
        return "";
    }
    if (t.dims.size() != g->sizes.size()) {
        std::string s;
        for (const auto& n : g->sizes) s += (s.empty() ? "" : ", ") + n;
        return "params " + g->name + " takes " + std::to_string(g->sizes.size()) + " size" +
               (g->sizes.size() == 1 ? "" : "s") + " [" + s + "], got " +
               std::to_string(t.dims.size());
    }
    return "";
}

// A bare name in a signature (`p: P`) or in `Adam[P]` is a params group or one of the
// function's type parameters; "" when `t` names nothing else.
std::string unknown_type(const Program& prog, const ast::TypeExpr& t,
                         const std::vector<std::string>& type_params) {
    for (const auto& e : t.elems)
        if (auto why = unknown_type(prog, e, type_params); !why.empty()) return why;
    auto known = [&](const std::string& n) {
        return prog.find_params(n) ||
               std::find(type_params.begin(), type_params.end(), n) != type_params.end();
    };
    if (t.kind == ast::TypeExpr::Kind::named && !known(t.name))
        return "unknown type '" + t.name + "'";
    if (t.kind == ast::TypeExpr::Kind::tensor && t.dtype == "Adam" && t.dims.size() == 1 &&
        t.dims[0].kind == ast::DimExpr::Kind::symbolic && !known(t.dims[0].name))
        return "unknown type '" + t.dims[0].name + "' in Adam[" + t.dims[0].name + "]";
    return "";
}

// In `params Linear[I, O]`, a field's dimensions are integers or the sizes I, O.
std::string unknown_size(const ast::ParamsDecl& p, const ast::TypeExpr& t) {
    for (const auto& e : t.elems)
        if (auto why = unknown_size(p, e); !why.empty()) return why;
    auto known = [&](const ast::DimExpr& d) {
        return d.kind != ast::DimExpr::Kind::symbolic ||
               std::find(p.sizes.begin(), p.sizes.end(), d.name) != p.sizes.end();
    };
    std::vector<ast::DimExpr> dims = t.dims;
    if (t.array) dims.push_back(*t.array);
    for (const auto& d : dims)
        if (!known(d)) {
            std::string s;
            for (const auto& n : p.sizes) s += (s.empty() ? "" : ", ") + n;
            return "unknown size '" + d.name + "' (the sizes of " + p.name + " are " + s + ")";
        }
    return "";
}

std::string where(const SourceFile* f, Span s) {
    auto [line, col] = f->line_col(s.begin);
    return f->path() + ":" + std::to_string(line) + ":" + std::to_string(col);
}

} // namespace

void validate(const Program& prog, Diagnostics& diags) {
    // The first declaration of each name: a user's definition shadows the standard library's
    // (a note says so); two user definitions, or two stdlib ones, are an error.
    struct Decl {
        const SourceFile* file;
        Span span;
        bool stdlib;
    };
    std::map<std::string, Decl> fns, groups;
    auto declare = [&](std::map<std::string, Decl>& seen, const std::string& kind,
                       const std::string& name, Span span, const Program::Unit& u) {
        Decl d{u.src.get(), span, u.stdlib};
        auto [it, fresh] = seen.emplace(name, d);
        if (fresh) return true;
        if (it->second.stdlib == u.stdlib) {
            diags.error(span, kind + " " + name + " is defined twice", u.src.get());
            return false;
        }
        const Decl& user = u.stdlib ? it->second : d;
        const Decl& lib = u.stdlib ? d : it->second;
        diags.note(user.span,
                   kind + " " + name + " shadows the standard library's " + name + " (" +
                       where(lib.file, lib.span) + "): this definition is used" +
                       (kind == "fn" ? " (the library's own layers keep calling theirs)"
                                     : ", also where the library's groups contain a " + name),
                   user.file);
        if (!u.stdlib) it->second = d;
        return false;
    };
    for (const auto& u : prog.units) {
        const SourceFile* file = u.src.get();
        for (const auto& p : u.module.params) {
            declare(groups, "params", p.name, p.name_span, u);
            if (u.stdlib) continue; // checked once per process (frontend/stdlib.cpp)
            const std::size_t before = diags.items().size();
            std::set<std::string> fields, sizes;
            for (const auto& n : p.sizes)
                if (!sizes.insert(n).second)
                    diags.error(p.name_span, "params " + p.name + ": size " + n + " is given twice",
                                file);
            for (const auto& f : p.fields) {
                if (!fields.insert(f.name).second)
                    diags.error(f.span, p.name + "." + f.name + " is declared twice", file);
                if (auto why = sizes_problem(prog, f.type); !why.empty())
                    diags.error(f.type.span, p.name + "." + f.name + ": " + why, file);
                else if (auto why = unknown_size(p, f.type); !p.sizes.empty() && !why.empty())
                    diags.error(f.type.span, p.name + "." + f.name + ": " + why, file);
                if (f.init && !prog.record_name(f.type) && !prog.sized_group(f.type))
                    if (auto why = initialiser_problem(*f.init); !why.empty())
                        diags.error(f.init->span, p.name + "." + f.name + ": " + why, file);
            }
            // A group with sizes is checked where it is given them; one with a bad field
            // already said so.
            if (!p.sizes.empty() || diags.items().size() != before) continue;
            try {
                prog.record_type(p.name);
            } catch (const Error& e) {
                // Point at the field the message names, else at the group.
                Span at = p.name_span;
                for (const auto& f : p.fields)
                    if (std::string(e.what()).find(p.name + "." + f.name + " ") !=
                            std::string::npos ||
                        std::string(e.what()).find(p.name + "." + f.name + ":") !=
                            std::string::npos)
                        at = f.type.span;
                diags.error(at, e.what(), file);
            }
        }
        for (const auto& f : u.module.fns) {
            declare(fns, "fn", f.name, f.name_span, u);
            if (u.stdlib) continue;
            std::set<std::string> names;
            for (const auto& t : f.type_params)
                if (!names.insert(t).second)
                    diags.error(f.name_span, f.name + ": type parameter " + t + " is given twice",
                                file);
            for (const auto& a : f.params) {
                if (!names.insert(a.name).second)
                    diags.error(a.span, f.name + ": parameter '" + a.name + "' is given twice",
                                file);
                if (auto why = sizes_problem(prog, a.type); !why.empty())
                    diags.error(a.type.span, f.name + ": parameter '" + a.name + "': " + why, file);
                else if (auto why = unknown_type(prog, a.type, f.type_params); !why.empty())
                    diags.error(a.type.span, f.name + ": parameter '" + a.name + "': " + why, file);
            }
            if (f.result) {
                if (auto why = sizes_problem(prog, *f.result); !why.empty())
                    diags.error(f.result->span, f.name + ": result: " + why, file);
                else if (auto why = unknown_type(prog, *f.result, f.type_params); !why.empty())
                    diags.error(f.result->span, f.name + ": result: " + why, file);
            }
        }
    }
}

} // namespace rag::frontend
