#include "bindings/convert.hpp"

#include "jit/kir_gpu.hpp"
#include "runtime/cuda.hpp"
#include "runtime/error.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>

namespace rag::bind {

using namespace pybind11::literals;

namespace {

py::module_ numpy() {
    return py::module_::import("numpy");
}

// What adoption needs of an address: element alignment, as the compiled kernels load and store
// at any element offset (vector accesses carry the element's alignment) and BLAS asks no more.
// rag's own buffers are 64-byte aligned for speed; adopting a NumPy array (16-byte aligned) or
// a slice of one costs less than the copy that alignment would take.
bool element_aligned(const void* p, std::size_t element_size) {
    return reinterpret_cast<std::uintptr_t>(p) % element_size == 0;
}

// Drops a Python reference from any thread: deleters of shared buffers may run where the GIL
// is not held (inside Module::call), or after the interpreter has gone (then it leaks).
void release_object(py::object* o) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete o;
}

std::vector<py::ssize_t> c_strides(const std::vector<py::ssize_t>& shape, std::size_t itemsize) {
    std::vector<py::ssize_t> s(shape.size());
    py::ssize_t stride = py::ssize_t(itemsize);
    for (std::size_t a = shape.size(); a-- > 0;) {
        s[a] = stride;
        stride *= std::max<py::ssize_t>(shape[a], 1);
    }
    return s;
}

std::vector<py::ssize_t> shape_of(const py::array& a) {
    return {a.shape(), a.shape() + a.ndim()};
}

// Sample i of the storage in logical axis order, as raw storage (bf16 stays uint16).
py::array sample_view(const RaggedTensor& t, std::int64_t i) {
    const Structure& st = t.structure();
    const std::size_t es = dtype_size(t.dtype());
    auto shape = st.sample_shape(i);
    auto strides = st.sample_strides(i);
    std::vector<py::ssize_t> sh(shape.begin(), shape.end()), str;
    for (auto s : strides) str.push_back(py::ssize_t(s * std::int64_t(es)));
    t.expose(); // the view is writable: the values are the host's from now on
    return view(t.buffer(), t.dtype(), sh, str, std::size_t(st.sample_begin(i)) * es);
}

// The order in which logical axes are laid out in storage: ragged first, then the others.
std::vector<int> storage_order(const std::vector<Axis>& axes) {
    std::vector<int> order;
    for (int a = 0; a < int(axes.size()); ++a)
        if (axes[a].is_ragged()) order.push_back(a);
    for (int a = 0; a < int(axes.size()); ++a)
        if (!axes[a].is_ragged()) order.push_back(a);
    return order;
}

std::vector<py::ssize_t> padded_shape(const RaggedTensor& t) {
    auto env = t.structure().envelope();
    std::vector<py::ssize_t> shape(env.begin(), env.end());
    if (t.shape().batched) shape.insert(shape.begin(), py::ssize_t(t.batch()));
    return shape;
}

// out[i, :n_1, :n_2, ...] for sample i of t.
py::tuple sample_slot(const RaggedTensor& t, std::int64_t i) {
    auto shape = t.structure().sample_shape(i);
    py::tuple idx(shape.size() + 1);
    idx[0] = py::int_(i);
    for (std::size_t a = 0; a < shape.size(); ++a)
        idx[a + 1] = py::slice(0, py::ssize_t(shape[a]), 1);
    return idx;
}

void copy_strided(const std::byte* src, const std::int64_t* strides,
                  const std::vector<std::int64_t>& shape, std::size_t es, std::byte* dst) {
    const std::size_t d = shape.size();
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    std::vector<std::int64_t> idx(d, 0);
    for (std::int64_t k = 0; k < n; ++k) {
        std::int64_t off = 0;
        for (std::size_t a = 0; a < d; ++a) off += idx[a] * strides[a];
        std::memcpy(dst + std::size_t(k) * es, src + off * std::int64_t(es), es);
        for (std::size_t a = d; a-- > 0;) {
            if (++idx[a] < shape[a]) break;
            idx[a] = 0;
        }
    }
}

} // namespace

// ---- dtypes ---------------------------------------------------------------------------------

py::dtype storage_dtype(DType t) {
    switch (t) {
    case DType::f16:
        return py::dtype("float16");
    case DType::bf16:
        return py::dtype("uint16");
    case DType::f32:
        return py::dtype("float32");
    case DType::f64:
        return py::dtype("float64");
    case DType::i32:
        return py::dtype("int32");
    case DType::i64:
        return py::dtype("int64");
    case DType::boolean:
        return py::dtype("bool");
    }
    fail("unknown dtype");
}

py::dtype value_dtype(DType t) {
    return t == DType::bf16 ? py::dtype("float32") : storage_dtype(t);
}

std::optional<DType> dtype_of(const py::dtype& d) {
    const char k = d.kind();
    const auto n = d.itemsize();
    if (k == 'f' && n == 2) return DType::f16;
    if (k == 'f' && n == 4) return DType::f32;
    if (k == 'f' && n == 8) return DType::f64;
    if (k == 'i' && n == 4) return DType::i32;
    if (k == 'i' && n == 8) return DType::i64;
    if (k == 'b') return DType::boolean;
    if (k == 'u' && n == 2) return DType::bf16;
    if (n == 2 && py::str(d.attr("name")).cast<std::string>() == "bfloat16") return DType::bf16;
    return std::nullopt;
}

