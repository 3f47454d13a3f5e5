// libFuzzer target for the parser: any bytes, as a file and as one expression. Beyond what the
// sanitizers catch, it checks that parsing never throws, that every span lies inside the text and
// that every diagnostic has a real message. Built and run by tests/fuzz/run.sh.
#include "frontend/parser.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

namespace {

using namespace rag;

void fail(const char* what, const std::string& detail) {
    std::fprintf(stderr, "parser_fuzz: %s: %s\n", what, detail.c_str());
    std::abort();
}

void check_span(const SourceFile& src, Span s, const char* what) {
    if (s.begin > s.end || s.end > src.text().size())
        fail("span out of range", std::string(what) + " [" + std::to_string(s.begin) + ", " +
                                      std::to_string(s.end) + ")");
}

void check_expr(const SourceFile& src, const ast::Expr& e) {
    check_span(src, e.span, "expr");
    for (const auto& o : e.operands) {
        if (!o) fail("null operand", "");
        check_expr(src, *o);
    }
    for (const auto& a : e.args) {
        check_span(src, a.span, "arg");
        if (!a.value) fail("null argument", "");
        check_expr(src, *a.value);
    }
    for (const auto& i : e.items) {
        check_span(src, i.span, "index item");
        if (i.kind == ast::IndexItem::Kind::gather) {
            if (!i.ids) fail("gather item without ids", "");
            check_expr(src, *i.ids);
        }
    }
}

void check_type(const SourceFile& src, const ast::TypeExpr& t) {
    check_span(src, t.span, "type");
    for (const auto& d : t.dims) check_span(src, d.span, "dim");
    for (const auto& e : t.elems) check_type(src, e);
}

void check_pattern(const SourceFile& src, const ast::Pattern& p) {
    check_span(src, p.span, "pattern");
    for (const auto& e : p.elems) check_pattern(src, e);
}

void check_diagnostics(const Diagnostics& diags) {
    for (const auto& d : diags.items()) {
        check_span(diags.source(), d.span, "diagnostic");
        const std::string& m = d.message;
        // A message made from an unnamed X3 parser would hold a mangled type name (unless the
        // input itself does: messages quote declaration names).
        auto quoted = [&](const char* s) {
            return m.find(s) != std::string::npos &&
                   diags.source().text().find(s) == std::string::npos;
        };
        if (m.empty() || quoted("boost") || quoted("x3") || quoted("{decl}"))
            fail("bad diagnostic message", m);
    }
    (void)diags.str();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    SourceFile src("fuzz.rag", std::string(reinterpret_cast<const char*>(data), size));
    try {
        Diagnostics diags(src);
        ast::Module m = frontend::parse(src, diags);
        check_diagnostics(diags);
        for (const auto& i : m.imports) check_span(src, i.span, "import");
        for (const auto& p : m.params) {
            check_span(src, p.span, "params");
            for (const auto& f : p.fields) {
                check_type(src, f.type);
                if (f.init) check_expr(src, *f.init);
            }
        }
        for (const auto& f : m.fns) {
            check_span(src, f.span, "fn");
            check_span(src, f.name_span, "fn name");
            for (const auto& p : f.params) check_type(src, p.type);
            if (f.result) check_type(src, *f.result);
            std::function<void(const std::vector<ast::Stmt>&)> check_body =
                [&](const std::vector<ast::Stmt>& body) {
                    for (const auto& s : body) {
                        check_span(src, s.span, "stmt");
                        if (s.kind != ast::Stmt::Kind::ret) check_pattern(src, s.target);
                        if (!s.value) fail("statement without value", "");
                        check_expr(src, *s.value);
                        check_body(s.body);
                    }
                };
            check_body(f.body);
        }
        (void)frontend::to_sexpr(m);

        Diagnostics expr_diags(src);
        ast::ExprPtr e = frontend::parse_expr(src, expr_diags);
        check_diagnostics(expr_diags);
        if (!e && expr_diags.empty()) fail("parse_expr returned null without a diagnostic", "");
        if (e) {
            check_expr(src, *e);
            (void)frontend::to_sexpr(*e);
        }
    } catch (const std::exception& ex) {
        fail("exception escaped the parser", ex.what());
    }
    return 0;
}
