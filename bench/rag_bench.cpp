// One benchmark cell for rag: an example's loss alone (forward) and its training step
// (forward, backward, SGD update) on one batch, ragged or padded (the same program on the dense
// envelope with masks), on the JIT or the interpreter. Prints one JSON line per measured
// function ("fwd": true for the loss): ms/step (the median and the least of the calls after the
// first), the first call (compile + run), compile seconds, peak buffer bytes of a call, peak RSS
// growth, the first loss (to check the peers compute the same thing) and the occupancies.
// `--dump DIR` also writes the batch and the initial params (dense, zero-padded, raw
// little-endian) with a manifest.json, so the peers run on the very same inputs.
//
// usage: rag_bench CASE N_LENGTHS [--padded] [--tier jit|interp] [--steps K] [--threads T]
//                  [--seed S] [--dump DIR] [--only fwd|train]
//   CASE: square | rect | nonleading | encoder   (rect: M lengths are N's reversed)
//   --only: measure one of the two functions (default: the loss, then the training step)
#include "dsl/module.hpp"
#include "runtime/error.hpp"
#include "runtime/memory.hpp"
#include "runtime/parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace rag;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Case {
    std::string file, fn, loss, params;
    int channels;
    bool second_set; // a second ragged set ~M (rect)
    bool labels;     // an i64[B, ~N] labels argument (encoder)
};

Case case_of(const std::string& name) {
    if (name == "square")
        return {"single_pair_single.rag", "train_step", "loss", "PairBlock", 384, false, false};
    if (name == "rect")
        return {"single_pair_single.rag",
                "train_step_rect",
                "loss_rect",
                "PairBlock",
                384,
                true,
                false};
    if (name == "nonleading")
        return {"single_pair_single.rag",
                "train_step_nonleading",
                "loss_nonleading",
                "PairBlock",
                384,
                false,
                false};
    if (name == "encoder") return {"encoder.rag", "train_step", "loss", "Encoder", 64, false, true};
    fail("unknown case '", name, "'; use square, rect, nonleading or encoder");
}

std::vector<std::int64_t> parse_lengths(const std::string& s) {
    std::vector<std::int64_t> out;
    std::stringstream ss(s);
    std::string tok;
    while (std::getline(ss, tok, ',')) out.push_back(std::stoll(tok));
    return out;
}

RaggedTensor random_batch(std::mt19937_64& g, const std::vector<std::int64_t>& lengths, int C) {
    std::normal_distribution<double> normal;
    std::vector<DenseArray> samples;
    for (auto n : lengths) {
        std::vector<double> v(static_cast<std::size_t>(n * C));
        for (auto& x : v) x = normal(g);
        samples.push_back(DenseArray::from_f64(DType::f32, {n, C}, v));
    }
    return RaggedTensor::from_list(samples, parse_axes("~N, " + std::to_string(C)));
}

RaggedTensor random_labels(std::mt19937_64& g, const std::vector<std::int64_t>& lengths) {
    std::vector<DenseArray> samples;
    for (auto n : lengths) {
        std::vector<double> v(static_cast<std::size_t>(n));
        for (auto& x : v) x = double(g() % 2);
        samples.push_back(DenseArray::from_f64(DType::i64, {n}, v));
    }
    return RaggedTensor::from_list(samples, parse_axes("~N"));
}

void write_raw(const fs::path& p, const DenseArray& a) {
    std::ofstream out(p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(a.bytes.data()), std::streamsize(a.bytes.size()));
}

std::string json_ints(const std::vector<std::int64_t>& v) {
    std::string s = "[";
    for (std::size_t k = 0; k < v.size(); ++k) s += (k ? ", " : "") + std::to_string(v[k]);
    return s + "]";
}

// The batch and params as dense zero-padded arrays plus a manifest the peers read.
void dump(const fs::path& dir, const std::string& name, const std::vector<std::int64_t>& n,
          const std::vector<std::int64_t>& m,
          const std::vector<std::pair<std::string, RaggedTensor>>& batch, const Value& params) {
    fs::create_directories(dir);
    std::ofstream man(dir / "manifest.json");
    man << "{\"case\": \"" << name << "\", \"n\": " << json_ints(n) << ", \"m\": " << json_ints(m)
        << ", \"tensors\": [";
    bool first = true;
    auto entry = [&](const std::string& key, const DenseArray& a) {
        write_raw(dir / (key + ".bin"), a);
        man << (first ? "" : ", ") << "{\"name\": \"" << key << "\", \"dtype\": \""
            << dtype_name(a.dtype) << "\", \"shape\": " << json_ints(a.shape) << "}";
        first = false;
    };
    for (const auto& [key, t] : batch) entry(key, t.to_padded(0.0));
    for (const auto& [key, t] : params.fields) entry("p." + key, t.to_dense());
    man << "]}\n";
}

