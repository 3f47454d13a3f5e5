// The language type of a host value (internal to dsl/: the specialisation key and the REPL).
#pragma once
#include "dsl/module.hpp"
#include "frontend/lower.hpp"

namespace rag {

// Records take their (nested) type from the program; `v` must be normalised.
frontend::VType vtype_of(const frontend::Program& prog, const Value& v);

} // namespace rag
