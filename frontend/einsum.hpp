// The einsum builtin (docs/language.md): two-operand einsum lowered to transpose, index, sum,
// mul and matmul ops, so it has no op of its own and every tier runs it.
#pragma once
#include "frontend/lowerer.hpp"

namespace rag::frontend {

// Lowers `einsum("spec", a, b)`; reports errors at the call's span.
LV einsum(Lowerer& L, const ast::Expr& call);

} // namespace rag::frontend
