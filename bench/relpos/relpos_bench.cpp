// rag_bench_relpos: one relative-position attention layer, forward and backward, on the CPU,
// in the layout of the relative-position paper's Tables 11 (throughput) and 12 (peak memory).
// Systems: rag's fused kernels (jit/relpos.hpp), "projections + per-score gather without
// tiling" (gather_baseline.hpp, float32, OpenBLAS GEMMs) and the materialising reference op
// (relpos_attention, float64 loops). The four mechanisms use their models' maps: Shaw clip(256),
// Transformer-XL identity (L = N), DeBERTa log_buckets(256, 512), T5 t5_buckets(32, 128).
//
// Sizes follow the paper: B * N = --tokens (16K), H = 12, d = 64, bidirectional; float32 here
// (the CPU has no fast f16). Useful FLOPs (REFERENCE.md section 4): forward 4BHN^2d plus
// 2BHNRd per relation projection (Shaw and TXL one, DeBERTa two, T5 none), backward twice
// that. Peak memory: resident bytes above the inputs (peak_rss.hpp), so every system is
// measured the same way. Correctness: each system, on the first sample of the batch, against
// the float64 gather reference with REFERENCE.md section 3's f32 criterion (marked † if not met).
// Writes one JSON record per cell (--json) for bench/relpos/report.py.
#include "bench/relpos/gather_baseline.hpp"
#include "bench/relpos/peak_rss.hpp"
#include "ir/op_table.hpp"
#include "jit/relpos.hpp"
#include "jit/relpos_programs.hpp"
#include "runtime/random.hpp"
#include "runtime/relpos_map.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace rag::bench {
namespace {

struct Options {
    std::vector<std::int64_t> lengths = {128, 256, 512, 1024, 2048, 4096, 8192};
    std::int64_t tokens = 16384, H = 12, D = 64;
    std::vector<std::string> mechanisms = {"Shaw", "TXL", "DeBERTa", "T5"};
    std::vector<std::string> systems = {"rag fused", "gather", "materialising"};
    std::map<std::string, std::int64_t> max_n = {{"materialising", 128}};
    double cap_s = 60; // skip a system's next N when forward + backward would exceed it
    std::int64_t check_max_n = 2048; // correctness check on sample 0 up to this N
    std::string json;
};

struct Mechanism {
    std::string name;
    bool aq, ak, bias, txl;
    int projections; // relation projections credited in the FLOP count
    Attrs attrs;
    RelposMap map_for(std::int64_t N) const {
        const std::string m = attrs.get_str("map");
        if (m == "identity") return RelposMap::identity(N);
        if (m == "clip") return RelposMap::clip(attrs.get_int("distance"));
        if (m == "t5_buckets")
            return RelposMap::t5_buckets(attrs.get_int("num"), attrs.get_int("max_distance"));
        return RelposMap::log_buckets(attrs.get_int("size"), attrs.get_int("max_position"));
    }
};

Mechanism mechanism(const std::string& name, std::int64_t D) {
    auto flags = [](bool aq, bool ak, bool bias) {
        return Attrs{{"aq", aq}, {"ak", ak}, {"bias", bias}};
    };
    if (name == "Shaw")
        return {name,
                true,
                false,
                false,
                false,
                1,
                flags(true, false, false)
                    .set("map", std::string("clip"))
                    .set("distance", std::int64_t(256))};
    if (name == "TXL")
        return {name,
                true,
                true,
                true,
                true,
                1,
                flags(true, true, true).set("map", std::string("identity"))};
    if (name == "DeBERTa")
        return {name,
                true,
                true,
                false,
                false,
                2,
                flags(true, true, false)
                    .set("map", std::string("log_buckets"))
                    .set("size", std::int64_t(256))
                    .set("max_position", std::int64_t(512))
                    .set("scale", 1.0 / std::sqrt(3.0 * double(D)))};
    if (name == "T5")
        return {name,
                false,
                false,
                true,
                false,
                0,
                flags(false, false, true)
                    .set("map", std::string("t5_buckets"))
                    .set("num", std::int64_t(32))
                    .set("max_distance", std::int64_t(128))
                    .set("scale", 1.0)};
    throw std::runtime_error("unknown mechanism " + name + " (Shaw, TXL, DeBERTa, T5)");
}

// Inputs both this binary and peers.py build bit for bit: value k of stream "<mechanism>.<name>"
// is 2 u_k - 1 with rag's counter-based generator (runtime/random.hpp) seeded by N, in packed
// order (token, head, feature) for tokens and (row, head, feature) for tables.
std::vector<double> stream(const std::string& mech, const std::string& name, std::int64_t N,
                           std::size_t n) {
    const CounterRng g(std::uint64_t(N), mech + "." + name);
    std::vector<double> v(n);
    for (std::size_t k = 0; k < n; ++k) v[k] = 2 * g.uniform(k) - 1;
    return v;
}

// A [B, ~N, H, w] batch of equal lengths (declared ragged) holding `vals`.
RaggedTensor batch(DType t, std::int64_t B, std::int64_t N, std::int64_t H, std::int64_t w,
                   const std::vector<double>& vals) {
    std::vector<DenseArray> s(std::size_t(B), DenseArray::zeros(t, {N, H, w}));
    auto shape = RaggedTensor::from_list(s, "~N, " + std::to_string(H) + ", " + std::to_string(w));
    return RaggedTensor::from_f64(t, shape.structure_ptr(), vals);
}
RaggedTensor tokens(const std::string& mech, const std::string& name, std::int64_t B,
                    std::int64_t N, std::int64_t H, std::int64_t w) {
    return batch(DType::f32, B, N, H, w, stream(mech, name, N, std::size_t(B * N * H * w)));
}
RaggedTensor table(std::vector<std::int64_t> shape, const std::vector<double>& vals) {
    return RaggedTensor::dense(DenseArray::from_f64(DType::f32, std::move(shape), vals));
}

// q, k, v and the mechanism's tables (TXL: aq = p_r, ak = u on every row, bias = v.p_r).
std::vector<RaggedTensor> make_inputs(const Mechanism& m, std::int64_t B, std::int64_t N,
                                      const Options& o) {
    const std::int64_t H = o.H, D = o.D, R = m.map_for(N).rows();
    std::vector<RaggedTensor> in = {tokens(m.name, "q", B, N, H, D),
                                    tokens(m.name, "k", B, N, H, D),
                                    tokens(m.name, "v", B, N, H, D)};
    const std::size_t RHD = std::size_t(R * H * D), HD = std::size_t(H * D);
    if (m.txl) {
        const auto p = stream(m.name, "p", N, RHD), u = stream(m.name, "u", N, HD),
                   vb = stream(m.name, "vb", N, HD);
        std::vector<double> ak(RHD), b(std::size_t(R * H), 0.0);
        for (std::int64_t r = 0; r < R; ++r)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t c = 0; c < D; ++c) {
                    ak[std::size_t((r * H + h) * D + c)] = u[std::size_t(h * D + c)];
                    b[std::size_t(r * H + h)] +=
                        vb[std::size_t(h * D + c)] * p[std::size_t((r * H + h) * D + c)];
                }
        in.push_back(table({R, H, D}, p));
        in.push_back(table({R, H, D}, ak));
        in.push_back(table({R, H}, b));
        return in;
    }
    if (m.aq) in.push_back(table({R, H, D}, stream(m.name, "aq", N, RHD)));
    if (m.ak) in.push_back(table({R, H, D}, stream(m.name, "ak", N, RHD)));
    if (m.bias) in.push_back(table({R, H}, stream(m.name, "bias", N, std::size_t(R * H))));
    return in;
}

