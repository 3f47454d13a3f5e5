// The kernels `./dev gpu-report` assembles for bench/results/gpu_static.md, listed once for the
// report's PTX dump (bench/gpu/gpu_kernels.cpp) and for the test that checks the committed
// report against ptxas at HEAD (tests/gpu/gpu_static_test.cpp): every kernel-IR program the GPU
// tier builds for relative-position attention (the four maps of REFERENCE.md section 2 by the
// relation terms they carry, and plain attention), GEMMs and normalisation, at the paper's
// head width d = 64, bidirectional, with tensor cores for the half types as the GPU tier runs
// them (jit/relpos_gpu.cpp).
#pragma once
#include "jit/gemm_programs.hpp"
#include "jit/norm_programs.hpp"
#include "jit/relpos_programs.hpp"

#include <functional>
#include <string>
#include <vector>

namespace rag::testing {

struct ReportKernel {
    std::string id;     // unique, e.g. "relpos_forward/Shaw/f16": the report's row
    std::string family; // relpos, attention, gemm, norm
    std::string map;    // Shaw, TXL, DeBERTa, T5, attention; "" outside relpos
    std::string pass;   // forward, query_grad, key_grad, reduce; "" outside relpos
    std::string dtype;
    std::function<kir::Kernel()> make;
};

struct ReportMap {
    const char* name;
    bool aq, ak, bias;
};
inline constexpr ReportMap kReportMaps[] = {{"Shaw", true, false, false},
                                            {"TXL", true, true, true},
                                            {"DeBERTa", true, true, false},
                                            {"T5", false, false, true},
                                            {"attention", false, false, false}};

inline std::vector<ReportKernel> report_kernels() {
    auto type = [](DType t) { return std::string(dtype_name(t)); };
    std::vector<ReportKernel> out;
    const DType types[] = {DType::f16, DType::bf16, DType::f32};
    for (const ReportMap& m : kReportMaps)
        for (DType t : types) {
            jit::RelposShape s{t, 64, 64, m.aq, m.ak, m.bias, false, 0.125};
            s.tensor_cores = jit::relpos_tensor_cores(t);
            const std::string family = std::string(m.name) == "attention" ? "attention" : "relpos";
            const std::string suffix = std::string("/") + m.name + "/" + type(t);
            out.push_back({"relpos_forward" + suffix, family, m.name, "forward", type(t),
                           [s] { return jit::relpos_forward_program(s); }});
            out.push_back({"relpos_query_grad" + suffix, family, m.name, "query_grad", type(t),
                           [s] { return jit::relpos_query_grad_program(s); }});
            out.push_back({"relpos_key_grad" + suffix, family, m.name, "key_grad", type(t),
                           [s] { return jit::relpos_key_grad_program(s); }});
        }
    out.push_back({"relpos_table_reduce", "relpos", "", "reduce", "f32",
                   [] { return jit::relpos_table_reduce_program(); }});
    for (DType t : types)
        for (bool partial : {false, true})
            out.push_back({std::string(partial ? "gemm_partial/" : "gemm/") + type(t), "gemm", "",
                           "", type(t), [t, partial] { return jit::gemm_program(t, partial); }});
    const std::pair<jit::NormOp, const char*> norms[] = {
        {jit::NormOp::layernorm, "layernorm"},
        {jit::NormOp::rmsnorm, "rmsnorm"},
        {jit::NormOp::layernorm_grad, "layernorm_grad"},
        {jit::NormOp::rmsnorm_grad, "rmsnorm_grad"}};
    for (DType t : types) {
        for (const auto& [op, name] : norms)
            out.push_back({std::string(name) + "/" + type(t), "norm", "", "", type(t),
                           [op, t] { return jit::norm_program(op, t, 1e-5); }});
        out.push_back({std::string("column_sums/") + type(t), "norm", "", "", type(t),
                       [t] { return jit::column_sums_program(t); }});
    }
    return out;
}

} // namespace rag::testing
