// `rag ptx`: every kernel one call of a function launches on the GPU tier, as PTX. The fused
// elementwise kernels come from the plan (one module); the kernel-IR programs (relpos tiles,
// GEMMs, norms, segmented reductions, self-attention, partial sums) are chosen at run time
// from the values, so the call is run once on the emulated device (RAG_GPU_EMULATE=1, see
// runtime/cuda.hpp) and every program it built is lowered for `arch`, one module each.
#pragma once
#include "dsl/module.hpp"

#include <string>
#include <vector>

namespace rag {

// The listing: a summary header naming every module and kernel, then each module after a
// line "// ==== module K of N: TITLE ====". Needs the emulated device (throws otherwise);
// `inputs` describes the arguments for the header. Kernels built by earlier calls in this
// process are not repeated.
std::string list_gpu_kernels(Module& m, const std::string& fn, const std::vector<Value>& args,
                             const std::string& arch, const std::string& inputs);

} // namespace rag
