#include "jit/kir_emulator.hpp"

#include "jit/kir_llvm.hpp"
#include "jit/kir_nvptx.hpp"
#include "jit/llvm_jit.hpp"
#include "runtime/dtype.hpp"
#include "runtime/error.hpp"

#include <llvm/Analysis/ValueTracking.h>
#include <llvm/IR/Operator.h>
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <sstream>

namespace rag::jit {
namespace {

static_assert(offsetof(EmuThread, tid) == kEmuTid && offsetof(EmuThread, ntid) == kEmuNtid &&
              offsetof(EmuThread, ctaid) == kEmuCtaid &&
              offsetof(EmuThread, nctaid) == kEmuNctaid &&
              offsetof(EmuThread, barrier) == kEmuBarrier && offsetof(EmuThread, mma) == kEmuMma &&
              offsetof(EmuThread, access) == kEmuAccess &&
              offsetof(EmuThread, ldmatrix) == kEmuLdmatrix &&
              offsetof(EmuThread, shfl) == kEmuShfl &&
              offsetof(EmuThread, cp_async) == kEmuCpAsync &&
              offsetof(EmuThread, cp_wait) == kEmuCpWait);

using Entry = void (*)(std::int64_t grid, const std::int64_t* params, void* const* buffers,
                       char* scratch, EmuThread* thread);

constexpr int kWarp = 32;
constexpr std::int64_t kUnit = 2; // bytes the race detector tracks as one
constexpr std::size_t kFiberStack = 256 << 10;

// What a lane brings to a warp-wide instruction.
struct Fragment {
    std::uint32_t regs[6]; // mma: A: 4, B: 2
    float acc[4];
    const char* row; // ldmatrix: the row this lane addresses (null when no matrix uses it)
    float value;     // shfl.sync
};

void on_barrier(EmuThread* t);
void on_mma(EmuThread* t, std::int64_t kind, const std::uint32_t* regs, float* acc);
void* on_access(EmuThread* t, std::int64_t region, char* base, char* at, std::int64_t how);
void on_ldmatrix(EmuThread* t, std::int64_t region, char* base, char* at, std::int64_t shape,
                 std::uint32_t* out);
float on_shfl(EmuThread* t, float v, std::int64_t mask);
void on_cp_async(EmuThread* t, std::int64_t region, char* base, char* at, const char* from,
                 std::int64_t bytes);
void on_cp_wait(EmuThread* t, std::int64_t in_flight);

// The arrays a launch checks accesses against (see kir_emulator.hpp): each shared array, and
// the scratch arrays at their offsets in a block's region, with the scratch base and the
// bytes of one block's region.
struct Layout {
    struct Array {
        std::string name;
        std::int64_t offset = 0, bytes = 0; // scratch: the offset in the block's region
    };
    std::string kernel;
    std::map<std::int64_t, Array> shared;  // by buffer index
    std::map<std::int64_t, Array> scratch; // by offset
    char* scratch_base = nullptr;
    std::int64_t region_bytes = 0;  // one block's stride in scratch
    std::int64_t scratch_bytes = 0; // of it used by arrays
};

// One block's record of the threads that touched each 2-byte unit (the smallest element, so
// two threads writing the halves of one word do not race) of shared memory and of
// its scratch region since the last bar.sync: the words an epoch (barrier interval) has not
// touched have an older epoch, so a barrier costs nothing. Keeps the first error.
class Shadow {
  public:
    Shadow(const Layout& l, std::int64_t ctaid) : l_(l), ctaid_(ctaid) {
        for (const auto& [b, a] : l.shared) {
            shared_[b].resize(std::size_t(a.bytes + 1) / kUnit);
            in_flight_[b].assign(std::size_t(a.bytes + 1) / kUnit, -1);
        }
        scratch_.resize(std::size_t(l.scratch_bytes + 1) / kUnit);
    }
    void barrier() { ++epoch_; }
    const std::string& error() const { return error_; }
    void report(const std::string& e) {
        if (error_.empty()) error_ = e;
    }

