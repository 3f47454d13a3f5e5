#include "runtime/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <thread>
#include <vector>

namespace rag {
namespace {

int default_threads() {
    if (const char* s = std::getenv("RAG_NUM_THREADS"); s && std::atoi(s) > 0) return std::atoi(s);
    return int(std::max(1u, std::thread::hardware_concurrency()));
}

std::atomic<int> chosen{0};

} // namespace

int num_threads() {
    int n = chosen.load();
    return n > 0 ? n : default_threads();
}

void set_num_threads(int n) {
    chosen = std::max(n, 0);
}

void parallel_for(std::int64_t n, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn) {
    const std::int64_t threads =
        std::min<std::int64_t>(num_threads(), n / std::max<std::int64_t>(grain, 1));
    if (threads <= 1) {
        if (n > 0) fn(0, n);
        return;
    }
    // An exception in a worker is rethrown here, after every thread has joined.
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
    auto chunk = [&](std::int64_t t) {
        try {
            fn(n * t / threads, n * (t + 1) / threads);
        } catch (...) {
            errors[std::size_t(t)] = std::current_exception();
        }
    };
    std::vector<std::thread> pool;
    for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(chunk, t);
    chunk(0);
    for (auto& th : pool) th.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

} // namespace rag
