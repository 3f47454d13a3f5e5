// The `rag` command: check, run and inspect .rag programs.
#include "dsl/module.hpp"
#include "dsl/ptx_listing.hpp"
#include "dsl/repl.hpp"
#include "frontend/lower.hpp"
#include "frontend/stdlib.hpp"
#include "ir/ops/derived_names.hpp"
#include "jit/blas.hpp"
#include "jit/compile_clock.hpp"
#include "jit/host_kernels.hpp"
#include "jit/object_cache.hpp"
#include "jit/plan.hpp"
#include "jit/ptx.hpp"
#include "runtime/cuda.hpp"
#include "runtime/error.hpp"
#include "runtime/random.hpp"

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace {

using namespace rag;

#ifndef RAG_VERSION
#define RAG_VERSION "unknown" // meson.build's project() version is passed in as -DRAG_VERSION
#endif

// One entry per command: `rag --help` prints them all, `rag COMMAND --help` its own.
struct Command {
    const char* name;
    const char* help;
};

const Command commands[] = {
    {"check",
     R"(  check FILE                    parse and type-check every function; print diagnostics
  check --stdlib [--markdown]   list the standard library (always in scope) with its docs
)"},
    {"run",
     R"(  run FILE --fn NAME [options]  call NAME on random ragged inputs and summarise the results
      --lengths 5,17,9          the ragged lengths of the batch (default 5,17,9); every
                                ragged axis gets these lengths (a second ragged name gets
                                them reversed; a derived name, ~N[1:], follows its base)
      --seed S                  seed for inputs and params (default 0)
      --steps K                 for a function returning (loss, params...) that takes those
                                params: run K steps, feeding the params back, and print each
                                loss
      --load CKPT               the params argument comes from this safetensors checkpoint
                                instead of its initialiser (repeat for a second params
                                argument, in order)
      --save CKPT               after the run, write the params argument as fed back (after
                                the last of --steps, or the params a (loss, params...) result
                                returns; otherwise as given) to this checkpoint (repeat as
                                for --load)
      --set NAME=VALUE          a scalar argument (such as lr: f32[]) takes this value
                                instead of a random one (repeat for others)
      --stats                   print compilations and cache hits per function
      --tier jit|interp         the LLVM-compiled CPU tier (default) or the reference
                                interpreter
      --device cpu|cuda         where to run (default cpu); cuda needs an NVIDIA driver
                                and device
      --padded                  run on the dense envelope B x N_max x ... with masks (the
                                padded baseline); same valid results
)"},
    {"ir",
     R"(  ir FILE --fn NAME [--plan]    print the SSA IR of NAME on its declared types (--plan: how
                                the CPU JIT runs it: fused loops, GEMMs, reference kernels)
)"},
    {"ptx",
     R"(  ptx FILE --fn NAME [--arch A]  print the PTX of every kernel NAME launches on the GPU tier:
                                its fused loops and the kernel-IR programs (relpos, GEMMs,
                                norms, reductions) one call on random inputs picks, run on
                                the emulated device (--lengths, --seed as for run; --arch
                                sm_90, the default, or sm_80)
)"},
    {"repl",
     R"(  repl                          an interactive session (:help inside); reading a pipe,
                                errors go to stderr and the exit status is 1 if any
)"},
};

std::string usage() {
    std::string s = "usage: rag COMMAND FILE [options]\n\ncommands:\n";
    for (const auto& c : commands) s += c.help;
    s += "  --help                        this text (rag COMMAND --help: one command's)\n"
         "  --version                     the version of rag\n";
    return s;
}

// A command line that rag cannot make sense of: exit status 2, like usage errors elsewhere.
class UsageError : public Error {
  public:
    using Error::Error;
};

template <class... Parts> [[noreturn]] void usage_fail(const Parts&... parts) {
    std::ostringstream os;
    (os << ... << parts);
    throw UsageError(os.str());
}

