// Output tensors of CPU kernels that write every element: allocated like Buffer::allocate
// (64-byte aligned, counted by the memory accounting) but without its zero fill, which would
// be a second single-threaded pass over the result. Internal to jit/.
#pragma once
#include "runtime/error.hpp"
#include "runtime/memory.hpp"
#include "runtime/tensor.hpp"

#include <cstdlib>

namespace rag::jit {

inline RaggedTensor uninitialized(DType t, StructurePtr st) {
    const std::size_t nbytes = std::size_t(st->numel()) * dtype_size(t);
    const std::size_t rounded = nbytes ? (nbytes + 63) / 64 * 64 : 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) fail("out of memory allocating ", nbytes, " bytes");
    memory::allocated(rounded);
    Buffer b{std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                        [rounded](std::byte* q) {
                                            memory::freed(rounded);
                                            std::free(q);
                                        }),
             nbytes};
    return RaggedTensor(t, std::move(st), std::move(b));
}

} // namespace rag::jit