DType dtype_arg(py::handle h) {
    if (py::isinstance<py::str>(h)) {
        std::string s = h.cast<std::string>();
        if (auto t = parse_dtype(s)) return *t;
        if (s == "bfloat16") return DType::bf16;
    }
    py::dtype d;
    try {
        d = py::dtype::from_args(py::reinterpret_borrow<py::object>(h));
    } catch (py::error_already_set&) {
        fail("unknown dtype ", py::str(h).cast<std::string>(),
             "; use f16, bf16, f32, f64, i32, i64 or bool");
    }
    if (auto t = dtype_of(d)) return *t;
    fail("NumPy dtype ", py::str(d).cast<std::string>(),
         " has no rag dtype; use f16, bf16, f32, f64, i32, i64 or bool");
}

DType infer_dtype(const py::array& a) {
    if (auto t = dtype_of(a.dtype())) return *t;
    fail("NumPy dtype ", py::str(a.dtype()).cast<std::string>(),
         " has no rag dtype (f16 bf16 f32 f64 i32 i64 bool); convert it or pass dtype=");
}

namespace {

std::string type_name(py::handle obj) {
    return py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
}

// a.astype(to, casting=casting), where NumPy's refusal (a float array asked to be i32 under
// same_kind, a str) is a rag.Error in rag's words; `obj` is what the user gave.
py::array cast_to(py::handle obj, const py::array& a, const py::dtype& to, DType t,
                  const char* casting) {
    try {
        return a.attr("astype")(to, "casting"_a = casting);
    } catch (py::error_already_set&) {
    }
    const std::string given =
        type_name(obj) + " of NumPy dtype " + py::str(a.dtype()).cast<std::string>();
    if (std::string_view("biufc").find(a.dtype().kind()) == std::string_view::npos)
        fail("expected numbers for ", dtype_name(t), ", got ", given);
    fail("expected ", dtype_name(t), ", got ", given, ", which does not convert without loss ",
         "(NumPy's '", casting, "' casting); convert it first");
}

} // namespace

py::array as_storage(py::handle obj, DType t, const char* casting) {
    py::module_ np = numpy();
    py::array a;
    try {
        a = np.attr("asarray")(obj);
    } catch (py::error_already_set&) { // a ragged nest of lists, say
        fail("expected an array of numbers for ", dtype_name(t), ", got a ", type_name(obj),
             " that NumPy cannot make an array of");
    }
    const auto src = dtype_of(a.dtype());
    // uint16 and ml_dtypes.bfloat16 hold bf16 bits: widen them before any numeric cast.
    if (src == DType::bf16) {
        a = a.attr("view")("uint16");
        if (t == DType::bf16) return a;
        a = widen(a, DType::bf16);
    }
    if (t != DType::bf16) {
        if (a.dtype().equal(storage_dtype(t))) return a;
        return cast_to(obj, a, storage_dtype(t), t, casting);
    }
    py::array_t<float, py::array::c_style> f = cast_to(obj, a, py::dtype("float32"), t, casting);
    py::array_t<std::uint16_t> out(shape_of(f));
    const float* in = f.data();
    std::uint16_t* o = out.mutable_data();
    for (py::ssize_t k = 0; k < f.size(); ++k) o[k] = float_to_bf16(in[k]);
    return out;
}

// ---- buffers and views ----------------------------------------------------------------------

py::object keep_alive(const Buffer& b) {
    auto* keep = new std::shared_ptr<std::byte>(b.data);
    return py::capsule(keep, [](void* p) { delete static_cast<std::shared_ptr<std::byte>*>(p); });
}

py::array view(const Buffer& b, DType t, std::vector<py::ssize_t> shape,
               std::vector<py::ssize_t> strides, std::size_t byte_offset) {
    return py::array(storage_dtype(t), std::move(shape), std::move(strides),
                     b.data.get() + byte_offset, keep_alive(b));
}

py::array widen(const py::array& a, DType t) {
    if (t != DType::bf16) return a;
    py::array_t<std::uint16_t, py::array::c_style | py::array::forcecast> bits(a);
    py::array_t<float> out(shape_of(bits));
    const std::uint16_t* in = bits.data();
    float* o = out.mutable_data();
    for (py::ssize_t k = 0; k < bits.size(); ++k) o[k] = bf16_to_float(in[k]);
    return out;
}

Buffer buffer_of(const py::array& a, DType t) {
    const std::size_t nbytes = std::size_t(a.size()) * dtype_size(t);
    const bool adoptable = (a.flags() & py::array::c_style) && a.writeable() && a.size() > 0 &&
                           element_aligned(a.data(), dtype_size(t)) &&
                           a.dtype().equal(storage_dtype(t));
    if (adoptable) {
        auto* keep = new py::object(a);
        py::array owned = a;
        auto* p = static_cast<std::byte*>(owned.mutable_data());
        return {std::shared_ptr<std::byte>(p, [keep](std::byte*) { release_object(keep); }), nbytes,
                nullptr};
    }
    Buffer b = Buffer::allocate(nbytes);
    if (nbytes) {
        py::array c = numpy().attr("asarray")(a, storage_dtype(t), "order"_a = "C");
        std::memcpy(b.data.get(), c.data(), nbytes);
    }
    return b;
}

