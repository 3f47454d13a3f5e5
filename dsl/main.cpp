// The `rag` command: check, run and inspect .rag programs.
#include "dsl/module.hpp"
#include "dsl/repl.hpp"
#include "frontend/lower.hpp"
#include "jit/plan.hpp"
#include "jit/ptx.hpp"
#include "runtime/cuda.hpp"
#include "runtime/error.hpp"
#include "runtime/random.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>

namespace {

using namespace rag;

const char* usage = R"(usage: rag COMMAND FILE [options]

commands:
  check FILE                    parse and type-check every function; print diagnostics
  run FILE --fn NAME [options]  call NAME on random ragged inputs and summarise the results
      --lengths 5,17,9          the ragged lengths of the batch (default 5,17,9); every
                                ragged axis gets these lengths (a second ragged name gets
                                them reversed)
      --seed S                  seed for inputs and params (default 0)
      --steps K                 for a function returning (loss, params): run K steps, feeding
                                the params back, and print each loss
      --stats                   print compilations and cache hits per function
      --tier jit|interp         the LLVM-compiled CPU tier (default) or the reference
                                interpreter
      --device cpu|cuda         where to run (default cpu); cuda needs an NVIDIA driver
                                and device
      --padded                  run on the dense envelope B x N_max x ... with masks (the
                                padded baseline); same valid results
  ir FILE --fn NAME [--plan]    print the SSA IR of NAME on its declared types (--plan: how
                                the CPU JIT runs it: fused loops, GEMMs, reference kernels)
  ptx FILE --fn NAME [--arch A]  print the PTX of NAME's GPU kernels on its declared types
                                (--arch sm_90, the default, or sm_80)
  repl                          an interactive session (:help inside)
  --help                        this text
)";

struct Options {
    std::string fn;
    std::vector<std::int64_t> lengths = {5, 17, 9};
    std::uint64_t seed = 0;
    int steps = 0;
    bool stats = false;
    bool plan = false;
    Tier tier = Tier::jit;
    std::string device = "cpu";
    std::string arch = "sm_90";
    bool padded = false;
};

std::vector<std::int64_t> parse_lengths(const std::string& s) {
    std::vector<std::int64_t> out;
    std::stringstream ss(s);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
        std::size_t used = 0;
        long long v = -1;
        try {
            v = std::stoll(tok, &used);
        } catch (...) {
        }
        if (v < 0 || used != tok.size()) fail("--lengths: '", tok, "' is not a length");
        out.push_back(v);
    }
    if (out.empty()) fail("--lengths needs at least one length");
    return out;
}

// A random tensor of a declared schema: ragged axes take the requested lengths.
RaggedTensor random_tensor(const Schema& s, const Options& o, std::uint64_t stream) {
    CounterRng rng(o.seed, "input" + std::to_string(stream));
    std::map<std::string, int> ragged_index;
    for (const auto& a : s.shape.axes)
        if (a.is_ragged()) ragged_index.try_emplace(a.name, int(ragged_index.size()));
    const std::int64_t B = s.shape.batched ? std::int64_t(o.lengths.size()) : 1;
    std::vector<DenseArray> samples;
    std::uint64_t k = 0;
    for (std::int64_t i = 0; i < B; ++i) {
        std::vector<std::int64_t> shape;
        for (const auto& a : s.shape.axes) {
            if (a.kind == AxisKind::fixed)
                shape.push_back(a.extent);
            else if (a.kind == AxisKind::symbolic)
                shape.push_back(4);
            else
                shape.push_back(ragged_index[a.name] % 2 ? o.lengths[std::size_t(B - 1 - i)]
                                                         : o.lengths[std::size_t(i)]);
        }
        DenseArray arr = DenseArray::zeros(s.dtype, shape);
        for (std::int64_t e = 0; e < arr.numel(); ++e) {
            double x = is_floating(s.dtype) ? rng.normal(k++) : std::floor(2 * rng.uniform(k++));
            store_from_f64(arr.bytes.data(), s.dtype, std::size_t(e), x);
        }
        samples.push_back(std::move(arr));
    }
    if (!s.shape.batched) return RaggedTensor::dense(samples[0]);
    return RaggedTensor::from_list(samples, s.shape.axes);
}

