#include "frontend/validate.hpp"

#include "runtime/error.hpp"

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

} // namespace

void validate(const Program& prog, Diagnostics& diags) {
    std::set<std::string> fns, groups;
    for (const auto& u : prog.units) {
        const SourceFile* file = u.src.get();
        for (const auto& p : u.module.params) {
            if (!groups.insert(p.name).second)
                diags.error(p.name_span, "params " + p.name + " is defined twice", file);
            std::set<std::string> fields;
            for (const auto& f : p.fields) {
                if (!fields.insert(f.name).second)
                    diags.error(f.span, p.name + "." + f.name + " is declared twice", file);
                if (f.init && !prog.record_name(f.type))
                    if (auto why = initialiser_problem(*f.init); !why.empty())
                        diags.error(f.init->span, p.name + "." + f.name + ": " + why, file);
            }
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
            if (!fns.insert(f.name).second)
                diags.error(f.name_span, "fn " + f.name + " is defined twice", file);
            std::set<std::string> names;
            for (const auto& t : f.type_params)
                if (!names.insert(t).second)
                    diags.error(f.name_span, f.name + ": type parameter " + t + " is given twice",
                                file);
            for (const auto& a : f.params)
                if (!names.insert(a.name).second)
                    diags.error(a.span, f.name + ": parameter '" + a.name + "' is given twice",
                                file);
        }
    }
}

} // namespace rag::frontend
