// Argument errors in rag's words (bindings/arguments.cpp).
#pragma once
#include <pybind11/pybind11.h>

namespace rag::bind {

// Wraps every function and method of the module so that pybind11's "incompatible function
// arguments" TypeError reaches the user as rag.ArgumentError (a rag.Error and a TypeError)
// naming the call, what it takes and what it was given. Call last, once everything is defined.
void install_argument_errors(pybind11::module_& m);

} // namespace rag::bind
