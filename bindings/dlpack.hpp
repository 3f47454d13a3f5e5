// The DLPack C ABI (https://dmlc.github.io/dlpack/latest/c_api.html): only what rag needs to
// export and import CPU tensors. Two managed forms: the legacy `DLManagedTensor` (dlpack.h
// v0.8, capsule "dltensor") that every consumer accepts, and DLPack 1.x's
// `DLManagedTensorVersioned` (capsule "dltensor_versioned") with its version and flags, which a
// consumer asks for with `__dlpack__(max_version=(1, x))`. Layouts must match dlpack.h exactly;
// both are stable ABIs.
#pragma once
#include <cstdint>

extern "C" {

enum DLDeviceType : std::int32_t {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
};

struct DLDevice {
    DLDeviceType device_type;
    std::int32_t device_id;
};

enum DLDataTypeCode : std::uint8_t {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6,
};

struct DLDataType {
    std::uint8_t code;
    std::uint8_t bits;
    std::uint16_t lanes;
};

struct DLTensor {
    void* data;
    DLDevice device;
    std::int32_t ndim;
    DLDataType dtype;
    std::int64_t* shape;
    std::int64_t* strides; // in elements; null means compact row-major
    std::uint64_t byte_offset;
};

struct DLManagedTensor {
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(DLManagedTensor* self);
};

// DLPack 1.x. The version says which ABI the producer implements; only the major number matters
// to a consumer (minor versions add dtypes and flags, never move fields).
struct DLPackVersion {
    std::uint32_t major;
    std::uint32_t minor;
};

struct DLManagedTensorVersioned {
    DLPackVersion version;
    void* manager_ctx;
    void (*deleter)(DLManagedTensorVersioned* self);
    std::uint64_t flags;
    DLTensor dl_tensor;
};

} // extern "C"

namespace rag::bind {
// Capsule names of the Python protocol: a fresh export, and one a consumer has taken over.
inline constexpr const char* dlpack_capsule = "dltensor";
inline constexpr const char* dlpack_used_capsule = "used_dltensor";
inline constexpr const char* dlpack_versioned_capsule = "dltensor_versioned";
inline constexpr const char* dlpack_used_versioned_capsule = "used_dltensor_versioned";

// The version rag's versioned exports declare (it uses nothing DLPack 1.1 added).
inline constexpr std::uint32_t dlpack_major = 1;
inline constexpr std::uint32_t dlpack_minor = 0;
// DLManagedTensorVersioned::flags: the consumer must not write through the tensor; the producer
// copied the data for this export.
inline constexpr std::uint64_t dlpack_flag_read_only = 1u << 0;
inline constexpr std::uint64_t dlpack_flag_is_copied = 1u << 1;
} // namespace rag::bind
