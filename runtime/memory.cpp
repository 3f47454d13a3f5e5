#include "runtime/memory.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace rag::memory {
namespace {

std::atomic<std::size_t> current_bytes{0}, peak_bytes{0};

// Blocks below this size go to malloc directly (its bins serve them without page faults).
constexpr std::size_t kCachedFrom = std::size_t(1) << 16;

// Four size classes per power of two: at most 25% of a cached block is unused, and buffers
// whose size changes a little with the lengths still share a class.
std::size_t size_class(std::size_t bytes) {
    if (bytes < kCachedFrom) return (bytes + 63) / 64 * 64;
    const int top = int(std::bit_width(bytes - 1)) - 1; // 2^top < bytes <= 2^(top+1)
    const std::size_t step = std::size_t(1) << (top - 2);
    return (bytes + step - 1) / step * step;
}

// Live bytes are counted as requested (to 64): what the computation holds, whatever its
// blocks' classes. The cache's bytes are reported apart.
std::size_t live_size(std::size_t bytes) {
    return (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
}

std::size_t cache_cap() {
    const char* env = std::getenv("RAG_HOST_CACHE_MB");
    return (env ? std::strtoull(env, nullptr, 10) : 1024ull) << 20;
}

struct Cache {
    std::mutex mutex;
    std::map<std::size_t, std::vector<void*>> free_blocks; // by size class
    std::size_t bytes = 0;
    const std::size_t cap = cache_cap();

    void drop_all() { // with mutex held
        for (auto& [size, blocks] : free_blocks)
            for (void* p : blocks) std::free(p);
        free_blocks.clear();
        bytes = 0;
    }
};

Cache& cache() {
    static Cache* c = new Cache; // never destroyed: buffers may be released during exit
    return *c;
}

void count_live(std::size_t bytes) {
    const std::size_t now = current_bytes += bytes;
    std::size_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
}

} // namespace

Stats stats() {
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    return {current_bytes.load(), peak_bytes.load(), c.bytes};
}

void reset_peak() {
    peak_bytes = current_bytes.load();
}

void* acquire(std::size_t bytes) {
    const std::size_t size = size_class(bytes ? bytes : 1);
    count_live(live_size(bytes));
    if (size >= kCachedFrom) {
        Cache& c = cache();
        std::lock_guard lock(c.mutex);
        auto it = c.free_blocks.find(size);
        if (it != c.free_blocks.end() && !it->second.empty()) {
            void* p = it->second.back();
            it->second.pop_back();
            c.bytes -= size;
            return p;
        }
    }
    void* p = std::aligned_alloc(64, size);
    if (!p) {
        current_bytes -= live_size(bytes);
        fail("out of memory allocating ", bytes, " bytes");
    }
    return p;
}

void release(void* p, std::size_t bytes) {
    if (!p) return;
    const std::size_t size = size_class(bytes ? bytes : 1);
    current_bytes -= live_size(bytes);
    if (size >= kCachedFrom) {
        Cache& c = cache();
        std::lock_guard lock(c.mutex);
        if (size <= c.cap) {
            if (c.bytes + size > c.cap) c.drop_all();
            c.free_blocks[size].push_back(p);
            c.bytes += size;
            return;
        }
    }
    std::free(p);
}

void release_cached() {
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    c.drop_all();
}

} // namespace rag::memory
