// Where the time of a first call goes: every piece of compile work (lowering, planning, LLVM
// set-up, optimisation and code generation of each module, kernel-IR program building, the
// on-disk cache) runs inside a CompilePhase, so `compile_seconds` can count all of it, not
// only the part that happens before the first step. This header knows nothing of LLVM.
//
// Phases on one thread are exclusive: an inner phase pauses its outer one, so the per-phase
// seconds partition the thread's compile time. RAG_JIT_PROFILE=1 prints the process-wide
// breakdown to stderr at exit.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace rag::jit {

class CompilePhase {
  public:
    explicit CompilePhase(const char* name); // `name` must outlive the process (a literal)
    ~CompilePhase();
    CompilePhase(const CompilePhase&) = delete;
    CompilePhase& operator=(const CompilePhase&) = delete;

  private:
    friend double thread_compile_seconds();
    void stop(); // adds the running interval to this phase
    const char* name_;
    CompilePhase* outer_;
    double start_;
};

// Seconds of compile work done on the calling thread since it started (monotonic). A caller
// that waits for compile work on other threads does so inside a phase, so the wait counts.
double thread_compile_seconds();

// Process-wide seconds per phase (all threads), in first-seen order.
std::vector<std::pair<std::string, double>> compile_breakdown();

// "lower=0.012 plan=0.001 ..." for --stats lines.
std::string format_breakdown(const std::vector<std::pair<std::string, double>>& b);

} // namespace rag::jit
