// The committed static report (bench/results/gpu_static.md and .jsonl, made by ./dev gpu-report)
// against the tree: it lists every kernel tests/gpu/report_kernels.hpp builds, and the
// registers, spills and stack frame it gives a few of them are what ptxas says at HEAD, so the
// report cannot drift silently when a kernel changes (rerun ./dev gpu-report then).
#include "jit/kir_nvptx.hpp"
#include "tests/gpu/ptxas.hpp"
#include "tests/gpu/report_kernels.hpp"
#include "tests/support/testing.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;
const fs::path root = source_root();

struct Resources {
    long registers = -1, spill_stores = -1, spill_loads = -1, stack = -1;
    bool operator==(const Resources&) const = default;
};
std::ostream& operator<<(std::ostream& o, const Resources& r) {
    return o << r.registers << " registers, " << r.spill_stores << " B spill stores, "
             << r.spill_loads << " B spill loads, " << r.stack << " B stack";
}

long number(const std::string& s, const std::string& re) {
    std::smatch m;
    return std::regex_search(s, m, std::regex(re)) ? std::stol(m[1]) : -1;
}

// The report's rows by "id arch", and the commit it names.
std::map<std::string, Resources> report(std::string* commit) {
    std::map<std::string, Resources> rows;
    std::ifstream f(root / "bench/results/gpu_static.jsonl");
    std::smatch m;
    for (std::string line; std::getline(f, line);) {
        const std::regex id("\"id\": \"([^\"]+)\""), arch("\"arch\": \"([^\"]+)\""),
            c("\"commit\": \"([^\"]+)\"");
        if (!std::regex_search(line, m, id)) continue;
        std::string key = m[1].str() + " ";
        std::regex_search(line, m, arch);
        key += m[1].str();
        if (std::regex_search(line, m, c)) *commit = m[1];
        rows[key] = {number(line, "\"registers\": (\\d+)"),
                     number(line, "\"spill_stores\": (\\d+)"),
                     number(line, "\"spill_loads\": (\\d+)"), number(line, "\"stack\": (\\d+)")};
    }
    return rows;
}

TEST(GpuStatic, TheReportListsEveryKernelAtBothArchsAndNamesItsCommit) {
    std::string commit;
    const auto rows = report(&commit);
    ASSERT_FALSE(rows.empty()) << "no bench/results/gpu_static.jsonl: run ./dev gpu-report";
    std::size_t want = 0;
    for (const auto& k : report_kernels())
        for (const char* arch : {"sm_80", "sm_90"}) {
            ++want;
            EXPECT_TRUE(rows.count(k.id + " " + arch)) << k.id << " " << arch << " not reported";
        }
    EXPECT_EQ(rows.size(), want) << "the report lists kernels the GPU tier no longer builds";
    std::ifstream md(root / "bench/results/gpu_static.md");
    const std::string text{std::istreambuf_iterator<char>(md), {}};
    EXPECT_NE(text.find("Commit `" + commit + "`"), std::string::npos)
        << "gpu_static.md and gpu_static.jsonl are from different runs";
}

// A few kernels, each from a different program (relpos forward and backward on tensor cores,
// f32 relpos, GEMM, layernorm), at the arch the report gives them.
TEST(GpuStatic, RegistersAndSpillsOfTheReportMatchPtxasAtHead) {
    if (ptxas_path().empty())
        GTEST_SKIP() << "SKIPPED: no ptxas (set RAG_PTXAS or CUDA_HOME); report not checked";
    std::string commit;
    const auto rows = report(&commit);
    const std::pair<const char*, const char*> checked[] = {{"relpos_forward/Shaw/f16", "sm_90"},
                                                           {"relpos_key_grad/TXL/f16", "sm_80"},
                                                           {"relpos_forward/T5/f32", "sm_90"},
                                                           {"gemm/f16", "sm_90"},
                                                           {"layernorm/f32", "sm_80"}};
    for (const auto& k : report_kernels())
        for (const auto& [id, arch] : checked) {
            if (k.id != id) continue;
            const auto row = rows.find(k.id + " " + arch);
            ASSERT_NE(row, rows.end()) << id << " " << arch;
            const PtxasResult r = run_ptxas(jit::kir_ptx(k.make(), arch), arch, "-v");
            ASSERT_EQ(r.status, 0) << r.output;
            const Resources now{number(r.output, "Used (\\d+) registers"),
                                number(r.output, "(\\d+) bytes spill stores"),
                                number(r.output, "(\\d+) bytes spill loads"),
                                number(r.output, "(\\d+) bytes stack frame")};
            EXPECT_EQ(now, row->second)
                << id << " " << arch << ": ptxas at HEAD vs bench/results/gpu_static.jsonl (at "
                << commit << "); rerun ./dev gpu-report";
        }
}

} // namespace
} // namespace rag