    void* access(int tid, std::int64_t region, char* base, char* at, std::int64_t bytes,
                 bool write) {
        const Layout::Array* array = nullptr;
        std::vector<Word>* words = nullptr;
        std::int64_t first = 0; // of the array, in `words`
        if (region >= 0) {
            const auto it = l_.shared.find(region);
            if (it != l_.shared.end()) array = &it->second, words = &shared_[region];
        } else {
            const std::int64_t off = base - (l_.scratch_base + ctaid_ * l_.region_bytes);
            const auto it = l_.scratch.find(off);
            if (it != l_.scratch.end()) array = &it->second, words = &scratch_, first = off / kUnit;
        }
        const std::int64_t off = at - base;
        if (!array || off < 0 || off + bytes > array->bytes ||
            off % std::min<std::int64_t>(bytes, 4) != 0) {
            if (error_.empty()) {
                std::ostringstream e;
                e << "kernel " << l_.kernel << " (emulated GPU): out-of-bounds "
                  << (region >= 0 ? "shared" : "scratch") << " " << (write ? "write" : "read")
                  << " by thread " << tid << " of block " << ctaid_ << ": byte " << off << " of "
                  << (array ? "`" + array->name + "`" : std::string("no array"));
                if (array) e << " (" << array->bytes << " bytes)";
                error_ = e.str();
            }
            return &dummy_;
        }
        for (std::int64_t w = off / kUnit; w < (off + bytes + 1) / kUnit; ++w) {
            if (const int owner = region >= 0 ? in_flight_[region][std::size_t(w)] : -1;
                owner >= 0 && error_.empty()) {
                std::ostringstream e;
                e << "kernel " << l_.kernel << " (emulated GPU): thread " << tid
                  << (write ? " writes" : " reads") << " `" << array->name << "` (byte "
                  << w * kUnit << ") in block " << ctaid_ << " while thread " << owner
                  << "'s cp.async to it is in flight (no cp.async.wait_group lands it)";
                error_ = e.str();
            }
            Word& word = (*words)[std::size_t(first + w)];
            if (word.epoch != epoch_) word = Word{epoch_};
            const int other = word.writer >= 0 && word.writer != tid            ? word.writer
                              : write && word.reader >= 0 && word.reader != tid ? word.reader
                              : write && word.readers                           ? word.other_reader
                                                                                : -1;
            if (other >= 0 && error_.empty()) {
                std::ostringstream e;
                e << "kernel " << l_.kernel
                  << " (emulated GPU): " << (region >= 0 ? "shared" : "scratch")
                  << "-memory race on `" << array->name << "` (byte " << w * kUnit << ") in block "
                  << ctaid_ << ": thread " << tid << (write ? " writes" : " reads")
                  << " it and thread " << other << (other == word.writer ? " wrote" : " read")
                  << " it with no bar.sync between";
                error_ = e.str();
            }
            if (write) {
                word.writer = tid;
            } else if (word.reader < 0) {
                word.reader = tid;
            } else if (word.reader != tid && !word.readers) {
                word.readers = true;
                word.other_reader = tid;
            }
        }
        return at;
    }

    // Marks the `bytes` at `at` of shared array `region` as the destination of thread tid's
    // cp.async in flight (tid >= 0), or as landed (tid < 0). The bytes are in bounds.
    void in_flight(std::int64_t region, char* base, char* at, std::int64_t bytes, int tid) {
        for (std::int64_t w = (at - base) / kUnit; w < (at - base + bytes) / kUnit; ++w)
            in_flight_[region][std::size_t(w)] = tid;
    }

  private:
    struct Word {
        std::uint32_t epoch = 0;
        std::int32_t writer = -1, reader = -1; // the last writer; the first reader
        std::int32_t other_reader = -1;        // a second reader, when readers
        bool readers = false;                  // more than one thread read it
    };
    const Layout& l_;
    std::int64_t ctaid_;
    std::uint32_t epoch_ = 1;
    std::map<std::int64_t, std::vector<Word>> shared_;
    std::map<std::int64_t, std::vector<std::int32_t>> in_flight_; // cp.async's thread, or -1
    std::vector<Word> scratch_;
    std::string error_;
    alignas(16) char dummy_[64] = {};
};

// One block's threads as fibers on the launching thread, switched only where a thread waits
// (bar.sync, mma.sync, ldmatrix), so a block costs a few context switches per barrier instead of
// 128 host threads. A wait ends when every thread of the block (bar.sync) or of the warp
// (mma.sync, ldmatrix) waits at the same kind of point; when no thread can run and the block has
// not finished, the block deadlocked (a barrier some thread never reaches).
class Block {
  public:
    enum class State : std::uint8_t { ready, at_barrier, at_warp, done };

