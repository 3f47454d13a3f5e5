// One meaning across tiers: a function's results on the CPU JIT against the reference
// interpreter (same schemas, same structures, f32 relative l2 <= 1e-5 by default).
#pragma once
#include "ir/interpreter.hpp"
#include "jit/cpu_jit.hpp"
#include "tests/support/testing.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace rag::testing {

inline void expect_tiers_agree(const ir::Function& f, const std::vector<RaggedTensor>& in,
                               double tol = 1e-5) {
    auto want = ir::interpret(f, in);
    auto got = jit::compile_cpu(f)->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(got[k].schema(), want[k].schema()) << f.name;
        EXPECT_TRUE(got[k].structure().same_as(want[k].structure())) << f.name;
        EXPECT_LE(rel_l2(got[k], want[k]), tol) << f.name << " output " << k;
    }
}

} // namespace rag::testing
