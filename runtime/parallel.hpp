// Work splitting over the host's cores, shared by every CPU kernel. The split is a function of
// the work size and the thread count alone; kernels that must be bitwise deterministic across
// thread counts give each index a fixed, independent piece of work (no cross-chunk sums).
#pragma once
#include <cstdint>
#include <functional>

namespace rag {

// Threads used by parallel_for: RAG_NUM_THREADS if set, else every core. 0 restores that.
int num_threads();
void set_num_threads(int n);

// Runs fn(begin, end) over disjoint chunks covering [0, n), on up to num_threads() threads of
// a process-wide pool (the caller being one), each chunk holding at least `grain` indices (one
// chunk, on this thread, when n < 2 grain). There are up to 8 chunks per thread, each thread
// taking the next when done, so uneven ragged work balances. A call made from inside a chunk,
// or while another thread's call runs, runs its chunks on its own thread.
void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

} // namespace rag
