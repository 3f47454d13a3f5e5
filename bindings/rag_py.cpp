// The Python module `rag` (LANGUAGE.md section 5): load and compile programs, call their
// functions on ragged batches, initialise params, and move data to and from NumPy and DLPack.
// See bindings/README.md for the API and the decisions behind it.
#include "bindings/arguments.hpp"
#include "bindings/convert.hpp"
#include "bindings/pickle.hpp"
#include "dsl/module.hpp"
#include "frontend/lower.hpp"
#include "jit/kir_gpu.hpp"
#include "runtime/cuda.hpp"
#include "runtime/error.hpp"
#include "runtime/memory.hpp"
#include "runtime/parallel.hpp"

#include <pybind11/stl.h>

#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <set>

namespace rag::bind {
namespace {

using namespace pybind11::literals;

// ---- params ---------------------------------------------------------------------------------

// A params record seen from Python: a mapping from field names to NumPy arrays.
struct Params {
    std::string record;
    std::vector<std::pair<std::string, RaggedTensor>> fields;

    static Params of(const Value& v) { return {v.record, v.fields}; }
    Value value() const {
        Value v;
        v.kind = Value::Kind::record;
        v.record = record;
        v.fields = fields;
        return v;
    }
    std::vector<std::string> keys() const {
        std::vector<std::string> k;
        for (const auto& f : fields) k.push_back(f.first);
        return k;
    }
    RaggedTensor* find(const std::string& name) {
        for (auto& [n, t] : fields)
            if (n == name) return &t;
        return nullptr;
    }
};

// A params group's fields in order (dotted name, schema), by group type name: built from the
// program's declarations once per module, as a call converts a dict of arrays field by field.
using RecordLeaves =
    std::map<std::string, std::vector<std::pair<std::string, Schema>>, std::less<>>;

// Module keeps a specialisation cache and stats that calls update, so calls on one module are
// serialised by `mu` (taken with the GIL released); different modules run in parallel.
struct PyModule {
    std::shared_ptr<Module> mod;
    std::string path;
    std::mutex mu;
    RecordLeaves records; // read and filled with the GIL held
};
using PyModulePtr = std::shared_ptr<PyModule>;

// A function of a module, callable from Python.
struct PyFunction {
    PyModulePtr mod;
    std::string name;
};

// What a call_saving keeps for its backward: the module stays alive with it.
struct PySaved {
    PyModulePtr mod;
    std::shared_ptr<const Module::Saved> saved;
    std::string name;
};

// An integer argument as Python holds it (any size; NumPy's integers too): the function then
// says which range it takes, where pybind11 would report a value outside its C++ type as an
// argument of the wrong type ("cannot take (int)").
struct Int {
    py::int_ value;
    std::string str() const { return py::repr(value).cast<std::string>(); }
};

} // namespace
} // namespace rag::bind

namespace pybind11::detail {
template <> class type_caster<rag::bind::Int> {
  public:
    PYBIND11_TYPE_CASTER(rag::bind::Int, const_name("int"));
    bool load(handle src, bool) {
        if (!PyIndex_Check(src.ptr())) return false; // a float or a str: an ArgumentError
        value.value = reinterpret_steal<int_>(PyNumber_Index(src.ptr()));
        if (!value.value) throw error_already_set();
        return true;
    }
};
} // namespace pybind11::detail

// ---- what a class is called and how one is made (bindings/initialised.hpp) -----------------

namespace rag::bind {
template <> struct Made<Params> {
    static constexpr const char* name = "rag.Params";
    static constexpr const char* how = "make params with m.init(name) or m.load_params(type, path)";
};
template <> struct Made<PyModule> {
    static constexpr const char* name = "rag.Module";
    static constexpr const char* how = "make modules with rag.load(path) or rag.compile(source)";
};
template <> struct Made<PyFunction> {
    static constexpr const char* name = "rag.Function";
    static constexpr const char* how = "get functions from a module, as m.name or m[\"name\"]";
};
template <> struct Made<PySaved> {
    static constexpr const char* name = "rag.Saved";
    static constexpr const char* how = "get one from m.name.call_saving(...)";
};
} // namespace rag::bind

RAG_INITIALISED_CASTER(rag::bind::Params)
RAG_INITIALISED_CASTER(rag::bind::PyModule)
RAG_INITIALISED_CASTER(rag::bind::PyFunction)
RAG_INITIALISED_CASTER(rag::bind::PySaved)
namespace pybind11::detail {
template <>
class type_caster<rag::bind::PyModulePtr>
    : public rag::bind::InitialisedHolderCaster<rag::bind::PyModule> {};
} // namespace pybind11::detail

