// RaggedTensor: packed values + a shared Structure + a dtype. Dense values are the special
// cases "batched with no ragged axis" (f32[B, 4]) and "unbatched" (f32[384, 128], f32[]).
// DenseArray is one plain n-dimensional array: a sample, a padded envelope, a weight.
#pragma once
#include "runtime/structure.hpp"

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace rag {

namespace cuda {
class Buffer;
}

struct DenseArray {
    DType dtype = DType::f32;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> bytes;

    static DenseArray zeros(DType t, std::vector<std::int64_t> shape);
    static DenseArray from_f64(DType t, std::vector<std::int64_t> shape,
                               const std::vector<double>& values);
    std::int64_t numel() const;
    std::vector<double> to_f64() const;
    double at(std::int64_t flat) const { return load_as_f64(bytes.data(), dtype, flat); }
};

// Where the bytes of a buffer the GPU tier computed are current (jit/gpu_function.hpp): its copy
// in device memory, and whether the host bytes are too (they are downloaded on the first host
// access). Tensors that share the buffer share this, so a result passed into the next call is
// not uploaded again. The device copy is dropped once the host bytes may be written
// (RaggedTensor::mutable_data, expose). Host-only buffers have none.
struct Residency {
    std::mutex mu;
    std::shared_ptr<const cuda::Buffer> device;
    std::atomic<bool> host_current{false}; // read without the lock once true
    // The device copy is shared with another library (DLPack, RaggedTensor::share_device),
    // which may write it at any time: the host bytes are never current, every host access
    // downloads. Guarded by mu.
    bool shared = false;
};

// Reference-counted, 64-byte-aligned storage; tensors that alias it share ownership.
struct Buffer {
    std::shared_ptr<std::byte> data;
    std::size_t nbytes = 0;
    std::shared_ptr<Residency> residency;       // GPU-tier results only
    static Buffer allocate(std::size_t nbytes); // zero-filled
    // Contents unspecified: for kernels that write every byte (no second pass to zero it).
    static Buffer allocate_uninitialized(std::size_t nbytes);
};

class RaggedTensor {
  public:
    RaggedTensor() = default;
    RaggedTensor(DType dtype, StructurePtr st, Buffer values);

    static RaggedTensor zeros(DType dtype, StructurePtr st);
    static RaggedTensor from_f64(DType dtype, StructurePtr st, const std::vector<double>& values);
    // A batch from per-sample arrays. `axes` declares every per-sample axis: a ragged name
    // keeps the axis ragged even when all samples agree on its extent. `empty_dtype` is the
    // dtype of an empty batch (otherwise the samples' dtype).
    static RaggedTensor from_list(const std::vector<DenseArray>& samples, std::vector<Axis> axes,
                                  DType empty_dtype = DType::f32);
    static RaggedTensor from_list(const std::vector<DenseArray>& samples, std::string_view axes) {
        return from_list(samples, parse_axes(axes));
    }
    // Without a declaration: the axes whose extent varies become ragged (named N, M, L, K, ...).
    static RaggedTensor from_list(const std::vector<DenseArray>& samples);
    // An unbatched dense value (a weight, a scalar).
    static RaggedTensor dense(const DenseArray& a);
    // Inverse of to_padded: `padded` is [B, e_1..e_d]; `lengths` holds one vector of B extents
    // per ragged axis of `axes`, in order.
    static RaggedTensor from_padded(const DenseArray& padded, std::vector<Axis> axes,
                                    const std::vector<std::vector<std::int64_t>>& lengths);

    DType dtype() const { return dtype_; }
    Schema schema() const { return {dtype_, st_->shape()}; }
    const Shape& shape() const { return st_->shape(); }
    const Structure& structure() const { return *st_; }
    const StructurePtr& structure_ptr() const { return st_; }
    std::int64_t batch() const { return st_->batch(); }
    std::int64_t numel() const { return st_->numel(); }
    // The packed values in host memory (a device-resident buffer is downloaded first).
    const void* data() const { return on_host().data.get(); }
    // For writing them on the host: a device copy is dropped, since it would go stale.
    void* mutable_data() {
        if (values_.residency) expose();
        return values_.data.get();
    }
    const Buffer& buffer() const { return on_host(); }
    // The current device copy of the values, or null (host-only, or written on the host since).
    std::shared_ptr<const cuda::Buffer> device_copy() const;
    // The same values (their buffer and residency, no copy) under another structure with as
    // many elements.
    RaggedTensor with_structure(StructurePtr st) const { return {dtype_, std::move(st), values_}; }
    // The host bytes are handed out writable (NumPy views, DLPack): make them current and drop
    // the device copy, which they could make stale.
    void expose() const;
    // The device copy is handed to (or taken from) another library that may write it: from now
    // on every host access downloads it again. Requires a device copy.
    void share_device() const;

    std::vector<DenseArray> to_list() const;
    DenseArray to_padded(double value) const; // [B, envelope...] (or the array, unbatched)
    DenseArray mask() const;                  // bool, same shape as to_padded, true = valid
    DenseArray to_dense() const;              // the one array of an unbatched value
    std::vector<double> to_f64() const;       // packed values
    RaggedTensor astype(DType t) const;
    double item() const; // the value of a one-element tensor

  private:
    const Buffer& on_host() const {
        if (values_.residency) download();
        return values_;
    }
    void download() const;

    DType dtype_ = DType::f32;
    StructurePtr st_;
    Buffer values_;
};

std::string describe(const RaggedTensor& t); // schema, batch, lengths: for messages and demos

} // namespace rag
