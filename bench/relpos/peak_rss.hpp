// Peak resident memory of one call beyond what the process held before it, the same measure
// for every system (rag's buffers, std::vector workspaces, OpenBLAS, and in peers.py PyTorch):
// the kernel's high-water mark is reset (/proc/self/clear_refs, "5"), rag's cached blocks and
// free heap pages are given back first (memory::release_cached, malloc_trim) so a reused free
// block cannot hide an allocation, and the result is VmHWM after the call minus VmRSS before it.
#pragma once
#include "runtime/memory.hpp"

#include <malloc.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace rag::bench {

inline std::int64_t status_kib(const char* key) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size()));
    return -1;
}

// Bytes of resident memory fn() added at its peak, or -1 where /proc cannot tell.
template <class Fn> std::int64_t peak_rss_bytes(Fn&& fn) {
    memory::release_cached();
    malloc_trim(0);
    {
        std::ofstream reset("/proc/self/clear_refs");
        reset << "5";
    }
    const std::int64_t before = status_kib("VmRSS:");
    fn();
    const std::int64_t hwm = status_kib("VmHWM:");
    if (before < 0 || hwm < 0) return -1;
    return (hwm - before) * 1024;
}

} // namespace rag::bench
