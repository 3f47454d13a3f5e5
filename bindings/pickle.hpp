// Pickling rag.Tensor (and through it rag.Params): the state is plain Python data (dtype name,
// per-sample axes, batch, per-sample extents, raw bytes), so a round trip is bitwise and keeps
// the ragged structure and axis names; unpickling validates it like any other input.
#pragma once
#include "bindings/initialised.hpp"
#include "runtime/tensor.hpp"

#include <pybind11/pybind11.h>

namespace rag::bind {

// The state is a tuple; both ends say object so that __setstate__ takes anything, and refuses
// what is not a state with a rag.Error.
pybind11::object tensor_state(const RaggedTensor& t);
RaggedTensor tensor_from_state(const pybind11::object& state);

} // namespace rag::bind
