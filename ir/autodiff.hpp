// Reverse-mode automatic differentiation as an IR transform. Each op's VJP rule from the op
// table emits the gradient ops into the same function; nothing is differentiated numerically.
#pragma once
#include "ir/ir.hpp"

namespace rag::ir {

// A function with f's inputs whose outputs are f's outputs followed by the gradient of
// output `of` (which must be a floating-point scalar) with respect to each input listed in
// `wrt` (input positions). Inputs the result does not depend on get zero gradients.
Function differentiate(const Function& f, int of, const std::vector<int>& wrt);

} // namespace rag::ir
