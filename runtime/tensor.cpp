#include "runtime/tensor.hpp"

#include "runtime/cuda.hpp"
#include "runtime/error.hpp"
#include "runtime/memory.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace rag {

std::int64_t DenseArray::numel() const {
    return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

DenseArray DenseArray::zeros(DType t, std::vector<std::int64_t> shape) {
    // Extents come from users (a static extent of 2^63 - 1 type-checks): a product that
    // overflows is an error naming the shape, not a wrapped size.
    std::int64_t bytes = std::int64_t(dtype_size(t));
    for (std::int64_t e : shape)
        if (e < 0 || __builtin_mul_overflow(bytes, e, &bytes) || bytes > (std::int64_t(1) << 56)) {
            std::string dims;
            for (std::int64_t d : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
            fail("out of memory: an array of shape (", dims,
                 ") is larger than any allocation can be");
        }
    DenseArray a{t, std::move(shape), {}};
    a.bytes.assign(std::size_t(bytes), std::byte{0});
    return a;
}

DenseArray DenseArray::from_f64(DType t, std::vector<std::int64_t> shape,
                                const std::vector<double>& values) {
    DenseArray a = zeros(t, std::move(shape));
    if (std::int64_t(values.size()) != a.numel())
        fail("array of ", a.numel(), " elements given ", values.size(), " values");
    for (std::size_t i = 0; i < values.size(); ++i) store_from_f64(a.bytes.data(), t, i, values[i]);
    return a;
}

std::vector<double> DenseArray::to_f64() const {
    std::vector<double> out(static_cast<std::size_t>(numel()));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = at(std::int64_t(i));
    return out;
}

Buffer Buffer::allocate_uninitialized(std::size_t nbytes) {
    void* p = memory::acquire(nbytes);
    return {std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                       [nbytes](std::byte* q) { memory::release(q, nbytes); }),
            nbytes, nullptr};
}

Buffer Buffer::allocate(std::size_t nbytes) {
    Buffer b = allocate_uninitialized(nbytes);
    std::memset(b.data.get(), 0, nbytes);
    return b;
}

void RaggedTensor::download() const {
    Residency& r = *values_.residency;
    if (r.host_current.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.host_current.load(std::memory_order_relaxed)) return;
    cuda::download(values_.data.get(), *r.device, values_.nbytes);
    if (!r.shared) r.host_current.store(true, std::memory_order_release);
}

std::shared_ptr<const cuda::Buffer> RaggedTensor::device_copy() const {
    if (!values_.residency) return nullptr;
    std::lock_guard<std::mutex> lock(values_.residency->mu);
    return values_.residency->device;
}

void RaggedTensor::expose() const {
    if (!values_.residency) return;
    download();
    Residency& r = *values_.residency;
    std::lock_guard<std::mutex> lock(r.mu);
    r.device.reset();
    r.shared = false; // the host bytes are the values now
    r.host_current.store(true, std::memory_order_release);
}

void RaggedTensor::share_device() const {
    if (!device_copy()) fail("share_device: the values have no device copy");
    Residency& r = *values_.residency;
    std::lock_guard<std::mutex> lock(r.mu);
    r.shared = true;
    r.host_current.store(false, std::memory_order_release);
}

RaggedTensor::RaggedTensor(DType dtype, StructurePtr st, Buffer values)
    : dtype_(dtype), st_(std::move(st)), values_(std::move(values)) {
    if (values_.nbytes < std::size_t(st_->numel()) * dtype_size(dtype_))
        fail("buffer of ", values_.nbytes, " bytes is too small for ", st_->numel(), " ",
             dtype_name(dtype_), " values");
}

RaggedTensor RaggedTensor::zeros(DType dtype, StructurePtr st) {
    std::size_t n = std::size_t(st->numel()) * dtype_size(dtype);
    return RaggedTensor(dtype, std::move(st), Buffer::allocate(n));
}

RaggedTensor RaggedTensor::from_f64(DType dtype, StructurePtr st, const std::vector<double>& v) {
    if (std::int64_t(v.size()) != st->numel())
        fail("structure holds ", st->numel(), " values but ", v.size(), " were given");
    RaggedTensor t = zeros(dtype, std::move(st));
    for (std::size_t i = 0; i < v.size(); ++i) store_from_f64(t.mutable_data(), dtype, i, v[i]);
    return t;
}

namespace {

// Calls fn(flat_logical_index_in_sample, storage_index) for every element of sample i.
template <class Fn> void for_each_element(const Structure& st, std::int64_t i, Fn&& fn) {
    const int d = st.rank();
    auto shape = st.sample_shape(i);
    auto strides = st.sample_strides(i);
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    std::vector<std::int64_t> idx(std::size_t(d), 0);
    const std::int64_t base = st.sample_begin(i);
    for (std::int64_t flat = 0; flat < n; ++flat) {
        std::int64_t off = 0;
        for (int a = 0; a < d; ++a) off += idx[a] * strides[a];
        fn(flat, base + off, idx);
        for (int a = d - 1; a >= 0; --a) {
            if (++idx[a] < shape[a]) break;
            idx[a] = 0;
        }
    }
}

} // namespace

RaggedTensor RaggedTensor::from_list(const std::vector<DenseArray>& samples, std::vector<Axis> axes,
                                     DType empty_dtype) {
    const int d = int(axes.size());
    DType t = samples.empty() ? empty_dtype : samples[0].dtype;
    std::vector<std::int64_t> sizes;
    for (std::size_t i = 0; i < samples.size(); ++i) {
        const DenseArray& s = samples[i];
        if (s.dtype != t)
            fail("sample ", i, " has dtype ", dtype_name(s.dtype), " but sample 0 has ",
                 dtype_name(t));
        if (int(s.shape.size()) != d)
            fail("sample ", i, " has rank ", s.shape.size(), " but ", d, " axes were declared");
        if (std::int64_t(s.bytes.size()) != s.numel() * std::int64_t(dtype_size(t)))
            fail("sample ", i, " holds ", s.bytes.size(), " bytes for ", s.numel(), " elements");
        sizes.insert(sizes.end(), s.shape.begin(), s.shape.end());
    }
    auto st = Structure::make(Shape{true, std::move(axes)}, std::int64_t(samples.size()),
                              std::move(sizes));
    RaggedTensor out = zeros(t, st);
    const std::size_t es = dtype_size(t);
    for (std::size_t i = 0; i < samples.size(); ++i)
        for_each_element(*st, std::int64_t(i), [&](std::int64_t flat, std::int64_t at, auto&) {
            std::memcpy(static_cast<std::byte*>(out.mutable_data()) + at * es,
                        samples[i].bytes.data() + flat * es, es);
        });
    return out;
}

RaggedTensor RaggedTensor::from_list(const std::vector<DenseArray>& samples) {
    if (samples.empty()) fail("cannot infer axes from an empty list; declare them");
    const std::size_t d = samples[0].shape.size();
    static const char* names[] = {"N", "M", "L", "K", "J", "I", "H", "G"};
    std::vector<Axis> axes;
    int next = 0;
    for (std::size_t a = 0; a < d; ++a) {
        bool varies = false;
        for (const auto& s : samples)
            if (s.shape.size() != d)
                fail("samples have different ranks: ", s.shape.size(), " vs ", d);
            else
                varies |= s.shape[a] != samples[0].shape[a];
        if (varies)
            axes.push_back(Axis::ragged_of(names[next++ % 8]));
        else
            axes.push_back(Axis::fixed_of(samples[0].shape[a]));
    }
    return from_list(samples, std::move(axes));
}

RaggedTensor RaggedTensor::dense(const DenseArray& a) {
    std::vector<Axis> axes;
    for (auto e : a.shape) axes.push_back(Axis::fixed_of(e));
    auto st = Structure::make(Shape{false, std::move(axes)}, 1, a.shape);
    Buffer b = Buffer::allocate(a.bytes.size());
    std::memcpy(b.data.get(), a.bytes.data(), a.bytes.size());
    return RaggedTensor(a.dtype, std::move(st), std::move(b));
}

RaggedTensor RaggedTensor::from_padded(const DenseArray& padded, std::vector<Axis> axes,
                                       const std::vector<std::vector<std::int64_t>>& lengths) {
    const int d = int(axes.size());
    if (std::int64_t(padded.bytes.size()) !=
        padded.numel() * std::int64_t(dtype_size(padded.dtype)))
        fail("from_padded: an array of ", padded.numel(), " elements holds ", padded.bytes.size(),
             " bytes");
    if (int(padded.shape.size()) != d + 1)
        fail("from_padded: array of rank ", padded.shape.size(), " for ", d,
             " per-sample axes + B");
    const std::int64_t B = padded.shape[0];
    std::vector<std::int64_t> sizes;
    for (std::int64_t i = 0; i < B; ++i) {
        std::size_t r = 0;
        for (int a = 0; a < d; ++a) {
            std::int64_t n = padded.shape[a + 1];
            if (axes[a].is_ragged()) {
                if (r >= lengths.size() || std::int64_t(lengths[r].size()) != B)
                    fail("from_padded: give B = ", B, " lengths for each of the ragged axes");
                n = lengths[r++][i];
                if (n > padded.shape[a + 1])
                    fail("from_padded: sample ", i, " has length ", n, " on axis ", a + 1,
                         " beyond the padded extent ", padded.shape[a + 1]);
            }
            sizes.push_back(n);
        }
    }
    auto st = Structure::make(Shape{true, std::move(axes)}, B, std::move(sizes));
    RaggedTensor out = zeros(padded.dtype, st);
    const std::size_t es = dtype_size(padded.dtype);
    std::vector<std::int64_t> pstride(std::size_t(d + 1), 1);
    for (int a = d - 1; a >= 0; --a) pstride[a] = pstride[a + 1] * padded.shape[a + 1];
    for (std::int64_t i = 0; i < B; ++i)
        for_each_element(*st, i, [&](std::int64_t, std::int64_t at, auto& idx) {
            std::int64_t src = i * pstride[0];
            for (int a = 0; a < d; ++a) src += idx[a] * pstride[a + 1];
            std::memcpy(static_cast<std::byte*>(out.mutable_data()) + at * es,
                        padded.bytes.data() + src * es, es);
        });
    return out;
}

std::vector<DenseArray> RaggedTensor::to_list() const {
    std::vector<DenseArray> out;
    const std::size_t es = dtype_size(dtype_);
    for (std::int64_t i = 0; i < batch(); ++i) {
        auto s = st_->sample_shape(i);
        DenseArray a = DenseArray::zeros(dtype_, {s.begin(), s.end()});
        for_each_element(*st_, i, [&](std::int64_t flat, std::int64_t at, auto&) {
            std::memcpy(a.bytes.data() + flat * es, static_cast<const std::byte*>(data()) + at * es,
                        es);
        });
        out.push_back(std::move(a));
    }
    return out;
}

DenseArray RaggedTensor::to_dense() const {
    if (shape().batched) fail("to_dense: value is batched; use to_list or to_padded");
    return to_list().at(0);
}

namespace {

// Writes every valid element into a [B, envelope...] array via `put(dst_flat, src_storage)`.
template <class Put> void scatter_padded(const Structure& st, Put&& put) {
    const int d = st.rank();
    auto env = st.envelope();
    std::vector<std::int64_t> pstride(std::size_t(d), 1);
    for (int a = d - 2; a >= 0; --a) pstride[a] = pstride[a + 1] * env[a + 1];
    std::int64_t per_sample = d ? pstride[0] * env[0] : 1;
    for (std::int64_t i = 0; i < st.batch(); ++i)
        for_each_element(st, i, [&](std::int64_t, std::int64_t at, auto& idx) {
            std::int64_t dst = i * per_sample;
            for (int a = 0; a < d; ++a) dst += idx[a] * pstride[a];
            put(dst, at);
        });
}

std::vector<std::int64_t> padded_shape(const Structure& st) {
    auto env = st.envelope();
    if (st.shape().batched) env.insert(env.begin(), st.batch());
    return env;
}

} // namespace

DenseArray RaggedTensor::to_padded(double value) const {
    DenseArray out = DenseArray::zeros(dtype_, padded_shape(*st_));
    for (std::int64_t k = 0; k < out.numel(); ++k)
        store_from_f64(out.bytes.data(), dtype_, k, value);
    const std::size_t es = dtype_size(dtype_);
    scatter_padded(*st_, [&](std::int64_t dst, std::int64_t src) {
        std::memcpy(out.bytes.data() + dst * es, static_cast<const std::byte*>(data()) + src * es,
                    es);
    });
    return out;
}

DenseArray RaggedTensor::mask() const {
    DenseArray out = DenseArray::zeros(DType::boolean, padded_shape(*st_));
    scatter_padded(*st_, [&](std::int64_t dst, std::int64_t) { out.bytes[dst] = std::byte{1}; });
    return out;
}

std::vector<double> RaggedTensor::to_f64() const {
    std::vector<double> out(static_cast<std::size_t>(numel()));
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = load_as_f64(data(), dtype_, k);
    return out;
}

RaggedTensor RaggedTensor::astype(DType t) const {
    return from_f64(t, st_, to_f64());
}

double RaggedTensor::item() const {
    if (numel() != 1) fail("item: tensor ", schema().str(), " holds ", numel(), " values, not 1");
    return load_as_f64(data(), dtype_, 0);
}

std::string describe(const RaggedTensor& t) {
    std::string out = t.schema().str();
    if (!t.shape().batched) return out;
    out += " B=" + std::to_string(t.batch());
    std::vector<std::string> shown;
    for (int a = 0; a < t.structure().rank(); ++a) {
        const std::string& name = t.shape().axes[a].name;
        if (!t.shape().axes[a].is_ragged() || std::count(shown.begin(), shown.end(), name))
            continue;
        shown.push_back(name);
        out += " " + t.shape().axes[a].name + "=[";
        auto l = t.structure().lengths(a);
        for (std::size_t i = 0; i < l.size(); ++i) out += (i ? ", " : "") + std::to_string(l[i]);
        out += "]";
    }
    return out;
}

} // namespace rag