namespace rag::bind {
namespace {

// A field value from Python, converted to the field's declared schema; errors name
// `group.field`.
RaggedTensor field_value(py::handle obj, const Schema& want, const std::string& group,
                         const std::string& field) {
    RaggedTensor t;
    if (py::isinstance<RaggedTensor>(obj)) {
        t = obj.cast<RaggedTensor>();
    } else {
        try {
            t = tensor_from_array(obj, want.dtype, false, "same_kind");
        } catch (const Error& e) {
            fail(group, ".", field, ": ", e.what(), "; the field is ", want.str());
        }
    }
    if (!(t.schema() == want))
        fail(group, ".", field, ": expected ", want.str(), ", got ", t.schema().str());
    return t;
}

// ---- declared types -------------------------------------------------------------------------

using frontend::batch_names;
using frontend::has_ragged;
using frontend::is_batched;

std::string type_str(const ast::TypeExpr& t) {
    switch (t.kind) {
    case ast::TypeExpr::Kind::named:
        return t.name;
    case ast::TypeExpr::Kind::function:
        return "fn";
    case ast::TypeExpr::Kind::tuple: {
        std::string s = "(";
        for (std::size_t k = 0; k < t.elems.size(); ++k)
            s += (k ? ", " : "") + type_str(t.elems[k]);
        return s + ")";
    }
    case ast::TypeExpr::Kind::tensor:
        break;
    }
    std::string s = t.dtype + "[";
    for (std::size_t k = 0; k < t.dims.size(); ++k) {
        const auto& d = t.dims[k];
        s += k ? ", " : "";
        s += d.kind == ast::DimExpr::Kind::fixed    ? std::to_string(d.extent)
             : d.kind == ast::DimExpr::Kind::ragged ? "~" + d.name
                                                    : d.name;
    }
    return s + "]";
}

std::string signature(const ast::FnDecl& fn) {
    std::string s = fn.name;
    if (!fn.type_params.empty()) {
        s += "[";
        for (std::size_t k = 0; k < fn.type_params.size(); ++k)
            s += (k ? ", " : "") + fn.type_params[k];
        s += "]";
    }
    s += "(";
    for (std::size_t k = 0; k < fn.params.size(); ++k)
        s += (k ? ", " : "") + fn.params[k].name + ": " + type_str(fn.params[k].type);
    s += ")";
    if (fn.result) s += " -> " + type_str(*fn.result);
    return s;
}

// The per-sample axes a declared tensor type names (the batch axis left out).
std::vector<Axis> declared_axes(const ast::TypeExpr& t, bool batched) {
    std::vector<Axis> axes;
    for (std::size_t k = batched ? 1 : 0; k < t.dims.size(); ++k) {
        const auto& d = t.dims[k];
        if (d.kind == ast::DimExpr::Kind::fixed)
            axes.push_back(Axis::fixed_of(d.extent));
        else if (d.kind == ast::DimExpr::Kind::symbolic)
            axes.push_back(Axis::symbolic_of(d.name));
        else
            axes.push_back(Axis::ragged_of(d.name));
    }
    return axes;
}

// A tensor argument given the declared type: ragged axes take the declared names, and axes the
// declaration makes ragged become ragged (a batch whose lengths happen to agree binds to ~N).
RaggedTensor adapt(const RaggedTensor& t, const ast::TypeExpr& decl, bool batched) {
    if (t.shape().batched != batched || !batched) return t;
    const auto want = declared_axes(decl, true);
    if (want.size() != t.shape().axes.size()) return t;
    auto axes = t.shape().axes;
    for (std::size_t a = 0; a < axes.size(); ++a)
        if (want[a].is_ragged() && axes[a].kind != AxisKind::symbolic) axes[a] = want[a];
    return with_axes(t, std::move(axes));
}

std::string type_name(py::handle obj) {
    return py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
}

// What one call knows while converting its arguments: the batch names of the signature, the
// dtypes its type parameters are bound to (by rag.Tensor arguments, then by inference), and
// the module's cache of params group fields.
struct Binding {
    std::set<std::string> batch;
    std::map<std::string, DType> dtypes;
    RecordLeaves& records;
};

// A params record (rag.Params, or any mapping from dotted field names to arrays).
Value record_value(py::handle obj, const std::string& type, const frontend::Program& prog,
                   RecordLeaves& records, const std::string& what) {
    if (py::isinstance<Params>(obj)) return obj.cast<const Params&>().value();
    if (!py::hasattr(obj, "keys"))
        fail(what, ": expected ", type, " (rag.Params or a dict of arrays), got ", type_name(obj));
    auto it = records.find(type);
    if (it == records.end()) it = records.emplace(type, prog.record_type(type).leaves()).first;
    Value v;
    v.kind = Value::Kind::record;
    v.record = type;
    const bool dict = py::isinstance<py::dict>(obj);
    for (const auto& [n, schema] : it->second) {
        py::str key(n);
        // A dict is read directly (no method lookups): a call converts every field.
        py::object field;
        if (dict) {
            if (PyObject* f = PyDict_GetItemWithError(obj.ptr(), key.ptr()))
                field = py::reinterpret_borrow<py::object>(f);
            else if (PyErr_Occurred())
                throw py::error_already_set();
        } else if (obj.attr("__contains__")(key).cast<bool>()) {
            field = obj.attr("__getitem__")(key);
        }
        if (!field) fail(what, ": missing field '", n, "' of ", type);
        v.fields.push_back({n, field_value(field, schema, what, n)});
    }
    // Every field is present, so a mapping of that many keys has no other.
    if (py::len(obj) == it->second.size()) return v;
    for (py::handle k : obj.attr("keys")()) {
        std::string key = py::str(k).cast<std::string>();
        auto named = [&](const auto& leaf) { return leaf.first == key; };
        if (std::none_of(it->second.begin(), it->second.end(), named))
            fail(what, ": ", type, " has no field '", key, "'");
    }
    return v;
}

Value to_value(py::handle obj, const ast::TypeExpr& decl, Binding& bind,
               const frontend::Program& prog, const std::string& what) {
    const auto& batch = bind.batch;
    if (auto record = prog.record_name(decl))
        return record_value(obj, *record, prog, bind.records, what);
    if (prog.sized_group(decl)) { // `p: Linear[I, O]`: the instance's sizes come with its value
        if (py::isinstance<Params>(obj)) return obj.cast<const Params&>().value();
        fail(what, ": expected ", type_str(decl), " as a rag.Params (m.init(\"", decl.dtype,
             "[...]\")), got ", type_name(obj));
    }
    switch (decl.kind) {
    case ast::TypeExpr::Kind::named:
        fail(what, ": ", decl.name,
             " is a type parameter of a generic function; call it from a rag function");
    case ast::TypeExpr::Kind::function:
        fail(what, ": a function (fn) cannot be passed from Python; call this function from a "
                   "rag function that names the fn to pass");
    case ast::TypeExpr::Kind::tuple: {
        if (!py::isinstance<py::tuple>(obj) && !py::isinstance<py::list>(obj))
            fail(what, ": expected a tuple ", type_str(decl), ", got ", type_name(obj));
        py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
        if (seq.size() != decl.elems.size())
            fail(what, ": expected a tuple of ", decl.elems.size(), " values, got ", seq.size());
        std::vector<Value> elems;
        for (std::size_t k = 0; k < decl.elems.size(); ++k)
            elems.push_back(
                to_value(seq[k], decl.elems[k], bind, prog, what + "[" + std::to_string(k) + "]"));
        return Value::tuple(std::move(elems));
    }
    case ast::TypeExpr::Kind::tensor:
        break;
    }
    const bool batched = is_batched(decl, batch);
    if (py::isinstance<RaggedTensor>(obj)) {
        auto t = obj.cast<RaggedTensor>();
        if (!parse_dtype(decl.dtype)) bind.dtypes.try_emplace(decl.dtype, t.dtype());
        return adapt(t, decl, batched);
    }
    auto declared = parse_dtype(decl.dtype);
    if (!declared)
        if (auto it = bind.dtypes.find(decl.dtype); it != bind.dtypes.end()) declared = it->second;
    if (batched && has_ragged(decl)) {
        if (!py::isinstance<py::list>(obj) && !py::isinstance<py::tuple>(obj))
            fail(what, ": declared ", type_str(decl),
                 "; pass rag.ragged([...]) or a list of per-sample arrays, got ", type_name(obj));
        std::vector<py::array> samples;
        for (py::handle s : obj) samples.push_back(py::module_::import("numpy").attr("asarray")(s));
        DType t = declared ? *declared : samples.empty() ? DType::f32 : infer_dtype(samples[0]);
        bind.dtypes.try_emplace(decl.dtype, t);
        for (auto& s : samples) s = as_storage(s, t, "same_kind");
        return pack(samples, t, declared_axes(decl, true));
    }
    DType t = declared ? *declared : infer_dtype(py::module_::import("numpy").attr("asarray")(obj));
    bind.dtypes.try_emplace(decl.dtype, t);
    return tensor_from_array(obj, t, batched, "same_kind");
}

py::object from_value(const Value& v) {
    switch (v.kind) {
    case Value::Kind::tensor:
        if (v.tensor.shape().batched) return py::cast(v.tensor);
        return dense_array(v.tensor);
    case Value::Kind::record:
        return py::cast(Params::of(v));
    case Value::Kind::tuple: {
        py::tuple out(v.elems.size());
        for (std::size_t k = 0; k < v.elems.size(); ++k) out[k] = from_value(v.elems[k]);
        return out;
    }
    }
    return py::none();
}

// A path argument: str, bytes or os.PathLike.
std::string fspath(py::handle path, const char* what) {
    py::object p;
    try {
        p = py::module_::import("os").attr("fspath")(path);
    } catch (py::error_already_set&) {
        fail(what, ": expected a file path (str or os.PathLike), got ", type_name(path));
    }
    return p.cast<std::string>(); // str or bytes
}

// ---- modules --------------------------------------------------------------------------------

const ast::FnDecl& find_fn(const PyModule& m, const std::string& name) {
    auto [fn, file] = m.mod->program().find_fn(name);
    if (!fn) throw py::attribute_error("module " + m.path + " has no function '" + name + "'");
    return *fn;
}

// `callee` names the call in errors of counts and keywords: "f()", "f.call_saving()".
std::vector<Value> bind_args(PyModule& m, const ast::FnDecl& fn, const py::args& args,
                             const py::kwargs& kwargs, const std::string& callee) {
    const std::size_t n = fn.params.size();
    if (args.size() > n)
        throw py::type_error(callee + " takes " + std::to_string(n) + " arguments but " +
                             std::to_string(args.size()) + " were given");
    std::vector<py::object> slots(n);
    for (std::size_t k = 0; k < args.size(); ++k) slots[k] = args[k];
    for (auto [key, value] : kwargs) {
        const std::string name = py::str(key).cast<std::string>();
        std::size_t k = 0;
        while (k < n && fn.params[k].name != name) ++k;
        if (k == n)
            throw py::type_error(callee + " got an unexpected keyword argument '" + name + "'");
        if (slots[k])
            throw py::type_error(callee + " got multiple values for argument '" + name + "'");
        slots[k] = py::reinterpret_borrow<py::object>(value);
    }
    Binding bind{batch_names(fn), {}, m.records};
    for (std::size_t k = 0; k < n; ++k) {
        const ast::TypeExpr& t = fn.params[k].type;
        if (slots[k] && t.kind == ast::TypeExpr::Kind::tensor && !parse_dtype(t.dtype) &&
            py::isinstance<RaggedTensor>(slots[k]))
            bind.dtypes.try_emplace(t.dtype, slots[k].cast<const RaggedTensor&>().dtype());
    }
    std::vector<Value> vals;
    for (std::size_t k = 0; k < n; ++k) {
        const std::string what = fn.name + ": argument " + fn.params[k].name;
        if (!slots[k])
            throw py::type_error(callee + " missing argument '" + fn.params[k].name + "'");
        try {
            vals.push_back(to_value(slots[k], fn.params[k].type, bind, m.mod->program(), what));
        } catch (py::error_already_set& e) {
            fail(what, ": ", e.what());
        } catch (const CompileError&) {
            throw;
        } catch (const Error& e) {
            // Every conversion failure names the function and the argument, once.
            if (std::string_view(e.what()).starts_with(what)) throw;
            fail(what, ": ", e.what());
        }
    }
    return vals;
}

py::object call(PyModule& m, const std::string& name, const py::args& args,
                const py::kwargs& kwargs) {
    const ast::FnDecl& fn = find_fn(m, name);
    std::vector<Value> vals = bind_args(m, fn, args, kwargs, name + "()");
    Value out;
    {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(m.mu);
        out = m.mod->call(name, vals);
    }
    return from_value(out);
}

std::string ir_of(PyModule& m, const std::string& name, const py::args& args) {
    const ast::FnDecl& fn = find_fn(m, name);
    std::optional<std::vector<Value>> vals;
    if (!args.empty()) vals = bind_args(m, fn, args, py::kwargs(), name + ".ir()");
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(m.mu);
    return m.mod->ir(name, vals);
}

// ---- reverse mode (Function.vjp, Function.call_saving) ---------------------------------------

// A cotangent from Python: None (zero), a rag.Tensor, a rag.Params, an array or a number (an
// unbatched tensor), or a tuple of these.
std::optional<Value> cotangent_value(py::handle obj) {
    if (obj.is_none()) return std::nullopt;
    if (py::isinstance<RaggedTensor>(obj)) return Value(obj.cast<RaggedTensor>());
    if (py::isinstance<Params>(obj)) return obj.cast<const Params&>().value();
    if (py::isinstance<py::tuple>(obj) || py::isinstance<py::list>(obj)) {
        std::vector<Value> elems;
        for (py::handle e : obj) {
            auto v = cotangent_value(e);
            if (!v) fail("vjp: None is allowed for a whole result element, not inside one");
            elems.push_back(*v);
        }
        return Value::tuple(std::move(elems));
    }
    py::array a = py::array::ensure(obj);
    if (!a)
        fail("vjp: a cotangent must be a rag.Tensor, rag.Params, array, number or None; got ",
             type_name(obj));
    return Value(tensor_from_array(a, infer_dtype(a), false, "same_kind"));
}

// One cotangent per element of the result: a tuple result takes a tuple (or list) of them.
std::vector<std::optional<Value>> cotangent_list(py::handle obj, bool tuple_result) {
    std::vector<std::optional<Value>> out;
    if (!tuple_result) {
        out.push_back(cotangent_value(obj));
        return out;
    }
    if (!py::isinstance<py::tuple>(obj) && !py::isinstance<py::list>(obj))
        fail("vjp: the function returns a tuple; give one cotangent per element, as a tuple");
    for (py::handle e : obj) out.push_back(cotangent_value(e));
    return out;
}

py::tuple gradients(const std::vector<std::optional<Value>>& grads) {
    py::tuple out(grads.size());
    for (std::size_t k = 0; k < grads.size(); ++k)
        out[k] = grads[k] ? from_value(*grads[k]) : py::none();
    return out;
}

py::tuple vjp_of(PyModule& m, const std::string& name, py::args args, py::kwargs kwargs) {
    const ast::FnDecl& fn = find_fn(m, name);
    // Errors of counts describe vjp's own signature: the function's arguments, then the
    // cotangents ("f.vjp(x, p, cotangents)"), not the function's with one argument taken away.
    std::string sig = name + ".vjp(";
    for (const auto& p : fn.params) sig += p.name + ", ";
    sig += "cotangents)";
    py::object cts;
    if (kwargs.contains("cotangents")) {
        cts = kwargs["cotangents"];
        kwargs.attr("pop")("cotangents");
    } else {
        const std::size_t n = fn.params.size(), given = args.size() + kwargs.size();
        if (given != n + 1)
            throw py::type_error(sig + " takes " + std::to_string(n + 1) + " arguments (the " +
                                 std::to_string(n) + " of " + name + ", then the cotangents) but " +
                                 std::to_string(given) + " were given");
        if (args.empty())
            throw py::type_error(sig + " needs the cotangents last among the positional "
                                       "arguments, or as cotangents=");
        cts = args[args.size() - 1];
        args = py::reinterpret_steal<py::args>(
            PyTuple_GetSlice(args.ptr(), 0, Py_ssize_t(args.size()) - 1));
    }
    std::vector<Value> vals = bind_args(m, fn, args, kwargs, name + ".vjp()");
    const bool tuple_result = fn.result && fn.result->kind == ast::TypeExpr::Kind::tuple;
    auto ct = cotangent_list(cts, tuple_result);
    std::vector<std::optional<Value>> grads;
    {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(m.mu);
        grads = m.mod->vjp(name, vals, ct);
    }
    return gradients(grads);
}

py::tuple call_saving(const PyModulePtr& m, const std::string& name, const py::args& args,
                      const py::kwargs& kwargs) {
    const ast::FnDecl& fn = find_fn(*m, name);
    std::vector<Value> vals = bind_args(*m, fn, args, kwargs, name + ".call_saving()");
    std::pair<Value, std::shared_ptr<const Module::Saved>> r;
    {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(m->mu);
        r = m->mod->call_saving(name, vals);
    }
    return py::make_tuple(from_value(r.first), PySaved{m, std::move(r.second), name});
}

py::tuple saved_backward(PySaved& s, py::handle cotangents) {
    const ast::FnDecl& fn = find_fn(*s.mod, s.name);
    const bool tuple_result = fn.result && fn.result->kind == ast::TypeExpr::Kind::tuple;
    auto ct = cotangent_list(cotangents, tuple_result);
    std::vector<std::optional<Value>> grads;
    {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(s.mod->mu);
        grads = s.mod->mod->backward(*s.saved, ct);
    }
    return gradients(grads);
}

Tier tier_arg(const std::string& name) {
    if (name == "jit") return Tier::jit;
    if (name == "interpreter") return Tier::interpreter;
    fail("unknown tier '", name, "'; use 'jit' or 'interpreter' (device='cuda' for the GPU)");
}

std::string tier_name(Tier t) {
    switch (t) {
    case Tier::jit:
        return "jit";
    case Tier::gpu:
        return "gpu";
    case Tier::interpreter:
        break;
    }
    return "interpreter";
}

// The tier of (tier, device): device "cuda" runs compiled code on the GPU (jit/gpu_function.hpp)
// and is a "CUDA unavailable: ..." error without a driver or device, before any work.
Tier tier_for(const std::string& tier, const std::string& device) {
    if (device == "cpu") return tier_arg(tier);
    if (device != "cuda") fail("unknown device '", device, "'; use 'cpu' or 'cuda'");
    if (tier != "jit")
        fail("device='cuda' runs compiled code; tier='", tier, "' is for device='cpu'");
    cuda::device();
    return Tier::gpu;
}

PyModulePtr wrap(std::shared_ptr<Module> mod, std::string path, const std::string& tier,
                 bool padded, const std::string& device) {
    mod->set_tier(tier_for(tier, device));
    mod->set_padded(padded);
    auto m = std::make_shared<PyModule>();
    m->mod = std::move(mod);
    m->path = std::move(path);
    return m;
}

// ---- constructors ---------------------------------------------------------------------------

// Per-sample axes from a list of per-sample axis indices (0 = first per-sample axis): those
// become ragged (N, M, ... in order), the others static with sample 0's extents.
std::vector<Axis> axes_from_indices(py::handle indices, const std::vector<std::int64_t>& extents) {
    const int d = int(extents.size());
    std::set<int> ragged;
    for (py::handle h : indices) {
        if (!py::isinstance<py::int_>(h))
            fail("ragged_axes: expected per-sample axis numbers (ints), got ", type_name(h));
        int a = h.cast<int>();
        if (a < -d || a >= d)
            fail("ragged axis ", a, " out of range for samples of rank ", d,
                 " (per-sample numbering: 0 is the first axis of a sample)");
        ragged.insert(a < 0 ? a + d : a);
    }
    std::vector<Axis> axes;
    int k = 0;
    for (int a = 0; a < d; ++a)
        axes.push_back(ragged.count(a) ? Axis::ragged_of(ragged_name(k++))
                                       : Axis::fixed_of(extents[std::size_t(a)]));
    return axes;
}

RaggedTensor ragged(py::handle samples_obj, py::handle ragged_axes, py::handle dtype) {
    py::module_ np = py::module_::import("numpy");
    std::vector<py::array> samples;
    for (py::handle s : samples_obj) samples.push_back(np.attr("asarray")(s));
    std::optional<DType> t;
    if (!dtype.is_none()) t = dtype_arg(dtype);
    const bool explicit_dtype = t.has_value();
    std::vector<Axis> axes;
    const int rank = samples.empty() ? -1 : int(samples[0].ndim());
    for (std::size_t i = 0; i < samples.size(); ++i)
        if (int(samples[i].ndim()) != rank)
            fail("sample ", i, " has rank ", samples[i].ndim(), " but sample 0 has rank ", rank);
    std::vector<std::int64_t> extents;
    if (rank >= 0) extents.assign(samples[0].shape(), samples[0].shape() + rank);
    if (py::isinstance<py::str>(ragged_axes)) {
        std::optional<DType> spec_dtype;
        axes = axes_from_spec(ragged_axes.cast<std::string>(), rank, &spec_dtype);
        if (!t) t = spec_dtype;
    } else if (!ragged_axes.is_none()) {
        if (samples.empty())
            fail("rag.ragged: an empty batch needs its axes as a spec string, e.g. \"~N, 384\"");
        axes = axes_from_indices(ragged_axes, extents);
    } else {
        if (samples.empty())
            fail("rag.ragged: cannot infer axes from an empty list; pass ragged_axes=\"~N, 384\"");
        int k = 0;
        for (int a = 0; a < rank; ++a) {
            bool varies = false;
            for (const auto& s : samples) varies |= s.shape(a) != samples[0].shape(a);
            axes.push_back(varies ? Axis::ragged_of(ragged_name(k++))
                                  : Axis::fixed_of(extents[std::size_t(a)]));
        }
    }
    if (!t) t = samples.empty() ? DType::f32 : infer_dtype(samples[0]);
    for (auto& s : samples) s = as_storage(s, *t, explicit_dtype ? "unsafe" : "same_kind");
    return pack(samples, *t, std::move(axes));
}

RaggedTensor from_padded(py::handle padded, py::handle lengths, py::handle ragged_axes,
                         py::handle dtype) {
    py::module_ np = py::module_::import("numpy");
    py::array a = np.attr("asarray")(padded);
    const DType t = dtype.is_none() ? infer_dtype(a) : dtype_arg(dtype);
    a = np.attr("asarray")(as_storage(a, t, dtype.is_none() ? "same_kind" : "unsafe"),
                           "order"_a = "C");
    if (a.ndim() < 1) fail("from_padded: expected a [B, ...] array, got a scalar");
    const int rank = int(a.ndim()) - 1;
    std::vector<std::int64_t> extents(a.shape() + 1, a.shape() + a.ndim());
    std::vector<Axis> axes;
    if (py::isinstance<py::str>(ragged_axes))
        axes = axes_from_spec(ragged_axes.cast<std::string>(), rank, nullptr);
    else if (ragged_axes.is_none())
        axes = axes_from_indices(py::make_tuple(0), extents);
    else
        axes = axes_from_indices(ragged_axes, extents);
    auto l = integer_array(lengths, "from_padded: lengths");
    std::vector<std::vector<std::int64_t>> lens;
    if (l.ndim() == 1)
        lens.emplace_back(l.data(), l.data() + l.size());
    else if (l.ndim() == 2)
        for (py::ssize_t r = 0; r < l.shape(0); ++r)
            lens.emplace_back(l.data(r, 0), l.data(r, 0) + l.shape(1));
    else
        fail("from_padded: lengths must be B extents, or one row of B extents per ragged axis");
    DenseArray d{t, {a.shape(), a.shape() + a.ndim()}, {}};
    d.bytes.resize(std::size_t(a.nbytes()));
    if (a.nbytes()) std::memcpy(d.bytes.data(), a.data(), std::size_t(a.nbytes()));
    return RaggedTensor::from_padded(d, std::move(axes), lens);
}

py::object item(const RaggedTensor& t) {
    const double v = t.item();
    if (t.dtype() == DType::boolean) return py::bool_(v != 0);
    if (t.dtype() == DType::i32 || t.dtype() == DType::i64) {
        const std::size_t es = dtype_size(t.dtype());
        std::int64_t i = 0;
        if (es == 4)
            i = *static_cast<const std::int32_t*>(t.data());
        else
            i = *static_cast<const std::int64_t*>(t.data());
        return py::int_(i);
    }
    return py::float_(v);
}

int logical_axis(const RaggedTensor& t, int axis) {
    const int n = t.shape().logical_rank();
    if (axis < 0) axis += n;
    if (axis < 0 || axis >= n)
        throw py::index_error("axis " + std::to_string(axis) + " out of range for " +
                              t.schema().str());
    return axis;
}

// The __init__ of rag's classes: their instances come from rag's functions, and pybind11's own
// "No constructor defined!" would not say which.
template <class T, class Made = T> Made no_constructor(const py::args&, const py::kwargs&) {
    fail(bind::Made<T>::name, " cannot be made directly; ", bind::Made<T>::how);
}

std::string format_of(DType t) {
    switch (t) {
    case DType::f16:
        return "e";
    case DType::bf16:
        return "H";
    case DType::f32:
        return "f";
    case DType::f64:
        return "d";
    case DType::i32:
        return "i";
    case DType::i64:
        return "q";
    case DType::boolean:
        return "?";
    }
    return "B";
}

} // namespace
} // namespace rag::bind

