#include "jit/kir_emulator.hpp"

#include "jit/kir_llvm.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/llvm_jit.hpp"
#include "runtime/dtype.hpp"
#include "runtime/error.hpp"

#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <new>

namespace rag::jit {
namespace {

static_assert(offsetof(EmuThread, tid) == kEmuTid && offsetof(EmuThread, ntid) == kEmuNtid &&
              offsetof(EmuThread, ctaid) == kEmuCtaid &&
              offsetof(EmuThread, nctaid) == kEmuNctaid &&
              offsetof(EmuThread, barrier) == kEmuBarrier && offsetof(EmuThread, mma) == kEmuMma);

using Entry = void (*)(std::int64_t grid, const std::int64_t* params, void* const* buffers,
                       char* scratch, EmuThread* thread);

constexpr int kWarp = 32;
constexpr std::size_t kFiberStack = 256 << 10;

struct Fragment {
    std::uint32_t regs[6]; // A: 4, B: 2
    float acc[4];
};

void on_barrier(EmuThread* t);
void on_mma(EmuThread* t, std::int64_t kind, const std::uint32_t* regs, float* acc);

// One block's threads as fibers on the launching thread, switched only where a thread waits
// (bar.sync, mma.sync), so a block costs a few context switches per barrier instead of 128
// host threads. A wait ends when every thread of the block (bar.sync) or of the warp
// (mma.sync) waits at the same kind of point; when no thread can run and the block has not
// finished, the block deadlocked (a barrier some thread never reaches).
class Block {
  public:
    enum class State : std::uint8_t { ready, at_barrier, at_mma, done };

    Block(const std::function<void(EmuThread&)>& body, std::int64_t ctaid, std::int64_t nctaid)
        : body_(body), stacks_(new char[std::size_t(kKirBlock) * kFiberStack]) {
        for (int t = 0; t < kKirBlock; ++t) {
            threads_[t] = EmuThread{t, kKirBlock, ctaid, nctaid, &on_barrier, &on_mma, this};
            getcontext(&fibers_[t]);
            fibers_[t].uc_stack.ss_sp = stacks_.get() + std::size_t(t) * kFiberStack;
            fibers_[t].uc_stack.ss_size = kFiberStack;
            fibers_[t].uc_link = &scheduler_;
            makecontext(&fibers_[t], reinterpret_cast<void (*)()>(&start), 0);
        }
    }

    // Runs every thread to its end; false if the block deadlocked.
    bool run() {
        for (;;) {
            bool ran = false;
            for (int t = 0; t < kKirBlock; ++t) {
                if (state_[t] != State::ready) continue;
                current_ = t;
                swapcontext(&scheduler_, &fibers_[t]);
                ran = true;
            }
            if (release()) continue;
            if (!ran)
                return std::all_of(state_, state_ + kKirBlock,
                                   [](State s) { return s == State::done; });
        }
    }

    Fragment slots[kKirBlock];

    // Parks the current thread until its block (at_barrier) or warp (at_mma) all waits.
    void wait(State why) {
        const int t = current_;
        state_[t] = why;
        swapcontext(&fibers_[t], &scheduler_);
    }

  private:
    static void start() {
        Block* b = starting_;
        const int t = b->current_;
        b->body_(b->threads_[t]);
        b->state_[t] = State::done; // back to the scheduler through uc_link
    }

    // Wakes the block if every thread waits at bar.sync, and each warp whose every lane waits
    // at mma.sync. Says whether anything woke.
    bool release() {
        if (std::all_of(state_, state_ + kKirBlock,
                        [](State s) { return s == State::at_barrier; })) {
            std::fill(state_, state_ + kKirBlock, State::ready);
            return true;
        }
        bool woke = false;
        for (int w = 0; w < kKirBlock / kWarp; ++w) {
            State* lanes = state_ + w * kWarp;
            if (std::all_of(lanes, lanes + kWarp, [](State s) { return s == State::at_mma; })) {
                std::fill(lanes, lanes + kWarp, State::ready);
                woke = true;
            }
        }
        return woke;
    }

    const std::function<void(EmuThread&)>& body_;
    std::unique_ptr<char[]> stacks_; // uninitialised: only the pages a fiber touches are paid
    ucontext_t scheduler_{}, fibers_[kKirBlock]{};
    EmuThread threads_[kKirBlock]{};
    State state_[kKirBlock]{};
    int current_ = 0;

