// Test support for whole programs: IR in another float type, and the float64 central-
// difference check of a derived gradient.
#pragma once
#include "ir/ir.hpp"

namespace rag::testing {

// The same function with every `from` value (inputs, constants, casts) made `to`: lets a test
// check gradients of an f32 program in float64.
ir::Function with_dtype(const ir::Function& f, DType from, DType to);

// Differentiates output 0 of `f` (a scalar) w.r.t. the inputs in `wrt`, interprets it on
// `inputs` (f64), and compares every gradient element (at most `max_probes` per input) with
// central differences of the interpreted function.
void check_program_gradient(const ir::Function& f, const std::vector<RaggedTensor>& inputs,
                            const std::vector<int>& wrt, double tol = 1e-6, int max_probes = 12);

} // namespace rag::testing
