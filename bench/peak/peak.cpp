// rag_bench_peak: this machine's measured f32 peak, the denominator of the executed-FLOP/s
// fractions in bench/results/relpos.md (issue 20, item 1; issue 18, item 6).
//   - fma: T threads (RAG_NUM_THREADS, else every core), each running 12 independent chains of
//     vector FMAs (AVX-512 when the CPU has it, else AVX2 + FMA): 2 FLOP per lane per FMA.
//   - sgemm: C = A B, f32, M = N = K = --size, through rag's GEMM (OpenBLAS pinned to one thread,
//     output blocks over rag's T threads: what rag's `gemm` steps run) and through OpenBLAS with
//     T threads of its own; 2 M N K FLOP per call.
// Each is a warm-up call and then the median of 5 timed calls. Prints one JSON line per
// measurement (--json FILE also writes them there).
//
// usage: rag_bench_peak [--size 2048] [--json FILE] [--cpu-time]
#include "jit/blas.hpp"
#include "runtime/parallel.hpp"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace {

constexpr int chains = 12; // independent FMA chains: covers 2 FMA pipes x 4-5 cycles latency
constexpr long iterations = 20'000'000;

__attribute__((target("avx2,fma"))) double fma_avx2(long n) {
    __m256 acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = _mm256_set1_ps(float(c) * 1e-3f);
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (long i = 0; i < n; ++i)
        for (int c = 0; c < chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    float out[8];
    __m256 s = acc[0];
    for (int c = 1; c < chains; ++c) s = _mm256_add_ps(s, acc[c]);
    _mm256_storeu_ps(out, s);
    return double(out[0]);
}

__attribute__((target("avx512f"))) double fma_avx512(long n) {
    __m512 acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = _mm512_set1_ps(float(c) * 1e-3f);
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (long i = 0; i < n; ++i)
        for (int c = 0; c < chains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < chains; ++c) s = _mm512_add_ps(s, acc[c]);
    float out[16];
    _mm512_storeu_ps(out, s);
    return double(out[0]);
}

// --cpu-time: the process's CPU time (all threads) instead of wall time, so a rate is per
// core-second: the peak one core gives when the machine is shared (as rag_bench_relpos
// --cpu-time measures with RAG_NUM_THREADS=1).
bool cpu_time = false;

double seconds(const auto& fn) {
    if (cpu_time) {
        timespec a{}, b{};
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
        fn();
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
        return double(b.tv_sec - a.tv_sec) + 1e-9 * double(b.tv_nsec - a.tv_nsec);
    }
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Warm-up, then the median of 5.
double median_seconds(const auto& fn) {
    fn();
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) t.push_back(seconds(fn));
    std::sort(t.begin(), t.end());
    return t[2];
}

} // namespace

int main(int argc, char** argv) {
    int size = 2048;
    std::string json;
    for (int a = 1; a < argc; ++a) {
        const std::string k = argv[a];
        if (k == "--size" && a + 1 < argc)
            size = std::stoi(argv[++a]);
        else if (k == "--json" && a + 1 < argc)
            json = argv[++a];
        else if (k == "--cpu-time")
            cpu_time = true;
        else {
            std::fprintf(stderr,
                         "usage: rag_bench_peak [--size 2048] [--json FILE] [--cpu-time]\n");
            return 2;
        }
    }
    const int T = int(rag::num_threads());
    std::ofstream out;
    if (!json.empty()) out.open(json);
    auto emit = [&](const std::string& what, double gflops, const std::string& extra) {
        char line[512];
        std::snprintf(
            line, sizeof line,
            "{\"measure\": \"%s\", \"threads\": %d, \"gflops\": %.2f, \"time\": \"%s\"%s}",
            what.c_str(), T, gflops, cpu_time ? "cpu" : "wall", extra.c_str());
        std::printf("%s\n", line);
        if (out) out << line << "\n";
    };

    const bool avx512 = __builtin_cpu_supports("avx512f");
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx512 || avx2) {
        const int lanes = avx512 ? 16 : 8;
        std::vector<double> sink(std::size_t(T), 0);
        const double s = median_seconds([&] {
            std::vector<std::thread> th;
            for (int t = 0; t < T; ++t)
                th.emplace_back([&, t] {
                    sink[std::size_t(t)] = avx512 ? fma_avx512(iterations) : fma_avx2(iterations);
                });
            for (auto& x : th) x.join();
        });
        const double flop = 2.0 * lanes * chains * double(iterations) * T;
        emit("fma", flop / s * 1e-9,
             std::string(", \"isa\": \"") + (avx512 ? "avx512" : "avx2") +
                 "\", \"check\": " + std::to_string(sink[0]));
    }

    const std::size_t n = std::size_t(size);
    std::vector<float> A(n * n), B(n * n), C(n * n);
    for (std::size_t k = 0; k < n * n; ++k) {
        A[k] = float(k % 7) * 0.1f - 0.3f;
        B[k] = float(k % 5) * 0.1f - 0.2f;
    }
    const double flop = 2.0 * double(size) * double(size) * double(size);
    const double rag_s = median_seconds([&] {
        rag::jit::gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, A.data(),
                       size, B.data(), size, C.data(), size);
    });
    emit("sgemm rag", flop / rag_s * 1e-9, ", \"size\": " + std::to_string(size));
    openblas_set_num_threads(T);
    const double blas_s = median_seconds([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, A.data(),
                    size, B.data(), size, 0.0f, C.data(), size);
    });
    emit("sgemm openblas", flop / blas_s * 1e-9,
         ", \"size\": " + std::to_string(size) + ", \"core\": \"" + rag::jit::blas_core() + "\"");
    return 0;
}