// The first sample of each batched input (tables unchanged).
std::vector<RaggedTensor> first_sample(const std::vector<RaggedTensor>& in) {
    std::vector<RaggedTensor> out;
    for (const auto& t : in) {
        if (!t.shape().batched) {
            out.push_back(t);
            continue;
        }
        std::vector<DenseArray> s = {t.to_list()[0]};
        std::vector<Axis> axes = t.shape().axes;
        out.push_back(RaggedTensor::from_list(s, axes));
    }
    return out;
}

// One system: forward returns an opaque state for backward; both return their outputs.
struct Run {
    std::vector<RaggedTensor> outputs; // forward: {O}; backward: every gradient
};
struct System {
    std::function<Run(const std::vector<RaggedTensor>&, const Attrs&, std::shared_ptr<void>&)> fwd;
    std::function<Run(const std::vector<RaggedTensor>&, const RaggedTensor&, const Attrs&,
                      const std::shared_ptr<void>&)>
        bwd;
};

System make_system(const std::string& name) {
    // "rag fused saved": the forward saves the relation projections for the backward
    // (jit::RelposOptions); opt-in with --systems.
    if (name == "rag fused" || name == "rag fused saved")
        return {[save = name != "rag fused"](const auto& in, const Attrs& at,
                                             std::shared_ptr<void>& st) {
                    auto f = std::make_shared<jit::RelposForward>(
                        jit::relpos_forward(in, at, {.save_projections = save}));
                    st = f;
                    return Run{{f->out}};
                },
                [](const auto& in, const RaggedTensor& dO, const Attrs& at, const auto& st) {
                    return Run{jit::relpos_backward(
                        in, dO, at, static_cast<const jit::RelposForward*>(st.get()))};
                }};
    if (name == "gather")
        return {[](const auto& in, const Attrs& at, std::shared_ptr<void>& st) {
                    auto f = std::make_shared<GatherForward>(gather_forward<float>(in, at));
                    st = f;
                    return Run{{f->out}};
                },
                [](const auto& in, const RaggedTensor& dO, const Attrs& at, const auto& st) {
                    return Run{gather_backward<float>(
                        in, dO, at, *static_cast<const GatherForward*>(st.get()))};
                }};
    if (name == "materialising")
        // The op's gradient kernel computes every input's gradient and returns the one asked
        // for: one call (wrt = 0) is the cost of the whole backward; the check asks for each.
        return {[](const auto& in, const Attrs& at, std::shared_ptr<void>&) {
                    return Run{{evaluate("relpos_attention", in, at)}};
                },
                [](const auto& in, const RaggedTensor& dO, const Attrs& at, const auto&) {
                    auto args = in;
                    args.push_back(dO);
                    return Run{{evaluate("relpos_attention_grad", args,
                                         Attrs(at).set("wrt", std::int64_t(0)))}};
                }};
    throw std::runtime_error("unknown system " + name +
                             " (rag fused, rag fused saved, gather, materialising)");
}

