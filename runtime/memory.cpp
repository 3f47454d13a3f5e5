#include "runtime/memory.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <map>
#include <mutex>
#include <vector>

namespace rag::memory {
namespace {

std::atomic<std::size_t> current_bytes{0}, peak_bytes{0};
// The same for the blocks as allocated (their size classes), now and at most ever (reset_peak
// does not touch it): what bounds the cache.
std::atomic<std::size_t> held_bytes{0}, held_high_water{0};

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

// RAG_HOST_CACHE_MB, when set: a fixed cap on top of the high-water bound.
std::size_t cache_cap() {
    const char* env = std::getenv("RAG_HOST_CACHE_MB");
    return env ? std::size_t(std::strtoull(env, nullptr, 10)) << 20 : SIZE_MAX;
}

struct Cache {
    std::mutex mutex;
    std::map<std::size_t, std::vector<void*>> free_blocks; // by size class
    std::size_t bytes = 0;
    const std::size_t cap = cache_cap();

    // Frees cached blocks, largest first, until at most `keep` bytes stay (mutex held).
    void shrink_to(std::size_t keep) {
        while (bytes > keep && !free_blocks.empty()) {
            auto last = std::prev(free_blocks.end());
            if (last->second.empty()) { // a class acquire() emptied
                free_blocks.erase(last);
                continue;
            }
            std::free(last->second.back());
            last->second.pop_back();
            bytes -= last->first;
            if (last->second.empty()) free_blocks.erase(last);
        }
    }
};

Cache& cache() {
    static Cache* c = new Cache; // never destroyed: buffers may be released during exit
    return *c;
}

void raise_to(std::atomic<std::size_t>& max, std::size_t now) {
    std::size_t seen = max.load();
    while (now > seen && !max.compare_exchange_weak(seen, now)) {
    }
}

void count_live(std::size_t bytes, std::size_t size) {
    raise_to(peak_bytes, current_bytes += bytes);
    raise_to(held_high_water, held_bytes += size);
}
void count_released(std::size_t bytes, std::size_t size) {
    current_bytes -= bytes;
    held_bytes -= size;
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
    count_live(live_size(bytes), size);
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
        count_released(live_size(bytes), size);
        fail("out of memory allocating ", bytes, " bytes");
    }
    return p;
}

void release(void* p, std::size_t bytes) {
    if (!p) return;
    const std::size_t size = size_class(bytes ? bytes : 1);
    count_released(live_size(bytes), size);
    if (size >= kCachedFrom) {
        Cache& c = cache();
        std::lock_guard lock(c.mutex);
        // Live and cached bytes together stay within 5/4 of the most the process ever had
        // live (memory.hpp says why not 1); RAG_HOST_CACHE_MB caps the cache further.
        const std::size_t live = held_bytes.load(), most = held_high_water.load();
        const std::size_t bound = most + most / 4;
        const std::size_t limit = std::min(c.cap, bound > live ? bound - live : 0);
        if (size <= limit) {
            c.shrink_to(limit - size);
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
    c.shrink_to(0);
#ifdef __GLIBC__
    // Blocks below glibc's mmap threshold went back to its heap, which keeps them resident:
    // hand the heap's free pages back too, so "returned to the system" holds.
    malloc_trim(0);
#endif
}

} // namespace rag::memory
