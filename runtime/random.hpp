// Counter-based random numbers: value k of a stream is a pure function of (seed, stream name,
// k), so results do not depend on evaluation order or thread count, and are the same on every
// platform. Used for params initialisation.
//
// Generator: key = splitmix64(seed ^ fnv1a64(stream)); u_k = top 53 bits of
// splitmix64(key + k) / 2^53 in [0, 1); normal_k = Box-Muller on (u_{2k}, u_{2k+1}), cosine
// branch, with u_{2k} mapped to (0, 1].
#pragma once
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace rag {

inline std::uint64_t splitmix64(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

inline std::uint64_t fnv1a64(std::string_view s) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

class CounterRng {
  public:
    CounterRng(std::uint64_t seed, std::string_view stream)
        : key_(splitmix64(seed ^ fnv1a64(stream))) {}
    double uniform(std::uint64_t k) const { return double(splitmix64(key_ + k) >> 11) * 0x1.0p-53; }
    double normal(std::uint64_t k) const {
        double u1 = 1.0 - uniform(2 * k), u2 = uniform(2 * k + 1);
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
    }

  private:
    std::uint64_t key_;
};

} // namespace rag
