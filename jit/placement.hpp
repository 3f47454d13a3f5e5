// Where each plan step of a call ran, for Module::stats(), `rag run --stats` and tests: a step is
// a compiled kernel (fused LLVM loop, BLAS GEMM, segmented or row loop, relpos tile program),
// a device kernel (GPU tier), a host fallback (a GPU-tier step run by the CPU tier's kernels),
// or a reference kernel (the interpreter's op, by op name). Host fallbacks are named op_dtype.
#pragma once
#include "ir/interpreter.hpp"

#include <cstdint>
#include <map>
#include <string>

namespace rag::jit {

struct Placement {
    std::int64_t compiled = 0, device = 0;
    std::map<std::string, std::int64_t> reference, host;
    // GPU tier: bytes copied host -> device and device -> host during the call.
    std::int64_t uploaded = 0, downloaded = 0;
};

// Reference kernels run by the current thread since it started: host kernels that hand a case
// to the reference kernel (operands that disagree, an order they do not handle) call it through
// reference_kernel, so the step is reported as what it was.
inline thread_local std::int64_t reference_runs = 0;

inline RaggedTensor reference_kernel(const std::string& op, const std::vector<RaggedTensor>& args,
                                     const Attrs& attrs) {
    ++reference_runs;
    return evaluate(op, args, attrs);
}

} // namespace rag::jit
