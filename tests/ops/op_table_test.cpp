// The op table itself: every op the language needs is registered once, with a doc line, a
// type rule and a reference kernel; arity and unknown ops are reported clearly.
#include "tests/support/testing.hpp"

namespace rag {
namespace {

using namespace rag::testing;

const char* required[] = {
    // unary
    "neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "relu", "gelu", "silu",
    // binary, comparisons, where
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "lt", "le", "gt", "ge", "eq", "ne",
    "where",
    // linear algebra and structure
    "matmul", "transpose", "index", "reshape", "concat",
    // reductions and normalisation
    "sum", "mean", "max", "min", "softmax", "logsumexp", "layernorm", "rmsnorm",
    // training and padding
    "dropout", "mse", "cross_entropy", "pad", "mask", "lengths",
    // attention
    "attention", "relpos_attention", "biased_attention"};

TEST(OpTable, EveryRequiredOpIsRegistered) {
    for (const char* name : required) EXPECT_NE(OpTable::builtin().find(name), nullptr) << name;
}

TEST(OpTable, EveryEntryIsComplete) {
    for (const OpDef* op : OpTable::builtin().all()) {
        EXPECT_FALSE(op->doc.empty()) << op->name;
        EXPECT_TRUE(bool(op->type)) << op->name;
        EXPECT_TRUE(bool(op->reference)) << op->name;
        EXPECT_GE(op->min_args, 0) << op->name;
        EXPECT_TRUE(op->max_args < 0 || op->max_args >= op->min_args) << op->name;
        for (int k : op->no_grad_args)
            EXPECT_TRUE(k >= 0 && (op->max_args < 0 || k < op->max_args)) << op->name;
    }
}

TEST(OpTable, DifferentiableOpsOfTheLanguageHaveVjps) {
    for (const char* name : required) {
        std::string n = name;
        bool integer_valued = n == "lt" || n == "le" || n == "gt" || n == "ge" || n == "eq" ||
                              n == "ne" || n == "mask" || n == "lengths";
        if (!integer_valued) {
            EXPECT_TRUE(bool(OpTable::builtin().at(n).vjp)) << n;
        }
    }
}

TEST(OpTable, UnknownOpsAndWrongArity) {
    EXPECT_NE(error_of([] { OpTable::builtin().at("frobnicate"); }).find("unknown op 'frobnicate'"),
              std::string::npos);
    auto x = random_batch(DType::f32, "~N", {{2}});
    EXPECT_NE(error_of([&] {
                  evaluate("exp", {x, x});
              }).find("exp takes 1 argument, got 2"),
              std::string::npos);
    EXPECT_NE(error_of([&] { evaluate("where", {x}); }).find("where takes 3 arguments, got 1"),
              std::string::npos);
    OpTable t;
    t.add({"twice", 1, 1, "doc", {}, {}, {}});
    EXPECT_NE(error_of([&] {
                  t.add({"twice", 1, 1, "doc", {}, {}, {}});
              }).find("registered twice"),
              std::string::npos);
}

TEST(OpTable, EvaluateChecksTheKernelAgainstTheTypeRule) {
    // Every evaluation validates the result's structure; a kernel that disagrees with its type
    // rule is an internal error, never a silently wrong value.
    auto x = random_batch(DType::f64, "~N, ~N, 2", shapes_for("~N, ~N, 2", {{0}, {1}, {3}}));
    for (const char* op : {"exp", "neg", "relu"}) {
        auto y = evaluate(op, {x});
        y.structure().validate();
        EXPECT_EQ(y.schema(), x.schema());
    }
}

} // namespace
} // namespace rag