PYBIND11_MODULE(_rag, m) {
    using namespace rag;
    using namespace rag::bind;
    // The package rag re-exports this module (bindings/rag/__init__.py): classes, exceptions
    // and functions say they are rag's, so reprs, tracebacks and pickles name rag.Tensor.
    m.attr("__name__") = "rag";
    m.doc() = "rag: a tensor language for ragged data (LANGUAGE.md section 5).";
    m.attr("__version__") = RAG_VERSION;
    m.attr("dtypes") = py::make_tuple("f16", "bf16", "f32", "f64", "i32", "i64", "bool");

    // The exception types live as long as the process (no destructor runs after finalisation).
    static PyObject* error = py::exception<Error>(m, "Error").release().ptr();
    static PyObject* compile_error =
        py::exception<CompileError>(m, "CompileError", error).release().ptr();
    m.attr("Error").attr("__doc__") =
        "Every rag failure: shapes, dtypes, lengths; the message names the sample.";
    m.attr("CompileError").attr("__doc__") =
        "A program that does not parse or type-check: file:line:col, the source line and a caret.";
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const CompileError& e) {
            PyErr_SetString(compile_error, e.what());
        } catch (const Error& e) {
            PyErr_SetString(error, e.what());
        } catch (const std::bad_alloc&) {
            // Sizes come from the user; an allocation that fails is theirs to shrink.
            PyErr_SetString(error, "out of memory: the values asked for do not fit in this "
                                   "machine's memory");
        } catch (const std::length_error&) {
            PyErr_SetString(error, "out of memory: a size asked for is larger than any "
                                   "allocation can be");
        } catch (const py::cast_error&) {
            PyErr_SetString(error, "a value of the wrong type was given (see help() of the "
                                   "function for what it takes)");
        }
    });

    // ---- Tensor -----------------------------------------------------------------------------
    py::class_<RaggedTensor>(m, "Tensor", py::buffer_protocol(),
                             R"(A batch of samples stored packed (or one dense value).

Built by rag.ragged, rag.tensor, rag.from_padded, rag.from_dlpack, or returned by a function.
Logical axis 0 is the batch axis; lengths(1) is the first per-sample axis.)")
        .def(py::init(&no_constructor<RaggedTensor>))
        .def_buffer([](RaggedTensor& t) {
            py::array v = values_view(t);
            std::vector<py::ssize_t> shape(v.shape(), v.shape() + v.ndim()),
                strides(v.strides(), v.strides() + v.ndim());
            return py::buffer_info(t.mutable_data(), py::ssize_t(dtype_size(t.dtype())),
                                   format_of(t.dtype()), v.ndim(), shape, strides);
        })
        .def_property_readonly(
            "schema", [](const RaggedTensor& t) { return t.schema().str(); },
            "The schema, e.g. 'f32[B, ~N, 384]'.")
        .def_property_readonly(
            "dtype", [](const RaggedTensor& t) { return std::string(dtype_name(t.dtype())); })
        .def_property_readonly("batched", [](const RaggedTensor& t) { return t.shape().batched; })
        .def_property_readonly("is_ragged",
                               [](const RaggedTensor& t) { return t.shape().ragged_count() > 0; })
        .def_property_readonly(
            "batch", [](const RaggedTensor& t) { return t.batch(); }, "The number of samples B.")
        .def_property_readonly("ndim",
                               [](const RaggedTensor& t) { return t.shape().logical_rank(); })
        .def_property_readonly(
            "shape",
            [](const RaggedTensor& t) {
                py::list out;
                const Structure& st = t.structure();
                if (t.shape().batched) out.append(t.batch());
                for (int a = 0; a < st.rank(); ++a) {
                    const Axis& ax = t.shape().axes[std::size_t(a)];
                    if (ax.is_ragged() || (t.batch() == 0 && ax.kind == AxisKind::symbolic))
                        out.append(py::none());
                    else if (ax.kind == AxisKind::fixed)
                        out.append(ax.extent);
                    else
                        out.append(st.size(0, a));
                }
                return py::tuple(out);
            },
            "The logical shape; None for ragged axes.")
        .def_property_readonly(
            "ragged_axes",
            [](const RaggedTensor& t) {
                std::vector<int> out;
                for (int a = 0; a < t.structure().rank(); ++a)
                    if (t.shape().axes[std::size_t(a)].is_ragged()) out.push_back(a + 1);
                return out;
            },
            "The logical indices of the ragged axes (1 = first per-sample axis).")
        .def(
            "lengths",
            [](const RaggedTensor& t, int axis) {
                if (!t.shape().batched) fail("lengths: ", t.schema().str(), " is not batched");
                axis = logical_axis(t, axis);
                if (axis == 0)
                    fail("lengths: axis 0 is the batch axis; per-sample axes start at 1");
                return t.structure().lengths(axis - 1);
            },
            "axis"_a,
            "The extent of logical axis `axis` (1 = first per-sample axis) in every sample.")
        .def_property_readonly(
            "device", [](const RaggedTensor& t) { return t.device_copy() ? "cuda" : "cpu"; },
            "'cuda' while the values have a current copy in GPU memory (a result of a "
            "device='cuda' function, or to('cuda')), which a GPU call reads without an upload; "
            "else 'cpu'. Host access keeps the copy, except writable views (values, to_list, "
            "DLPack), after which the tensor is 'cpu'.")
        .def(
            "to",
            [](const RaggedTensor& t, const std::string& device) {
                if (device != "cpu" && device != "cuda")
                    fail("to: unknown device '", device, "'; use 'cpu' or 'cuda'");
                const bool resident = t.device_copy() != nullptr;
                if ((device == "cuda") == resident) return t;
                py::gil_scoped_release nogil;
                if (device == "cuda") return jit::to_resident(t);
                Buffer b = Buffer::allocate_uninitialized(t.buffer().nbytes);
                if (b.nbytes) std::memcpy(b.data.get(), t.data(), b.nbytes);
                return RaggedTensor(t.dtype(), t.structure_ptr(), std::move(b));
            },
            "device"_a,
            "The tensor with its values on `device`: 'cuda' uploads them once (rag.Error 'CUDA "
            "unavailable: ...' without a GPU), so GPU calls read them in place; 'cpu' a host "
            "copy without the GPU one. Itself when already there.")
        .def("packed", &packed,
             "(values, lengths): the packed values (a zero-copy view, as `values`) and one int64 "
             "array of B extents per ragged name, in order; rag.from_packed's inverse.")
        .def_property_readonly(
            "sizes",
            [](const RaggedTensor& t) {
                const auto& s = t.structure().sizes();
                py::array_t<std::int64_t> out(
                    {py::ssize_t(t.batch()), py::ssize_t(t.structure().rank())});
                std::copy(s.begin(), s.end(), out.mutable_data());
                return out;
            },
            "Per-sample extents, [B, per-sample rank].")
        .def_property_readonly(
            "offsets",
            [](const RaggedTensor& t) { return py::array(py::cast(t.structure().offsets())); },
            "Row offsets of the samples in the packed values, [B + 1].")
        .def_property_readonly(
            "values", [](const RaggedTensor& t) { return values_view(t); },
            "The packed values without a copy: [rows, non-ragged extents...] (unbatched: the "
            "array).\n"
            "bf16 shows as uint16 bits. Writes go to the tensor.")
        .def(
            "to_list",
            [](const RaggedTensor& t) {
                if (!t.shape().batched) fail("to_list: ", t.schema().str(), " is not batched");
                py::list out;
                for (std::int64_t i = 0; i < t.batch(); ++i) out.append(sample_array(t, i));
                return out;
            },
            "One NumPy array per sample (views without a copy; bf16 as float32 copies).")
        .def(
            "to_padded",
            [](const RaggedTensor& t, py::object value) { return to_padded(t, value); },
            "value"_a = 0, "A [B, envelope...] array with `value` outside each sample.")
        .def(
            "mask", [](const RaggedTensor& t) { return mask(t); },
            "bool, the shape of to_padded(), true where valid.")
        .def(
            "numpy",
            [](const RaggedTensor& t) {
                if (t.shape().ragged_count() > 0)
                    fail(t.schema().str(), " is ragged: use to_padded(), to_list() or values");
                return widen(values_view(t), t.dtype());
            },
            "The dense array of a value without ragged axes (zero copy unless bf16).")
        .def(
            "astype",
            [](const RaggedTensor& t, py::handle dtype) { return t.astype(dtype_arg(dtype)); },
            "dtype"_a)
        .def("item", &item)
        .def("__len__",
             [](const RaggedTensor& t) {
                 if (!t.shape().batched) throw py::type_error("len() of an unbatched rag.Tensor");
                 return t.batch();
             })
        .def(
            "__getitem__",
            [](const RaggedTensor& t, const Int& index) {
                if (!t.shape().batched)
                    fail("indexing selects a sample; ", t.schema().str(), " is not batched");
                int overflow = 0;
                const std::int64_t i = PyLong_AsLongLongAndOverflow(index.value.ptr(), &overflow);
                const std::int64_t k = i < 0 ? i + t.batch() : i;
                // The message shows the index given (-3), not the one it counts as (-1).
                if (overflow || k < 0 || k >= t.batch())
                    throw py::index_error("sample index " + index.str() +
                                          " out of range for a batch of " +
                                          std::to_string(t.batch()));
                return sample_array(t, k);
            },
            "Sample i as a NumPy array (a view).")
        .def("__iter__",
             [](const RaggedTensor& t) {
                 py::list out;
                 for (std::int64_t i = 0; i < t.batch(); ++i) out.append(sample_array(t, i));
                 return out.attr("__iter__")();
             })
        .def("__repr__", [](const RaggedTensor& t) { return "rag.Tensor(" + describe(t) + ")"; })
        .def(
            "__dlpack__",
            [](const RaggedTensor& t, py::object stream, py::object max_version,
               py::object dl_device,
               py::object copy) { return to_dlpack(t, stream, max_version, dl_device, copy); },
            py::kw_only(), "stream"_a = py::none(), "max_version"_a = py::none(),
            "dl_device"_a = py::none(), "copy"_a = py::none(),
            "DLPack export of the packed values (see `values`), zero copy, where they are: CUDA "
            "device 0 while the tensor is on the device (its memory is shared: rag reads it back "
            "on every host access), else the CPU (a device copy is then dropped). A DLPack 1.x "
            "\"dltensor_versioned\" capsule when max_version >= (1, 0), else the legacy "
            "\"dltensor\" one. stream: the consumer's CUDA stream, which waits for rag's work "
            "(None: the legacy default stream; -1: no wait).")
        .def("__dlpack_device__", &dlpack_device)
        .def(py::pickle(&tensor_state, &tensor_from_state));

    // ---- Params -----------------------------------------------------------------------------
    py::class_<Params>(m, "Params",
                       "A params record: a mapping from field names to NumPy arrays (views).")
        .def(py::init(&no_constructor<Params>))
        .def_readonly("name", &Params::record, "The params group, e.g. 'PairBlock'.")
        .def("__getitem__",
             [](Params& p, const std::string& k) {
                 if (auto* t = p.find(k)) return dense_array(*t);
                 throw py::key_error(k);
             })
        .def("__setitem__",
             [](Params& p, const std::string& k, py::handle v) {
                 auto* t = p.find(k);
                 if (!t) throw py::key_error(p.record + " has no field '" + k + "'");
                 *t = field_value(v, t->schema(), p.record, k);
             })
        .def("__getattr__",
             [](Params& p, const std::string& k) {
                 if (auto* t = p.find(k)) return dense_array(*t);
                 throw py::attribute_error(p.record + " has no field '" + k + "'");
             })
        .def("__contains__", [](Params& p, const std::string& k) { return p.find(k) != nullptr; })
        .def("__len__", [](const Params& p) { return p.fields.size(); })
        .def("__iter__", [](const Params& p) { return py::iter(py::cast(p.keys())); })
        .def("keys", &Params::keys)
        .def("values",
             [](const Params& p) {
                 py::list out;
                 for (const auto& f : p.fields) out.append(dense_array(f.second));
                 return out;
             })
        .def("items",
             [](const Params& p) {
                 py::list out;
                 for (const auto& f : p.fields)
                     out.append(py::make_tuple(f.first, dense_array(f.second)));
                 return out;
             })
        .def(
            "get",
            [](Params& p, const std::string& k, py::object dflt) -> py::object {
                if (auto* t = p.find(k)) return dense_array(*t);
                return dflt;
            },
            "key"_a, "default"_a = py::none())
        .def(
            "to_dict",
            [](const Params& p) {
                py::dict out;
                for (const auto& f : p.fields) out[py::str(f.first)] = dense_array(f.second);
                return out;
            },
            "A dict of the field arrays (views).")
        .def(
            "copy",
            [](const Params& p) {
                Params q = p;
                for (auto& f : q.fields) f.second = f.second.astype(f.second.dtype());
                return q;
            },
            "A deep copy (fresh buffers).")
        .def(
            "save",
            [](const Params& p, py::object path) {
                const std::string file = fspath(path, "rag.Params.save");
                const Value v = p.value();
                py::gil_scoped_release nogil;
                save_checkpoint(v, file);
            },
            "path"_a,
            "Write a safetensors checkpoint: one tensor per (dotted) field name, written to a "
            "temporary file and renamed over `path`.")
        .def(py::pickle(
            [](const Params& p) -> py::object {
                py::list fields;
                for (const auto& [n, t] : p.fields) fields.append(py::make_tuple(n, t));
                return py::make_tuple(p.record, fields);
            },
            [](const py::object& state) {
                if (!py::isinstance<py::tuple>(state) || py::len(state) != 2 ||
                    !py::isinstance<py::list>(state[py::int_(1)]))
                    fail("rag.Params state: expected (name, [fields])");
                py::tuple s = py::reinterpret_borrow<py::tuple>(state);
                Params p;
                p.record = py::str(s[0]).cast<std::string>();
                for (py::handle f : s[1]) {
                    if (!py::isinstance<py::tuple>(f) || py::len(f) != 2 ||
                        !py::isinstance<RaggedTensor>(f[py::int_(1)]))
                        fail("rag.Params state: a field is not (name, rag.Tensor)");
                    py::tuple nt = py::reinterpret_borrow<py::tuple>(f);
                    p.fields.emplace_back(py::str(nt[0]).cast<std::string>(),
                                          nt[1].cast<RaggedTensor>());
                }
                return p;
            }))
        .def("__repr__", [](const Params& p) {
            std::string s = "rag.Params(" + p.record + ": ";
            for (std::size_t k = 0; k < p.fields.size(); ++k)
                s += (k ? ", " : "") + p.fields[k].first + " " + p.fields[k].second.schema().str();
            return s + ")";
        });
    py::module_::import("collections.abc").attr("Mapping").attr("register")(m.attr("Params"));

    // ---- Module and Function ----------------------------------------------------------------
    py::class_<PyFunction>(
        m, "Function", "A function of a rag module; calling it compiles on first use per schema.")
        .def(py::init(&no_constructor<PyFunction>))
        .def("__call__", [](PyFunction& f, py::args args,
                            py::kwargs kwargs) { return call(*f.mod, f.name, args, kwargs); })
        .def_readonly("name", &PyFunction::name)
        .def(
            "vjp",
            [](PyFunction& f, py::args args, py::kwargs kwargs) {
                return vjp_of(*f.mod, f.name, std::move(args), std::move(kwargs));
            },
            "vjp(*args, cotangents): the gradient of sum_k <result_k, cotangents_k> for every "
            "argument, from rag's autodiff: a tuple with one entry per argument (a rag.Tensor, "
            "array or rag.Params like it; None for an argument without float tensors). A tuple "
            "result takes a tuple of cotangents; None is a zero cotangent.")
        .def(
            "call_saving",
            [](PyFunction& f, py::args args, py::kwargs kwargs) {
                return call_saving(f.mod, f.name, args, kwargs);
            },
            "call_saving(*args) -> (result, saved): the call, keeping what its reverse pass "
            "reads; saved.backward(cotangents) then returns what vjp does without running the "
            "function again.")
        .def_property_readonly(
            "signature", [](const PyFunction& f) { return signature(find_fn(*f.mod, f.name)); })
        .def(
            "ir", [](PyFunction& f, py::args args) { return ir_of(*f.mod, f.name, args); },
            "The SSA IR, specialised on these arguments (none: the declared types).")
        .def("__repr__", [](const PyFunction& f) {
            return "<rag.Function " + signature(find_fn(*f.mod, f.name)) + ">";
        });

    py::class_<PySaved>(m, "Saved",
                        "What Function.call_saving kept for the reverse pass of one call.")
        .def(py::init(&no_constructor<PySaved>))
        .def("backward", &saved_backward, "cotangents"_a,
             "The gradients of the saved call for these cotangents (see Function.vjp).");

    py::class_<PyModule, PyModulePtr>(m, "Module",
                                      "A loaded .rag program; its functions are attributes.")
        .def(py::init(&no_constructor<PyModule, PyModulePtr>))
        .def_readonly("path", &PyModule::path)
        .def_property(
            "tier",
            [](PyModule& pm) {
                py::gil_scoped_release nogil;
                std::lock_guard<std::mutex> lock(pm.mu);
                return tier_name(pm.mod->tier());
            },
            [](PyModule& pm, const std::string& name) {
                const Tier t = tier_arg(name);
                py::gil_scoped_release nogil;
                std::lock_guard<std::mutex> lock(pm.mu);
                pm.mod->set_tier(t);
            },
            "Where calls run: 'jit' (LLVM-compiled CPU code, the default), 'interpreter' (the "
            "reference), or 'gpu' (loaded with device='cuda'; setting 'jit' or 'interpreter' "
            "moves calls back to the CPU).")
        .def_property_readonly(
            "device",
            [](PyModule& pm) {
                py::gil_scoped_release nogil;
                std::lock_guard<std::mutex> lock(pm.mu);
                return std::string(pm.mod->tier() == Tier::gpu ? "cuda" : "cpu");
            },
            "'cuda' when calls run on the GPU (loaded with device='cuda'), else 'cpu'.")
        .def_property(
            "padded",
            [](PyModule& pm) {
                py::gil_scoped_release nogil;
                std::lock_guard<std::mutex> lock(pm.mu);
                return pm.mod->padded();
            },
            [](PyModule& pm, bool on) {
                py::gil_scoped_release nogil;
                std::lock_guard<std::mutex> lock(pm.mu);
                pm.mod->set_padded(on);
            },
            "True: calls run on the dense envelope B x N_max x ... with masks (the padded "
            "baseline); same valid results.")
        .def(
            "functions", [](const PyModule& pm) { return pm.mod->functions(); },
            "Functions of the main file, in order.")
        .def(
            "notes", [](const PyModule& pm) { return pm.mod->notes(); },
            "Notes from loading, formatted (a definition shadowing the standard library's).")
        .def("__getattr__",
             [](PyModulePtr pm, const std::string& name) {
                 if (name.rfind("__", 0) == 0) throw py::attribute_error(name);
                 find_fn(*pm, name);
                 return PyFunction{pm, name};
             })
        .def("__getitem__",
             [](PyModulePtr pm, const std::string& name) {
                 if (!pm->mod->program().find_fn(name).first) throw py::key_error(name);
                 return PyFunction{pm, name};
             })
        .def("__contains__",
             [](const PyModule& pm, const std::string& name) {
                 return pm.mod->program().find_fn(name).first != nullptr;
             })
        .def("__dir__",
             [](py::object self) {
                 py::list out =
                     py::module_::import("builtins").attr("object").attr("__dir__")(self);
                 for (const auto& f : self.cast<const PyModule&>().mod->functions()) out.append(f);
                 return out;
             })
        .def(
            "call",
            [](PyModule& pm, const std::string& name, py::args args, py::kwargs kwargs) {
                return call(pm, name, args, kwargs);
            },
            "name"_a)
        .def(
            "init",
            [](PyModule& pm, const std::string& name, const Int& seed) {
                const unsigned long long s = PyLong_AsUnsignedLongLong(seed.value.ptr());
                if (PyErr_Occurred()) { // negative, or 2**64 or more
                    PyErr_Clear();
                    fail("rag.Module.init: seed must be an integer in [0, 2**64), got ",
                         seed.str());
                }
                Value v;
                {
                    py::gil_scoped_release nogil;
                    v = pm.mod->init(name, s);
                }
                return Params::of(v);
            },
            "name"_a, "seed"_a = 0,
            "Deterministic initialisation of a params group; seed: an integer in [0, 2**64).")
        .def(
            "load_params",
            [](PyModule& pm, const std::string& type, py::object path) {
                const std::string file = fspath(path, "rag.Module.load_params");
                Value v;
                {
                    py::gil_scoped_release nogil;
                    v = pm.mod->load_params(type, file);
                }
                return Params::of(v);
            },
            "type"_a, "path"_a,
            "Read a params record of `type` (e.g. 'Model', 'Adam[Model]') from a safetensors "
            "file; a missing, extra or mis-shaped name is a rag.Error naming it.")
        .def(
            "save_params",
            [](PyModule& pm, py::object params, py::object path) {
                if (!py::isinstance<Params>(params))
                    fail("save_params: expected rag.Params, got ", type_name(params));
                const Value v = params.cast<const Params&>().value();
                const std::string file = fspath(path, "rag.Module.save_params");
                py::gil_scoped_release nogil;
                pm.mod->save_params(v, file);
            },
            "params"_a, "path"_a,
            "p.save(path), after checking p against its params type in this module.")
        .def(
            "ir",
            [](PyModule& pm, const std::string& name, py::args args) {
                return ir_of(pm, name, args);
            },
            "name"_a)
        .def(
            "stats",
            [](PyModule& pm) {
                std::map<std::string, FnStats> s;
                {
                    py::gil_scoped_release nogil;
                    std::lock_guard<std::mutex> lock(pm.mu);
                    s = pm.mod->stats();
                }
                py::dict out;
                for (const auto& [fn, st] : s) {
                    // Where the steps of the latest call ran: counts, and op -> count.
                    py::dict steps("compiled"_a = st.compiled_steps,
                                   "reference"_a = py::cast(st.reference_steps),
                                   "device"_a = st.device_steps,
                                   "host"_a = py::cast(st.host_steps));
                    out[py::str(fn)] =
                        py::dict("compilations"_a = st.compilations, "cache_hits"_a = st.cache_hits,
                                 "compile_seconds"_a = st.compile_seconds,
                                 "disk_cache_hits"_a = st.disk_cache_hits, "steps"_a = steps,
                                 "uploaded_bytes"_a = st.uploaded_bytes,
                                 "downloaded_bytes"_a = st.downloaded_bytes);
                }
                return out;
            },
            "{function: {'compilations', 'cache_hits', 'compile_seconds', 'disk_cache_hits', "
            "'steps': {'compiled', 'reference': {op: n}, 'device', 'host': {op_dtype: n}}, "
            "'uploaded_bytes', 'downloaded_bytes'}} (steps and bytes: the latest call; bytes: "
            "copies to and from the GPU during it)")
        .def("__repr__", [](const PyModule& pm) {
            std::string s = "<rag.Module '" + pm.path + "':";
            for (const auto& f : pm.mod->functions()) s += " " + f;
            return s + ">";
        });

    // ---- functions --------------------------------------------------------------------------
    m.def(
        "load",
        [](py::object path, const std::string& tier, bool padded, const std::string& device) {
            std::string p = fspath(path, "rag.load");
            std::shared_ptr<Module> mod;
            {
                py::gil_scoped_release nogil;
                mod = Module::load(p);
            }
            return wrap(std::move(mod), p, tier, padded, device);
        },
        "path"_a, "tier"_a = "jit", "padded"_a = false, "device"_a = "cpu",
        "Load and type-check a .rag file. padded=True: run on the dense envelope with masks. "
        "device='cuda': run on the GPU (rag.Error 'CUDA unavailable: ...' without one).");
    m.def(
        "compile",
        [](const std::string& source, const std::string& path, const std::string& tier, bool padded,
           const std::string& device) {
            std::shared_ptr<Module> mod;
            {
                py::gil_scoped_release nogil;
                mod = Module::compile(source, path);
            }
            return wrap(std::move(mod), path, tier, padded, device);
        },
        "source"_a, "path"_a = "<input>", "tier"_a = "jit", "padded"_a = false, "device"_a = "cpu",
        "Compile a program from source text. padded=True: run on the dense envelope with masks. "
        "device='cuda': run on the GPU (rag.Error 'CUDA unavailable: ...' without one).");
    m.def(
        "ragged",
        [](py::object samples, py::object ragged_axes, py::object dtype) {
            return ragged(samples, ragged_axes, dtype);
        },
        "samples"_a, "ragged_axes"_a = py::none(), "dtype"_a = py::none(),
        R"(A batch from per-sample arrays.

ragged_axes: None (axes whose extents vary become ragged), a list of per-sample axis indices
(0 = the first axis of each sample), or a spec such as "~N, ~N, 128" or "f32[B, ~N, 384]".
dtype: a rag dtype name or NumPy dtype (default: the samples' own; uint16 means bf16 bits).)");
    m.def(
        "tensor",
        [](py::object a, py::object dtype, bool batched) {
            if (py::isinstance<RaggedTensor>(a)) {
                auto t = a.cast<RaggedTensor>();
                return dtype.is_none() ? t : t.astype(dtype_arg(dtype));
            }
            py::array arr = py::module_::import("numpy").attr("asarray")(a);
            const DType t = dtype.is_none() ? infer_dtype(arr) : dtype_arg(dtype);
            return tensor_from_array(arr, t, batched, "unsafe");
        },
        "array"_a, "dtype"_a = py::none(), "batched"_a = false,
        "A dense tensor; batched=True makes axis 0 the batch axis (f32[B, ...]).");
    m.def(
        "from_padded",
        [](py::object padded, py::object lengths, py::object ragged_axes, py::object dtype) {
            return from_padded(padded, lengths, ragged_axes, dtype);
        },
        "padded"_a, "lengths"_a, "ragged_axes"_a = py::none(), "dtype"_a = py::none(),
        R"(Inverse of to_padded: padded is [B, envelope...]; lengths is B extents (one ragged axis)
or one row of B extents per ragged axis. ragged_axes as in rag.ragged (default [0]).)");
    m.def(
        "set_num_threads",
        [](const Int& n) {
            // runtime/parallel.cpp cuts a call into at most 64 chunks, so no call ever runs on
            // more threads; a larger count is taken as 64, and num_threads() says so.
            constexpr long long most = 64;
            int overflow = 0;
            const long long k = PyLong_AsLongLongAndOverflow(n.value.ptr(), &overflow);
            if (overflow < 0 || (!overflow && k < 0))
                fail("rag.set_num_threads: n must be 0 (every core) or a positive count, got ",
                     n.str());
            set_num_threads(int(overflow ? most : std::min(k, most)));
        },
        "n"_a,
        "Threads rag's kernels use from now on (RAG_NUM_THREADS at start; 0: every core); "
        "counts above 64, the most chunks a kernel's work is cut into, are taken as 64. "
        "Results are bitwise the same for any count.");
    m.def("num_threads", &num_threads, "Threads rag's kernels use.");
    m.def(
        "empty_cache",
        [] {
            memory::release_cached();
            cuda::release_cached();
        },
        "Returns the memory rag keeps for reuse to the system: freed host blocks (the cache "
        "holds at most 5/4 of the process's peak of live bytes minus those live now; "
        "RAG_HOST_CACHE_MB caps it) and, with a GPU, freed device blocks.");
    m.def(
        "from_packed",
        [](py::object values, py::object lengths, const std::string& spec, py::object dtype) {
            return from_packed(values, lengths, spec, dtype);
        },
        "values"_a, "lengths"_a, "spec"_a, "dtype"_a = py::none(),
        R"(A batch from packed values and lengths, t.packed()'s inverse. values: [rows, static
extents...] (an array or any DLPack producer such as a torch tensor; zero copy when it is
C-contiguous, aligned to its element size and of the dtype). lengths: one row of B extents per ragged name
(a dict by name, a list in order, or one row for one name). spec: the per-sample axes,
"~N, 128", "[B, ~N, ~N, 64]" or "f32[B, ~N, 4]".)");
    m.def(
        "from_dlpack", [](py::object obj, bool batched) { return from_dlpack(obj, batched); },
        "obj"_a, "batched"_a = false,
        "A tensor from a DLPack producer (NumPy, PyTorch, ...) in CPU memory or on CUDA device 0.\n"
        "CPU: zero copy when the memory is C-contiguous and aligned to its element size, one copy\n"
        "otherwise. CUDA: the producer orders its work before rag's stream; contiguous 16-byte-\n"
        "aligned memory is adopted as a device-resident tensor (shared: rag reads it back on "
        "every\n"
        "host access), other contiguous memory is copied on the device, strided memory refused.");

    install_argument_errors(m);
}
