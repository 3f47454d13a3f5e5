#include "dsl/module.hpp"

#include "dsl/padded_io.hpp"
#include "dsl/value_type.hpp"

#include "frontend/lower.hpp"
#include "ir/autodiff.hpp"
#include "ir/interpreter.hpp"
#include "ir/ops/derived_names.hpp"
#include "jit/compile_clock.hpp"
#include "jit/cpu_jit.hpp"
#include "jit/gpu_function.hpp"
#include "jit/object_cache.hpp"
#include "runtime/error.hpp"
#include "runtime/random.hpp"

#include <fstream>
#include <optional>
#include <sstream>

namespace rag {

Value Value::tuple(std::vector<Value> elems) {
    Value v;
    v.kind = Kind::tuple;
    v.elems = std::move(elems);
    return v;
}

const RaggedTensor& Value::field(std::string_view name) const {
    for (const auto& [n, t] : fields)
        if (n == name) return t;
    fail(record, " has no field '", name, "'");
}

std::string Value::type_str() const {
    switch (kind) {
    case Kind::tensor:
        return tensor.schema().str();
    case Kind::record:
        return record;
    case Kind::tuple: {
        std::string s = "(";
        for (std::size_t k = 0; k < elems.size(); ++k) s += (k ? ", " : "") + elems[k].type_str();
        return s + ")";
    }
    }
    return "?";
}

struct Module::Compiled {
    frontend::Lowered lowered;
    std::unique_ptr<jit::CpuFunction> cpu; // null on the interpreter tier
    std::unique_ptr<jit::GpuFunction> gpu; // on the gpu tier
};

// fn's vector-Jacobian product cut in two (ir::split_vjp): the forward returns fn's outputs and
// then the residuals; the backward takes the residuals and one cotangent per float output.
struct Module::Split {
    Compiled forward, backward;
    std::string name;                  // fn's
    std::vector<frontend::VType> args; // fn's argument types
    frontend::VType result;            // fn's result type
    std::size_t outputs = 0;           // fn's flat outputs (the forward's first ones)
    std::vector<std::size_t> seeded;   // the float ones among them, which take cotangents
    std::vector<std::size_t> wrt;      // the flat inputs with gradients (float ones), in order
};

struct Module::Saved {
    const Split* split = nullptr;
    std::vector<RaggedTensor> inputs, outputs, residuals; // flat
};

namespace {

void flatten(const Value& v, std::vector<RaggedTensor>& out) {
    if (v.kind == Value::Kind::tensor) out.push_back(v.tensor);
    for (const auto& [_, f] : v.fields) out.push_back(f);
    for (const auto& e : v.elems) flatten(e, out);
}

Value unflatten(const frontend::VType& t, const std::vector<RaggedTensor>& vals, std::size_t& pos) {
    using K = frontend::VType::Kind;
    if (t.kind == K::tensor) return vals.at(pos++);
    Value v;
    if (t.kind == K::record) {
        v.kind = Value::Kind::record;
        v.record = t.record;
        for (const auto& [n, _] : t.leaves()) v.fields.push_back({n, vals.at(pos++)});
        return v;
    }
    v.kind = Value::Kind::tuple;
    for (const auto& e : t.elems) v.elems.push_back(unflatten(e, vals, pos));
    return v;
}

// The tensor with its axes named as the specialised signature names them. Rebuilding the
// structure checks that axes sharing a name agree in every sample.
RaggedTensor relabel(const RaggedTensor& t, const Schema& want, const std::string& what) {
    if (t.schema() == want) return t;
    try {
        auto st = Structure::make(want.shape, t.batch(), t.structure().sizes());
        return RaggedTensor(t.dtype(), st, t.buffer());
    } catch (const Error& e) {
        fail(what, ": ", e.what());
    }
}

// A params record as its declaration orders it, every field present with its declared schema;
// tuples element by element. Records built by hand may list fields in any order.
Value normalise(const frontend::Program& prog, const Value& v) {
    if (v.kind == Value::Kind::tuple) {
        Value out = v;
        for (auto& e : out.elems) e = normalise(prog, e);
        return out;
    }
    if (v.kind != Value::Kind::record) return v;
    const auto leaves = prog.record_type(v.record).leaves();
    for (const auto& [name, _] : v.fields) {
        bool known = false;
        for (const auto& [n, _2] : leaves) known |= n == name;
        if (!known) fail(v.record, " has no field '", name, "'");
    }
    Value out;
    out.kind = Value::Kind::record;
    out.record = v.record;
    for (const auto& [name, schema] : leaves) {
        const RaggedTensor& f = v.field(name);
        if (f.schema() != schema)
            fail(v.record, ".", name, " has schema ", f.schema().str(), ", expected ",
                 schema.str());
        out.fields.push_back({name, f});
    }
    return out;
}

} // namespace

frontend::VType vtype_of(const frontend::Program& prog, const Value& v) {
    using frontend::VType;
    switch (v.kind) {
    case Value::Kind::tensor:
        return VType::tensor(v.tensor.schema());
    case Value::Kind::record:
        return prog.record_type(v.record);
    case Value::Kind::tuple: {
        VType t{VType::Kind::tuple, {}, {}, {}, {}};
        for (const auto& e : v.elems) t.elems.push_back(vtype_of(prog, e));
        return t;
    }
    }
    return {};
}

Module::Module(std::unique_ptr<frontend::Program> prog) : prog_(std::move(prog)) {}
Module::~Module() = default;

std::shared_ptr<Module> Module::compile(const std::string& source, const std::string& path) {
    auto src = std::make_shared<SourceFile>(path, source);
    Diagnostics diags(*src);
    auto prog = std::make_unique<frontend::Program>(frontend::load_program(src, diags));
    if (diags.empty()) frontend::check(*prog, diags);
    if (!diags.empty()) throw CompileError(diags.str());
    auto m = std::shared_ptr<Module>(new Module(std::move(prog)));
    m->notes_ = diags.notes_str();
    return m;
}

std::shared_ptr<Module> Module::load(const std::string& path) {
    return compile(frontend::read_source(path), path);
}

std::vector<std::string> Module::functions() const {
    return prog_->fn_names();
}

const Module::Compiled& Module::specialise(std::string_view fn, const std::vector<Value>& args) {
    std::vector<frontend::VType> types;
    std::string key = (tier_ == Tier::jit   ? "jit:"
                       : tier_ == Tier::gpu ? "cuda:"
                                            : "interp:") +
                      std::string(padded_ ? "padded:" : "") + std::string(fn);
    for (const auto& a : args) {
        types.push_back(vtype_of(*prog_, a));
        key += "|" + types.back().str();
    }
    FnStats& st = stats_[std::string(fn)];
    if (auto it = cache_.find(key); it != cache_.end()) {
        ++st.cache_hits;
        return *it->second;
    }
    // Compile work of later calls (kernels compiled on first use) is added by call().
    const double t0 = jit::compile_wall_seconds();
    const std::int64_t hits0 = jit::disk_cache_stats().hits;
    std::optional<jit::CompilePhase> phase(std::in_place, "lower");
    Diagnostics diags(*prog_->units.at(0).src);
    auto lowered = frontend::lower(*prog_, fn, types, diags, padded_);
    if (!lowered) throw CompileError(diags.str());
    auto compiled = std::make_unique<Compiled>(Compiled{std::move(*lowered), nullptr, nullptr});
    phase.reset();
    build(*compiled);
    ++st.compilations;
    st.compile_seconds += jit::compile_wall_seconds() - t0;
    st.disk_cache_hits += int(jit::disk_cache_stats().hits - hits0);
    auto& slot = cache_[key];
    slot = std::move(compiled);
    return *slot;
}

void Module::build(Compiled& c) const {
    jit::CompilePhase phase("plan");
    if (tier_ == Tier::jit) c.cpu = jit::compile_cpu(c.lowered.fn);
    if (tier_ == Tier::gpu) c.gpu = jit::compile_gpu(c.lowered.fn);
}

Value Module::call(std::string_view fn, const std::vector<Value>& given) {
    std::vector<Value> args;
    for (const auto& a : given) args.push_back(normalise(*prog_, a));
    const Compiled& c = specialise(fn, args);
    std::vector<RaggedTensor> flat;
    for (const auto& a : args) flatten(a, flat);
    auto out = run(c, fn, std::move(flat));
    std::size_t pos = 0;
    return unflatten(c.lowered.result, out, pos);
}

std::vector<RaggedTensor> Module::run(const Compiled& c, std::string_view fn,
                                      std::vector<RaggedTensor> flat) {
    const std::size_t n_in = c.lowered.fn.inputs.size() - c.lowered.masks.size();
    if (flat.size() != n_in) fail(fn, " takes ", n_in, " tensors in all, got ", flat.size());
    auto want = c.lowered.fn.input_types();
    // Equal ragged names must agree per sample across arguments, and batches must agree.
    std::map<std::string, std::pair<std::size_t, std::vector<std::int64_t>>> seen;
    std::int64_t batch = -1;
    for (std::size_t k = 0; k < flat.size(); ++k) {
        const std::string what =
            std::string(fn) + ": " + c.lowered.fn.nodes[std::size_t(c.lowered.fn.inputs[k])].label;
        flat[k] = relabel(flat[k], want[k], what);
        if (!want[k].shape.batched) continue;
        if (batch >= 0 && flat[k].batch() != batch)
            fail(what, " has a batch of ", flat[k].batch(), " samples; earlier arguments have ",
                 batch);
        batch = flat[k].batch();
        for (int a = 0; a < flat[k].structure().rank(); ++a) {
            const Axis& ax = want[k].shape.axes[std::size_t(a)];
            if (!ax.is_ragged()) continue;
            auto lengths = flat[k].structure().lengths(a);
            auto [it, fresh] = seen.try_emplace(ax.name, k, lengths);
            if (fresh) continue;
            for (std::size_t i = 0; i < lengths.size(); ++i)
                if (lengths[i] != it->second.second[i])
                    fail(what, ": sample ", i, " has ", ax.name, " = ", lengths[i],
                         " but argument ",
                         c.lowered.fn.nodes[std::size_t(c.lowered.fn.inputs[it->second.first])]
                             .label,
                         " has ", ax.name, " = ", it->second.second[i]);
        }
    }
    // A derived name (`N[1:]`, `H[::4][*4]`) must have the lengths its base name's give.
    auto label = [&](std::size_t k) {
        return c.lowered.fn.nodes[std::size_t(c.lowered.fn.inputs[k])].label;
    };
    for (const auto& [name, where] : seen) {
        const auto base = derived_base(name);
        if (!base || !seen.count(*base)) continue;
        const auto& [bk, base_lengths] = seen.at(*base);
        for (std::size_t i = 0; i < where.second.size(); ++i) {
            const std::int64_t want = derived_length(name, base_lengths[i]);
            if (where.second[i] != want)
                fail(fn, ": ", label(where.first), ": sample ", i, " has ", name, " = ",
                     where.second[i], " but argument ", label(bk), " has ", *base, " = ",
                     base_lengths[i], ", so ", name, " = ", want);
        }
    }
    std::map<std::string, std::vector<std::int64_t>> lengths;
    for (const auto& [name, where] : seen) lengths[name] = where.second;
    if (padded_) {
        for (auto& t : flat) t = to_envelope(t);
        for (const auto& name : c.lowered.masks)
            flat.push_back(envelope_mask(name, lengths.at(name)));
    }
    const double t0 = jit::compile_wall_seconds(); // kernels compiled on first use
    const std::int64_t hits0 = jit::disk_cache_stats().hits;
    jit::Placement place;
    auto out = c.cpu   ? c.cpu->run(flat, &place)
               : c.gpu ? c.gpu->run(flat, &place)
                       : ir::interpret(c.lowered.fn, flat);
    FnStats& st = stats_[std::string(fn)];
    st.compile_seconds += jit::compile_wall_seconds() - t0;
    st.disk_cache_hits += int(jit::disk_cache_stats().hits - hits0);
    st.compiled_steps = place.compiled;
    st.device_steps = place.device;
    st.reference_steps = std::move(place.reference);
    st.host_steps = std::move(place.host);
    st.uploaded_bytes = place.uploaded;
    st.downloaded_bytes = place.downloaded;
    if (padded_)
        for (auto& t : out) t = from_envelope(t, lengths);
    return out;
}

// Every tensor of the record type `name` (a params group, an array of one, or Adam state),
// initialised as its field declares with a counter-based stream keyed by "<name>.<dotted
// field>", so each layer of an array draws its own values. Adam state starts at zero.
Value Module::init(std::string_view given, std::uint64_t seed) const {
    // One spelling per type (`Linear[4,8]` is `Linear[4, 8]`): the key of every stream.
    const std::string name = frontend::Program::canonical(given);
    Value v;
    v.kind = Value::Kind::record;
    v.record = name;
    for (const auto& leaf : prog_->record_leaves(name)) {
        const Schema& s = leaf.schema;
        const std::string where = std::string(name) + "." + leaf.name;
        std::vector<std::int64_t> shape;
        for (const auto& a : s.shape.axes) shape.push_back(a.extent);
        DenseArray arr = DenseArray::zeros(s.dtype, shape);
        std::vector<double> vals(static_cast<std::size_t>(arr.numel()), 0.0);
        const ast::Expr* init = leaf.field ? leaf.field->init.get() : nullptr;
        std::string kind = !init                                 ? "zeros"
                           : init->kind == ast::Expr::Kind::name ? init->name
                           : init->kind == ast::Expr::Kind::call &&
                                   init->operands[0]->kind == ast::Expr::Kind::name
                               ? init->operands[0]->name
                               : "";
        auto number = [&](std::size_t k) {
            if (!init || init->kind != ast::Expr::Kind::call || k >= init->args.size())
                fail(where, ": ", kind, " needs ", k + 1, " argument(s)");
            const ast::Expr& e = *init->args[k].value;
            if (e.kind == ast::Expr::Kind::integer) return double(e.ival);
            if (e.kind == ast::Expr::Kind::floating) return e.fval;
            if (e.kind == ast::Expr::Kind::unary &&
                e.operands[0]->kind == ast::Expr::Kind::floating)
                return -e.operands[0]->fval;
            if (e.kind == ast::Expr::Kind::unary && e.operands[0]->kind == ast::Expr::Kind::integer)
                return -double(e.operands[0]->ival);
            fail(where, ": initialiser arguments must be numbers");
        };
        CounterRng rng(seed, where);
        if (kind == "zeros") {
        } else if (kind == "ones") {
            std::fill(vals.begin(), vals.end(), 1.0);
        } else if (kind == "normal") {
            double sd = number(0);
            for (std::size_t k = 0; k < vals.size(); ++k) vals[k] = sd * rng.normal(k);
        } else if (kind == "uniform") {
            double lo = number(0), hi = number(1);
            for (std::size_t k = 0; k < vals.size(); ++k) vals[k] = lo + (hi - lo) * rng.uniform(k);
        } else {
            fail(where, ": unknown initialiser; use zeros, ones, normal(std) or uniform(lo, hi)");
        }
        v.fields.push_back(
            {leaf.name, RaggedTensor::dense(DenseArray::from_f64(s.dtype, shape, vals))});
    }
    return v;
}

// ---- reverse mode from the host ------------------------------------------------------------

const Module::Split& Module::specialise_split(std::string_view fn, const std::vector<Value>& args) {
    if (padded_) fail(fn, ": vjp runs on ragged modules only, not with padded execution");
    std::string key = std::string(tier_ == Tier::jit   ? "jit:"
                                  : tier_ == Tier::gpu ? "cuda:"
                                                       : "interp:") +
                      std::string(fn);
    std::vector<frontend::VType> types;
    for (const auto& a : args) {
        types.push_back(vtype_of(*prog_, a));
        key += "|" + types.back().str();
    }
    const std::string fwd = std::string(fn) + "_forward", bwd = std::string(fn) + "_backward";
    if (auto it = splits_.find(key); it != splits_.end()) {
        ++stats_[fwd].cache_hits, ++stats_[bwd].cache_hits;
        return *it->second;
    }
    const double t0 = jit::compile_wall_seconds();
    const std::int64_t hits0 = jit::disk_cache_stats().hits;
    std::optional<jit::CompilePhase> phase(std::in_place, "lower");
    Diagnostics diags(*prog_->units.at(0).src);
    auto lowered = frontend::lower(*prog_, fn, types, diags);
    if (!lowered) throw CompileError(diags.str());
    auto split = std::make_unique<Split>();
    split->name = std::string(fn);
    split->args = types;
    split->result = lowered->result;
    const ir::Function& f = lowered->fn;
    split->outputs = f.outputs.size();
    std::vector<int> seeded, wrt;
    for (std::size_t k = 0; k < f.outputs.size(); ++k)
        if (is_floating(f.type(f.outputs[k]).dtype)) seeded.push_back(int(k));
    for (std::size_t k = 0; k < f.inputs.size(); ++k)
        if (is_floating(f.type(f.inputs[k]).dtype)) wrt.push_back(int(k));
    split->seeded.assign(seeded.begin(), seeded.end());
    split->wrt.assign(wrt.begin(), wrt.end());
    ir::SplitVjp parts;
    try {
        parts = ir::split_vjp(f, ir::vjp(f, seeded, wrt));
    } catch (const Error& e) {
        fail(fn, ": vjp: ", e.what());
    }
    split->forward.lowered = frontend::Lowered{std::move(parts.forward), {}, {}, {}};
    split->backward.lowered = frontend::Lowered{std::move(parts.backward), {}, {}, {}};
    phase.reset();
    // Lowering and differentiating count for the forward, each build for its own half.
    double t = t0;
    std::int64_t hits = hits0;
    for (auto [c, name] : {std::pair{&split->forward, &fwd}, std::pair{&split->backward, &bwd}}) {
        build(*c);
        FnStats& st = stats_[*name];
        ++st.compilations;
        st.compile_seconds += jit::compile_wall_seconds() - t;
        st.disk_cache_hits += int(jit::disk_cache_stats().hits - hits);
        t = jit::compile_wall_seconds(), hits = jit::disk_cache_stats().hits;
    }
    auto& slot = splits_[key];
    slot = std::move(split);
    return *slot;
}

std::pair<Value, std::shared_ptr<const Module::Saved>>
Module::call_saving(std::string_view fn, const std::vector<Value>& given) {
    std::vector<Value> args;
    for (const auto& a : given) args.push_back(normalise(*prog_, a));
    const Split& split = specialise_split(fn, args);
    auto saved = std::make_shared<Saved>();
    saved->split = &split;
    for (const auto& a : args) flatten(a, saved->inputs);
    auto out = run(split.forward, split.forward.lowered.fn.name, saved->inputs);
    saved->residuals.assign(out.begin() + std::ptrdiff_t(split.outputs), out.end());
    out.resize(split.outputs);
    saved->outputs = out;
    std::size_t pos = 0;
    return {unflatten(split.result, out, pos), std::move(saved)};
}

std::vector<std::optional<Value>>
Module::backward(const Saved& saved, const std::vector<std::optional<Value>>& cotangents) {
    const Split& split = *saved.split;
    // The cotangents, flat in output order: each given element's tensors, zeros elsewhere.
    using K = frontend::VType::Kind;
    const std::vector<frontend::VType> elems =
        split.result.kind == K::tuple ? split.result.elems : std::vector{split.result};
    if (cotangents.size() != elems.size())
        fail(split.name, ": vjp takes one cotangent per result element (", elems.size(), "), got ",
             cotangents.size());
    std::vector<std::optional<RaggedTensor>> given;
    for (std::size_t e = 0; e < elems.size(); ++e) {
        const std::size_t n = elems[e].flatten().size();
        if (!cotangents[e]) {
            given.resize(given.size() + n);
            continue;
        }
        std::vector<RaggedTensor> flat;
        flatten(normalise(*prog_, *cotangents[e]), flat);
        if (flat.size() != n)
            fail(split.name, ": the cotangent of result element ", e, " is a ",
                 cotangents[e]->type_str(), "; it must be a ", elems[e].str());
        given.insert(given.end(), flat.begin(), flat.end());
    }
    std::vector<RaggedTensor> inputs = saved.residuals;
    for (std::size_t k : split.seeded) {
        const RaggedTensor& out = saved.outputs[k];
        if (!given[k]) {
            inputs.push_back(RaggedTensor::zeros(out.dtype(), out.structure_ptr()));
            continue;
        }
        RaggedTensor ct = *given[k];
        if (ct.dtype() != out.dtype() && is_floating(ct.dtype()) && is_floating(out.dtype()) &&
            !ct.shape().batched)
            ct = ct.astype(out.dtype()); // a number or array given for a scalar result
        if (ct.dtype() != out.dtype() || ct.batch() != out.batch() ||
            ct.structure().sizes() != out.structure().sizes())
            fail(split.name, ": the cotangent of output ", k, " is ", describe(ct),
                 "; it must match the output, ", describe(out));
        inputs.push_back(RaggedTensor(out.dtype(), out.structure_ptr(), ct.buffer()));
    }
    auto grads = run(split.backward, split.backward.lowered.fn.name, std::move(inputs));
    // Per argument: its gradient, with zeros for integer fields of a record; none for an
    // argument without float tensors.
    std::vector<std::optional<Value>> result;
    std::size_t flat = 0, next = 0;
    for (const auto& type : split.args) {
        const std::size_t n = type.flatten().size();
        std::vector<RaggedTensor> leaves;
        bool any = false;
        for (std::size_t j = 0; j < n; ++j, ++flat) {
            if (next < split.wrt.size() && split.wrt[next] == flat) {
                leaves.push_back(grads[next++]);
                any = true;
            } else {
                const RaggedTensor& in = saved.inputs[flat];
                leaves.push_back(RaggedTensor::zeros(in.dtype(), in.structure_ptr()));
            }
        }
        if (!any) {
            result.emplace_back();
            continue;
        }
        std::size_t p = 0;
        result.push_back(unflatten(type, leaves, p));
    }
    return result;
}

std::vector<std::optional<Value>> Module::vjp(std::string_view fn, const std::vector<Value>& args,
                                              const std::vector<std::optional<Value>>& cotangents) {
    return backward(*call_saving(fn, args).second, cotangents);
}

std::string Module::ir(std::string_view fn, const std::optional<std::vector<Value>>& args) {
    if (args) return ir::print(specialise(fn, *args).lowered.fn);
    Diagnostics diags(*prog_->units.at(0).src);
    auto lowered = frontend::lower(*prog_, fn, std::nullopt, diags);
    if (!lowered) throw CompileError(diags.str());
    return ir::print(lowered->fn);
}

std::string Module::plan(std::string_view fn) {
    Diagnostics diags(*prog_->units.at(0).src);
    auto lowered = frontend::lower(*prog_, fn, std::nullopt, diags);
    if (!lowered) throw CompileError(diags.str());
    return jit::print(jit::make_plan(lowered->fn), lowered->fn);
}

} // namespace rag
