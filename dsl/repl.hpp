// `rag repl`: an interactive session over the same Module machinery as files.
#pragma once
#include <cstdio>

namespace rag {

// Runs a session reading from `in` (a terminal gets line editing and history) and writing to
// `out`; returns the process exit status.
int run_repl(std::FILE* in, std::FILE* out);

} // namespace rag
