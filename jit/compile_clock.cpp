#include "jit/compile_clock.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace rag::jit {
namespace {

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

struct Totals {
    std::mutex mu;
    std::vector<std::pair<std::string, double>> phases;

    void add(const char* name, double s) {
        std::lock_guard<std::mutex> lock(mu);
        for (auto& [n, v] : phases)
            if (n == name) {
                v += s;
                return;
            }
        phases.emplace_back(name, s);
    }
};

// Never destroyed: phases may end during static destruction (kernel caches).
Totals& totals() {
    static Totals* t = [] {
        auto* out = new Totals;
        if (const char* e = std::getenv("RAG_JIT_PROFILE"); e && *e && std::strcmp(e, "0") != 0)
            std::atexit([] {
                std::fprintf(stderr, "compile breakdown (s, all threads): %s\n",
                             format_breakdown(compile_breakdown()).c_str());
            });
        return out;
    }();
    return *t;
}

thread_local CompilePhase* current = nullptr;

// The union of every thread's outermost phases.
struct Busy {
    std::mutex mu;
    int active = 0;
    double since = 0, total = 0;
};
Busy& busy() {
    static Busy* b = new Busy; // never destroyed, like totals()
    return *b;
}

} // namespace

CompilePhase::CompilePhase(const char* name) : name_(name), outer_(current), start_(now()) {
    if (outer_) {
        outer_->stop();
    } else {
        Busy& b = busy();
        std::lock_guard<std::mutex> lock(b.mu);
        if (b.active++ == 0) b.since = start_;
    }
    current = this;
}

void CompilePhase::stop() {
    totals().add(name_, now() - start_);
}

CompilePhase::~CompilePhase() {
    stop();
    current = outer_;
    if (outer_) {
        outer_->start_ = now();
        return;
    }
    Busy& b = busy();
    std::lock_guard<std::mutex> lock(b.mu);
    if (--b.active == 0) b.total += now() - b.since;
}

double compile_wall_seconds() {
    Busy& b = busy();
    std::lock_guard<std::mutex> lock(b.mu);
    return b.total + (b.active ? now() - b.since : 0.0);
}

std::vector<std::pair<std::string, double>> compile_breakdown() {
    Totals& t = totals();
    std::lock_guard<std::mutex> lock(t.mu);
    return t.phases;
}

std::string format_breakdown(const std::vector<std::pair<std::string, double>>& b) {
    std::string out;
    char buf[64];
    for (const auto& [n, s] : b) {
        std::snprintf(buf, sizeof buf, "%s%s=%.3f", out.empty() ? "" : " ", n.c_str(), s);
        out += buf;
    }
    return out;
}

} // namespace rag::jit
