// `rag ptx` lists every kernel a function launches on the GPU tier (fused loops and the
// kernel-IR programs picked at run time), each module under its own header, and every module
// it prints is accepted by ptxas. Runs the rag command ($RAG_CLI, else the build's).
#include "tests/gpu/ptxas.hpp"
#include "tests/support/testing.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <sys/wait.h>

namespace rag {
namespace {

using namespace rag::testing;
namespace fs = std::filesystem;
const fs::path root = source_root();
const std::string cli = std::getenv("RAG_CLI") ? std::getenv("RAG_CLI") : RAG_CLI;

struct CliRun {
    int status = -1;
    std::string out;
};

// The command's stdout and exit status; its disk cache is off unless the caller set one.
CliRun run(const std::string& args) {
    const std::string cmd = "RAG_CACHE_DIR=\"${RAG_CACHE_DIR-off}\" '" + cli + "' " + args;
    CliRun r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    std::array<char, 65536> buf;
    for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;)
        r.out.append(buf.data(), n);
    const int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

struct PtxModule {
    std::string title, ptx;
};

std::vector<PtxModule> modules(const std::string& out) {
    const std::string mark = "// ==== module ";
    std::vector<PtxModule> m;
    for (std::size_t at = out.find(mark); at != std::string::npos;) {
        const std::size_t eol = out.find('\n', at);
        const std::size_t next = out.find(mark, eol);
        m.push_back(
            {out.substr(at, eol - at),
             out.substr(eol + 1, (next == std::string::npos ? out.size() : next) - eol - 1)});
        at = next;
    }
    return m;
}

TEST(RagPtx, ARelposTrainingStepListsEveryKernelAndEachAssembles) {
    ASSERT_TRUE(fs::exists(cli)) << cli;
    const CliRun r = run("ptx '" + (root / "examples/relpos_encoder.rag").string() +
                         "' --fn train_step_deberta --lengths 3,2");
    ASSERT_EQ(r.status, 0) << r.out;
    const std::string head = r.out.substr(0, r.out.find("// ==== module "));
    // The relpos tile programs, forward and backward, and the other kernel-IR programs.
    for (const char* k : {"relpos_forward", "relpos_query_grad", "relpos_key_grad",
                          "relpos_table_reduce", "gemm_f32", "layernorm_f32", "layernorm_grad_f32"})
        EXPECT_NE(head.find(std::string(": ") + k + " ("), std::string::npos) << k << "\n" << head;
    EXPECT_NE(head.find(" fused elementwise kernels"), std::string::npos) << head;
    const auto mods = modules(r.out);
    ASSERT_GE(mods.size(), 8u);
    // The header's count of modules is the number printed.
    EXPECT_NE(head.find("in " + std::to_string(mods.size()) + " modules"), std::string::npos)
        << head;
    // Every kernel the header names is an entry of the module it says holds it:
    // "//   module K: NAME (key)" or, for the fused module, "//     NAME: ops" lines after it.
    std::istringstream lines(head);
    std::size_t in = 0;
    int named = 0;
    for (std::string line; std::getline(lines, line);) {
        std::string name;
        if (line.rfind("//   module ", 0) == 0) {
            in = std::stoul(line.substr(12)) - 1;
            const std::size_t colon = line.find(": ");
            const std::size_t paren = line.find(" (");
            if (paren != std::string::npos) name = line.substr(colon + 2, paren - colon - 2);
        } else if (line.rfind("//     ", 0) == 0) {
            name = line.substr(7, line.find(':') - 7);
        }
        if (name.empty()) continue;
        ++named;
        ASSERT_LT(in, mods.size()) << line;
        EXPECT_NE(mods[in].ptx.find(".entry " + name + "("), std::string::npos)
            << name << " is not in " << mods[in].title;
    }
    EXPECT_GE(named, int(mods.size()));
    for (const PtxModule& m : mods) {
        EXPECT_NE(m.ptx.find(".entry "), std::string::npos) << m.title;
        EXPECT_EQ(m.ptx.find(".extern"), std::string::npos) << m.title;
    }
    if (ptxas_path().empty()) {
        std::printf("ptxas not found: the %zu modules were not assembled\n", mods.size());
        return;
    }
    for (const PtxModule& m : mods) {
        const PtxasResult a = run_ptxas(m.ptx, "sm_90");
        EXPECT_EQ(a.status, 0) << m.title << ":\n" << a.output;
    }
}

TEST(RagPtx, BadUseIsAnErrorExit) {
    ASSERT_TRUE(fs::exists(cli)) << cli;
    const std::string file = (root / "examples/relpos_encoder.rag").string();
    EXPECT_EQ(run("ptx '" + file + "' 2>/dev/null").status, 2);           // no --fn: usage
    EXPECT_EQ(run("ptx '" + file + "' --fn nope 2>/dev/null").status, 1); // no such fn
    EXPECT_EQ(run("ptx '" + file + "' --fn loss_deberta --arch sm_70 2>/dev/null").status, 1);
}

} // namespace
} // namespace rag
