// Kernel-IR kernels through their GPU lowering, run on the host CPU by emulating a device, so
// that what only a GPU would otherwise exercise is tested everywhere: the NVPTX lowering's
// distribution of `threads` loops over a block, its barriers, thread-0 stores in serial code,
// the grid-stride loop over instances, shared arrays, and the tensor-core fragments of mma.
//
// The lowering is jit/kir_nvptx.cpp's, built for the host: special registers, bar.sync and
// mma.sync, ldmatrix and shfl.sync become reads of, and calls through, an EmuThread that the
// emulator passes each thread. A launch runs its blocks one after another, each as kKirBlock fibers
// on the calling thread (switched only at bar.sync and the warp-wide mma.sync, ldmatrix and
// shfl.sync);
// bar.sync waits for all of them, mma.sync gathers its warp's 32 fragments and computes the
// tile as the PTX ISA lays it out ("Matrix Fragments for mma.m16n8k16 with floating point
// type"), and ldmatrix gathers the warp's row addresses and hands each lane its elements of
// the 8 x 8 matrices ("Warp-level matrix load instruction: ldmatrix"), both written out again
// here independently of the lowering. An ldmatrix row is a checked 16-byte read by the lane
// that gave its address, which must be 16-byte aligned. Exact PTX semantics beyond these (memory
// model, warp scheduling, libdevice math: the host's libm is used) are not emulated. A barrier that
// not every thread reaches is reported as a rag::Error, not a hang.
//
// Race and bounds checking: every load and store of a shared array or of the block's scratch
// region (global memory every thread of the block shares) goes through EmuThread::access,
// added to the lowered module here (kir_emulator.cpp), not by the lowering. Per 2-byte unit
// the block records which threads read and wrote it since the last bar.sync; two threads
// touching one unit, at least one writing, with no bar.sync between is a race, and an access
// outside its array (shared: the declared size; scratch: the array the address was computed
// from) is out of bounds. Either fails the launch with a rag::Error naming the kernel, the
// array, the byte and the two threads (an out-of-bounds access is redirected to a dummy word,
// so the emulation itself stays in bounds). mma.sync and ldmatrix are no barriers: they order a
// warp's lanes, not the block.
//
// cp.async (16 or 4 bytes, global to shared): checked and recorded as the issuing thread's write
// when issued (it may land any time before its wait), and its destination is in flight until a
// cp.async.wait_group lands its group (the copy is made then): any access to bytes in flight,
// by any thread, and a block whose threads end with copies in flight, fail the launch. So a
// program that reads a staged tile before its wait is caught even though the host copies
// nothing early.
#pragma once
#include "jit/kir.hpp"
#include "jit/kir_cpu.hpp"
#include "jit/plan.hpp"

#include <cstdint>
#include <memory>

namespace rag::jit {

// What an emulated kernel reads for its special registers and calls for bar.sync and
// mma.sync. The lowering addresses the fields by these offsets (all 8 bytes wide).
struct EmuThread {
    std::int64_t tid, ntid, ctaid, nctaid;
    void (*barrier)(EmuThread*);
    // regs: A's four and B's two 32-bit registers (two halves each, the first in the low
    // half); acc: C's four floats in, D's four out. kind: 0 f16, 1 bf16.
    void (*mma)(EmuThread*, std::int64_t kind, const std::uint32_t* regs, float* acc);
    void* block; // the emulator's per-block state
    // A checked access of how >> 1 bytes at `at`, a write when how & 1, into the array that
    // starts at `base`: shared array `region` (a buffer index), or a scratch array when region
    // is -1. Returns the address to use.
    void* (*access)(EmuThread*, std::int64_t region, char* base, char* at,
                    std::int64_t how) = nullptr; // unused by the fused kernels
    // ldmatrix.sync.aligned.m8n8.x{shape & 7}{.trans if shape & 8}.b16 for one lane: `at` is
    // this lane's row address in shared array `region` (starting at `base`), out receives the
    // lane's registers.
    void (*ldmatrix)(EmuThread*, std::int64_t region, char* base, char* at, std::int64_t shape,
                     std::uint32_t* out) = nullptr;
    // shfl.sync.bfly.b32 over the whole warp: lane ^ mask's value.
    float (*shfl)(EmuThread*, float v, std::int64_t mask) = nullptr;
    // cp.async.{cg,ca}.shared.global of `bytes` (16 or 4) from `from` to `at` in shared array
    // `region` (starting at `base`), and cp.async.commit_group + cp.async.wait_group in_flight.
    void (*cp_async)(EmuThread*, std::int64_t region, char* base, char* at, const char* from,
                     std::int64_t bytes) = nullptr;
    void (*cp_wait)(EmuThread*, std::int64_t in_flight) = nullptr;
};
inline constexpr int kEmuTid = 0, kEmuNtid = 8, kEmuCtaid = 16, kEmuNctaid = 24, kEmuBarrier = 32,
                     kEmuMma = 40, kEmuAccess = 56, kEmuLdmatrix = 64, kEmuShfl = 72,
                     kEmuCpAsync = 80, kEmuCpWait = 88;

// The kernel lowered as for the GPU and compiled for the host. Its launch (CpuKernel's
// interface, host pointers) runs `blocks` blocks (default: 2, fewer for smaller grids) so
// that the grid-stride loop is taken.
std::unique_ptr<CpuKernel> compile_kernel_emulated(const kir::Kernel& k, int blocks = 2);

// The fused elementwise kernels of a plan (jit/ptx.hpp's ABI) built for the host with the
// emulator's special registers. launch(group, blocks, params) takes cuLaunchKernel's
// parameter array and runs every thread of every block in turn (these kernels have no
// barriers), kFusedBlock threads per block.
class EmulatedFused {
  public:
    virtual ~EmulatedFused() = default;
    virtual void launch(std::size_t group, unsigned blocks,
                        const std::vector<void*>& params) const = 0;
};
std::unique_ptr<EmulatedFused> compile_fused_emulated(const ir::Function& f, const Plan& plan);

} // namespace rag::jit
