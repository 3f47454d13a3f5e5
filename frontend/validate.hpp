// Declaration checks that need no types: duplicate names, params fields whose type or
// initialiser cannot work, reported at the declaration (LANGUAGE.md §3).
#pragma once
#include "frontend/lower.hpp"

namespace rag::frontend {

// Reports every problem in `prog`'s declarations to `diags`.
void validate(const Program& prog, Diagnostics& diags);

} // namespace rag::frontend