// ---- tensors --------------------------------------------------------------------------------

namespace {
// The shape of values_view(t): dense, or [packed rows, the static extents].
std::vector<py::ssize_t> values_shape(const RaggedTensor& t) {
    const Structure& st = t.structure();
    std::vector<py::ssize_t> shape;
    if (!t.shape().batched) {
        auto s = st.sample_shape(0);
        shape.assign(s.begin(), s.end());
    } else {
        shape.push_back(py::ssize_t(st.rows()));
        for (int a = 0; a < st.rank(); ++a) {
            const Axis& ax = t.shape().axes[std::size_t(a)];
            if (ax.is_ragged()) continue;
            shape.push_back(
                py::ssize_t(st.batch() > 0 ? st.size(0, a) : std::max<std::int64_t>(ax.extent, 0)));
        }
    }
    return shape;
}
} // namespace

py::array values_view(const RaggedTensor& t) {
    auto shape = values_shape(t);
    auto strides = c_strides(shape, dtype_size(t.dtype()));
    t.expose(); // the view is writable: the values are the host's from now on
    return view(t.buffer(), t.dtype(), shape, strides, 0);
}

py::array sample_array(const RaggedTensor& t, std::int64_t i) {
    if (i < 0 || i >= t.batch())
        throw py::index_error("sample " + std::to_string(i) + " out of range for a batch of " +
                              std::to_string(t.batch()));
    return widen(sample_view(t, i), t.dtype());
}

py::array dense_array(const RaggedTensor& t) {
    if (t.shape().batched)
        fail("tensor ", t.schema().str(), " is batched; use to_list() or to_padded()");
    return sample_array(t, 0);
}

py::array to_padded(const RaggedTensor& t, py::handle value) {
    py::array out = numpy().attr("full")(padded_shape(t), value, value_dtype(t.dtype()));
    if (!t.shape().batched) {
        out.attr("__setitem__")(py::ellipsis(), dense_array(t));
        return out;
    }
    for (std::int64_t i = 0; i < t.batch(); ++i)
        out.attr("__setitem__")(sample_slot(t, i), sample_array(t, i));
    return out;
}

py::array mask(const RaggedTensor& t) {
    py::array out = numpy().attr("zeros")(padded_shape(t), "bool");
    if (!t.shape().batched) {
        out.attr("fill")(true);
        return out;
    }
    for (std::int64_t i = 0; i < t.batch(); ++i) out.attr("__setitem__")(sample_slot(t, i), true);
    return out;
}

RaggedTensor tensor_from_array(py::handle obj, DType t, bool batched, const char* casting) {
    // An array already in storage form (the common case: a params field, on every call) is
    // taken as it is, without the two NumPy calls.
    auto in_storage_form = [&] {
        if (!py::isinstance<py::array>(obj)) return false;
        auto given = py::reinterpret_borrow<py::array>(obj);
        return dtype_of(given.dtype()) == t && (given.flags() & py::array::c_style);
    };
    // asarray(order="C"), not ascontiguousarray: that one turns a scalar into shape (1,).
    py::array a =
        in_storage_form()
            ? py::reinterpret_borrow<py::array>(obj)
            : py::array(numpy().attr("asarray")(as_storage(obj, t, casting), "order"_a = "C"));
    std::vector<std::int64_t> shape(a.shape(), a.shape() + a.ndim());
    if (!batched) {
        std::vector<Axis> axes;
        for (auto e : shape) axes.push_back(Axis::fixed_of(e));
        return RaggedTensor(t, Structure::make(Shape{false, std::move(axes)}, 1, shape),
                            buffer_of(a, t));
    }
    if (shape.empty()) fail("a batched value needs a batch axis; got a scalar");
    const std::int64_t B = shape[0];
    std::vector<Axis> axes;
    std::vector<std::int64_t> sample(shape.begin() + 1, shape.end()), sizes;
    for (auto e : sample) axes.push_back(Axis::fixed_of(e));
    for (std::int64_t i = 0; i < B; ++i) sizes.insert(sizes.end(), sample.begin(), sample.end());
    return RaggedTensor(t, Structure::make(Shape{true, std::move(axes)}, B, std::move(sizes)),
                        buffer_of(a, t));
}

RaggedTensor pack(const std::vector<py::array>& samples, DType t, std::vector<Axis> axes) {
    const std::size_t d = axes.size();
    std::vector<std::int64_t> sizes;
    for (std::size_t i = 0; i < samples.size(); ++i) {
        const py::array& s = samples[i];
        if (std::size_t(s.ndim()) != d)
            fail("sample ", i, " has rank ", s.ndim(), " but ", d,
                 " per-sample axes were declared");
        sizes.insert(sizes.end(), s.shape(), s.shape() + s.ndim());
    }
    auto st = Structure::make(Shape{true, std::move(axes)}, std::int64_t(samples.size()),
                              std::move(sizes));
    RaggedTensor out = RaggedTensor::zeros(t, st);
    py::object copyto = numpy().attr("copyto");
    for (std::size_t i = 0; i < samples.size(); ++i)
        if (samples[i].size() > 0) copyto(sample_view(out, std::int64_t(i)), samples[i]);
    return out;
}

