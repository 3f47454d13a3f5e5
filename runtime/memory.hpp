// Host memory accounting: every tensor buffer (Buffer::allocate) and every kernel workspace
// reports here, so tests and benchmarks can read the peak extra memory of a computation.
#pragma once
#include <cstddef>

namespace rag::memory {

struct Stats {
    std::size_t current = 0; // bytes held now
    std::size_t peak = 0;    // most bytes held at once since the last reset_peak()
};

Stats stats();
void reset_peak(); // peak := current

void allocated(std::size_t bytes);
void freed(std::size_t bytes);

} // namespace rag::memory
