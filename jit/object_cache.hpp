// The persistent cache of compiled objects: a second process running the same program loads
// each module's machine code from disk instead of optimising and compiling it again.
//
// Where: $RAG_CACHE_DIR, else $XDG_CACHE_HOME/rag, else $HOME/.cache/rag; RAG_CACHE_DIR=off
// (or empty) disables it. Entries live under <dir>/rag-<version>/, one file per key, so a new
// rag version never reads an old entry. The key (computed by jit/llvm_jit.cpp) hashes the
// module's unoptimised IR, the rag version, the LLVM version, the target triple, the host CPU
// and its features and the optimisation levels.
//
// Safe under concurrent processes: an entry is written to a temporary file and renamed into
// place, so a reader sees a whole entry or none. A corrupt, truncated or foreign entry fails
// its checks, is ignored (counted as rejected) and is rebuilt; nothing here throws.
// This header knows nothing of LLVM.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace rag::jit {

struct CachedObject {
    std::string object; // the relocatable object file
    std::string ir;     // the optimised IR text (for llvm_ir() and dumps)
};

// The directory entries go to, with the version folder; empty when the cache is off.
// Read from the environment on every call, so tests can point it elsewhere.
std::string object_cache_dir();

// The entry for `key` (hex) if one is there and intact.
std::optional<CachedObject> load_cached_object(const std::string& key);

// Writes the entry (best effort: an unwritable directory only means no caching).
void store_cached_object(const std::string& key, const CachedObject& entry);

struct DiskCacheStats {
    std::int64_t hits = 0;     // modules loaded from disk
    std::int64_t misses = 0;   // modules compiled with the cache on
    std::int64_t rejected = 0; // entries present but corrupt, truncated or unloadable
    std::int64_t writes = 0;   // entries written
};
DiskCacheStats disk_cache_stats(); // process-wide
void count_disk_cache_rejected();  // for a loaded entry the JIT then refuses

} // namespace rag::jit
