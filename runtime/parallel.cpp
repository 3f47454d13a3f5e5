#include "runtime/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace rag {
namespace {

int default_threads() {
    if (const char* s = std::getenv("RAG_NUM_THREADS"); s && std::atoi(s) > 0) return std::atoi(s);
    return int(std::max(1u, std::thread::hardware_concurrency()));
}

std::atomic<int> chosen{0};

// The most chunks a call is cut into. Ragged work is uneven (one long sample among short ones),
// so a call has more chunks than threads and each thread takes the next chunk when it is done.
// The count depends on n and grain alone, never on the thread count: a kernel whose result
// depends on where a chunk ends (a vector body and a scalar tail) then computes the same bits
// under any RAG_NUM_THREADS.
constexpr std::int64_t max_chunks = 64;

// Threads that live as long as the process and wait for work, so a call costs a wake-up, not a
// thread start. One call runs at a time; a call made while another runs (a nested call, or one
// from a second user thread) runs on its own thread alone.
class Pool {
  public:
    // Runs fn(c) for every c in [0, chunks) on the calling thread and `helpers` pool threads.
    void run(int helpers, std::int64_t chunks, const std::function<void(std::int64_t)>& fn) {
        auto alone = [&] {
            for (std::int64_t c = 0; c < chunks; ++c) fn(c);
        };
        if (inside_) return alone(); // a call from inside a chunk
        std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
        if (!busy.owns_lock()) return alone(); // another user thread's call is running
        struct Inside {
            Inside() { inside_ = true; }
            ~Inside() { inside_ = false; }
        } inside;
        {
            std::lock_guard<std::mutex> lock(mu_);
            while (int(threads_.size()) < helpers)
                threads_.emplace_back([this, k = int(threads_.size())] { serve(k); });
            fn_ = &fn;
            chunks_ = chunks;
            next_ = 0;
            wanted_ = helpers;
            running_ = helpers;
            error_ = nullptr;
            ++generation_;
        }
        wake_.notify_all();
        work();
        spin_until([&] { return running_.load(std::memory_order_acquire) == 0; });
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [&] { return running_ == 0; });
        fn_ = nullptr;
        if (error_) std::rethrow_exception(error_);
    }

  private:
    void serve(int k) {
        inside_ = true;
        std::uint64_t seen = 0;
        for (;;) {
            spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
            {
                std::unique_lock<std::mutex> lock(mu_);
                wake_.wait(lock, [&] { return generation_ != seen; });
                seen = generation_;
                if (k >= wanted_) continue;
            }
            work();
            std::lock_guard<std::mutex> lock(mu_);
            if (--running_ == 0) done_.notify_one();
        }
    }
    // Waits up to spin_time for done() before the caller sleeps on a condition variable: a
    // training step runs hundreds of parallel loops of tens of microseconds each, and waking a
    // sleeping thread (a futex and a context switch each way) cost about as much as the loop
    // (the encoder's training step spent ~12% of its time in the scheduler). The next loop's
    // work usually arrives within the spin, so pool threads stay awake between a call's steps
    // and fall asleep 100 us after its last.
    template <class Done> static void spin_until(Done done) {
        constexpr auto spin_time = std::chrono::microseconds(100);
        const auto until = std::chrono::steady_clock::now() + spin_time;
        for (int k = 1; !done(); ++k) {
            // Yield, not pause: when more threads than cores are runnable (another library's
            // spinning pool), the thread this one waits for may need this core.
            std::this_thread::yield();
            if (k % 16 == 0 && std::chrono::steady_clock::now() > until) return;
        }
    }
    // Takes chunks until none is left; the first exception is kept for the caller.
    void work() {
        for (std::int64_t c; (c = next_++) < chunks_;) {
            try {
                (*fn_)(c);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mu_);
                if (!error_) error_ = std::current_exception();
            }
        }
    }

    std::mutex busy_, mu_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> threads_;
    const std::function<void(std::int64_t)>* fn_ = nullptr;
    std::int64_t chunks_ = 0;
    std::atomic<std::int64_t> next_{0};
    int wanted_ = 0;
    // Written under mu_; atomic so that spinning threads may read them without it.
    std::atomic<int> running_{0};
    std::atomic<std::uint64_t> generation_{0};
    std::exception_ptr error_;
    static thread_local bool inside_; // this thread runs chunks of a call now (or always)
};
thread_local bool Pool::inside_ = false;

// Never destroyed: its threads wait for work until the process ends.
Pool& pool() {
    static Pool* p = new Pool;
    return *p;
}

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
    if (n <= 0) return;
    // Chunks of >= grain indices, their boundaries a function of n and grain alone.
    const std::int64_t most = std::max<std::int64_t>(1, n / std::max<std::int64_t>(grain, 1));
    const std::int64_t chunks = std::min(most, max_chunks);
    auto chunk = [&](std::int64_t c) { fn(n * c / chunks, n * (c + 1) / chunks); };
    const std::int64_t threads = std::min<std::int64_t>(num_threads(), chunks);
    if (threads <= 1) { // the same chunks, in order, on this thread
        for (std::int64_t c = 0; c < chunks; ++c) chunk(c);
        return;
    }
    pool().run(int(threads - 1), chunks, chunk);
}

} // namespace rag