// REFERENCE.md section 3 for f32: relative l2 <= 1e-5 against the float64 reference.
double rel_l2(const RaggedTensor& got, const RaggedTensor& ref) {
    const auto g = got.to_f64(), r = ref.to_f64();
    double e2 = 0, r2 = 0;
    for (std::size_t k = 0; k < g.size() && k < r.size(); ++k) {
        const double x = double(float(g[k]));
        e2 += (x - r[k]) * (x - r[k]);
        r2 += r[k] * r[k];
    }
    if (g.size() != r.size()) return INFINITY;
    return r2 > 0 ? std::sqrt(e2 / r2) : std::sqrt(e2);
}

std::vector<RaggedTensor> to_f64(const std::vector<RaggedTensor>& in) {
    std::vector<RaggedTensor> out;
    for (const auto& t : in) out.push_back(t.astype(DType::f64));
    return out;
}

// The worst relative l2 error of the forward output and of every gradient on sample 0.
struct Check {
    double fwd = NAN, bwd = NAN;
};
Check check(const std::string& sys_name, const System& sys, const std::vector<RaggedTensor>& in,
            const RaggedTensor& dO, const Attrs& at) {
    const auto in1 = first_sample(in);
    const auto dO1 = first_sample({dO})[0];
    const auto in64 = to_f64(in1);
    const auto dO64 = dO1.astype(DType::f64);
    const auto ref_f = gather_forward<double>(in64, at);
    const auto ref_g = gather_backward<double>(in64, dO64, at, ref_f);
    Check c;
    std::shared_ptr<void> st;
    c.fwd = rel_l2(sys.fwd(in1, at, st).outputs[0], ref_f.out);
    std::vector<RaggedTensor> grads;
    if (sys_name == "materialising") {
        auto args = in1;
        args.push_back(dO1);
        for (std::size_t k = 0; k < in1.size(); ++k)
            grads.push_back(
                evaluate("relpos_attention_grad", args, Attrs(at).set("wrt", std::int64_t(k))));
    } else {
        grads = sys.bwd(in1, dO1, at, st).outputs;
    }
    c.bwd = grads.size() == ref_g.size() ? 0.0 : INFINITY;
    for (std::size_t k = 0; k < grads.size() && k < ref_g.size(); ++k)
        c.bwd = std::max(c.bwd, rel_l2(grads[k], ref_g[k]));
    return c;
}

// --cpu-time: time is the process's CPU time (all threads) instead of wall time, for A/B
// comparisons on a loaded machine (run with RAG_NUM_THREADS=1 so no worker waits or spins).
bool cpu_time = false;

