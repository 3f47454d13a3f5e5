#include "runtime/memory.hpp"

#include <atomic>

namespace rag::memory {
namespace {
std::atomic<std::size_t> current_bytes{0}, peak_bytes{0};
}

Stats stats() {
    return {current_bytes.load(), peak_bytes.load()};
}

void reset_peak() {
    peak_bytes = current_bytes.load();
}

void allocated(std::size_t bytes) {
    const std::size_t now = current_bytes += bytes;
    std::size_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
}

void freed(std::size_t bytes) {
    current_bytes -= bytes;
}

} // namespace rag::memory