  public:
    static thread_local Block* starting_; // the block whose fiber `start` begins
};
thread_local Block* Block::starting_ = nullptr;

void on_barrier(EmuThread* t) {
    static_cast<Block*>(t->block)->wait(Block::State::at_barrier);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 for one lane: the warp's
// fragments are gathered, A (16 x 16) and B (16 x 8) rebuilt from them as the PTX ISA lays them
// out, and this lane's four elements of D = A B + C computed. Element i of a fragment is half
// i % 2 (the low half first) of register i / 2; lane = 4 groupID + threadID_in_group.
void on_mma(EmuThread* t, std::int64_t kind, const std::uint32_t* regs, float* acc) {
    Block& b = *static_cast<Block*>(t->block);
    const int warp = int(t->tid / kWarp), lane = int(t->tid % kWarp);
    Fragment& mine = b.slots[t->tid];
    std::copy(regs, regs + 6, mine.regs);
    std::copy(acc, acc + 4, mine.acc);
    b.wait(Block::State::at_mma); // every lane's fragment is in
    auto element = [&](int from, int i, int first_reg) {
        const std::uint32_t reg = b.slots[warp * kWarp + from].regs[first_reg + i / 2];
        const auto bits = std::uint16_t(reg >> (16 * (i % 2)));
        return kind == 0 ? half_to_float(bits) : bf16_to_float(bits);
    };
    float A[16][16], B[16][8];
    for (int from = 0; from < kWarp; ++from) {
        const int group = from / 4, in_group = from % 4;
        for (int i = 0; i < 8; ++i) { // a0 .. a7
            const int row = (i == 2 || i == 3 || i == 6 || i == 7) ? group + 8 : group;
            const int col = in_group * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = element(from, i, 0);
        }
        for (int i = 0; i < 4; ++i) // b0 .. b3
            B[in_group * 2 + (i & 1) + (i >= 2 ? 8 : 0)][group] = element(from, i, 4);
    }
    const int group = lane / 4, in_group = lane % 4;
    for (int i = 0; i < 4; ++i) { // c0 .. c3, d0 .. d3
        const int row = i < 2 ? group : group + 8, col = in_group * 2 + (i & 1);
        double sum = mine.acc[i];
        for (int k = 0; k < 16; ++k) sum += double(A[row][k]) * double(B[k][col]);
        acc[i] = float(sum);
    }
    b.wait(Block::State::at_mma); // no lane rewrites its slot before all have read
}

class EmulatedKernel final : public CpuKernel {
  public:
    EmulatedKernel(const kir::Kernel& k, int blocks) : k_(k), blocks_(std::max(blocks, 1)) {
        static std::atomic<int> counter{0};
        const std::string name = "emu_" + std::to_string(counter++) + "_" + k.name;
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = new_module(name, *ctx);
        lower_kir_emulated(*m, k_, name + "0");
        entry_ = reinterpret_cast<Entry>(
            add_module(std::move(m), std::move(ctx), 1, name, &ir_, &tracker_).at(0));
    }
    ~EmulatedKernel() override { remove_module(tracker_); }

    const std::string& llvm_ir() const override { return ir_; }

    void launch(std::int64_t grid, std::span<void* const> buffers,
                std::span<const std::int64_t> params) const override {
        if (buffers.size() != k_.globals() || params.size() != k_.params.size())
            fail("internal: kernel ", k_.name, " launched with ", buffers.size(), " buffers and ",
                 params.size(), " parameters, wants ", k_.globals(), " and ", k_.params.size());
        if (grid <= 0) return;
        // Shared arrays are the module's globals: one launch at a time.
        std::lock_guard<std::mutex> one_at_a_time(mu_);
        const int blocks = int(std::min<std::int64_t>(blocks_, grid));
        const std::size_t bytes =
            std::size_t(std::max<std::int64_t>(kir_scratch_bytes(k_, params), 64)) *
            std::size_t(blocks);
        std::unique_ptr<char[]> scratch(new (std::align_val_t(64)) char[bytes]);
        const std::function<void(EmuThread&)> body = [&](EmuThread& t) {
            entry_(grid, params.data(), buffers.data(), scratch.get(), &t);
        };
        for (int blk = 0; blk < blocks; ++blk) {
            auto state = std::make_unique<Block>(body, blk, blocks);
            Block::starting_ = state.get();
            if (!state->run())
                fail("kernel ", k_.name, " (emulated GPU): block ", blk,
                     " deadlocked: a barrier or mma was not reached by every thread");
        }
    }

  private:
    kir::Kernel k_;
    int blocks_;
    Entry entry_ = nullptr;
    std::string ir_;
    llvm::orc::ResourceTrackerSP tracker_;
    mutable std::mutex mu_;
};

} // namespace

std::unique_ptr<CpuKernel> compile_kernel_emulated(const kir::Kernel& k, int blocks) {
    return std::make_unique<EmulatedKernel>(k, blocks);
}

} // namespace rag::jit
