// Output tensors of CPU kernels that write every element: Buffer::allocate_uninitialized,
// without the zero fill that would be a second single-threaded pass over the result.
#pragma once
#include "runtime/tensor.hpp"

namespace rag::jit {

inline RaggedTensor uninitialized(DType t, StructurePtr st) {
    const std::size_t nbytes = std::size_t(st->numel()) * dtype_size(t);
    return RaggedTensor(t, std::move(st), Buffer::allocate_uninitialized(nbytes));
}

} // namespace rag::jit