// A flag's integer value in [0, max]; anything else names the flag and what it got.
std::uint64_t parse_count(const std::string& flag, const std::string& text, std::uint64_t max) {
    std::uint64_t v = 0;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, v);
    if (text.empty() || ec != std::errc() || ptr != end || v > max)
        usage_fail(flag, " takes an integer from 0 to ", max, ", got '", text, "'");
    return v;
}

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
    std::vector<std::string> load, save; // checkpoints for the params arguments, in order
    std::map<std::string, double> set;   // --set NAME=VALUE: scalar arguments
};

// --set NAME=VALUE
void parse_set(const std::string& s, Options& o) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) usage_fail("--set takes NAME=VALUE, got '", s, "'");
    const std::string text = s.substr(eq + 1);
    double v = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
        usage_fail("--set ", s.substr(0, eq), ": '", text, "' is not a number");
    o.set[s.substr(0, eq)] = v;
}

std::vector<std::int64_t> parse_lengths(const std::string& s) {
    std::vector<std::int64_t> out;
    std::stringstream ss(s);
    std::string tok;
    while (std::getline(ss, tok, ','))
        out.push_back(std::int64_t(parse_count("--lengths", tok, std::uint64_t(1) << 40)));
    if (!s.empty() && s.back() == ',') // "5,17," is as wrong as "5,,17"
        parse_count("--lengths", "", std::uint64_t(1) << 40);
    if (out.empty()) usage_fail("--lengths needs at least one length");
    return out;
}

// The lengths the ragged axes of one call's random inputs take: ragged names in order of first
// appearance across the arguments, the first the requested lengths, the second those reversed,
// and so on; a derived name (`~N[1:]`, `~H[::4][*4]`) the length its base name gives
// (ir/ops/derived_names.hpp), so that the arguments agree as the function's types say.
class RaggedLengths {
  public:
    explicit RaggedLengths(const std::vector<std::int64_t>& lengths) : lengths_(lengths) {}
    std::int64_t of(const std::string& name, std::size_t sample) {
        const std::string base = derived_base(name).value_or(name);
        const int k = order_.try_emplace(base, int(order_.size())).first->second;
        const std::int64_t n = lengths_[k % 2 ? lengths_.size() - 1 - sample : sample];
        return base == name ? n : derived_length(name, n);
    }

  private:
    const std::vector<std::int64_t>& lengths_;
    std::map<std::string, int> order_;
};

