// The benchmark's "projections + per-score gather without tiling" baseline (issue 6): per
// sample and head, project every query onto every relation row as one GEMM (Z^Q = Q aQ^T,
// [N, R]; likewise Z^K), form the N x N scores with a GEMM, add the relation terms by a lookup
// per score, softmax, and O = P V. Backward recomputes one head's scores from the saved
// log-sum-exp and scatters dS into dZ^Q and dZ^K score by score. Holds one head's N x N
// buffers at a time; GEMMs are OpenBLAS, the per-score loops run on rag::parallel_for.
//
// Templated on the scalar: float is the benchmarked baseline, double (inputs in f64) is the
// float64 reference of REFERENCE.md section 3 that the benchmark checks every system against,
// since it is exactly "gather the relation vector of every (i, j)" and fast enough at large N.
// Inputs are those of the relpos_attention op (q, k, v, then the present tables) in the
// scalar's dtype; attrs as for the op.
#pragma once
#include "ir/attrs.hpp"
#include "runtime/tensor.hpp"

#include <span>
#include <vector>

namespace rag::bench {

struct GatherForward {
    RaggedTensor out;
    std::vector<double> lse; // [token][head]
};

template <class T> GatherForward gather_forward(std::span<const RaggedTensor> in, const Attrs& at);

// Every input's gradient, in input order, given dO and the forward's result.
template <class T>
std::vector<RaggedTensor> gather_backward(std::span<const RaggedTensor> in, const RaggedTensor& dO,
                                          const Attrs& at, const GatherForward& fwd);

} // namespace rag::bench
