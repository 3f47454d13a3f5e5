// Runs NVIDIA's PTX assembler on generated PTX, so CI checks GPU code without a GPU.
#pragma once
#include <string>

namespace rag::testing {

// $RAG_PTXAS, else $CUDA_HOME/bin/ptxas, else /usr/local/cuda/bin/ptxas; "" when none is
// executable (tests then skip and say so).
std::string ptxas_path();

struct PtxasResult {
    int status = -1;
    std::string output; // ptxas's messages
};

// Assembles `ptx` for `arch` (sm_80, sm_90) into nothing; status 0 means accepted. `flags`:
// more options (-v: the resources each entry uses, in `output`).
PtxasResult run_ptxas(const std::string& ptx, const std::string& arch,
                      const std::string& flags = "");

} // namespace rag::testing
