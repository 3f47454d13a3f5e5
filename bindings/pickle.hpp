// Pickling rag.Tensor (and through it rag.Params): the state is plain Python data (dtype name,
// per-sample axes, batch, per-sample extents, raw bytes), so a round trip is bitwise and keeps
// the ragged structure and axis names; unpickling validates it like any other input.
#pragma once
#include "runtime/tensor.hpp"

#include <pybind11/pybind11.h>

namespace rag::bind {

pybind11::tuple tensor_state(const RaggedTensor& t);
RaggedTensor tensor_from_state(const pybind11::tuple& state);

} // namespace rag::bind