    Block(const std::function<void(EmuThread&)>& body, std::int64_t ctaid, std::int64_t nctaid,
          const Layout& layout)
        : shadow(layout, ctaid), body_(body),
          stacks_(new char[std::size_t(kKirBlock) * kFiberStack]) {
        for (int t = 0; t < kKirBlock; ++t) {
            threads_[t] =
                EmuThread{t,    kKirBlock,  ctaid,        nctaid,   &on_barrier,  &on_mma,
                          this, &on_access, &on_ldmatrix, &on_shfl, &on_cp_async, &on_cp_wait};
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
            if (!ran) break;
        }
        for (int t = 0; t < kKirBlock; ++t)
            if (!copies[t].issued.empty() ||
                std::any_of(copies[t].groups.begin(), copies[t].groups.end(),
                            [](const std::vector<Copy>& g) { return !g.empty(); })) {
                std::ostringstream e;
                e << "cp.async (emulated GPU): thread " << t << " of block " << threads_[t].ctaid
                  << " ended with copies in flight (no cp.async.wait_group lands them)";
                shadow.report(e.str());
            }
        return std::all_of(state_, state_ + kKirBlock, [](State s) { return s == State::done; });
    }

    // A thread's cp.async copies: issued since its last commit, and committed groups in flight
    // (oldest first).
    struct Copy {
        std::int64_t region;
        char *base, *at;
        const char* from;
        std::int64_t bytes;
    };
    struct Copies {
        std::vector<Copy> issued;
        std::deque<std::vector<Copy>> groups;
    };
    Copies copies[kKirBlock];

    Fragment slots[kKirBlock];
    Shadow shadow;

