// The slice of the CUDA Driver API rag uses, declared here so that rag builds without the CUDA
// toolkit and never links libcuda: the driver is opened at run time (runtime/cuda.cpp). The
// values match cuda.h (tests/gpu/driver_abi_test.cpp checks them when cuda.h is present).
// Each entry point is listed once, with the versioned symbol the driver exports.
#pragma once
#include <cstddef>

namespace rag::cuda::driver {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUjit_option = int;

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_INVALID_PTX = 218;
inline constexpr CUjit_option CU_JIT_INFO_LOG_BUFFER = 3;
inline constexpr CUjit_option CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4;
inline constexpr CUjit_option CU_JIT_ERROR_LOG_BUFFER = 5;
inline constexpr CUjit_option CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6;
inline constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 2;
inline constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

// X(member, symbol, return-and-parameter types)
#define RAG_CUDA_DRIVER_FUNCTIONS(X)                                                               \
    X(cuInit, "cuInit", CUresult(unsigned))                                                        \
    X(cuDriverGetVersion, "cuDriverGetVersion", CUresult(int*))                                    \
    X(cuGetErrorName, "cuGetErrorName", CUresult(CUresult, const char**))                          \
    X(cuGetErrorString, "cuGetErrorString", CUresult(CUresult, const char**))                      \
    X(cuDeviceGetCount, "cuDeviceGetCount", CUresult(int*))                                        \
    X(cuDeviceGet, "cuDeviceGet", CUresult(CUdevice*, int))                                        \
    X(cuDeviceGetName, "cuDeviceGetName", CUresult(char*, int, CUdevice))                          \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", CUresult(int*, int, CUdevice))                 \
    X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", CUresult(std::size_t*, CUdevice))                   \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult(CUcontext*, CUdevice))        \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult(CUcontext))                                     \
    X(cuCtxSynchronize, "cuCtxSynchronize", CUresult())                                            \
    X(cuStreamCreate, "cuStreamCreate", CUresult(CUstream*, unsigned))                             \
    X(cuStreamSynchronize, "cuStreamSynchronize", CUresult(CUstream))                              \
    X(cuMemAlloc, "cuMemAlloc_v2", CUresult(CUdeviceptr*, std::size_t))                            \
    X(cuMemFree, "cuMemFree_v2", CUresult(CUdeviceptr))                                            \
    X(cuMemGetInfo, "cuMemGetInfo_v2", CUresult(std::size_t*, std::size_t*))                       \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                                                   \
      CUresult(CUdeviceptr, const void*, std::size_t, CUstream))                                   \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2",                                                   \
      CUresult(void*, CUdeviceptr, std::size_t, CUstream))                                         \
    X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2",                                                   \
      CUresult(CUdeviceptr, CUdeviceptr, std::size_t, CUstream))                                   \
    X(cuMemsetD8Async, "cuMemsetD8Async",                                                          \
      CUresult(CUdeviceptr, unsigned char, std::size_t, CUstream))                                 \
    X(cuModuleLoadDataEx, "cuModuleLoadDataEx",                                                    \
      CUresult(CUmodule*, const void*, unsigned, CUjit_option*, void**))                           \
    X(cuModuleUnload, "cuModuleUnload", CUresult(CUmodule))                                        \
    X(cuModuleGetFunction, "cuModuleGetFunction", CUresult(CUfunction*, CUmodule, const char*))    \
    X(cuFuncSetAttribute, "cuFuncSetAttribute", CUresult(CUfunction, int, int))                    \
    X(cuLaunchKernel, "cuLaunchKernel",                                                            \
      CUresult(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,   \
               CUstream, void**, void**))                                                          \
    X(cuEventCreate, "cuEventCreate", CUresult(CUevent*, unsigned))                                \
    X(cuEventRecord, "cuEventRecord", CUresult(CUevent, CUstream))                                 \
    X(cuEventSynchronize, "cuEventSynchronize", CUresult(CUevent))                                 \
    X(cuEventElapsedTime, "cuEventElapsedTime", CUresult(float*, CUevent, CUevent))                \
    X(cuEventDestroy, "cuEventDestroy_v2", CUresult(CUevent))                                      \
    X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult(CUstream, CUevent, unsigned))

} // namespace rag::cuda::driver
