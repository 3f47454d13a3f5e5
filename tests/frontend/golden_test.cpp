// Golden tests: malformed and ill-typed programs with their exact diagnostics
// (tests/golden/errors/NAME.rag -> NAME.expected), and the IR of the examples
// (tests/golden/ir/FILE.FN.ir) and its CPU plan (FILE.FN.plan). `RAG_UPDATE_GOLDEN=1 ./dev test`
// rewrites the expectations; review the diff before committing.
#include "dsl/module.hpp"
#include "tests/support/testing.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace rag {
namespace {

namespace fs = std::filesystem;
const fs::path root = RAG_SOURCE_DIR;

std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

bool updating() {
    return std::getenv("RAG_UPDATE_GOLDEN") != nullptr;
}

void expect_golden(const fs::path& expected, const std::string& got) {
    if (updating()) {
        std::ofstream(expected) << got;
        return;
    }
    ASSERT_TRUE(fs::exists(expected))
        << expected << " is missing; run RAG_UPDATE_GOLDEN=1 ./dev test";
    EXPECT_EQ(got, slurp(expected)) << "golden " << expected;
}

TEST(Golden, ErrorPrograms) {
    int count = 0;
    for (const auto& entry : fs::directory_iterator(root / "tests/golden/errors")) {
        if (entry.path().extension() != ".rag") continue;
        ++count;
        const std::string name = "errors/" + entry.path().filename().string();
        std::string got;
        try {
            Module::compile(slurp(entry.path()), name);
            got = "(compiled without errors)\n";
        } catch (const CompileError& e) {
            got = e.what();
        }
        SCOPED_TRACE(name);
        expect_golden(fs::path(entry.path()).replace_extension(".expected"), got);
    }
    EXPECT_GE(count, 25);
}

TEST(Golden, ExampleIr) {
    const std::pair<const char*, const char*> cases[] = {{"single_pair_single", "block"},
                                                         {"single_pair_single", "train_step"},
                                                         {"single_pair_single", "block_rect"},
                                                         {"single_pair_single", "block_nonleading"},
                                                         {"encoder", "encoder"},
                                                         {"encoder", "train_step"},
                                                         {"gpt", "loss"}};
    for (auto [file, fn] : cases) {
        auto m = Module::load((root / "examples" / (std::string(file) + ".rag")).string());
        expect_golden(root / "tests/golden/ir" / (std::string(file) + "." + fn + ".ir"), m->ir(fn));
        expect_golden(root / "tests/golden/ir" / (std::string(file) + "." + fn + ".plan"),
                      m->plan(fn));
    }
}

} // namespace
} // namespace rag
