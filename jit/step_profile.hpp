// Per-step wall time of a compiled function, for finding what dominates a training step.
// Enabled by RAG_JIT_PROFILE=1: each CpuFunction sums the time of every plan step over its
// calls after the first (which also compiles the process-wide kernels) and prints the steps,
// slowest first, to stderr when it is destroyed. Off, it costs one branch per step.
#pragma once
#include "jit/plan.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace rag::jit {

class StepProfile {
  public:
    StepProfile() : on_(std::getenv("RAG_JIT_PROFILE") != nullptr) {}
    bool on() const { return on_; }
    static double now() {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    }
    void add(std::size_t step, double seconds) const {
        std::lock_guard<std::mutex> lock(mu_);
        if (calls_ == 0) return; // the first call
        if (seconds_.size() <= step) seconds_.resize(step + 1, 0.0);
        seconds_[step] += seconds;
    }
    // Called at the start of every call: the first one is not counted.
    void count_call() const {
        std::lock_guard<std::mutex> lock(mu_);
        calls_ += started_ ? 1 : 0;
        started_ = true;
    }
    void print(const Plan& p, const ir::Function& f) const {
        if (!on_ || calls_ == 0) return;
        std::vector<std::size_t> order(seconds_.size());
        double total = 0;
        for (std::size_t k = 0; k < order.size(); ++k) {
            order[k] = k;
            total += seconds_[k];
        }
        std::sort(order.begin(), order.end(),
                  [&](std::size_t a, std::size_t b) { return seconds_[a] > seconds_[b]; });
        std::fprintf(stderr, "profile %s: %d calls, %.3f ms/call in steps\n", f.name.c_str(),
                     calls_, 1e3 * total / calls_);
        // The plan printout has one line per step, in order.
        std::string text = print_plan(p, f);
        std::vector<std::string> lines;
        for (std::size_t a = 0, b; a < text.size(); a = b + 1) {
            b = text.find('\n', a);
            lines.push_back(text.substr(a, b - a));
        }
        for (std::size_t k = 0; k < order.size() && k < 25; ++k)
            std::fprintf(stderr, "  %8.3f ms  %5.1f%%  %s\n", 1e3 * seconds_[order[k]] / calls_,
                         100 * seconds_[order[k]] / std::max(total, 1e-12),
                         lines[order[k]].c_str());
        // Totals per step kind and op ("gemm matmul", "fused"): a long plan's time is spread
        // over many steps of a few kinds.
        std::map<std::string, std::pair<double, int>> by;
        for (std::size_t k = 0; k < order.size(); ++k) {
            const std::string& l = lines[k];
            std::string key = l.substr(0, l.find(' '));
            if (auto eq = l.find(" = "); eq != std::string::npos && key != "fused")
                key += " " + l.substr(eq + 3, l.find(' ', eq + 3) - eq - 3);
            by[key].first += seconds_[k];
            by[key].second += 1;
        }
        std::vector<std::pair<double, std::string>> kinds;
        for (const auto& [key, v] : by) kinds.push_back({v.first, key});
        std::sort(kinds.rbegin(), kinds.rend());
        std::fprintf(stderr, "by kind:\n");
        for (const auto& [sec, key] : kinds)
            std::fprintf(stderr, "  %8.3f ms  %5.1f%%  %s (%d steps)\n", 1e3 * sec / calls_,
                         100 * sec / std::max(total, 1e-12), key.c_str(), by[key].second);
    }

  private:
    static std::string print_plan(const Plan& p, const ir::Function& f) { return jit::print(p, f); }
    bool on_;
    mutable std::mutex mu_;
    mutable std::vector<double> seconds_;
    mutable int calls_ = 0;
    mutable bool started_ = false;
};

} // namespace rag::jit
