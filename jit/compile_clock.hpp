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
    void stop(); // adds the running interval to this phase
    const char* name_;
    CompilePhase* outer_;
    double start_;
};

// Wall seconds during which some thread of the process was compiling (the union of the
// phases' intervals over all threads), since the process started; monotonic. A call's compile
// time is the difference across it: kernels compiled lazily on a worker thread of
// parallel_for count, and modules compiled in parallel count once. Calls running at the same
// time on several threads each see the other's compile work too.
double compile_wall_seconds();

// Process-wide seconds per phase (all threads), in first-seen order.
std::vector<std::pair<std::string, double>> compile_breakdown();

// "lower=0.012 plan=0.001 ..." for --stats lines.
std::string format_breakdown(const std::vector<std::pair<std::string, double>>& b);

} // namespace rag::jit
