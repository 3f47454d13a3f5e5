#include "jit/object_cache.hpp"

#include <llvm/Support/BLAKE3.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

#ifndef RAG_VERSION
#error "RAG_VERSION must be defined by the build"
#endif

namespace rag::jit {
namespace {

namespace fs = std::filesystem;

// File layout: magic, key, two sizes, the object, the IR text, then a BLAKE3 checksum of
// everything before it (a truncated or bit-flipped entry fails it).
constexpr char kMagic[8] = {'R', 'A', 'G', 'O', 'B', 'J', '0', '1'};
constexpr std::size_t kSum = 32;

std::atomic<std::int64_t> hits{0}, misses{0}, rejected{0}, writes{0};

std::string checksum(std::string_view bytes) {
    llvm::BLAKE3 h;
    h.update(llvm::StringRef(bytes.data(), bytes.size()));
    const auto r = h.final();
    return std::string(reinterpret_cast<const char*>(r.data()), r.size());
}

void put_u64(std::string& out, std::uint64_t v) {
    for (int b = 0; b < 8; ++b) out.push_back(char((v >> (8 * b)) & 0xff));
}

std::uint64_t get_u64(const std::string& in, std::size_t at) {
    std::uint64_t v = 0;
    for (int b = 0; b < 8; ++b)
        v |= std::uint64_t(std::uint8_t(in[at + std::size_t(b)])) << (8 * b);
    return v;
}

std::string path_of(const std::string& dir, const std::string& key) {
    return dir + "/" + key + ".obj";
}

} // namespace

std::string object_cache_dir() {
    std::string base;
    if (const char* d = std::getenv("RAG_CACHE_DIR")) {
        if (!*d || std::strcmp(d, "off") == 0) return "";
        base = d;
    } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
        base = std::string(x) + "/rag";
    } else if (const char* h = std::getenv("HOME"); h && *h) {
        base = std::string(h) + "/.cache/rag";
    } else {
        return "";
    }
    return base + "/rag-" RAG_VERSION;
}

std::optional<CachedObject> load_cached_object(const std::string& key) {
    const std::string dir = object_cache_dir();
    if (dir.empty()) return std::nullopt;
    std::ifstream in(path_of(dir, key), std::ios::binary);
    if (!in) {
        ++misses;
        return std::nullopt;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string bytes = ss.str();
    const std::size_t head = sizeof kMagic + key.size() + 16;
    auto reject = [] {
        ++rejected;
        ++misses;
        return std::nullopt;
    };
    if (bytes.size() < head + kSum || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0 ||
        bytes.compare(sizeof kMagic, key.size(), key) != 0)
        return reject();
    const std::uint64_t n_obj = get_u64(bytes, sizeof kMagic + key.size());
    const std::uint64_t n_ir = get_u64(bytes, sizeof kMagic + key.size() + 8);
    // Sizes from the file are untrusted: compare without overflowing.
    const std::size_t room = bytes.size() - head - kSum;
    if (n_obj > room || n_ir > room - n_obj || n_obj + n_ir != room || n_obj == 0) return reject();
    const std::string_view body(bytes.data(), bytes.size() - kSum);
    if (checksum(body) != std::string_view(bytes).substr(bytes.size() - kSum)) return reject();
    ++hits;
    return CachedObject{bytes.substr(head, n_obj), bytes.substr(head + n_obj, n_ir)};
}

void store_cached_object(const std::string& key, const CachedObject& entry) {
    const std::string dir = object_cache_dir();
    if (dir.empty()) return;
    std::string bytes(kMagic, sizeof kMagic);
    bytes += key;
    put_u64(bytes, entry.object.size());
    put_u64(bytes, entry.ir.size());
    bytes += entry.object;
    bytes += entry.ir;
    bytes += checksum(bytes);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return;
    // A name no other process or thread uses; rename makes the whole entry appear at once.
    thread_local std::mt19937_64 rng(std::random_device{}());
    const std::string tmp =
        dir + "/." + key + "." + std::to_string(::getpid()) + "." + std::to_string(rng()) + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) return;
        out.write(bytes.data(), std::streamsize(bytes.size()));
        out.close();
        if (!out) {
            fs::remove(tmp, ec);
            return;
        }
    }
    fs::rename(tmp, path_of(dir, key), ec);
    if (ec) {
        fs::remove(tmp, ec);
        return;
    }
    ++writes;
}

DiskCacheStats disk_cache_stats() {
    return {hits.load(), misses.load(), rejected.load(), writes.load()};
}

void count_disk_cache_rejected() {
    ++rejected;
    --hits;
    ++misses;
}

} // namespace rag::jit
