// The language type of a host value (internal to dsl/: the specialisation key and the REPL).
#pragma once
#include "dsl/module.hpp"
#include "frontend/lower.hpp"

namespace rag {

frontend::VType vtype_of(const Value& v);

} // namespace rag
