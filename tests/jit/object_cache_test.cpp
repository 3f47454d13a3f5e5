// The on-disk cache of compiled objects (jit/object_cache.hpp) across real processes: each
// case runs this test binary again as a child (DiskCacheChild.DISABLED_Run) with its own
// temporary RAG_CACHE_DIR, so no test reads or writes the user's cache.
#include "dsl/module.hpp"
#include "jit/object_cache.hpp"
#include "tests/support/testing.hpp"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <spawn.h>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace rag {
namespace {

namespace fs = std::filesystem;
const fs::path root = RAG_SOURCE_DIR;

// What a child reports: the process's disk cache counters and the bits of its results.
struct ChildReport {
    std::int64_t hits = -1, misses = -1, rejected = -1, writes = -1;
    std::string bits;
};

// A fresh directory under the system's temporary directory, removed with the object.
struct TempDir {
    fs::path path;
    TempDir() {
        std::random_device rd;
        path = fs::temp_directory_path() /
               ("rag-cache-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

// Starts this binary as a child running only the child test; returns its pid.
pid_t spawn_child(const fs::path& cache, const fs::path& report) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
        if (std::strncmp(*e, "RAG_CACHE_DIR=", 14) != 0 &&
            std::strncmp(*e, "RAG_CACHE_REPORT=", 17))
            env.emplace_back(*e);
    env.push_back("RAG_CACHE_DIR=" + cache.string());
    env.push_back("RAG_CACHE_REPORT=" + report.string());
    std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=DiskCacheChild.DISABLED_Run",
                                     "--gtest_also_run_disabled_tests", "--gtest_brief=1"};
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    for (auto& e : env) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0)
        return -1;
    return pid;
}

ChildReport wait_child(pid_t pid, const fs::path& report) {
    ChildReport r;
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        return r;
    std::ifstream in(report, std::ios::binary);
    in >> r.hits >> r.misses >> r.rejected >> r.writes;
    in.get();
    std::stringstream ss;
    ss << in.rdbuf();
    r.bits = ss.str();
    return r;
}

ChildReport run_child(const fs::path& cache, const fs::path& report) {
    return wait_child(spawn_child(cache, report), report);
}

std::vector<fs::path> entries(const fs::path& cache) {
    std::vector<fs::path> out;
    for (const auto& d : fs::recursive_directory_iterator(cache))
        if (d.is_regular_file()) out.push_back(d.path());
    std::sort(out.begin(), out.end());
    return out;
}

void collect(const Value& v, std::string& bits) {
    if (v.kind == Value::Kind::tensor) {
        const auto x = v.tensor.to_f64();
        bits.append(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(double));
    }
    for (const auto& [_, f] : v.fields) collect(Value(f), bits);
    for (const auto& e : v.elems) collect(e, bits);
}

// The child: one training step of the example encoder (fused loops, GEMMs, row-wise and
// segmented kernels), reported to $RAG_CACHE_REPORT. Run only through spawn_child.
TEST(DiskCacheChild, DISABLED_Run) {
    const char* report = std::getenv("RAG_CACHE_REPORT");
    ASSERT_NE(report, nullptr);
    auto m = Module::load((root / "examples/encoder.rag").string());
    const std::vector<std::int64_t> lengths = {5, 17, 9};
    const Value x =
        testing::random_for(Schema{DType::f32, Shape{true, parse_axes("~N, 64")}}, lengths);
    const Value labels =
        testing::random_for(Schema{DType::i64, Shape{true, parse_axes("~N")}}, lengths);
    const Value out = m->call("train_step", {x, labels, m->init("Encoder", 3)});
    std::string bits;
    collect(out, bits);
    const jit::DiskCacheStats d = jit::disk_cache_stats();
    std::ofstream os(report, std::ios::binary | std::ios::trunc);
    os << d.hits << ' ' << d.misses << ' ' << d.rejected << ' ' << d.writes << '\n' << bits;
    ASSERT_TRUE(os.good());
}

TEST(DiskCache, ASecondProcessLoadsEveryModuleAndGetsTheSameBits) {
    TempDir dir;
    const ChildReport first = run_child(dir.path / "cache", dir.path / "first");
    ASSERT_GE(first.hits, 0) << "the first child failed";
    EXPECT_EQ(first.hits, 0);
    EXPECT_GT(first.writes, 0);
    EXPECT_EQ(first.writes, first.misses);
    ASSERT_FALSE(first.bits.empty());
    // One entry per module, under the version's folder.
    const auto files = entries(dir.path / "cache");
    EXPECT_EQ(std::int64_t(files.size()), first.writes);
    for (const auto& f : files)
        EXPECT_EQ(f.parent_path().filename().string().rfind("rag-", 0), 0u) << f;

    const ChildReport second = run_child(dir.path / "cache", dir.path / "second");
    EXPECT_EQ(second.hits, first.writes);
    EXPECT_EQ(second.misses, 0);
    EXPECT_EQ(second.rejected, 0);
    EXPECT_EQ(second.writes, 0);
    EXPECT_TRUE(second.bits == first.bits) << "results differ bitwise";
}

TEST(DiskCache, CorruptOrTruncatedEntriesAreIgnoredAndRebuilt) {
    TempDir dir;
    const ChildReport first = run_child(dir.path / "cache", dir.path / "first");
    ASSERT_GT(first.writes, 2) << "the first child failed";
    auto files = entries(dir.path / "cache");
    ASSERT_GE(files.size(), 3u);
    // Truncated to half, one flipped bit in the middle, and three bytes of junk.
    fs::resize_file(files[0], fs::file_size(files[0]) / 2);
    {
        std::fstream f(files[1], std::ios::in | std::ios::out | std::ios::binary);
        const auto mid = std::streamoff(fs::file_size(files[1]) / 2);
        f.seekg(mid);
        char c = 0;
        f.get(c);
        f.seekp(mid);
        f.put(char(c ^ 0x10));
    }
    std::ofstream(files[2], std::ios::binary | std::ios::trunc) << "abc";

    const ChildReport second = run_child(dir.path / "cache", dir.path / "second");
    EXPECT_EQ(second.rejected, 3);
    EXPECT_EQ(second.writes, 3); // rebuilt
    EXPECT_EQ(second.hits, first.writes - 3);
    EXPECT_TRUE(second.bits == first.bits) << "results differ bitwise";

    const ChildReport third = run_child(dir.path / "cache", dir.path / "third");
    EXPECT_EQ(third.hits, first.writes);
    EXPECT_EQ(third.rejected, 0);
    EXPECT_TRUE(third.bits == first.bits) << "results differ bitwise";
}

TEST(DiskCache, TwoProcessesFillingOneDirectoryAtOnce) {
    TempDir dir;
    const pid_t a = spawn_child(dir.path / "cache", dir.path / "a");
    const pid_t b = spawn_child(dir.path / "cache", dir.path / "b");
    const ChildReport ra = wait_child(a, dir.path / "a");
    const ChildReport rb = wait_child(b, dir.path / "b");
    ASSERT_GE(ra.hits, 0) << "child a failed";
    ASSERT_GE(rb.hits, 0) << "child b failed";
    EXPECT_EQ(ra.rejected + rb.rejected, 0); // a reader never sees half an entry
    EXPECT_TRUE(ra.bits == rb.bits) << "results differ bitwise";
    for (const auto& f : entries(dir.path / "cache"))
        EXPECT_EQ(f.extension(), ".obj") << "a temporary file was left: " << f;

    const ChildReport c = run_child(dir.path / "cache", dir.path / "c");
    EXPECT_EQ(c.misses, 0);
    EXPECT_EQ(c.rejected, 0);
    EXPECT_GT(c.hits, 0);
    EXPECT_TRUE(c.bits == ra.bits) << "results differ bitwise";
}

// Restores an environment variable when the test ends.
struct EnvVar {
    std::string name;
    std::optional<std::string> old;
    explicit EnvVar(std::string n) : name(std::move(n)) {
        if (const char* v = std::getenv(name.c_str())) old = v;
    }
    ~EnvVar() {
        if (old)
            setenv(name.c_str(), old->c_str(), 1);
        else
            unsetenv(name.c_str());
    }
};

TEST(DiskCache, DirectoryFromTheEnvironment) {
    EnvVar dir("RAG_CACHE_DIR"), xdg("XDG_CACHE_HOME"), home("HOME");
    setenv("RAG_CACHE_DIR", "off", 1);
    EXPECT_EQ(jit::object_cache_dir(), "");
    setenv("RAG_CACHE_DIR", "", 1);
    EXPECT_EQ(jit::object_cache_dir(), "");
    setenv("RAG_CACHE_DIR", "/some/where", 1);
    EXPECT_EQ(jit::object_cache_dir().rfind("/some/where/rag-", 0), 0u);
    unsetenv("RAG_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    EXPECT_EQ(jit::object_cache_dir().rfind("/xdg/rag/rag-", 0), 0u);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    EXPECT_EQ(jit::object_cache_dir().rfind("/home/u/.cache/rag/rag-", 0), 0u);
}

TEST(DiskCache, StoreLoadAndRejectInProcess) {
    TempDir dir;
    EnvVar env("RAG_CACHE_DIR");
    setenv("RAG_CACHE_DIR", dir.path.c_str(), 1);
    const std::string key(64, 'a');
    EXPECT_FALSE(jit::load_cached_object(key)); // absent
    jit::store_cached_object(key, {"object bytes", "ir text"});
    auto got = jit::load_cached_object(key);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->object, "object bytes");
    EXPECT_EQ(got->ir, "ir text");
    // Another key's entry under this key's name (a renamed file) is not taken.
    const std::string other(64, 'b');
    fs::copy_file(fs::path(jit::object_cache_dir()) / (key + ".obj"),
                  fs::path(jit::object_cache_dir()) / (other + ".obj"));
    EXPECT_FALSE(jit::load_cached_object(other));
    // Every truncation is rejected, never a crash.
    const fs::path p = fs::path(jit::object_cache_dir()) / (key + ".obj");
    const auto size = fs::file_size(p);
    for (std::uintmax_t n = size; n-- > 0;) {
        fs::resize_file(p, n);
        EXPECT_FALSE(jit::load_cached_object(key)) << n;
    }
    // An unwritable directory only means no caching.
    setenv("RAG_CACHE_DIR", "/proc/rag-cannot-write-here", 1);
    jit::store_cached_object(key, {"x", "y"});
    EXPECT_FALSE(jit::load_cached_object(key));
}

} // namespace
} // namespace rag
