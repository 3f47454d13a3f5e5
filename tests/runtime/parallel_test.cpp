// parallel_for: every index exactly once in chunks of at least `grain`, the same chunks for a
// given (n, grain) whatever the thread count, exceptions reach the caller, and calls nested inside
// a chunk or made from several threads at once complete.
#include "runtime/parallel.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace rag {
namespace {

struct Threads {
    explicit Threads(int n) { set_num_threads(n); }
    ~Threads() { set_num_threads(0); }
};

std::set<std::pair<std::int64_t, std::int64_t>> chunks_of(std::int64_t n, std::int64_t grain) {
    std::mutex mu;
    std::set<std::pair<std::int64_t, std::int64_t>> out;
    parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
        std::lock_guard<std::mutex> lock(mu);
        out.insert({b, e});
    });
    return out;
}

TEST(ParallelFor, CoversEveryIndexOnceInChunksOfAtLeastTheGrain) {
    for (int threads : {1, 2, 3, 5})
        for (std::int64_t n : {0, 1, 2, 7, 64, 1000, 100003})
            for (std::int64_t grain : {1, 3, 1000}) {
                Threads t(threads);
                std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
                parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
                    if (n >= grain) {
                        EXPECT_GE(e - b, grain);
                    }
                    for (std::int64_t i = b; i < e; ++i) ++hits[std::size_t(i)];
                });
                for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[std::size_t(i)], 1) << i;
                // Deterministic boundaries: a second call makes the same chunks.
                EXPECT_EQ(chunks_of(n, grain), chunks_of(n, grain));
            }
}

TEST(ParallelFor, ChunksDoNotDependOnTheThreadCount) {
    // A kernel whose result depends on where a chunk ends (a vector body and a scalar tail)
    // computes the same bits under any RAG_NUM_THREADS only if the chunks are the same.
    for (std::int64_t n : {1, 7, 64, 1000, 100003})
        for (std::int64_t grain : {1, 3, 1000}) {
            std::set<std::pair<std::int64_t, std::int64_t>> one;
            {
                Threads t(1);
                one = chunks_of(n, grain);
            }
            for (int threads : {2, 3, 5}) {
                Threads t(threads);
                EXPECT_EQ(chunks_of(n, grain), one) << n << " " << grain << " " << threads;
            }
        }
}

TEST(ParallelFor, UnevenWorkIsSharedByTheThreads) {
    // One expensive index among cheap ones (a long sample among short ones): the thread that
    // runs it must not also own half of the cheap ones, as a split into one chunk per thread
    // would make it; the other thread takes them while it works.
    Threads t(2);
    std::mutex mu;
    std::map<std::thread::id, int> count;
    std::thread::id slow;
    parallel_for(64, 1, [&](std::int64_t b, std::int64_t e) {
        if (b == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            std::lock_guard<std::mutex> lock(mu);
            slow = std::this_thread::get_id();
        }
        std::lock_guard<std::mutex> lock(mu);
        count[std::this_thread::get_id()] += int(e - b);
    });
    EXPECT_LE(count[slow], 16);
}

TEST(ParallelFor, ExceptionsReachTheCallerAndThePoolStaysUsable) {
    Threads t(3);
    EXPECT_THROW(parallel_for(100, 1,
                              [](std::int64_t b, std::int64_t) {
                                  if (b > 50) throw std::runtime_error("chunk failed");
                              }),
                 std::runtime_error);
    std::atomic<std::int64_t> sum{0};
    parallel_for(100, 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum, 4950);
}

TEST(ParallelFor, NestedAndConcurrentCallsComplete) {
    Threads t(2);
    std::atomic<std::int64_t> inner{0};
    parallel_for(8, 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i)
            parallel_for(10, 1, [&](std::int64_t x, std::int64_t y) { inner += y - x; });
    });
    EXPECT_EQ(inner, 80);
    std::atomic<std::int64_t> total{0};
    std::vector<std::thread> users;
    for (int u = 0; u < 4; ++u)
        users.emplace_back([&] {
            for (int r = 0; r < 50; ++r)
                parallel_for(1000, 1, [&](std::int64_t b, std::int64_t e) { total += e - b; });
        });
    for (auto& u : users) u.join();
    EXPECT_EQ(total, 4 * 50 * 1000);
}

} // namespace
} // namespace rag
