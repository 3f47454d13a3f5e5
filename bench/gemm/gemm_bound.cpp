// Issue 5's GEMM target: a GEMM-dominated training step (bench/gemm/mlp.rag, a wide MLP block
// on ragged tokens) against the time OpenBLAS alone needs for the same step's GEMMs, called
// directly on the same shapes with the same thread count. Prints one JSON line per length
// profile: ms per step (least of the calls after the first), ms of the bare GEMMs (least of
// as many repetitions) and their ratio (target <= 1.3).
//
// usage: rag_bench_gemm [--steps K] [--threads T]   (run from the repository root)
#include "dsl/module.hpp"
#include "runtime/error.hpp"
#include "runtime/parallel.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace rag;
using Clock = std::chrono::steady_clock;
constexpr int C = 512, F = 2048; // mlp.rag's widths

double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// The GEMMs of mlp.rag's train_step as the CPU tier plans them (rag ir --plan): x @ w1,
// h @ w2, the cotangent of h (g @ w2^T, w2^T materialised), and the weight gradients
// h^T g and x^T dh (one GEMM each over all packed rows).
double bare_gemms_ms(int T, int reps) {
    std::mt19937 g(1);
    std::normal_distribution<float> normal;
    auto filled = [&](std::size_t n) {
        std::vector<float> v(n);
        for (auto& e : v) e = normal(g);
        return v;
    };
    auto x = filled(std::size_t(T) * C), w1 = filled(std::size_t(C) * F);
    auto h = filled(std::size_t(T) * F), w2 = filled(std::size_t(F) * C);
    auto gy = filled(std::size_t(T) * C), w2t = filled(std::size_t(C) * F);
    std::vector<float> out1(std::size_t(T) * F), out2(std::size_t(T) * C), dh(std::size_t(T) * F),
        dw2(std::size_t(F) * C), dw1(std::size_t(C) * F);
    auto gemm = [](bool ta, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                   float* c) {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a,
                    lda, b, ldb, 0.0f, c, n);
    };
    double best = 1e30;
    for (int r = 0; r < reps + 1; ++r) {
        auto t = Clock::now();
        gemm(false, T, F, C, x.data(), C, w1.data(), F, out1.data());
        gemm(false, T, C, F, h.data(), F, w2.data(), C, out2.data());
        gemm(false, T, F, C, gy.data(), C, w2t.data(), F, dh.data());
        gemm(true, F, C, T, h.data(), F, gy.data(), C, dw2.data());
        gemm(true, C, F, T, x.data(), C, dh.data(), F, dw1.data());
        if (r > 0) best = std::min(best, 1e3 * seconds_since(t));
    }
    return best;
}

int run(int argc, char** argv) {
    int steps = 6, threads = 2;
    for (int k = 1; k < argc; ++k) {
        const std::string a = argv[k];
        if (k + 1 >= argc) fail(a, " needs a value");
        if (a == "--steps")
            steps = std::stoi(argv[++k]);
        else if (a == "--threads")
            threads = std::stoi(argv[++k]);
        else
            fail("unknown option ", a, "; usage: rag_bench_gemm [--steps K] [--threads T]");
    }
    set_num_threads(threads);
    openblas_set_num_threads(threads);
    auto mod = Module::load("bench/gemm/mlp.rag");
    for (const std::vector<std::int64_t>& n :
         {std::vector<std::int64_t>{250, 256, 240, 256, 248, 256, 252, 244},
          std::vector<std::int64_t>{16, 32, 64, 96, 128, 192, 256, 512}}) {
        std::mt19937_64 g(0);
        std::normal_distribution<double> normal;
        std::vector<DenseArray> samples;
        std::string lengths;
        int T = 0;
        for (auto len : n) {
            std::vector<double> v(std::size_t(len * C));
            for (auto& e : v) e = normal(g);
            samples.push_back(DenseArray::from_f64(DType::f32, {len, C}, v));
            lengths += (lengths.empty() ? "" : ",") + std::to_string(len);
            T += int(len);
        }
        std::vector<Value> args{RaggedTensor::from_list(samples, parse_axes("~N, 512")),
                                mod->init("Mlp", 0)};
        double best = 1e30;
        for (int s = 0; s < steps; ++s) {
            auto t = Clock::now();
            Value r = mod->call("train_step", args);
            args[1] = r.elems.at(1);
            if (s > 0) best = std::min(best, 1e3 * seconds_since(t));
        }
        const double bare = bare_gemms_ms(T, std::max(steps - 1, 1));
        std::printf("{\"program\": \"mlp train_step\", \"lengths\": \"%s\", \"tokens\": %d, "
                    "\"threads\": %d, \"step_ms\": %.3f, \"bare_gemms_ms\": %.3f, "
                    "\"ratio\": %.3f}\n",
                    lengths.c_str(), T, threads, best, bare, best / bare);
        std::fflush(stdout);
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rag_bench_gemm: %s\n", e.what());
        return 1;
    }
}
