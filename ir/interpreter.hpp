// The reference interpreter: runs IR on RaggedTensors through the op table's reference
// kernels. It is the oracle every compiled tier is compared with.
#pragma once
#include "ir/ir.hpp"

namespace rag::ir {

// Inputs must have the function's input schemas (rag::Error naming the argument otherwise).
std::vector<RaggedTensor> interpret(const Function& f, const std::vector<RaggedTensor>& inputs);

// One value per node with the `input` and `const` nodes filled in, the rest empty: how every
// tier starts a call. Checks the inputs as interpret() does.
std::vector<RaggedTensor> bind_inputs(const Function& f, const std::vector<RaggedTensor>& inputs);

} // namespace rag::ir
