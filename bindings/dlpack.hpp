// The DLPack C ABI (https://dmlc.github.io/dlpack/latest/c_api.html), the unversioned
// `DLManagedTensor` form that every consumer accepts: only what rag needs to export and import
// CPU tensors. The layout must match dlpack.h v0.8 exactly; it is a stable ABI.
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

} // extern "C"

namespace rag::bind {
// Capsule names of the Python protocol: a fresh export, and one a consumer has taken over.
inline constexpr const char* dlpack_capsule = "dltensor";
inline constexpr const char* dlpack_used_capsule = "used_dltensor";
} // namespace rag::bind
