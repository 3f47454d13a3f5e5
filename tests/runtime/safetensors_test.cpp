// Safetensors files from C++: a round trip of every dtype, bytes laid out as the format says,
// and headers that lie about the file are rag::Errors naming it.
#include "runtime/safetensors.hpp"
#include "tests/support/testing.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace rag {
namespace {

// The message of the rag::Error that `f` throws ("(no error)" when it returns).
template <class F> std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}
#define EXPECT_THROW_MSG(stmt, text)                                                               \
    do {                                                                                           \
        const std::string msg = error_of([&] { (void)(stmt); });                                   \
        EXPECT_NE(msg.find(text), std::string::npos) << msg;                                       \
    } while (0)

std::string temp_path(const char* name) {
    return (std::filesystem::temp_directory_path() /
            (std::string("rag_st_") + std::to_string(::getpid()) + "_" + name))
        .string();
}

TEST(Safetensors, RoundTripsEveryDtypeBitwise) {
    safetensors::Named in;
    int k = 0;
    for (DType t : all_dtypes) {
        std::vector<double> v = {1.5, -2.25, 0.0, 3.0, 7.0, -1.0};
        in.emplace_back("f." + std::to_string(k++),
                        RaggedTensor::dense(DenseArray::from_f64(t, {2, 3}, v)));
    }
    in.emplace_back("scalar", RaggedTensor::dense(DenseArray::from_f64(DType::i64, {}, {42})));
    const std::string path = temp_path("round.safetensors");
    safetensors::save(path, in, {{"k", "v \"quoted\""}});
    auto out = safetensors::load(path);
    std::filesystem::remove(path);
    ASSERT_EQ(out.tensors.size(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
        EXPECT_EQ(out.tensors[i].first, in[i].first);
        EXPECT_EQ(out.tensors[i].second.schema(), in[i].second.schema());
        const std::size_t n = std::size_t(in[i].second.numel()) * dtype_size(in[i].second.dtype());
        EXPECT_EQ(std::memcmp(out.tensors[i].second.data(), in[i].second.data(), n), 0);
    }
    ASSERT_EQ(out.metadata.size(), 1u);
    EXPECT_EQ(out.metadata[0].second, "v \"quoted\"");
}

std::string file_of(const std::string& header, std::size_t data_bytes) {
    std::string h = header;
    while (h.size() % 8) h += ' ';
    std::uint64_t n = h.size();
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, 8);
    return bytes + h + std::string(data_bytes, '\0');
}

TEST(Safetensors, ParsesTheLayoutItDocuments) {
    auto c = safetensors::parse(file_of(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                                        R"("a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
                                        12),
                                "mem");
    ASSERT_EQ(c.tensors.size(), 2u);
    EXPECT_EQ(c.tensors[0].first, "a"); // in the order of their data
    EXPECT_EQ(c.tensors[1].second.schema().str(), "f32[2]");
}

TEST(Safetensors, LyingHeadersAreErrorsNamingTheFile) {
    const char* entry = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
    EXPECT_THROW_MSG(safetensors::parse(file_of(entry, 8), "x.st"), "x.st: truncated");
    EXPECT_THROW_MSG(safetensors::parse(file_of(entry, 16), "x.st"), "4 bytes after the last");
    EXPECT_THROW_MSG(safetensors::parse(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8), "x.st"),
                     "x.st: not a safetensors file: header size");
    EXPECT_THROW_MSG(
        safetensors::parse(file_of(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],)"
                                   R"("data_offsets":[0,12]}})",
                                   12),
                           "x.st"),
        "the shape is too large");
    EXPECT_THROW_MSG(safetensors::parse(file_of(std::string(5000, '['), 0), "x.st"),
                     "nested too deeply");
}

TEST(Safetensors, RaggedTensorsAreNotSaved) {
    auto t = RaggedTensor::from_list(
        {DenseArray::zeros(DType::f32, {2, 3}), DenseArray::zeros(DType::f32, {4, 3})}, "~N, 3");
    EXPECT_THROW_MSG(safetensors::save(temp_path("ragged.safetensors"), {{"x", t}}), "ragged");
}

} // namespace
} // namespace rag