RaggedTensor with_axes(const RaggedTensor& t, std::vector<Axis> axes) {
    if (axes == t.shape().axes) return t;
    if (axes.size() != t.shape().axes.size()) fail("with_axes: rank mismatch");
    const bool same_layout = storage_order(axes) == storage_order(t.shape().axes);
    Shape shape{t.shape().batched, std::move(axes)};
    auto st = Structure::make(shape, t.batch(), t.structure().sizes());
    if (same_layout) return RaggedTensor(t.dtype(), st, t.buffer());
    RaggedTensor out = RaggedTensor::zeros(t.dtype(), st);
    py::object copyto = numpy().attr("copyto");
    for (std::int64_t i = 0; i < t.batch(); ++i)
        if (t.structure().sample_numel(i) > 0) copyto(sample_view(out, i), sample_view(t, i));
    return out;
}

std::string ragged_name(int k) {
    static const char* names[] = {"N", "M", "L", "K", "J", "I", "H", "G"};
    std::string n = names[k % 8];
    if (k >= 8) n += std::to_string(k / 8);
    return n;
}

std::vector<Axis> axes_from_spec(std::string spec, int rank, std::optional<DType>* dtype) {
    const auto open = spec.find('[');
    bool bracketed = open != std::string::npos;
    if (bracketed) {
        const auto close = spec.rfind(']');
        if (close == std::string::npos || close < open) fail("axis spec '", spec, "': missing ']'");
        std::string head = spec.substr(0, open);
        head.erase(std::remove_if(head.begin(), head.end(),
                                  [](unsigned char c) { return std::isspace(c); }),
                   head.end());
        if (!head.empty()) {
            auto t = parse_dtype(head);
            if (!t) fail("axis spec '", spec, "': unknown dtype '", head, "'");
            if (dtype) *dtype = *t;
        }
        spec = spec.substr(open + 1, close - open - 1);
    }
    auto axes = parse_axes(spec);
    const bool leading_name = !axes.empty() && axes[0].kind == AxisKind::symbolic;
    if (leading_name && (bracketed || (rank >= 0 && int(axes.size()) == rank + 1)))
        axes.erase(axes.begin());
    return axes;
}

// ---- DLPack ---------------------------------------------------------------------------------