void summarise(const Value& v, const std::string& name) {
    if (v.kind == Value::Kind::tuple) {
        for (std::size_t k = 0; k < v.elems.size(); ++k)
            summarise(v.elems[k], name + "." + std::to_string(k));
        return;
    }
    if (v.kind == Value::Kind::record) {
        for (const auto& [n, t] : v.fields) summarise(Value(t), name + "." + n);
        return;
    }
    auto x = v.tensor.to_f64();
    double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
    for (double e : x) {
        sum += e;
        sq += e * e;
        lo = std::min(lo, e);
        hi = std::max(hi, e);
    }
    double n = double(x.size()), mean = n ? sum / n : 0,
           sd = n ? std::sqrt(std::max(0.0, sq / n - mean * mean)) : 0;
    std::printf("%s: %s  values=%zu", name.c_str(), describe(v.tensor).c_str(), x.size());
    if (x.size() == 1)
        std::printf("  value=%.6g\n", x[0]);
    else
        std::printf("  mean=%.6g std=%.6g min=%.6g max=%.6g\n", mean, sd, lo, hi);
}

int cmd_check(const std::string& path) {
    Module::load(path);
    std::printf("%s: ok\n", path.c_str());
    return 0;
}

int cmd_run(const std::string& path, const Options& o) {
    if (o.fn.empty()) fail("run needs --fn NAME");
    if (o.device == "cuda") cuda::device(); // "CUDA unavailable: why" before any work
    auto m = Module::load(path);
    m->set_tier(o.device == "cuda" ? Tier::gpu : o.tier);
    m->set_padded(o.padded);
    Diagnostics diags(*m->program().units[0].src);
    auto decl = frontend::lower(m->program(), o.fn, std::nullopt, diags);
    if (!decl) throw CompileError(diags.str());
    std::vector<Value> args;
    std::uint64_t stream = 0;
    for (const auto& t : decl->params) {
        if (t.kind == frontend::VType::Kind::record)
            args.push_back(m->init(t.record, o.seed));
        else if (t.kind == frontend::VType::Kind::tensor)
            args.push_back(random_tensor(t.schema, o, stream++));
        else
            fail("run: cannot make a random tuple argument");
    }
    if (o.steps > 0) {
        // (loss, params) -> feed params back.
        int slot = -1;
        for (std::size_t k = 0; k < args.size(); ++k)
            if (args[k].kind == Value::Kind::record) slot = int(k);
        double later = 0; // seconds of the steps after the first (which compiles)
        for (int s = 0; s < o.steps; ++s) {
            auto t0 = std::chrono::steady_clock::now();
            Value r = m->call(o.fn, args);
            if (s > 0)
                later +=
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (r.kind != Value::Kind::tuple || r.elems.size() != 2 || slot < 0 ||
                r.elems[1].kind != Value::Kind::record || r.elems[0].kind != Value::Kind::tensor)
                fail("--steps needs a function returning (loss, params) that takes the params");
            std::printf("step %d loss %.6f\n", s + 1, r.elems[0].tensor.item());
            args[std::size_t(slot)] = r.elems[1];
        }
        if (o.steps > 1)
            std::printf("%.3f ms/step after the first step\n", 1e3 * later / (o.steps - 1));
    } else {
        std::size_t flat = 0; // position among the function's tensor inputs
        for (const auto& arg : args) {
            if (arg.kind == Value::Kind::tensor)
                summarise(arg, "arg " + decl->fn.nodes[std::size_t(decl->fn.inputs[flat])].label);
            flat += arg.kind == Value::Kind::record ? arg.fields.size() : 1;
        }
        summarise(m->call(o.fn, args), o.fn);
    }
    if (o.stats)
        for (const auto& [fn, st] : m->stats()) {
            // Where the latest call's steps ran: every reference kernel and host fallback named.
            std::string where = "steps " + fn + ": compiled=" + std::to_string(st.compiled_steps) +
                                " device=" + std::to_string(st.device_steps);
            for (const auto& [kind, ops] :
                 {std::pair{"reference", &st.reference_steps}, std::pair{"host", &st.host_steps}}) {
                where += std::string(" ") + kind + "=";
                std::string list;
                for (const auto& [op, n] : *ops)
                    list += (list.empty() ? "" : ",") + op + ":" + std::to_string(n);
                where += list.empty() ? "0" : list;
            }
            std::printf("stats %s: compilations=%d cache_hits=%d compile_seconds=%.3f\n",
                        fn.c_str(), st.compilations, st.cache_hits, st.compile_seconds);
            std::printf("%s\n", where.c_str());
        }
    return 0;
}

