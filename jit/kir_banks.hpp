// Shared-memory bank conflicts of a kernel-IR program under its NVPTX lowering, derived from the
// addressing (issue 19's gate: 1-way on staging and on tensor-core fragment loads), without a
// GPU. Shared memory has 32 banks of 4-byte words; one warp-wide access takes as many passes
// (wavefronts) as the most distinct words any one bank is asked for (one word asked by several
// lanes is a broadcast: one pass). The degree is that count: 1 is conflict-free, 32 the worst.
//
// What the lowering (jit/kir_nvptx.cpp) makes warp-wide, and how each is evaluated here:
//   - a load or store of a shared array inside a distributed `threads` loop (the outermost one):
//     lane L of warp 0 runs iteration lo + L on the first trip; every other loop index takes
//     its loop's first value, conditions are taken as true, and a mutable variable its last
//     assignment in program order. Serial code outside such a loop reads one address in every
//     thread (a broadcast) and stores from thread 0 alone: never a conflict, not listed.
//   - an mma on tensor cores with an operand or accumulator in shared memory, for the warp's
//     first 16 x 8 tile and k step: an operand kir::fragment_load gives to ldmatrix as its
//     8 x 8 matrices, each one pass of 8 lanes' 16-byte rows ("ldmatrix A", "ldmatrix B": the
//     worst matrix); any other as the lowering gathers it, one load per element of the PTX
//     ISA's m16n8k16 fragments (lane = 4 g + t; A: rows g, g + 8 by columns 2t, 2t + 1, + 8;
//     B: rows 2t, 2t + 1, + 8 of column g; C: rows g, g + 8 by columns 2t, 2t + 1).
//   - a copy16 in a distributed threads loop: 16 bytes per lane, 8 lanes a pass.
// Element indices become words through the array's element size and padding (BufferDecl).
// Index expressions are evaluated with the given parameters and with each load of a global
// buffer answered by `global` (the strip list, for instance); an index that still depends on
// something unknown (a scratch or shared load) is listed with degree 0 (not derived).
#pragma once
#include "jit/kir.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace rag::jit {

struct BankAccess {
    std::string array; // the shared array's name
    // "store", "load" (in a threads loop), "ldmatrix A", "ldmatrix B", or "mma A", "mma B",
    // "mma C" (fragments gathered element by element).
    std::string kind;
    int degree = 0; // wavefronts per warp-wide access; 0: the address was not derived
};

// global(buffer, index): the value a load of global buffer `buffer` at `index` gives.
using GlobalValue = std::function<std::int64_t(int buffer, std::int64_t index)>;

// Every warp-wide shared-memory access of k, in program order (mma fragments: one entry per
// distinct load or store instruction of the fragment gathering).
std::vector<BankAccess> kir_bank_conflicts(const kir::Kernel& k,
                                           std::span<const std::int64_t> params,
                                           const GlobalValue& global);

// The degree of one warp-wide access of 4-byte words at these word addresses.
int bank_degree(std::span<const std::int64_t> words);

} // namespace rag::jit