// Peak resident set growth: VmHWM is reset to the current RSS by writing 5 to clear_refs.
long status_kb(const char* key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::string(key).size()));
    return -1;
}
void reset_hwm() {
    std::ofstream("/proc/self/clear_refs") << "5";
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int run(int argc, char** argv) {
    std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() < 2)
        fail("usage: rag_bench CASE N_LENGTHS [--padded] [--tier jit|interp] "
             "[--steps K] [--threads T] [--seed S] [--dump DIR] [--only fwd|train]");
    const std::string name = a[0];
    const Case c = case_of(name);
    const auto n = parse_lengths(a[1]);
    bool padded = false;
    Tier tier = Tier::jit;
    int steps = 5, threads = 2;
    std::uint64_t seed = 0;
    std::string dump_dir, only;
    for (std::size_t k = 2; k < a.size(); ++k) {
        auto value = [&]() -> std::string {
            if (k + 1 >= a.size()) fail(a[k], " needs a value");
            return a[++k];
        };
        if (a[k] == "--padded")
            padded = true;
        else if (a[k] == "--tier")
            tier = value() == "interp" ? Tier::interpreter : Tier::jit;
        else if (a[k] == "--steps")
            steps = std::stoi(value());
        else if (a[k] == "--threads")
            threads = std::stoi(value());
        else if (a[k] == "--seed")
            seed = std::stoull(value());
        else if (a[k] == "--dump")
            dump_dir = value();
        else if (a[k] == "--only")
            only = value();
        else
            fail("unknown option ", a[k]);
    }
    if (!only.empty() && only != "fwd" && only != "train")
        fail("--only takes fwd or train, not '", only, "'");
    set_num_threads(threads);
    // Run from the repository root (bench/run.sh does), or point RAG_ROOT at it.
    const char* root_env = std::getenv("RAG_ROOT");
    const fs::path root = root_env ? fs::path(root_env) : fs::current_path();
    auto mod = Module::load((root / "examples" / c.file).string());
    mod->set_tier(tier);
    mod->set_padded(padded);

    std::mt19937_64 g(seed);
    std::vector<std::int64_t> m(n.rbegin(), n.rend());
    std::vector<std::pair<std::string, RaggedTensor>> batch{{"x", random_batch(g, n, c.channels)}};
    if (c.second_set) batch.push_back({"z", random_batch(g, m, c.channels)});
    if (c.labels) batch.push_back({"labels", random_labels(g, n)});
    Value params = mod->init(c.params, seed);
    if (!dump_dir.empty()) dump(dump_dir, name, n, c.second_set ? m : n, batch, params);

    std::vector<Value> args;
    for (const auto& [_, t] : batch) args.push_back(t);
    args.push_back(params);
    const std::size_t slot = args.size() - 1;

    // Occupancy: valid / padded entries of the token state and of the pair state.
    double tok = 0, pair = 0;
    const double nmax = double(*std::max_element(n.begin(), n.end()));
    const auto& mm = c.second_set ? m : n;
    const double mmax = double(*std::max_element(mm.begin(), mm.end()));
    for (std::size_t i = 0; i < n.size(); ++i) {
        tok += double(n[i]);
        pair += double(n[i]) * double(mm[i]);
    }
    const double B = double(n.size());

    // Calls `fn` `steps` times; the training step feeds its updated params to the next call.
    auto measure = [&](const std::string& fn, bool fwd) {
        auto call = [&]() {
            Value r = mod->call(fn, args);
            if (fwd) return r.tensor.item();
            args[slot] = r.elems.at(1);
            return r.elems.at(0).tensor.item();
        };
        auto t0 = Clock::now();
        const double loss0 = call();
        const double first_s = std::chrono::duration<double>(Clock::now() - t0).count();
        std::vector<double> ms;
        const auto before = memory::stats().current;
        memory::reset_peak();
        memory::release_cached(); // the measured steps must fetch their blocks again
        const long rss0 = status_kb("VmRSS:");
        reset_hwm();
        for (int s = 1; s < steps; ++s) {
            auto t = Clock::now();
            call();
            ms.push_back(1e3 * std::chrono::duration<double>(Clock::now() - t).count());
        }
        const long hwm = status_kb("VmHWM:");
        const auto peak = memory::stats().peak - before;
        const auto st = mod->stats().at(fn);
        std::printf("{\"case\": \"%s\", \"mode\": \"%s\", \"tier\": \"%s\", \"system\": \"rag\", "
                    "\"fwd\": %s, \"lengths\": \"%s\", \"threads\": %d, \"steps\": %d, "
                    "\"ms_step\": %.3f, \"ms_min\": %.3f, "
                    "\"first_call_s\": %.4f, \"compile_s\": %.4f, \"compilations\": %d, "
                    "\"peak_bytes\": %zu, \"peak_rss_bytes\": %ld, \"loss0\": %.9g, "
                    "\"rho_tokens\": %.4f, \"rho_pairs\": %.4f}\n",
                    name.c_str(), padded ? "padded" : "ragged",
                    tier == Tier::jit ? "jit" : "interp", fwd ? "true" : "false", a[1].c_str(),
                    threads, steps, median(ms),
                    ms.empty() ? 0.0 : *std::min_element(ms.begin(), ms.end()), first_s,
                    st.compile_seconds, st.compilations, peak, (hwm - rss0) * 1024L, loss0,
                    tok / (B * nmax), pair / (B * nmax * mmax));
        std::fflush(stdout);
    };
    // The loss first: the training step would change the params it sees.
    if (only != "train") measure(c.loss, true);
    if (only != "fwd") measure(c.fn, false);
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rag_bench: %s\n", e.what());
        return 1;
    }
}