// A random tensor of a declared schema.
RaggedTensor random_tensor(const Schema& s, const Options& o, std::uint64_t stream,
                           RaggedLengths& ragged) {
    CounterRng rng(o.seed, "input" + std::to_string(stream));
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
                shape.push_back(ragged.of(a.name, std::size_t(i)));
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

// ---- checkpoints for `rag run` (--load, --save) ----------------------------------------------

// The k-th params argument: from the k-th --load checkpoint when given, else initialised.
Value initial_params(const Module& m, const std::string& type, const Options& o, std::size_t k) {
    if (k < o.load.size()) return m.load_params(type, o.load[k]);
    return m.init(type, o.seed);
}

// Each --save path names its own file, which can be written: checked before a run, so that
// steps are not thrown away for a typo in the path. A file that did not exist is not left
// behind.
void check_save_paths(const std::vector<std::string>& save) {
    std::set<std::string> seen;
    for (const std::string& path : save) {
        std::error_code ec;
        std::string key = std::filesystem::weakly_canonical(path, ec).string();
        if (ec) key = path;
        if (!seen.insert(key).second)
            usage_fail("--save ", path, " is given twice: each params argument needs its own file");
        const bool existed = std::filesystem::exists(path);
        if (!std::ofstream(path, std::ios::app))
            fail("--save ", path, ": cannot write there (", std::strerror(errno), ")");
        if (!existed) std::filesystem::remove(path);
    }
}

// The positions of the params arguments; --load and --save may not name more than there are
// (checked on the declared types, before any checkpoint is read).
std::vector<std::size_t> params_slots(const std::vector<frontend::VType>& params,
                                      const Options& o) {
    std::vector<std::size_t> slots;
    for (std::size_t k = 0; k < params.size(); ++k)
        if (params[k].kind == frontend::VType::Kind::record) slots.push_back(k);
    for (const auto* list : {&o.load, &o.save})
        if (list->size() > slots.size())
            fail(list == &o.load ? "--load" : "--save", " is given ", list->size(), " time(s) but ",
                 o.fn, " takes ", slots.size(), " params argument(s)");
    check_save_paths(o.save);
    return slots;
}

// A step's result (loss, params...) holds one new value per params argument, in order, of the
// same types; those replace the arguments. False when `r` is not of that shape.
bool feed_back(std::vector<Value>& args, const std::vector<std::size_t>& slots, const Value& r) {
    if (r.kind != Value::Kind::tuple || slots.empty() || r.elems.size() != 1 + slots.size() ||
        r.elems[0].kind != Value::Kind::tensor)
        return false;
    for (std::size_t k = 0; k < slots.size(); ++k)
        if (r.elems[1 + k].kind != Value::Kind::record ||
            r.elems[1 + k].record != args[slots[k]].record)
            return false;
    for (std::size_t k = 0; k < slots.size(); ++k) args[slots[k]] = r.elems[1 + k];
    return true;
}

void save_params(const Module& m, const std::vector<Value>& args,
                 const std::vector<std::size_t>& slots, const Options& o) {
    for (std::size_t k = 0; k < o.save.size(); ++k) {
        m.save_params(args[slots[k]], o.save[k]);
        std::printf("saved %s to %s\n", args[slots[k]].record.c_str(), o.save[k].c_str());
    }
}

int cmd_check(const std::string& path) {
    auto m = Module::load(path);
    std::fputs(m->notes().c_str(), stderr);
    std::printf("%s: ok\n", path.c_str());
    return 0;
}

int cmd_run(const std::string& path, const Options& o) {
    if (o.fn.empty()) usage_fail("run needs --fn NAME");
    if (o.device == "cuda") cuda::device(); // "CUDA unavailable: why" before any work
    auto m = Module::load(path);
    m->set_tier(o.device == "cuda" ? Tier::gpu : o.tier);
    m->set_padded(o.padded);
    Diagnostics diags(*m->program().units[0].src);
    auto decl = frontend::lower(m->program(), o.fn, std::nullopt, diags);
    if (!decl) throw CompileError(diags.str());
    const std::vector<std::size_t> slots = params_slots(decl->params, o);
    std::vector<Value> args;
    std::uint64_t stream = 0;
    RaggedLengths ragged(o.lengths);
    std::size_t n_params = 0;
    const ast::FnDecl& fn = *m->program().find_fn(o.fn).first;
    std::set<std::string> unused;
    for (const auto& [name, _] : o.set) unused.insert(name);
    for (std::size_t k = 0; k < decl->params.size(); ++k) {
        const frontend::VType& t = decl->params[k];
        const std::string& name = fn.params[k].name;
        if (o.set.count(name)) {
            unused.erase(name);
            if (t.kind != frontend::VType::Kind::tensor || t.schema.shape.batched ||
                !t.schema.shape.axes.empty())
                usage_fail("--set ", name, ": ", o.fn, "'s ", name, " is ", t.str(),
                           ", not a scalar");
            args.push_back(
                RaggedTensor::dense(DenseArray::from_f64(t.schema.dtype, {}, {o.set.at(name)})));
        } else if (t.kind == frontend::VType::Kind::record) {
            args.push_back(initial_params(*m, t.record, o, n_params++));
        } else if (t.kind == frontend::VType::Kind::tensor) {
            args.push_back(random_tensor(t.schema, o, stream++, ragged));
        } else {
            fail("run: cannot make a random tuple argument");
        }
    }
    if (!unused.empty())
        usage_fail("--set ", *unused.begin(), ": ", o.fn, " has no parameter of that name");
    if (o.steps > 0) {
        double later = 0; // seconds of the steps after the first (which compiles)
        for (int s = 0; s < o.steps; ++s) {
            auto t0 = std::chrono::steady_clock::now();
            Value r = m->call(o.fn, args);
            if (s > 0)
                later +=
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (!feed_back(args, slots, r))
                fail("--steps needs a function returning (loss, params...) with one new value "
                     "per params argument, in order; ",
                     o.fn, " returns ", r.type_str());
            std::printf("step %d loss %.6f\n", s + 1, r.elems[0].tensor.item());
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
        const Value r = m->call(o.fn, args);
        summarise(r, o.fn);
        if (!o.save.empty()) feed_back(args, slots, r);
    }
    save_params(*m, args, slots, o);
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
            std::printf("stats %s: compilations=%d cache_hits=%d compile_seconds=%.3f "
                        "disk_cache_hits=%d\n",
                        fn.c_str(), st.compilations, st.cache_hits, st.compile_seconds,
                        st.disk_cache_hits);
            std::printf("%s\n", where.c_str());
        }
    if (o.stats) std::printf("stats blas kernels: %s\n", jit::blas_core());
    if (o.stats) { // process-wide, every thread: where the compile time went
        std::printf("stats compile breakdown (s): %s\n",
                    jit::format_breakdown(jit::compile_breakdown()).c_str());
        const auto host = jit::host_kernels_compiled();
        std::string list;
        for (const std::string& k : host) list += " " + k;
        std::printf("stats host kernels compiled: %zu%s\n", host.size(), list.c_str());
        const jit::DiskCacheStats d = jit::disk_cache_stats();
        std::printf("stats disk cache: hits=%lld misses=%lld rejected=%lld writes=%lld dir=%s\n",
                    (long long)d.hits, (long long)d.misses, (long long)d.rejected,
                    (long long)d.writes, jit::object_cache_dir().c_str());
    }
    return 0;
}

int cmd_ir(const std::string& path, const Options& o) {
    if (o.fn.empty()) usage_fail("ir needs --fn NAME");
    auto m = Module::load(path);
    std::fputs((o.plan ? m->plan(o.fn) : m->ir(o.fn)).c_str(), stdout);
    return 0;
}

// `rag ptx`: the kernel-IR programs a function launches are chosen from its values, so one
// call runs on the emulated device (no GPU needed) on random inputs, as `rag run` makes them.
int cmd_ptx(const std::string& path, const Options& o) {
    if (o.fn.empty()) usage_fail("ptx needs --fn NAME");
    setenv("RAG_GPU_EMULATE", "1", 1); // before anything asks runtime/cuda.hpp
    auto m = Module::load(path);
    Diagnostics diags(*m->program().units[0].src);
    auto decl = frontend::lower(m->program(), o.fn, std::nullopt, diags);
    if (!decl) throw CompileError(diags.str());
    std::vector<Value> args;
    std::uint64_t stream = 0;
    RaggedLengths ragged(o.lengths);
    for (const auto& t : decl->params) {
        if (t.kind == frontend::VType::Kind::record)
            args.push_back(m->init(t.record, o.seed));
        else if (t.kind == frontend::VType::Kind::tensor)
            args.push_back(random_tensor(t.schema, o, stream++, ragged));
        else
            fail("ptx: cannot make a random tuple argument");
    }
    std::string lengths;
    for (std::int64_t l : o.lengths) lengths += (lengths.empty() ? "" : ",") + std::to_string(l);
    std::fputs(list_gpu_kernels(*m, o.fn, args, o.arch,
                                "random inputs with lengths " + lengths + " (--lengths)")
                   .c_str(),
               stdout);
    return 0;
}

// The command line: a command, its FILE and options. Throws UsageError when it makes no sense.
int dispatch(const std::vector<std::string>& a) {
    if (a.empty()) {
        std::fputs(usage().c_str(), stderr);
        return 2;
    }
    if (a[0] == "--help" || a[0] == "-h" || a[0] == "help") {
        if (a.size() > 1)
            for (const auto& c : commands)
                if (a[1] == c.name) {
                    std::printf("usage:\n%s", c.help);
                    return 0;
                }
        std::fputs(usage().c_str(), stdout);
        return 0;
    }
    if (a[0] == "--version" || a[0] == "-V" || a[0] == "version") {
        std::printf("rag %s\n", RAG_VERSION);
        return 0;
    }
    const Command* cmd = nullptr;
    for (const auto& c : commands)
        if (a[0] == c.name) cmd = &c;
    if (!cmd) {
        std::string names;
        for (const auto& c : commands) names += std::string(names.empty() ? "" : ", ") + c.name;
        usage_fail(a[0].starts_with("-") ? "unknown option '" : "unknown command '", a[0],
                   "'; the commands are ", names, " (rag --help)");
    }
    for (const auto& s : a)
        if (s == "--help" || s == "-h") {
            std::printf("usage:\n%s", cmd->help);
            return 0;
        }
    const std::string name = cmd->name;
    if (name == "repl") {
        if (a.size() > 1) usage_fail("repl takes no arguments, got '", a[1], "'");
        return run_repl(stdin, stdout);
    }
    if (name == "check" && a.size() >= 2 && a[1] == "--stdlib") {
        if (a.size() > 3 || (a.size() == 3 && a[2] != "--markdown"))
            usage_fail("check --stdlib takes only --markdown");
        std::fputs(a.size() == 3 ? frontend::stdlib_markdown().c_str()
                                 : frontend::stdlib_text().c_str(),
                   stdout);
        return 0;
    }
    if (a.size() < 2 || a[1].starts_with("--")) {
        if (name == "check" && a.size() >= 2 && a[1] == "--markdown")
            usage_fail("--markdown lists the standard library: rag check --stdlib --markdown");
        usage_fail(name, " needs a FILE (rag ", name, " --help)");
    }
    Options o;
    for (std::size_t k = 2; k < a.size(); ++k) {
        auto value = [&]() -> const std::string& {
            if (k + 1 >= a.size()) usage_fail(a[k], " needs a value");
            return a[++k];
        };
        if (a[k] == "--fn") {
            if (!o.fn.empty()) usage_fail("--fn is given twice: ", name, " runs one function");
            o.fn = value();
        } else if (a[k] == "--lengths")
            o.lengths = parse_lengths(value());
        else if (a[k] == "--seed")
            o.seed = parse_count("--seed", value(), ~std::uint64_t(0));
        else if (a[k] == "--steps")
            o.steps = int(parse_count("--steps", value(), 1u << 30));
        else if (a[k] == "--load")
            o.load.push_back(value());
        else if (a[k] == "--set")
            parse_set(value(), o);
        else if (a[k] == "--save")
            o.save.push_back(value());
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
                usage_fail("--device takes cpu or cuda, got '", o.device, "'");
        } else if (a[k] == "--tier") {
            const std::string& t = value();
            if (t != "jit" && t != "interp")
                usage_fail("--tier takes jit or interp, got '", t, "'");
            o.tier = t == "jit" ? Tier::jit : Tier::interpreter;
        } else
            usage_fail("unknown option '", a[k], "' for rag ", name, " (rag ", name, " --help)");
    }
    if (name == "check") return cmd_check(a[1]);
    if (name == "run") return cmd_run(a[1], o);
    if (name == "ir") return cmd_ir(a[1], o);
    return cmd_ptx(a[1], o);
}

} // namespace

int main(int argc, char** argv) {
    try {
        return dispatch(std::vector<std::string>(argv + 1, argv + argc));
    } catch (const CompileError& e) {
        std::fputs(e.what(), stderr);
        return 1;
    } catch (const UsageError& e) {
        std::fprintf(stderr, "rag: error: %s\n", e.what());
        return 2;
    } catch (const Error& e) {
        std::fprintf(stderr, "rag: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fputs("rag: error: out of memory\n", stderr);
        return 1;
    } catch (const std::length_error&) { // as the Python module says it (bindings/rag_py.cpp)
        std::fputs("rag: error: out of memory: a size asked for is larger than any allocation "
                   "can be\n",
                   stderr);
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rag: error: %s\n", e.what());
        return 1;
    }
}
