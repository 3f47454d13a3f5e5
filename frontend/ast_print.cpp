// to_sexpr: a compact, stable rendering of the AST, for tests and dumps. Atoms never contain
// spaces, so a rendering splits into tokens on blanks and parentheses.
//
// Expressions
//   42   1.5   1e-05   2.0          integers; floats in shortest round-trip form, always with
//                                   '.', 'e', "inf" or "nan" so they differ from integers
//   true  false  x                  booleans, names
//   (neg x)                         unary minus
//   (+ a b)  (** a b)  (< a b)      binary operators, with the operator as written
//   (call f x (kw axis 2))          call: callee, positional arguments, keyword arguments
//   (call (call value_and_grad loss (kw wrt p)) x p)
//   (index x : new 0 1:3 :-1 2:)    index items: keep ':', 'new', an index, slices lo:hi
//   (. p wu)                        member
//   (tuple a b)                     tuple, also for one element
// Types
//   f32[B,~N,384]  f32[]  T[B,C]    tensor: dtype and dims (fixed, symbolic, ~ragged)
//   PairBlock                       named
//   (tuple f32[] PairBlock)         tuple
// Module: imports, then params, then functions, one declaration per block of lines
//   (import "lib.rag")
//   (params PairBlock
//     (field wu f32[384,128] (call normal 0.02))
//     (field ln_b f32[128]))                          a field without initialiser
//   (fn scale [T] ((x T[B,~N,C]) (s T[])) -> T[B,~N,C]
//     (let (tuple a (tuple b c)) (call f x))          let: pattern (name or tuple), value
//     (return (* x s)))
// `[T]` appears only for generic functions, `-> type` only with a declared result.
#include "frontend/parser.hpp"

#include <charconv>

namespace rag::frontend {
namespace {

std::string number(double v) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    std::string s(buf, r.ptr);
    if (s.find_first_of(".ein") == std::string::npos) s += ".0";
    return s;
}

std::string item(const ast::IndexItem& i) {
    switch (i.kind) {
    case ast::IndexItem::Kind::keep:
        return ":";
    case ast::IndexItem::Kind::newaxis:
        return "new";
    case ast::IndexItem::Kind::index:
        return std::to_string(i.index);
    case ast::IndexItem::Kind::slice:
        return (i.lo ? std::to_string(*i.lo) : "") + ":" + (i.hi ? std::to_string(*i.hi) : "") +
               (i.step ? ":" + std::to_string(*i.step) : "");
    case ast::IndexItem::Kind::gather:
        return i.ids ? to_sexpr(*i.ids) : "<null>";
    }
    return "?";
}

std::string pattern(const ast::Pattern& p) {
    if (!p.is_tuple()) return p.name;
    std::string s = "(tuple";
    for (const auto& e : p.elems) s += " " + pattern(e);
    return s + ")";
}

std::string expr(const ast::ExprPtr& e) {
    return e ? to_sexpr(*e) : "<null>";
}

std::string body(const std::vector<ast::Stmt>& stmts, const std::string& indent) {
    std::string s;
    for (const auto& st : stmts) {
        switch (st.kind) {
        case ast::Stmt::Kind::let:
            s += indent + "(let " + pattern(st.target) + " " + expr(st.value) + ")";
            break;
        case ast::Stmt::Kind::assign:
            s += indent + "(set " + pattern(st.target) + " " + expr(st.value) + ")";
            break;
        case ast::Stmt::Kind::ret:
            s += indent + "(return " + expr(st.value) + ")";
            break;
        case ast::Stmt::Kind::loop:
            s += indent + "(for " + pattern(st.target) + " " + expr(st.value) +
                 body(st.body, indent + "  ") + ")";
            break;
        }
    }
    return s;
}

} // namespace

std::string to_sexpr(const ast::Expr& e) {
    using K = ast::Expr::Kind;
    std::string s;
    switch (e.kind) {
    case K::integer:
        return std::to_string(e.ival);
    case K::floating:
        return number(e.fval);
    case K::boolean:
        return e.bval ? "true" : "false";
    case K::string:
        return "\"" + e.name + "\"";
    case K::name:
        return e.name;
    case K::unary:
        s = "(" + std::string(e.op == "-" ? "neg" : e.op);
        break;
    case K::binary:
        s = "(" + e.op;
        break;
    case K::call:
        s = "(call";
        break;
    case K::index:
        s = "(index";
        break;
    case K::member:
        s = "(.";
        break;
    case K::tuple:
        s = "(tuple";
        break;
    }
    for (const auto& o : e.operands) s += " " + expr(o);
    for (const auto& a : e.args)
        s += a.spread            ? " (spread " + expr(a.value) + ")"
             : a.keyword.empty() ? " " + expr(a.value)
                                 : " (kw " + a.keyword + " " + expr(a.value) + ")";
    for (const auto& i : e.items) s += " " + item(i);
    if (e.kind == K::member) s += " " + e.name;
    return s + ")";
}

std::string to_sexpr(const ast::TypeExpr& t) {
    switch (t.kind) {
    case ast::TypeExpr::Kind::tensor: {
        std::string s = t.dtype + "[";
        for (std::size_t i = 0; i < t.dims.size(); ++i) {
            const auto& d = t.dims[i];
            if (i) s += ",";
            if (d.kind == ast::DimExpr::Kind::fixed)
                s += std::to_string(d.extent);
            else
                s += (d.kind == ast::DimExpr::Kind::ragged ? "~" : "") + d.name;
        }
        s += "]";
        if (t.array)
            s += "[" +
                 (t.array->kind == ast::DimExpr::Kind::fixed ? std::to_string(t.array->extent)
                                                             : t.array->name) +
                 "]";
        return s;
    }
    case ast::TypeExpr::Kind::named:
        return t.name;
    case ast::TypeExpr::Kind::function:
        return "fn";
    case ast::TypeExpr::Kind::tuple: {
        std::string s = "(tuple";
        for (const auto& e : t.elems) s += " " + to_sexpr(e);
        return s + ")";
    }
    }
    return "?";
}

std::string to_sexpr(const ast::Module& m) {
    std::string s;
    for (const auto& i : m.imports) s += "(import \"" + i.path + "\")\n";
    for (const auto& p : m.params) {
        s += "(params " + p.name;
        if (!p.sizes.empty()) {
            s += " [";
            for (std::size_t i = 0; i < p.sizes.size(); ++i) s += (i ? " " : "") + p.sizes[i];
            s += "]";
        }
        for (const auto& f : p.fields) {
            s += "\n  (field " + f.name + " " + to_sexpr(f.type);
            if (f.init) s += " " + to_sexpr(*f.init);
            s += ")";
        }
        s += ")\n";
    }
    for (const auto& f : m.fns) {
        s += "(fn " + f.name;
        if (!f.type_params.empty()) {
            s += " [";
            for (std::size_t i = 0; i < f.type_params.size(); ++i)
                s += (i ? " " : "") + f.type_params[i];
            s += "]";
        }
        s += " (";
        for (std::size_t i = 0; i < f.params.size(); ++i)
            s += (i ? " (" : "(") + f.params[i].name + " " + to_sexpr(f.params[i].type) + ")";
        s += ")";
        if (f.result) s += " -> " + to_sexpr(*f.result);
        s += body(f.body, "\n  ");
        s += ")\n";
    }
    return s;
}

} // namespace rag::frontend
