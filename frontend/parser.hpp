// The parser (Boost.Spirit X3): rag source text -> ast::Module with source spans.
#pragma once
#include "frontend/ast.hpp"

namespace rag::frontend {

// Parses one file. Syntax errors go to `diags` (several per file: after an error the parser
// resynchronises at the next top-level `fn`, `params` or `import`); the module holds every
// declaration that parsed. Never throws on malformed input.
ast::Module parse(const SourceFile& src, Diagnostics& diags);

// Parses one expression spanning the whole text (the REPL evaluates these).
ast::ExprPtr parse_expr(const SourceFile& src, Diagnostics& diags);

// A compact, stable rendering of the AST, for tests: `(+ x (@ y W))`, `(call f x axis=2)`.
std::string to_sexpr(const ast::Expr& e);
std::string to_sexpr(const ast::TypeExpr& t);
std::string to_sexpr(const ast::Module& m);

} // namespace rag::frontend
