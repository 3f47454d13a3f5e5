// The standard library: the layers of stdlib/*.rag, embedded in the binary when it is built
// (stdlib/embed.py), parsed and validated once per process, and appended to every program
// after its own files, so its names are in scope without an import and a user's definition of
// the same name shadows it (with a note).
#pragma once
#include "frontend/lower.hpp"

#include <string>
#include <utility>
#include <vector>

namespace rag::frontend {

// (path, text) of each embedded file (generated: stdlib_sources.cpp).
const std::vector<std::pair<std::string, std::string>>& stdlib_sources();

// The parsed library, built on first use (thread-safe) and shared by every program;
// rag::Error if it does not parse or validate (a build problem, never a user's).
const std::vector<Program::Unit>& stdlib_units();

// One documented declaration: its kind ("params" or "fn"), name, signature as written, the
// comment lines above it, and the file it is in.
struct StdlibEntry {
    std::string kind, name, signature, doc, file;
};
std::vector<StdlibEntry> stdlib_entries();
// The reference page docs/stdlib.md (`rag check --stdlib --markdown`); `rag check --stdlib`
// prints the same entries as plain text.
std::string stdlib_markdown();
std::string stdlib_text();

} // namespace rag::frontend
