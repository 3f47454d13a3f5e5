// Host memory for tensor buffers and kernel workspaces, with accounting: every block handed
// out is counted while it is live, so tests and benchmarks can read the peak extra memory of
// a computation.
//
// Large blocks are cached after release and handed out again for a request of the same size
// class. A training step allocates and frees the same large buffers every call; without the
// cache, glibc returns them to the kernel (mmap'd chunks, heap trimming) and the next call
// pays a page fault per 4 KiB when it first writes them, which measured a third of a
// near-uniform pair-program step here. Small blocks go straight to malloc, which caches them
// itself.
//
// The cache holds at most 5/4 of the process's high-water mark of live bytes minus the bytes
// live now, so a step's whole working set stays resident between calls, however large (a
// fixed 1 GiB cap emptied the whole cache whenever a larger step passed it). Why not the
// high-water mark itself: a step needs, size class by size class, the most blocks of that
// class it ever holds at once, and those maxima add up to more than the peak of the sum;
// bounded by the peak, BERT-Small's training step freed and faulted in again about 900 MB of
// blocks every call (220K page faults). The quarter's slack removes them all there, at most
// a quarter more resident memory than the computation's own peak.
#pragma once
#include <cstddef>

namespace rag::memory {

struct Stats {
    std::size_t current = 0; // bytes in live blocks now
    std::size_t peak = 0;    // most bytes in live blocks at once since the last reset_peak()
    std::size_t cached = 0;  // bytes held in the cache for reuse (not live, still resident)
};

Stats stats();
void reset_peak(); // peak := current

// A 64-byte-aligned block of at least `bytes` (never null: fails with rag::Error), counted
// as live until release(p, bytes) with the same size. Contents are unspecified.
void* acquire(std::size_t bytes);
void release(void* p, std::size_t bytes);

// Returns every cached block to the system (rag.empty_cache() in Python). RAG_HOST_CACHE_MB,
// when set, caps the cache further (0 disables it); past its bound the cache frees its largest
// blocks first.
void release_cached();

} // namespace rag::memory
