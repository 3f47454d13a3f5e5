// rag_bench_gpu: one relative-position attention layer, forward and backward, on the CUDA
// device through rag's tile programs (jit/relpos_gpu.hpp), for bench/gpu/run.sh. The layout of
// REFERENCE.md section 4: fp16, B * N = --tokens (16K), H = 12, d = 64, bidirectional, N = 128
// ... 8192, the four mechanisms with their models' maps (Shaw clip(256), Transformer-XL
// identity (L = N), DeBERTa log_buckets(256, 512), T5 t5_buckets(32, 128)).
//
// Useful FLOPs (REFERENCE.md section 4): forward 4BHN^2d plus 2BHNRd per relation projection
// (Shaw one, TXL one, DeBERTa two, T5 none), backward twice that. Times: device time between
// events on rag's stream (cuda::time_ms), median of --reps after one warm-up; the inputs are
// on the device before timing, the downloads of results are not timed. Peak memory: the
// caching allocator's high-water mark above what the inputs and dO hold (every buffer rag
// allocates: outputs, log-sum-exp, partials, scratch). Correctness: at N <= --check-max-n the
// device results are compared with the CPU tier's fused kernels on the same inputs (relative
// l2 of O and of every gradient). One JSON record per cell on stdout (or --json FILE).
#include "jit/relpos.hpp"
#include "jit/relpos_gpu.hpp"
#include "runtime/cuda.hpp"
#include "runtime/random.hpp"
#include "runtime/relpos_map.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace rag::bench {
namespace {

struct Options {
    std::vector<std::int64_t> lengths = {128, 256, 512, 1024, 2048, 4096, 8192};
    std::vector<std::string> mechanisms = {"Shaw", "TXL", "DeBERTa", "T5"};
    std::int64_t tokens = 16384, H = 12, D = 64, reps = 5, check_max_n = 256;
    std::string json;
};

struct Mechanism {
    std::string name;
    int projections; // relation projections credited in the FLOP count
    Attrs attrs;
    std::int64_t rows(std::int64_t N) const {
        const std::string m = attrs.get_str("map");
        if (m == "identity") return RelposMap::identity(N).rows();
        if (m == "clip") return RelposMap::clip(attrs.get_int("distance")).rows();
        if (m == "t5_buckets")
            return RelposMap::t5_buckets(attrs.get_int("num"), attrs.get_int("max_distance"))
                .rows();
        return RelposMap::log_buckets(attrs.get_int("size"), attrs.get_int("max_position")).rows();
    }
};

Mechanism mechanism(const std::string& name, std::int64_t D) {
    auto flags = [](bool aq, bool ak, bool bias) {
        return Attrs{{"aq", aq}, {"ak", ak}, {"bias", bias}};
    };
    const std::string map = "map";
    if (name == "Shaw")
        return {name, 1,
                flags(true, false, false)
                    .set(map, std::string("clip"))
                    .set("distance", std::int64_t(256))};
    if (name == "TXL") return {name, 1, flags(true, true, true).set(map, std::string("identity"))};
    if (name == "DeBERTa")
        return {name, 2,
                flags(true, true, false)
                    .set(map, std::string("log_buckets"))
                    .set("size", std::int64_t(256))
                    .set("max_position", std::int64_t(512))
                    .set("scale", 1.0 / std::sqrt(3.0 * double(D)))};
    if (name == "T5")
        return {name, 0,
                flags(false, false, true)
                    .set(map, std::string("t5_buckets"))
                    .set("num", std::int64_t(32))
                    .set("max_distance", std::int64_t(128))
                    .set("scale", 1.0)};
    throw std::runtime_error("unknown mechanism " + name + " (Shaw, TXL, DeBERTa, T5)");
}

// 2 u_k - 1 with rag's counter-based generator, seeded by N, stream "<mechanism>.<name>".
std::vector<double> stream(const std::string& mech, const std::string& name, std::int64_t N,
                           std::size_t n) {
    const CounterRng g(std::uint64_t(N), mech + "." + name);
    std::vector<double> v(n);
    for (std::size_t k = 0; k < n; ++k) v[k] = 2 * g.uniform(k) - 1;
    return v;
}

RaggedTensor tokens(const std::string& mech, const std::string& name, std::int64_t B,
                    std::int64_t N, std::int64_t H, std::int64_t w) {
    std::vector<DenseArray> s(std::size_t(B), DenseArray::zeros(DType::f16, {N, H, w}));
    auto shape = RaggedTensor::from_list(s, "~N, " + std::to_string(H) + ", " + std::to_string(w));
    return RaggedTensor::from_f64(DType::f16, shape.structure_ptr(),
                                  stream(mech, name, N, std::size_t(B * N * H * w)));
}

RaggedTensor table(const std::string& mech, const std::string& name, std::int64_t N,
                   std::vector<std::int64_t> shape) {
    std::size_t n = 1;
    for (auto e : shape) n *= std::size_t(e);
    return RaggedTensor::dense(
        DenseArray::from_f64(DType::f16, std::move(shape), stream(mech, name, N, n)));
}

double rel_l2(const RaggedTensor& a, const RaggedTensor& b) {
    auto x = a.to_f64(), y = b.to_f64();
    double num = 0, den = 0;
    for (std::size_t k = 0; k < x.size(); ++k) {
        num += (x[k] - y[k]) * (x[k] - y[k]);
        den += y[k] * y[k];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

std::string cell(const Options& o, const Mechanism& m, std::int64_t N) {
    const std::int64_t B = std::max<std::int64_t>(o.tokens / N, 1), H = o.H, D = o.D;
    const std::int64_t R = m.rows(N);
    std::vector<RaggedTensor> in = {tokens(m.name, "q", B, N, H, D),
                                    tokens(m.name, "k", B, N, H, D),
                                    tokens(m.name, "v", B, N, H, D)};
    for (const char* t : {"aq", "ak"})
        if (m.attrs.get_bool(t, false)) in.push_back(table(m.name, t, N, {R, H, D}));
    if (m.attrs.get_bool("bias", false)) in.push_back(table(m.name, "bias", N, {R, H}));
    const RaggedTensor dO = tokens(m.name, "dO", B, N, H, D);

    std::ostringstream js;
    js << "{\"system\": \"rag\", \"mechanism\": \"" << m.name << "\", \"N\": " << N
       << ", \"B\": " << B << ", \"R\": " << R;
    try {
        jit::RelposOnDevice dev(in, m.attrs);
        dev.set_dO(dO);
        cuda::synchronize();
        const std::size_t held = cuda::memory_stats().in_use; // inputs, tables, lists, dO
        cuda::reset_peak();
        dev.forward(); // warm-up: compiles and loads the programs
        dev.backward();
        cuda::synchronize();
        std::vector<double> fwd, bwd;
        for (std::int64_t r = 0; r < o.reps; ++r) {
            fwd.push_back(cuda::time_ms([&] { dev.forward(); }));
            bwd.push_back(cuda::time_ms([&] { dev.backward(); }));
        }
        const double peak_mib = double(cuda::memory_stats().peak - held) / (1 << 20);
        const double attn = 4.0 * double(B * H) * double(N) * double(N) * double(D);
        const double proj = 2.0 * double(B * H) * double(N) * double(R) * double(D);
        const double flops = attn + m.projections * proj;
        const double f_ms = median(fwd), b_ms = median(bwd);
        js << ", \"fwd_ms\": " << f_ms << ", \"bwd_ms\": " << b_ms
           << ", \"fwd_tflops\": " << flops / (f_ms * 1e-3) / 1e12
           << ", \"bwd_tflops\": " << 2 * flops / (b_ms * 1e-3) / 1e12
           << ", \"peak_mib\": " << peak_mib;
        if (N <= o.check_max_n) {
            double worst = rel_l2(dev.out(), jit::relpos_forward(in, m.attrs).out);
            const auto want = jit::relpos_backward(in, dO, m.attrs);
            const auto got = dev.gradients();
            for (std::size_t k = 0; k < want.size(); ++k)
                worst = std::max(worst, rel_l2(got[k], want[k]));
            js << ", \"rel_l2_vs_cpu\": " << worst;
        }
    } catch (const std::exception& e) {
        std::string msg = e.what();
        std::replace(msg.begin(), msg.end(), '"', '\'');
        std::replace(msg.begin(), msg.end(), '\n', ' ');
        js << ", \"error\": \"" << msg << "\"";
    }
    js << "}";
    return js.str();
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
    return out;
}

int run(int argc, char** argv) {
    Options o;
    for (int a = 1; a < argc; ++a) {
        const std::string arg = argv[a];
        auto value = [&]() -> std::string {
            if (a + 1 >= argc) throw std::runtime_error(arg + " needs a value");
            return argv[++a];
        };
        if (arg == "--lengths") {
            o.lengths.clear();
            for (auto& x : split(value())) o.lengths.push_back(std::stoll(x));
        } else if (arg == "--mechanisms") {
            o.mechanisms = split(value());
        } else if (arg == "--tokens") {
            o.tokens = std::stoll(value());
        } else if (arg == "--reps") {
            o.reps = std::max<std::int64_t>(1, std::stoll(value()));
        } else if (arg == "--check-max-n") {
            o.check_max_n = std::stoll(value());
        } else if (arg == "--json") {
            o.json = value();
        } else {
            std::fprintf(stderr,
                         "usage: rag_bench_gpu [--lengths 128,...] [--mechanisms Shaw,TXL,...] "
                         "[--tokens 16384] [--reps 5] [--check-max-n 256] [--json FILE]\n");
            return 2;
        }
    }
    const cuda::DeviceInfo& d = cuda::device(); // "CUDA unavailable: ..." before any work
    std::fprintf(stderr, "rag_bench_gpu on %s (%s)\n", d.name.c_str(), d.arch().c_str());
    std::ofstream file;
    if (!o.json.empty()) file.open(o.json);
    std::ostream& out = o.json.empty() ? std::cout : file;
    for (const auto& name : o.mechanisms) {
        const Mechanism m = mechanism(name, o.D);
        for (std::int64_t N : o.lengths) {
            const std::string line = cell(o, m, N);
            out << line << "\n" << std::flush;
            std::fprintf(stderr, "%s\n", line.c_str());
        }
    }
    return 0;
}

} // namespace
} // namespace rag::bench

int main(int argc, char** argv) {
    try {
        return rag::bench::run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rag_bench_gpu: %s\n", e.what());
        return 1;
    }
}
