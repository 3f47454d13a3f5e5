// Work splitting over the host's cores, shared by every CPU kernel. The split into chunks is a
// function of the work size and grain alone, never of the thread count, so a kernel computes
// the same bits under any RAG_NUM_THREADS as long as it combines chunk results (if at all) in
// chunk order.
#pragma once
#include <cstdint>
#include <functional>

namespace rag {

// Threads used by parallel_for: RAG_NUM_THREADS if set, else every core. 0 restores that.
int num_threads();
void set_num_threads(int n);

// Runs fn(begin, end) over disjoint chunks covering [0, n), on up to num_threads() threads of
// a process-wide pool (the caller being one), each chunk holding at least `grain` indices (one
// chunk when n < 2 grain). There are up to 64 chunks, each thread taking the next when done, so
// uneven ragged work balances. A call made from inside a chunk, or while another thread's call
// runs, runs the same chunks on its own thread.
void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

} // namespace rag
