// The CUDA driver loader: without a driver or device it reports "unavailable" with a reason
// and every device operation is a clear rag::Error; the declared driver ABI matches cuda.h.
#include "runtime/cuda.hpp"
#include "runtime/cuda_driver.hpp"
#include "tests/support/testing.hpp"

#include <unistd.h>

#ifdef RAG_HAVE_CUDA_H
#include <cuda.h>
#include <type_traits>
#endif

namespace rag {
namespace {

using namespace rag::testing;

TEST(CudaDriver, AvailabilityHasAReasonOrADevice) {
    if (cuda::available()) {
        EXPECT_EQ(cuda::unavailable_reason(), "");
        const cuda::DeviceInfo& d = cuda::device();
        EXPECT_FALSE(d.name.empty());
        EXPECT_GE(d.major, 5);
        EXPECT_GT(d.total_memory, 0u);
        std::printf("CUDA device: %s (%s), driver %d\n", d.name.c_str(), d.arch().c_str(),
                    d.driver_version);
        return;
    }
    const std::string reason = cuda::unavailable_reason();
    EXPECT_FALSE(reason.empty());
    std::printf("CUDA unavailable here: %s\n", reason.c_str());
    for (auto* op : {+[] { cuda::device(); }, +[] { cuda::Buffer b(64); },
                     +[] { cuda::Module m(".version 7.8\n"); }, +[] { cuda::synchronize(); }}) {
        auto msg = error_of(op);
        EXPECT_NE(msg.find("CUDA unavailable: " + reason), std::string::npos) << msg;
    }
    // Harmless without a device.
    cuda::release_cached();
    EXPECT_EQ(cuda::memory_stats().in_use, 0u);
}

TEST(CudaDriver, MissingLibraryIsUnavailable) {
    const std::string reason = cuda::probe_library("/nonexistent/libcuda.so.1");
    EXPECT_NE(reason.find("no CUDA driver"), std::string::npos) << reason;
    EXPECT_NE(reason.find("/nonexistent/libcuda.so.1"), std::string::npos) << reason;
}

// The toolkit's link stub exports the entry points but has no driver behind it: the loader
// resolves every symbol of its list, then cuInit says it is a stub.
TEST(CudaDriver, ToolkitStubIsUnavailable) {
    const char* stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (access(stub, R_OK) != 0) GTEST_SKIP() << "SKIPPED: no CUDA toolkit stub at " << stub;
    const std::string reason = cuda::probe_library(stub);
    EXPECT_NE(reason.find("stub"), std::string::npos) << reason;
}

#ifdef RAG_HAVE_CUDA_H
// rag declares the driver's types and constants itself (so it builds without the toolkit);
// they must be cuda.h's.
TEST(CudaDriver, DeclaredAbiMatchesCudaH) {
    namespace d = cuda::driver;
    static_assert(sizeof(d::CUdeviceptr) == sizeof(::CUdeviceptr));
    static_assert(sizeof(d::CUresult) == sizeof(::CUresult));
    static_assert(d::CUDA_ERROR_OUT_OF_MEMORY == ::CUDA_ERROR_OUT_OF_MEMORY);
    static_assert(d::CUDA_ERROR_STUB_LIBRARY == ::CUDA_ERROR_STUB_LIBRARY);
    static_assert(d::CUDA_ERROR_NO_DEVICE == ::CUDA_ERROR_NO_DEVICE);
    static_assert(d::CUDA_ERROR_INVALID_PTX == ::CUDA_ERROR_INVALID_PTX);
    static_assert(d::CU_JIT_ERROR_LOG_BUFFER == ::CU_JIT_ERROR_LOG_BUFFER);
    static_assert(d::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES == ::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES);
    static_assert(d::CU_JIT_INFO_LOG_BUFFER == ::CU_JIT_INFO_LOG_BUFFER);
    static_assert(d::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES == ::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES);
    static_assert(d::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ==
                  ::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    static_assert(d::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ==
                  ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    static_assert(d::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ==
                  ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    static_assert(d::CU_STREAM_NON_BLOCKING == ::CU_STREAM_NON_BLOCKING);
    static_assert(d::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES ==
                  ::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    // Parameter lists agree in arity and in the size of every parameter (the handle types
    // are distinct but all pointers).
    auto same_shape = []<class R1, class... A1, class R2, class... A2>(R1 (*)(A1...),
                                                                       R2 (*)(A2...)) {
        return sizeof(R1) == sizeof(R2) && sizeof...(A1) == sizeof...(A2) &&
               ((sizeof(A1) == sizeof(A2)) && ...);
    };
    int checked = 0;
#define RAG_CHECK(name, symbol, type)                                                              \
    EXPECT_TRUE(same_shape(static_cast<std::add_pointer_t<type>>(nullptr), &::name)) << symbol;    \
    ++checked;
    RAG_CUDA_DRIVER_FUNCTIONS(RAG_CHECK)
#undef RAG_CHECK
    EXPECT_GT(checked, 20);
}
#endif

} // namespace
} // namespace rag