    // Parks the current thread until its block (at_barrier) or warp (at_warp) all waits.
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
    // at a warp-wide instruction. Says whether anything woke.
    bool release() {
        if (std::all_of(state_, state_ + kKirBlock,
                        [](State s) { return s == State::at_barrier; })) {
            std::fill(state_, state_ + kKirBlock, State::ready);
            shadow.barrier();
            return true;
        }
        bool woke = false;
        for (int w = 0; w < kKirBlock / kWarp; ++w) {
            State* lanes = state_ + w * kWarp;
            if (std::all_of(lanes, lanes + kWarp, [](State s) { return s == State::at_warp; })) {
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

void* on_access(EmuThread* t, std::int64_t region, char* base, char* at, std::int64_t how) {
    return static_cast<Block*>(t->block)->shadow.access(int(t->tid), region, base, at, how >> 1,
                                                        (how & 1) != 0);
}

// cp.async: the copy is checked and recorded as this thread's write now (it may land any time
// before its wait), and its bytes are in flight until a cp.async.wait_group lands it: any access
// to them before then, by any thread, is an error.
void on_cp_async(EmuThread* t, std::int64_t region, char* base, char* at, const char* from,
                 std::int64_t bytes) {
    Block& b = *static_cast<Block*>(t->block);
    if ((at - base) % bytes != 0 || std::uintptr_t(from) % std::uintptr_t(bytes) != 0) {
        std::ostringstream e;
        e << "cp.async (emulated GPU): thread " << t->tid << " of block " << t->ctaid << " copies "
          << bytes << " bytes to byte " << at - base << " of a shared array, not " << bytes
          << "-byte aligned";
        b.shadow.report(e.str());
        return;
    }
    if (b.shadow.access(int(t->tid), region, base, at, bytes, true) != at) return; // outside
    b.shadow.in_flight(region, base, at, bytes, int(t->tid));
    b.copies[t->tid].issued.push_back({region, base, at, from, bytes});
}

// cp.async.commit_group, then cp.async.wait_group in_flight: the groups older than the newest
// `in_flight` land (copied, no longer in flight, recorded as this thread's writes).
void on_cp_wait(EmuThread* t, std::int64_t in_flight) {
    Block& b = *static_cast<Block*>(t->block);
    Block::Copies& mine = b.copies[t->tid];
    mine.groups.push_back(std::move(mine.issued));
    mine.issued.clear();
    while (std::int64_t(mine.groups.size()) > in_flight) {
        for (const Block::Copy& c : mine.groups.front()) {
            b.shadow.in_flight(c.region, c.base, c.at, c.bytes, -1);
            std::memcpy(c.at, c.from, std::size_t(c.bytes));
            b.shadow.access(int(t->tid), c.region, c.base, c.at, c.bytes, true);
        }
        mine.groups.pop_front();
    }
}

// Routes every load and store of entry's shared arrays and scratch arrays through the
// thread's `access` (the EmuThread is the entry's last argument, the scratch region its
// fourth): a shared array is a global of the module, a scratch array a GEP from the block's
// region, itself a GEP from the scratch argument (kir_nvptx.cpp's build()).
void instrument(llvm::Module& m, const std::string& entry, const kir::Kernel& k) {
    llvm::Function* fn = m.getFunction(entry);
    if (!fn) fail("internal: emulated kernel ", k.name, " has no entry ", entry);
    llvm::Value* scratch = fn->getArg(3);
    llvm::Value* thread = fn->getArg(4);
    std::map<const llvm::Value*, std::int64_t> shared;
    for (std::size_t b = 0; b < k.buffers.size(); ++b)
        if (k.buffers[b].space == kir::Space::shared) {
            llvm::GlobalVariable* g = m.getNamedGlobal(k.name + "_" + k.buffers[b].name);
            if (!g)
                fail("internal: emulated kernel ", k.name, " lost shared array ",
                     k.buffers[b].name);
            shared[g] = std::int64_t(b);
        }
    // The scratch array a pointer is computed from, or null.
    auto scratch_array = [&](llvm::Value* p) -> llvm::Value* {
        for (llvm::Value* v = p; auto* g = llvm::dyn_cast<llvm::GEPOperator>(v);
             v = g->getPointerOperand()) {
            auto* region = llvm::dyn_cast<llvm::GEPOperator>(g->getPointerOperand());
            if (region && region->getPointerOperand() == scratch) return v;
        }
        return nullptr;
    };
    struct Access {
        llvm::Instruction* inst;
        std::int64_t region;
        llvm::Value* base;
    };
    std::vector<Access> accesses;
    for (llvm::BasicBlock& bb : *fn)
        for (llvm::Instruction& i : bb) {
            llvm::Value* p = llvm::getLoadStorePointerOperand(&i);
            if (!p) continue;
            const llvm::Value* object = llvm::getUnderlyingObject(p, 0);
            if (auto it = shared.find(object); it != shared.end())
                accesses.push_back({&i, it->second, const_cast<llvm::Value*>(object)});
            else if (object == scratch)
                if (llvm::Value* base = scratch_array(p)) accesses.push_back({&i, -1, base});
        }
    auto& ctx = m.getContext();
    auto* ptr = llvm::PointerType::get(ctx, 0);
    auto* i64 = llvm::Type::getInt64Ty(ctx);
    auto* hook = llvm::FunctionType::get(ptr, {ptr, i64, ptr, ptr, i64}, false);
    const llvm::DataLayout& dl = m.getDataLayout();
    for (const Access& a : accesses) {
        llvm::IRBuilder<> b(a.inst);
        const bool write = llvm::isa<llvm::StoreInst>(a.inst);
        llvm::Type* t = write ? llvm::cast<llvm::StoreInst>(a.inst)->getValueOperand()->getType()
                              : a.inst->getType();
        const auto bytes = std::int64_t(dl.getTypeStoreSize(t));
        llvm::Value* fnp =
            b.CreateLoad(ptr, b.CreateConstGEP1_64(b.getInt8Ty(), thread, kEmuAccess));
        llvm::Value* at = b.CreateCall(hook, fnp,
                                       {thread, b.getInt64(a.region), a.base,
                                        llvm::getLoadStorePointerOperand(a.inst),
                                        b.getInt64(bytes * 2 + (write ? 1 : 0))});
        a.inst->setOperand(write ? 1 : 0, at);
    }
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
    b.wait(Block::State::at_warp); // every lane's fragment is in
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
    b.wait(Block::State::at_warp); // no lane rewrites its slot before all have read
}

// ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16 for one lane: matrix m's row i is
// the 16 bytes at the address of lane 8m + i; lane = 4 g + t receives in register m the
// elements (g, 2t) and (g, 2t + 1) of matrix m (the low half first), or with .trans (2t, g)
// and (2t + 1, g). Addresses of lanes past 8 count are ignored, as on the GPU.
void on_ldmatrix(EmuThread* t, std::int64_t region, char* base, char* at, std::int64_t shape,
                 std::uint32_t* out) {
    Block& b = *static_cast<Block*>(t->block);
    const int warp = int(t->tid / kWarp), lane = int(t->tid % kWarp);
    const int count = int(shape & 7);
    const bool trans = (shape & 8) != 0;
    Fragment& mine = b.slots[t->tid];
    mine.row = nullptr;
    if (lane < 8 * count) {
        if ((at - base) % 16 != 0) {
            std::ostringstream e;
            e << "ldmatrix (emulated GPU): thread " << t->tid << " of block " << t->ctaid
              << " addresses byte " << at - base << " of a shared array, not 16-byte aligned";
            b.shadow.report(e.str());
        }
        mine.row =
            static_cast<const char*>(b.shadow.access(int(t->tid), region, base, at, 16, false));
    }
    b.wait(Block::State::at_warp); // every lane's address is in
    auto element = [&](int m, int row, int col) {
        std::uint16_t bits = 0;
        std::memcpy(&bits, b.slots[warp * kWarp + 8 * m + row].row + 2 * col, 2);
        return std::uint32_t(bits);
    };
    const int g = lane / 4, t2 = lane % 4 * 2;
    for (int m = 0; m < count; ++m)
        out[m] = trans ? element(m, t2, g) | element(m, t2 + 1, g) << 16
                       : element(m, g, t2) | element(m, g, t2 + 1) << 16;
    b.wait(Block::State::at_warp); // no lane rewrites its slot before all have read
}

// shfl.sync.bfly.b32 with every lane taking part: each lane's value is in before any is read.
float on_shfl(EmuThread* t, float v, std::int64_t mask) {
    Block& b = *static_cast<Block*>(t->block);
    const int warp = int(t->tid / kWarp), lane = int(t->tid % kWarp);
    b.slots[t->tid].value = v;
    b.wait(Block::State::at_warp);
    const float got = b.slots[warp * kWarp + (lane ^ int(mask & 31))].value;
    b.wait(Block::State::at_warp);
    return got;
}

class EmulatedKernel final : public CpuKernel {
  public:
    EmulatedKernel(const kir::Kernel& k, int blocks) : k_(k), blocks_(std::max(blocks, 1)) {
        static std::atomic<int> counter{0};
        const std::string name = "emu_" + std::to_string(counter++) + "_" + k.name;
        auto ctx = std::make_unique<llvm::LLVMContext>();
        auto m = new_module(name, *ctx);
        lower_kir_emulated(*m, k_, name + "0");
        instrument(*m, name + "0", k_);
        entry_ = reinterpret_cast<Entry>(
            add_module(std::move(m), std::move(ctx), 1, name, &ir_, &tracker_).at(0));
    }
    ~EmulatedKernel() override { remove_module(tracker_); }

    const std::string& llvm_ir() const override { return ir_; }

    void launch(std::int64_t grid, std::span<void* const> buffers,
                std::span<const std::int64_t> params) const override {
        std::vector<std::uint64_t> addresses;
        for (void* b : buffers) addresses.push_back(std::uint64_t(std::uintptr_t(b)));
        check_kir_launch(k_, addresses, params, "(emulated GPU)");
        if (grid <= 0) return;
        // Shared arrays are the module's globals: one launch at a time.
        std::lock_guard<std::mutex> one_at_a_time(mu_);
        const int blocks = int(std::min<std::int64_t>(blocks_, grid));
        const std::size_t bytes =
            std::size_t(std::max<std::int64_t>(kir_scratch_bytes(k_, params), 64)) *
            std::size_t(blocks);
        std::unique_ptr<char[]> scratch(new (std::align_val_t(64)) char[bytes]);
        const Layout layout = this->layout(params, scratch.get());
        const std::function<void(EmuThread&)> body = [&](EmuThread& t) {
            entry_(grid, params.data(), buffers.data(), scratch.get(), &t);
        };
        for (int blk = 0; blk < blocks; ++blk) {
            auto state = std::make_unique<Block>(body, blk, blocks, layout);
            Block::starting_ = state.get();
            if (!state->run())
                fail("kernel ", k_.name, " (emulated GPU): block ", blk,
                     " deadlocked: a barrier or mma was not reached by every thread");
            if (!state->shadow.error().empty()) fail(state->shadow.error());
        }
    }

  private:
    // Where a launch's arrays lie: scratch arrays 64-byte aligned in order, as
    // kir_scratch_bytes lays them out.
    Layout layout(std::span<const std::int64_t> params, char* scratch) const {
        Layout l;
        l.kernel = k_.name;
        l.scratch_base = scratch;
        l.region_bytes = kir_scratch_bytes(k_, params);
        for (std::size_t b = 0; b < k_.buffers.size(); ++b) {
            const kir::BufferDecl& d = k_.buffers[b];
            const std::int64_t bytes =
                d.space == kir::Space::global ? 0 : kir::array_bytes(d, params);
            if (d.space == kir::Space::shared) l.shared[std::int64_t(b)] = {d.name, 0, bytes};
            if (d.space == kir::Space::scratch) {
                l.scratch[l.scratch_bytes] = {d.name, l.scratch_bytes, bytes};
                l.scratch_bytes = (l.scratch_bytes + bytes + 63) / 64 * 64;
            }
        }
        return l;
    }

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