double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double seconds_of(const std::function<void()>& fn) {
    if (cpu_time) {
        const double c0 = process_cpu_seconds();
        fn();
        return process_cpu_seconds() - c0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Every system at every N: a first call (warm-up: compiled code, caches and pages; it also
// measures peak memory) and then the median of `repeats` timed calls, whatever their length
// (issue 18: timing calls over a second once, cold, favoured the faster system).
constexpr int repeats = 5;
struct Measure {
    double seconds = NAN;
    std::int64_t peak = -1;
};
Measure measure(const std::function<void()>& fn) {
    Measure m;
    m.peak = peak_rss_bytes([&] { seconds_of(fn); });
    std::vector<double> t;
    for (int r = 0; r < repeats; ++r) t.push_back(seconds_of(fn));
    std::sort(t.begin(), t.end());
    m.seconds = t[t.size() / 2];
    return m;
}

struct Cell {
    std::string mechanism, system, pass;
    std::int64_t N = 0;
    double ms = NAN, gflops = NAN, mib = NAN, rel = NAN;
    double exec_gflops = NAN; // rag fused: executed FLOPs (relpos_executed_flops) per second
    std::string note;         // "skipped: ...", "failed: ..."
};

std::string escaped(const std::string& s) {
    std::string out;
    for (char ch : s) {
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch == '\n' ? ' ' : ch;
    }
    return out;
}

std::string json_of(const Cell& c) {
    auto num = [](double x) {
        if (!std::isfinite(x)) return std::string("null");
        std::ostringstream s;
        s.precision(6);
        s << x;
        return s.str();
    };
    std::ostringstream s;
    s << "{\"mechanism\": \"" << c.mechanism << "\", \"system\": \"" << c.system
      << "\", \"pass\": \"" << c.pass << "\", \"N\": " << c.N << ", \"ms\": " << num(c.ms)
      << ", \"gflops\": " << num(c.gflops) << ", \"exec_gflops\": " << num(c.exec_gflops)
      << ", \"mib\": " << num(c.mib) << ", \"rel_l2\": " << num(c.rel)
      << ", \"ok\": " << (std::isfinite(c.rel) ? (c.rel <= 1e-5 ? "true" : "false") : "null")
      << ", \"note\": \"" << escaped(c.note) << "\"}";
    return s.str();
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
    return out;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int a = 1; a < argc; ++a) {
        std::string k = argv[a];
        auto val = [&]() -> std::string {
            if (a + 1 >= argc) throw std::runtime_error(k + " needs a value");
            return argv[++a];
        };
        if (k == "--lengths") {
            o.lengths.clear();
            for (auto& x : split(val())) o.lengths.push_back(std::stoll(x));
        } else if (k == "--tokens")
            o.tokens = std::stoll(val());
        else if (k == "--heads")
            o.H = std::stoll(val());
        else if (k == "--dim")
            o.D = std::stoll(val());
        else if (k == "--mechanisms")
            o.mechanisms = split(val());
        else if (k == "--systems")
            o.systems = split(val());
        else if (k == "--max-n") { // system=N
            auto s = val();
            auto eq = s.find('=');
            o.max_n[s.substr(0, eq)] = std::stoll(s.substr(eq + 1));
        } else if (k == "--cap-s")
            o.cap_s = std::stod(val());
        else if (k == "--check-max-n")
            o.check_max_n = std::stoll(val());
        else if (k == "--json")
            o.json = val();
        else if (k == "--cpu-time")
            cpu_time = true;
        else
            throw std::runtime_error(
                "usage: rag_bench_relpos [--lengths 128,...] [--tokens 16384] [--heads 12] "
                "[--dim 64] [--mechanisms Shaw,TXL,DeBERTa,T5] [--systems 'rag fused,rag fused "
                "saved,gather,materialising'] [--max-n system=N] [--cap-s 60] [--check-max-n 2048] "
                "[--json F] [--cpu-time]");
    }
    return o;
}

int main_(int argc, char** argv) {
    const Options o = parse(argc, argv);
    std::ofstream json;
    if (!o.json.empty()) json.open(o.json);
    std::vector<Cell> cells;
    auto emit = [&](Cell c) {
        std::printf(
            "%-8s %-14s %-3s N=%-5lld %10.1f ms %8.2f GFLOP/s (executed %8.2f) %9.1f MiB  rel_l2 "
            "%-9.2g %s\n",
            c.mechanism.c_str(), c.system.c_str(), c.pass.c_str(), (long long)c.N, c.ms, c.gflops,
            c.exec_gflops, c.mib, c.rel, c.note.c_str());
        std::fflush(stdout);
        if (json) json << json_of(c) << "\n" << std::flush;
        cells.push_back(std::move(c));
    };
    for (const auto& mname : o.mechanisms) {
        const Mechanism m = mechanism(mname, o.D);
        std::map<std::string, double> last; // seconds of fwd + bwd at the previous N
        {
            // Compile rag's kernels for this mechanism before any timing.
            const auto in = make_inputs(m, 1, o.lengths.front(), o);
            std::shared_ptr<void> st;
            for (const char* name : {"rag fused", "rag fused saved"}) {
                if (!std::count(o.systems.begin(), o.systems.end(), name)) continue;
                const System fused = make_system(name);
                fused.fwd(in, m.attrs, st);
                fused.bwd(in, tokens(m.name, "dO", 1, o.lengths.front(), o.H, o.D), m.attrs, st);
            }
        }
        for (std::int64_t N : o.lengths) {
            const std::int64_t B = std::max<std::int64_t>(1, o.tokens / N);
            const auto in = make_inputs(m, B, N, o);
            const auto dO = tokens(m.name, "dO", B, N, o.H, o.D);
            const double R = double(m.map_for(N).rows());
            const double fwd_flop =
                4.0 * double(B) * double(o.H) * double(N) * double(N) * double(o.D) +
                m.projections * 2.0 * double(B) * double(o.H) * double(N) * R * double(o.D);
            for (const auto& sname : o.systems) {
                const System sys = make_system(sname);
                Cell f, b;
                f.mechanism = b.mechanism = mname;
                f.system = b.system = sname;
                f.pass = "F", b.pass = "B";
                f.N = b.N = N;
                auto cap = o.max_n.find(sname);
                std::string skip;
                if (cap != o.max_n.end() && N > cap->second)
                    skip = "skipped: N > " + std::to_string(cap->second);
                else if (last.count(sname) && 2 * last[sname] > o.cap_s)
                    skip = "skipped: > " + std::to_string(int(o.cap_s)) + " s per call";
                if (!skip.empty()) {
                    f.note = b.note = skip;
                    last[sname] = INFINITY;
                    emit(f), emit(b);
                    continue;
                }
                try {
                    std::shared_ptr<void> st;
                    Measure mf = measure([&] {
                        st.reset();
                        sys.fwd(in, m.attrs, st);
                    });
                    if (!st) sys.fwd(in, m.attrs, st);
                    Measure mb = measure([&] { sys.bwd(in, dO, m.attrs, st); });
                    f.ms = mf.seconds * 1e3, b.ms = mb.seconds * 1e3;
                    f.gflops = fwd_flop / mf.seconds * 1e-9;
                    b.gflops = 2 * fwd_flop / mb.seconds * 1e-9;
                    f.mib = double(mf.peak) / (1 << 20), b.mib = double(mb.peak) / (1 << 20);
                    if (sname.rfind("rag fused", 0) == 0) {
                        const jit::RelposShape shape{DType::f32, o.D,  o.D,
                                                     m.aq,       m.ak, m.bias,
                                                     false,      1.0,  sname != "rag fused"};
                        const auto ex = jit::relpos_executed_flops(
                            shape, std::vector<std::int64_t>(std::size_t(B), N), o.H,
                            m.map_for(N).saturation());
                        f.exec_gflops = ex.forward / mf.seconds * 1e-9;
                        b.exec_gflops = ex.backward / mb.seconds * 1e-9;
                    }
                    last[sname] = mf.seconds + mb.seconds;
                    if (N <= o.check_max_n) {
                        Check c = check(sname, sys, in, dO, m.attrs);
                        f.rel = c.fwd, b.rel = c.bwd;
                    }
                } catch (const std::exception& e) {
                    f.note = b.note = std::string("failed: ") + e.what();
                    last[sname] = INFINITY;
                }
                emit(f), emit(b);
            }
        }
    }
    return 0;
}

} // namespace
} // namespace rag::bench

int main(int argc, char** argv) {
    try {
        return rag::bench::main_(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rag_bench_relpos: %s\n", e.what());
        return 2;
    }
}