int cmd_ir(const std::string& path, const Options& o) {
    if (o.fn.empty()) fail("ir needs --fn NAME");
    auto m = Module::load(path);
    std::fputs((o.plan ? m->plan(o.fn) : m->ir(o.fn)).c_str(), stdout);
    return 0;
}

int cmd_ptx(const std::string& path, const Options& o) {
    if (o.fn.empty()) fail("ptx needs --fn NAME");
    auto m = Module::load(path);
    Diagnostics diags(*m->program().units[0].src);
    auto lowered = frontend::lower(m->program(), o.fn, std::nullopt, diags);
    if (!lowered) throw CompileError(diags.str());
    const jit::Plan plan = jit::make_plan(lowered->fn);
    std::fputs(jit::describe(jit::fused_ptx(lowered->fn, plan, o.arch), lowered->fn, plan).c_str(),
               stdout);
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    std::vector<std::string> a(argv + 1, argv + argc);
    for (const auto& s : a)
        if (s == "--help" || s == "-h") {
            std::fputs(usage, stdout);
            return 0;
        }
    if (!a.empty() && a[0] == "repl") return run_repl(stdin, stdout);
    if (a.size() < 2) {
        std::fputs(usage, stderr);
        return 2;
    }
    try {
        Options o;
        for (std::size_t k = 2; k < a.size(); ++k) {
            auto value = [&]() -> const std::string& {
                if (k + 1 >= a.size()) fail(a[k], " needs a value");
                return a[++k];
            };
            if (a[k] == "--fn")
                o.fn = value();
            else if (a[k] == "--lengths")
                o.lengths = parse_lengths(value());
            else if (a[k] == "--seed")
                o.seed = std::stoull(value());
            else if (a[k] == "--steps")
                o.steps = std::stoi(value());
            else if (a[k] == "--stats")
                o.stats = true;
            else if (a[k] == "--plan")
                o.plan = true;
            else if (a[k] == "--padded")
                o.padded = true;
            else if (a[k] == "--arch")
                o.arch = value();
            else if (a[k] == "--device") {
                o.device = value();
                if (o.device != "cpu" && o.device != "cuda")
                    fail("--device takes cpu or cuda, got '", o.device, "'");
            } else if (a[k] == "--tier") {
                const std::string& t = value();
                if (t != "jit" && t != "interp") fail("--tier takes jit or interp, got '", t, "'");
                o.tier = t == "jit" ? Tier::jit : Tier::interpreter;
            } else
                fail("unknown option '", a[k], "' (see rag --help)");
        }
        if (a[0] == "check") return cmd_check(a[1]);
        if (a[0] == "run") return cmd_run(a[1], o);
        if (a[0] == "ir") return cmd_ir(a[1], o);
        if (a[0] == "ptx") return cmd_ptx(a[1], o);
        fail("unknown command '", a[0], "' (see rag --help)");
    } catch (const CompileError& e) {
        std::fputs(e.what(), stderr);
        return 1;
    } catch (const Error& e) {
        std::fprintf(stderr, "rag: error: %s\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rag: error: %s\n", e.what());
        return 1;
    }
}