namespace {

// What an export owns: the buffer, the shape and strides the DLTensor points at, and the
// managed struct of the kind the consumer asked for (one of the two is used).
struct ExportCtx {
    std::shared_ptr<const void> keep; // host bytes or a cuda::Buffer
    std::vector<std::int64_t> shape, strides;
    DLManagedTensor managed{};
    DLManagedTensorVersioned versioned{};
};

// The capsule names of each managed form.
template <class M> struct Capsule;
template <> struct Capsule<DLManagedTensor> {
    static constexpr const char* name = dlpack_capsule;
    static constexpr const char* used = dlpack_used_capsule;
};
template <> struct Capsule<DLManagedTensorVersioned> {
    static constexpr const char* name = dlpack_versioned_capsule;
    static constexpr const char* used = dlpack_used_versioned_capsule;
};

DLDataType dl_dtype(DType t) {
    switch (t) {
    case DType::f16:
        return {kDLFloat, 16, 1};
    case DType::bf16:
        return {kDLBfloat, 16, 1};
    case DType::f32:
        return {kDLFloat, 32, 1};
    case DType::f64:
        return {kDLFloat, 64, 1};
    case DType::i32:
        return {kDLInt, 32, 1};
    case DType::i64:
        return {kDLInt, 64, 1};
    case DType::boolean:
        return {kDLBool, 8, 1};
    }
    fail("unknown dtype");
}

std::optional<DType> from_dl_dtype(DLDataType d) {
    if (d.lanes != 1) return std::nullopt;
    if (d.code == kDLFloat && d.bits == 16) return DType::f16;
    if (d.code == kDLFloat && d.bits == 32) return DType::f32;
    if (d.code == kDLFloat && d.bits == 64) return DType::f64;
    if (d.code == kDLBfloat && d.bits == 16) return DType::bf16;
    if (d.code == kDLUInt && d.bits == 16) return DType::bf16; // bf16 bits, as rag exports to NumPy
    if (d.code == kDLInt && d.bits == 32) return DType::i32;
    if (d.code == kDLInt && d.bits == 64) return DType::i64;
    if (d.code == kDLBool && d.bits == 8) return DType::boolean;
    return std::nullopt;
}

template <class M> void capsule_destructor(PyObject* cap) {
    // Only a capsule nobody consumed still owns its tensor.
    if (!PyCapsule_IsValid(cap, Capsule<M>::name)) return;
    auto* m = static_cast<M*>(PyCapsule_GetPointer(cap, Capsule<M>::name));
    if (m && m->deleter) m->deleter(m);
}

// Producers' deleters may touch Python objects (NumPy's drop a reference), and rag releases
// buffers on its own threads.
template <class M> void call_deleter(M* m) {
    if (!m || !m->deleter || !Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    m->deleter(m);
}

template <class M> py::capsule export_capsule(M* m, ExportCtx* ctx) {
    m->manager_ctx = ctx;
    m->deleter = [](M* self) { delete static_cast<ExportCtx*>(self->manager_ctx); };
    PyObject* cap = PyCapsule_New(m, Capsule<M>::name, capsule_destructor<M>);
    if (!cap) {
        delete ctx;
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::capsule>(cap);
}

// A tensor taken over from a capsule: its DLTensor, whether the producer forbids writes, and
// the owner that calls the producer's deleter once rag no longer uses the memory.
struct Imported {
    const DLTensor* dl = nullptr;
    bool read_only = false;
    std::shared_ptr<void> owner;
};

template <class M> Imported take(py::handle cap) {
    auto* m = static_cast<M*>(PyCapsule_GetPointer(cap.ptr(), Capsule<M>::name));
    if (!m) throw py::error_already_set();
    Imported out;
    if constexpr (std::is_same_v<M, DLManagedTensorVersioned>) {
        // A newer major version may move every field after `version`: refuse it before taking
        // ownership, so the capsule still frees it.
        if (m->version.major != dlpack_major)
            fail("from_dlpack: DLPack ", m->version.major, ".", m->version.minor,
                 " tensor; rag reads DLPack ", dlpack_major, ".x and the legacy form");
        out.read_only = (m->flags & dlpack_flag_read_only) != 0;
    }
    if (PyCapsule_SetName(cap.ptr(), Capsule<M>::used) != 0) throw py::error_already_set();
    out.dl = &m->dl_tensor;
    out.owner = std::shared_ptr<M>(m, call_deleter<M>);
    return out;
}

// Refuses memory rag cannot read: CPU memory and CUDA device 0 (rag's device) only.
void check_importable(int type, int id) {
    if (type == kDLCPU || type == kDLCUDAHost) return;
    if (type != kDLCUDA)
        fail("from_dlpack: the tensor lives on DLPack device type ", type,
             "; rag takes CPU memory and CUDA device 0 (copy it there first)");
    if (id != 0)
        fail("from_dlpack: the tensor is on CUDA device ", id,
             "; rag runs on device 0 (copy it there first)");
    cuda::device(); // "CUDA unavailable: ..." without one
}

// A capsule from `obj`: the capsule itself, or a producer's export in the newest form rag reads.
py::object capsule_of(py::handle obj) {
    if (PyCapsule_CheckExact(obj.ptr())) return py::reinterpret_borrow<py::object>(obj);
    if (!py::hasattr(obj, "__dlpack__"))
        fail("from_dlpack: expected an object with __dlpack__ or a DLPack capsule, got ",
             py::str(py::type::of(obj)).cast<std::string>());
    py::dict kw;
    if (py::hasattr(obj, "__dlpack_device__")) {
        py::tuple dev = obj.attr("__dlpack_device__")();
        const int type = dev[0].cast<int>(), id = dev[1].cast<int>();
        check_importable(type, id);
        // The producer orders its pending work on the memory before rag's stream reads it.
        if (type == kDLCUDA) kw["stream"] = cuda::dlpack_stream();
    }
    try {
        py::dict versioned = kw.attr("copy")(); // `py::dict versioned = kw` would alias kw
        versioned["max_version"] = py::make_tuple(dlpack_major, dlpack_minor);
        return obj.attr("__dlpack__")(**versioned);
    } catch (py::error_already_set& e) {
        // Producers older than DLPack 1.0 take no max_version (the protocol's prescribed retry).
        if (!e.matches(PyExc_TypeError)) throw;
    }
    return obj.attr("__dlpack__")(**kw);
}

// The shape and strides (in elements) of values_view(t), which every export describes.
void describe_values(const RaggedTensor& t, ExportCtx& ctx) {
    const auto shape = values_shape(t);
    ctx.shape.assign(shape.begin(), shape.end());
    ctx.strides.assign(shape.size(), 1);
    for (std::size_t a = shape.size(); a-- > 1;) ctx.strides[a - 1] = ctx.strides[a] * ctx.shape[a];
}

// The capsule of the kind asked for over `data` on `device`, owning ctx.
py::capsule export_values(const RaggedTensor& t, ExportCtx* ctx, void* data, DLDeviceType device,
                          bool copied, bool versioned) {
    DLTensor dl{};
    dl.data = data;
    dl.device = {device, 0};
    dl.ndim = std::int32_t(ctx->shape.size());
    dl.dtype = dl_dtype(t.dtype());
    dl.shape = ctx->shape.data();
    dl.strides = ctx->strides.data();
    dl.byte_offset = 0;
    if (!versioned) {
        ctx->managed.dl_tensor = dl;
        return export_capsule(&ctx->managed, ctx);
    }
    // Writable: rag's own views of the values (`values`, the buffer protocol) are too.
    ctx->versioned.version = {dlpack_major, dlpack_minor};
    ctx->versioned.flags = copied ? dlpack_flag_is_copied : 0;
    ctx->versioned.dl_tensor = dl;
    return export_capsule(&ctx->versioned, ctx);
}

// The host bytes: made current, and the values' home from now on (the capsule is writable).
py::capsule export_host(const RaggedTensor& t, bool copy, bool versioned) {
    t.expose();
    auto ctx = std::make_unique<ExportCtx>();
    describe_values(t, *ctx);
    ctx->keep = t.buffer().data;
    std::byte* data = t.buffer().data.get();
    if (copy) {
        Buffer b = Buffer::allocate(t.buffer().nbytes);
        std::memcpy(b.data.get(), data, t.buffer().nbytes);
        ctx->keep = b.data;
        data = b.data.get();
    }
    return export_values(t, ctx.release(), data, kDLCPU, copy, versioned);
}

// The device copy, shared with the consumer (which may write it: rag's host reads download it
// again from then on), or a device-to-device copy; readable on `stream` once this returns.
py::capsule export_device(const RaggedTensor& t, bool copy, bool copied, bool versioned,
                          std::int64_t stream) {
    std::shared_ptr<const cuda::Buffer> dev = t.device_copy();
    if (!dev) fail("__dlpack__: the values were taken to the host meanwhile");
    if (copy) {
        const std::size_t bytes = std::size_t(t.numel()) * dtype_size(t.dtype());
        auto fresh = std::make_shared<cuda::Buffer>(jit::device_buffer(bytes));
        cuda::copy(*fresh, *dev, bytes);
        dev = std::move(fresh);
    } else {
        t.share_device();
    }
    cuda::order_before(stream);
    auto ctx = std::make_unique<ExportCtx>();
    describe_values(t, *ctx);
    ctx->keep = dev;
    return export_values(t, ctx.release(), reinterpret_cast<void*>(std::uintptr_t(dev->ptr())),
                         kDLCUDA, copy || copied, versioned);
}

// The consumer's stream of __dlpack__(stream=...) for a CUDA export: None is the legacy
// default stream (the protocol's rule); 0 is ambiguous and refused.
std::int64_t consumer_stream(py::handle stream) {
    if (stream.is_none()) return 1;
    const auto s = stream.cast<std::int64_t>();
    if (s == 0 || s < -1)
        throw py::buffer_error("__dlpack__: stream " + std::to_string(s) +
                               " is not a CUDA stream; pass 1 (legacy default), 2 (per-thread "
                               "default), a stream handle, or -1 (no synchronisation)");
    return s;
}

} // namespace

std::tuple<int, int> dlpack_device(const RaggedTensor& t) {
    return {t.device_copy() ? kDLCUDA : kDLCPU, 0};
}

py::capsule to_dlpack(const RaggedTensor& t, py::handle stream, py::handle max_version,
                      py::handle dl_device, py::handle copy) {
    // A consumer that reads DLPack 1.x says so with max_version (major, minor).
    const bool versioned =
        !max_version.is_none() &&
        py::tuple(py::reinterpret_borrow<py::object>(max_version))[0].cast<int>() >= 1;
    const bool must_copy = !copy.is_none() && copy.cast<bool>();
    const bool may_copy = copy.is_none() || must_copy;
    int where = std::get<0>(dlpack_device(t));
    if (!dl_device.is_none()) {
        py::tuple dev(py::reinterpret_borrow<py::object>(dl_device));
        const int type = dev[0].cast<int>(), id = dev[1].cast<int>();
        if (!(type == kDLCPU && id == 0) && !(type == kDLCUDA && id == 0))
            throw py::buffer_error("rag tensors live in CPU memory or on CUDA device 0; cannot "
                                   "export to DLPack device (" +
                                   std::to_string(type) + ", " + std::to_string(id) + ")");
        if (type == kDLCUDA && where == kDLCPU) {
            if (!may_copy)
                throw py::buffer_error("__dlpack__: the values are in CPU memory and copy=False "
                                       "forbids uploading them (to('cuda') first)");
            if (!cuda::available()) // the protocol's error for a device the producer cannot reach
                throw py::buffer_error("__dlpack__: CUDA unavailable: " +
                                       cuda::unavailable_reason());
            return export_device(jit::to_resident(t), false, true, versioned,
                                 consumer_stream(stream));
        }
        where = type;
    }
    if (where == kDLCPU) return export_host(t, must_copy, versioned);
    return export_device(t, must_copy, false, versioned, consumer_stream(stream));
}

RaggedTensor from_dlpack(py::handle obj, bool batched) {
    py::object cap = capsule_of(obj);
    Imported in;
    if (PyCapsule_IsValid(cap.ptr(), dlpack_versioned_capsule))
        in = take<DLManagedTensorVersioned>(cap);
    else if (PyCapsule_IsValid(cap.ptr(), dlpack_capsule))
        in = take<DLManagedTensor>(cap);
    else
        fail("from_dlpack: not a \"dltensor\" or \"dltensor_versioned\" capsule (already "
             "consumed?)");
    // From here on the tensor is ours: `in.owner` calls its deleter once nothing uses it.
    const DLTensor& dl = *in.dl;
    check_importable(dl.device.device_type, dl.device.device_id);
    auto t = from_dl_dtype(dl.dtype);
    if (!t)
        fail("from_dlpack: DLPack dtype (code ", int(dl.dtype.code), ", bits ", int(dl.dtype.bits),
             ", lanes ", dl.dtype.lanes, ") has no rag dtype");
    std::vector<std::int64_t> shape(dl.shape, dl.shape + dl.ndim);
    std::int64_t numel = 1;
    for (auto e : shape) numel *= e;
    std::vector<std::int64_t> strides(std::size_t(dl.ndim));
    bool contiguous = true;
    std::int64_t expect = 1;
    for (int a = dl.ndim - 1; a >= 0; --a) {
        strides[std::size_t(a)] = dl.strides ? dl.strides[a] : expect;
        if (shape[std::size_t(a)] != 1 && strides[std::size_t(a)] != expect) contiguous = false;
        expect *= shape[std::size_t(a)];
    }
    StructurePtr st;
    if (!batched) {
        std::vector<Axis> axes;
        for (auto e : shape) axes.push_back(Axis::fixed_of(e));
        st = Structure::make(Shape{false, std::move(axes)}, 1, shape);
    } else {
        if (shape.empty()) fail("from_dlpack: a batched value needs a batch axis; got a scalar");
        std::vector<Axis> axes;
        std::vector<std::int64_t> sample(shape.begin() + 1, shape.end()), sizes;
        for (auto e : sample) axes.push_back(Axis::fixed_of(e));
        for (std::int64_t i = 0; i < shape[0]; ++i)
            sizes.insert(sizes.end(), sample.begin(), sample.end());
        st = Structure::make(Shape{true, std::move(axes)}, shape[0], std::move(sizes));
    }
    const std::size_t es = dtype_size(*t), bytes = std::size_t(numel) * es;
    auto* data = static_cast<std::byte*>(dl.data) + dl.byte_offset;
    if (dl.device.device_type == kDLCUDA && numel > 0) {
        if (!contiguous)
            fail("from_dlpack: a strided CUDA tensor; rag takes contiguous device memory (torch: "
                 ".contiguous() first)");
        // Shared with the producer, which may write it (rag never writes its inputs): host reads
        // download it each time. The kernels stage 16-byte vectors (jit/kir_gpu.hpp), so memory
        // less aligned than that is copied into rag's own, once.
        auto borrowed = std::shared_ptr<const cuda::Buffer>(
            new cuda::Buffer(cuda::Buffer::borrow(std::uint64_t(std::uintptr_t(data)), bytes)),
            [owner = in.owner](const cuda::Buffer* b) { delete b; });
        in.owner.reset();
        if (std::uintptr_t(data) % 16 == 0) {
            RaggedTensor out = jit::resident(std::move(borrowed), *t, st);
            out.share_device();
            return out;
        }
        cuda::Buffer own = jit::device_buffer(bytes);
        cuda::copy(own, *borrowed, bytes);
        cuda::synchronize(); // before the producer may free its memory
        return jit::resident(std::move(own), *t, st);
    }
    Buffer buf;
    // Read-only memory is copied: rag's views of a tensor's values are writable, so adopting it
    // would hand out write access the producer forbade (the rule buffer_of applies to arrays).
    if (contiguous && numel > 0 && element_aligned(data, es) && !in.read_only) {
        buf = {std::shared_ptr<std::byte>(in.owner, data), bytes, nullptr};
    } else {
        buf = Buffer::allocate(bytes);
        // Contiguous memory (misaligned or read-only) is one memcpy; the element loop is for
        // strided views only (it costs ~8 ns an element).
        if (contiguous && numel > 0)
            std::memcpy(buf.data.get(), data, bytes);
        else if (numel > 0)
            copy_strided(data, strides.data(), shape, es, buf.data.get());
        in.owner.reset();
    }
    return RaggedTensor(*t, st, std::move(buf));
}

// ---- packed values and lengths ----------------------------------------------------------------

py::array_t<std::int64_t, py::array::c_style> integer_array(py::handle obj,
                                                            const std::string& what) {
    py::array a;
    try {
        a = numpy().attr("asarray")(obj);
    } catch (py::error_already_set&) {
        fail(what, " must be a sequence of integers, got a ", type_name(obj));
    }
    // Floats are refused, not truncated: lengths of 2.5 are a mistake, not 2.
    if (a.size() > 0 && a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
        fail(what, " must be a sequence of integers, got NumPy dtype ",
             py::str(a.dtype()).cast<std::string>(), " values");
    return py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>(a);
}

namespace {

// The distinct ragged names of `axes`, in order of first appearance.
std::vector<std::string> ragged_names(const std::vector<Axis>& axes) {
    std::vector<std::string> names;
    for (const auto& a : axes)
        if (a.is_ragged() && std::find(names.begin(), names.end(), a.name) == names.end())
            names.push_back(a.name);
    return names;
}

std::vector<std::int64_t> int_vector(py::handle obj, const std::string& what) {
    // A list of Python ints (the usual lengths) is read directly: NumPy's conversion costs
    // more than the rest of a from_packed call.
    if (py::isinstance<py::list>(obj)) {
        std::vector<std::int64_t> v;
        for (py::handle e : obj) {
            int overflow = 0;
            const long long x =
                PyLong_CheckExact(e.ptr()) ? PyLong_AsLongLongAndOverflow(e.ptr(), &overflow) : 0;
            if (!PyLong_CheckExact(e.ptr()) || overflow) { // NumPy's conversion says what
                v.clear();
                break;
            }
            v.push_back(std::int64_t(x));
            if (v.back() < 0)
                fail("from_packed: ", what, "[", v.size() - 1, "] is negative (", v.back(), ")");
        }
        if (v.size() == py::len(obj)) return v;
    }
    auto a = integer_array(obj, "from_packed: " + what);
    if (a.ndim() != 1)
        fail("from_packed: ", what, " must be one-dimensional, got ", a.ndim(), " dimensions");
    std::vector<std::int64_t> v(a.data(), a.data() + a.size());
    for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] < 0) fail("from_packed: ", what, "[", i, "] is negative (", v[i], ")");
    return v;
}

} // namespace

RaggedTensor from_packed(py::handle values, py::handle lengths, const std::string& spec,
                         py::handle dtype) {
    std::optional<DType> want;
    std::vector<Axis> axes = axes_from_spec(spec, -1, &want);
    if (!dtype.is_none()) want = dtype_arg(dtype);
    const auto names = ragged_names(axes);
    if (names.empty())
        fail("from_packed: the spec '", spec,
             "' has no ragged axis; use rag.tensor(values, batched=True)");
    // One row of B extents per ragged name: a mapping by name, a list in order, or one row.
    std::map<std::string, std::vector<std::int64_t>> by_name;
    if (py::isinstance<py::dict>(lengths)) {
        for (const auto& n : names) {
            py::dict d = py::reinterpret_borrow<py::dict>(lengths);
            if (!d.contains(n)) fail("from_packed: lengths has no entry for ~", n);
            by_name[n] = int_vector(d[py::str(n)], "lengths['" + n + "']");
        }
    } else {
        // One row or one row per name: a list of ints is one row without asking NumPy.
        auto one_row_of_ints = [&] {
            return py::isinstance<py::list>(lengths) && py::len(lengths) > 0 &&
                   PyLong_CheckExact(py::reinterpret_borrow<py::list>(lengths)[0].ptr());
        };
        auto rows_given = [&] {
            py::array probe = numpy().attr("asarray")(lengths, "dtype"_a = "object");
            return probe.ndim() == 2 || (probe.ndim() == 1 && probe.size() > 0 &&
                                         py::hasattr(probe[py::int_(0)], "__len__"));
        };
        const bool rows = !one_row_of_ints() && rows_given();
        if (!rows) {
            if (names.size() != 1)
                fail("from_packed: the spec has ", names.size(),
                     " ragged names; give one row of lengths per name (or a dict)");
            by_name[names[0]] = int_vector(lengths, "lengths");
        } else {
            py::list list = py::module_::import("builtins").attr("list")(lengths);
            if (list.size() != names.size())
                fail("from_packed: ", list.size(), " rows of lengths for ", names.size(),
                     " ragged names");
            for (std::size_t k = 0; k < names.size(); ++k)
                by_name[names[k]] = int_vector(list[k], "lengths[" + std::to_string(k) + "]");
        }
    }
    const std::size_t B = by_name.begin()->second.size();
    for (const auto& [n, v] : by_name)
        if (v.size() != B)
            fail("from_packed: ~", n, " has ", v.size(), " lengths, ~", by_name.begin()->first,
                 " has ", B);
    std::vector<std::int64_t> sizes;
    for (std::size_t i = 0; i < B; ++i)
        for (const auto& a : axes) sizes.push_back(a.is_ragged() ? by_name[a.name][i] : a.extent);
    auto st = Structure::make(Shape{true, axes}, std::int64_t(B), std::move(sizes));
    // The values: adopted from a DLPack producer or an array when they can be, else copied once.
    const bool dl = PyCapsule_CheckExact(values.ptr()) ||
                    (py::hasattr(values, "__dlpack__") && !py::isinstance<py::array>(values));
    RaggedTensor v;
    if (dl) {
        v = from_dlpack(values, false);
    } else {
        try {
            v = tensor_from_array(values, want ? *want : infer_dtype(py::array::ensure(values)),
                                  false, "same_kind");
        } catch (const Error& e) { // the dtype of the spec or dtype= that the values do not fit
            fail("from_packed: values: ", e.what());
        }
    }
    if (want && v.dtype() != *want) v = v.astype(*want);
    if (v.numel() != st->numel())
        fail("from_packed: the values hold ", v.numel(), " elements; the lengths and '", spec,
             "' need ", st->numel(),
             " (rows = the per-sample products of the ragged extents, "
             "times the static extents)");
    RaggedTensor out = v.with_structure(st); // device-resident values stay where they are
    // Flat values are fine; shaped ones must be the packed layout, so a transposed array whose
    // element count happens to agree is not taken silently.
    const auto& given = v.structure().sizes();
    if (given.size() > 1) {
        const auto shape = values_shape(out);
        const std::vector<std::int64_t> expect(shape.begin(), shape.end());
        if (given != expect) {
            std::string e, g;
            for (auto x : expect) e += (e.empty() ? "" : ", ") + std::to_string(x);
            for (auto x : given) g += (g.empty() ? "" : ", ") + std::to_string(x);
            fail("from_packed: the values have shape [", g, "]; the lengths and '", spec,
                 "' pack as [", e, "] (or give them flat)");
        }
    }
    return out;
}

py::tuple packed(const RaggedTensor& t) {
    if (!t.shape().batched) fail("packed: ", t.schema().str(), " is not batched");
    py::list rows;
    std::vector<std::string> seen;
    const auto& axes = t.shape().axes;
    for (std::size_t a = 0; a < axes.size(); ++a) {
        if (!axes[a].is_ragged() || std::find(seen.begin(), seen.end(), axes[a].name) != seen.end())
            continue;
        seen.push_back(axes[a].name);
        auto l = t.structure().lengths(int(a));
        py::array_t<std::int64_t> arr(py::ssize_t(l.size()));
        std::copy(l.begin(), l.end(), arr.mutable_data());
        rows.append(arr);
    }
    return py::make_tuple(values_view(t), rows);
}

} // namespace rag::bind
