// Reverse-mode automatic differentiation as an IR transform. Each op's VJP rule from the op
// table emits the gradient ops into the same function; nothing is differentiated numerically.
#pragma once
#include "ir/ir.hpp"

namespace rag::ir {

// A function with f's inputs whose outputs are f's outputs followed by the gradient of
// output `of` (which must be a floating-point scalar) with respect to each input listed in
// `wrt` (input positions). Inputs the result does not depend on get zero gradients.
Function differentiate(const Function& f, int of, const std::vector<int>& wrt);

// The vector-Jacobian product of f: f's inputs followed by one cotangent input per output
// listed in `seeded` (each with that output's schema), returning the gradient of
// sum_k <f.outputs[seeded[k]], cotangent k> with respect to each input in `wrt` (zeros where
// it does not depend on them). Nodes [0, f.nodes.size()) are f's own, unchanged (split_vjp
// relies on it); call eliminate_common_subexpressions before running it whole.
Function vjp(const Function& f, const std::vector<int>& seeded, const std::vector<int>& wrt);

// g = vjp(f, ...) cut after f: `forward` returns f's outputs followed by the `residuals` values
// of f that the reverse pass reads; `backward` takes those residuals followed by the
// cotangents and returns g's outputs. So a host that runs the forward keeps its intermediates
// and never runs it twice (the PyTorch bridge).
struct SplitVjp {
    Function forward, backward;
    int residuals = 0;
};
SplitVjp split_vjp(const Function& f, const Function& g);

} // namespace rag::ir
