// Parser tests: the programs of LANGUAGE.md, precedence, index items, calls, spans, and the
// exact diagnostics for malformed input.
#include "frontend/parser.hpp"

#include <gtest/gtest.h>

#include <string>

namespace rag::frontend {
namespace {

// LANGUAGE.md §3, verbatim.
const char* const kPairProgram =
    R"(# examples/single_pair_single.rag — singles to pairs and back (NestedTensor paper, eq. 1)
params PairBlock {
    wu: f32[384, 128] = normal(0.02)
    wv: f32[384, 128] = normal(0.02)
    ln_g: f32[128] = ones
    ln_b: f32[128] = zeros
    wh: f32[128, 128] = normal(0.02)
    wg: f32[128, 384] = normal(0.02)
}

fn block(x: f32[B, ~N, 384], p: PairBlock) -> (f32[B, ~N, 384], f32[B, ~N, ~N, 128]) {
    let a = x @ p.wu                                   # [B, ~N, 128]
    let b = x @ p.wv
    let pair = a[:, :, new, :] + b[:, new, :, :]       # broadcast creates the pair axes
    let pair = pair + layernorm(pair, p.ln_g, p.ln_b) @ p.wh
    let y = x + mean(pair, axis=2) @ p.wg              # the reduction consumes one pair axis
    return (y, pair)
}

fn loss(x: f32[B, ~N, 384], p: PairBlock) -> f32[] {
    let (y, pair) = block(x, p)
    return mean(y * y) + mean(pair * pair)
}

fn train_step(x: f32[B, ~N, 384], p: PairBlock) -> (f32[], PairBlock) {
    let (l, g) = value_and_grad(loss, wrt=p)(x, p)    # g has the type PairBlock
    return (l, sgd(p, g, lr=0.01))
}
)";

const char* const kPairSexpr = R"((params PairBlock
  (field wu f32[384,128] (call normal 0.02))
  (field wv f32[384,128] (call normal 0.02))
  (field ln_g f32[128] ones)
  (field ln_b f32[128] zeros)
  (field wh f32[128,128] (call normal 0.02))
  (field wg f32[128,384] (call normal 0.02)))
(fn block ((x f32[B,~N,384]) (p PairBlock)) -> (tuple f32[B,~N,384] f32[B,~N,~N,128])
  (let a (@ x (. p wu)))
  (let b (@ x (. p wv)))
  (let pair (+ (index a : : new :) (index b : new : :)))
  (let pair (+ pair (@ (call layernorm pair (. p ln_g) (. p ln_b)) (. p wh))))
  (let y (+ x (@ (call mean pair (kw axis 2)) (. p wg))))
  (return (tuple y pair)))
(fn loss ((x f32[B,~N,384]) (p PairBlock)) -> f32[]
  (let (tuple y pair) (call block x p))
  (return (+ (call mean (* y y)) (call mean (* pair pair)))))
(fn train_step ((x f32[B,~N,384]) (p PairBlock)) -> (tuple f32[] PairBlock)
  (let (tuple l g) (call (call value_and_grad loss (kw wrt p)) x p))
  (return (tuple l (call sgd p g (kw lr 0.01)))))
)";

// The types of LANGUAGE.md §2 and the generic signature of §3, each verbatim, in one file.
const char* const kTypesProgram = R"(fn types(
    a: f32[B, ~N, 384],      # batch of B samples, ragged axis N, static feature axis of 384
    b: f32[B, ~N, ~N, 128],  # square pair state: both pair axes are the same ragged extent N
    c: f32[B, ~N, ~M, 64],   # rectangular pair state: independent ragged extents N and M
    d: f32[B, 3, ~H, ~W],    # images: static channels first, two ragged spatial axes (non-leading)
    e: f32[384, 128],        # dense weight, no batch axis
    f: f32[],                # scalar
    g: i64[B]               # one integer per sample
) {
    return a
}
fn scale[T](x: T[B, ~N, C], s: T[]) -> T[B, ~N, C] { return x * s; }
import "path.rag"
)";

struct Parsed {
    SourceFile src;
    Diagnostics diags{src};
    ast::Module module;
    explicit Parsed(std::string text) : src("t.rag", std::move(text)) {
        module = parse(src, diags);
    }
};

// The s-expression of one expression, or its diagnostics.
std::string sexpr(const std::string& text) {
    SourceFile src("e.rag", text);
    Diagnostics diags(src);
    ast::ExprPtr e = parse_expr(src, diags);
    if (!diags.empty()) return diags.str();
    return e ? to_sexpr(*e) : "<null>";
}

// The formatted diagnostics of a whole file.
std::string errors(const std::string& text) {
    return Parsed(text).diags.str();
}

std::string at(const Parsed& p, Span s) {
    auto [line, col] = p.src.line_col(s.begin);
    return std::to_string(line) + ":" + std::to_string(col);
}

TEST(ParserPrograms, PairProgramParsesWithoutDiagnostics) {
    Parsed p(kPairProgram);
    EXPECT_EQ(p.diags.str(), "");
    ASSERT_EQ(p.module.params.size(), 1u);
    EXPECT_EQ(p.module.params[0].fields.size(), 6u);
    ASSERT_EQ(p.module.fns.size(), 3u);
    EXPECT_EQ(to_sexpr(p.module), kPairSexpr);
}

TEST(ParserPrograms, TypesAndGenericSignature) {
    Parsed p(kTypesProgram);
    EXPECT_EQ(p.diags.str(), "");
    EXPECT_EQ(to_sexpr(p.module), R"((import "path.rag")
(fn types ((a f32[B,~N,384]) (b f32[B,~N,~N,128]) (c f32[B,~N,~M,64]) (d f32[B,3,~H,~W]) (e f32[384,128]) (f f32[]) (g i64[B]))
  (return a))
(fn scale [T] ((x T[B,~N,C]) (s T[])) -> T[B,~N,C]
  (return (* x s)))
)");
    const auto& d = p.module.fns[0].params[3].type.dims;
    ASSERT_EQ(d.size(), 4u);
    EXPECT_EQ(d[0].kind, ast::DimExpr::Kind::symbolic);
    EXPECT_EQ(d[1].kind, ast::DimExpr::Kind::fixed);
    EXPECT_EQ(d[1].extent, 3);
    EXPECT_EQ(d[2].kind, ast::DimExpr::Kind::ragged);
    EXPECT_EQ(d[2].name, "H");
}

TEST(ParserPrograms, FunctionParametersAndWholeTypeParameters) {
    Parsed p("fn step[P, D](loss: fn, data: D, p: P, s: Adam[P]) -> (f32[], P) {\n"
             "    return value_and_grad(loss, wrt=-1)(*data, p)\n}\n");
    EXPECT_EQ(p.diags.str(), "");
    EXPECT_EQ(to_sexpr(p.module),
              R"((fn step [P D] ((loss fn) (data D) (p P) (s Adam[P])) -> (tuple f32[] P)
  (return (call (call value_and_grad loss (kw wrt (neg 1))) (spread data) p)))
)");
    EXPECT_EQ(p.module.fns[0].params[0].type.kind, ast::TypeExpr::Kind::function);
}

TEST(ParserPrograms, ExpressionsOfSection4) {
    EXPECT_EQ(sexpr("layernorm(x, g, b, eps=1e-5)"), "(call layernorm x g b (kw eps 1e-05))");
    EXPECT_EQ(sexpr("sum(x, axis=0)"), "(call sum x (kw axis 0))");
    EXPECT_EQ(sexpr("attention(q, k, v, causal=false)"),
              "(call attention q k v (kw causal false))");
    EXPECT_EQ(sexpr("relpos_attention(q, k, v, map=clip(16), aq=aq, bias=bias)"),
              "(call relpos_attention q k v (kw map (call clip 16)) (kw aq aq) (kw bias bias))");
    EXPECT_EQ(sexpr("t5_buckets(num=32, max_distance=128)"),
              "(call t5_buckets (kw num 32) (kw max_distance 128))");
    EXPECT_EQ(sexpr("grad(f, wrt=arg)"), "(call grad f (kw wrt arg))");
}

TEST(ParserPrograms, ParamsFieldSeparatorsAndOptionalInit) {
    Parsed p("params U { a: f32[3], b: f32[] = uniform(-0.1, 0.1); c: i64[B] }\n"
             "fn f(x: f32[]) { let y = x; return y; }");
    EXPECT_EQ(p.diags.str(), "");
    EXPECT_EQ(to_sexpr(p.module), R"((params U
  (field a f32[3])
  (field b f32[] (call uniform (neg 0.1) 0.1))
  (field c i64[B]))
(fn f ((x f32[]))
  (let y x)
  (return y))
)");
}

TEST(ParserPrograms, EmptyFileAndCommentsOnly) {
    Parsed empty("");
    EXPECT_TRUE(empty.diags.empty());
    EXPECT_EQ(to_sexpr(empty.module), "");
    Parsed comments("# nothing here\n   \n# still nothing");
    EXPECT_TRUE(comments.diags.empty());
    EXPECT_TRUE(comments.module.fns.empty());
}

TEST(ParserExpr, PrecedenceAndAssociativity) {
    EXPECT_EQ(sexpr("a + b * c"), "(+ a (* b c))");
    EXPECT_EQ(sexpr("a * b + c"), "(+ (* a b) c)");
    EXPECT_EQ(sexpr("a - b - c"), "(- (- a b) c)");
    EXPECT_EQ(sexpr("a / b * c"), "(* (/ a b) c)");
    EXPECT_EQ(sexpr("-x ** 2"), "(neg (** x 2))");
    EXPECT_EQ(sexpr("a ** b ** c"), "(** a (** b c))");
    EXPECT_EQ(sexpr("2 ** -1"), "(** 2 (neg 1))");
    EXPECT_EQ(sexpr("x @ W + b"), "(+ (@ x W) b)");
    EXPECT_EQ(sexpr("a @ b * c"), "(* (@ a b) c)");
    EXPECT_EQ(sexpr("- -x"), "(neg (neg x))");
    EXPECT_EQ(sexpr("a - -b"), "(- a (neg b))");
    EXPECT_EQ(sexpr("(a + b) * c"), "(* (+ a b) c)");
    EXPECT_EQ(sexpr("a + b < c * d"), "(< (+ a b) (* c d))");
    EXPECT_EQ(sexpr("a <= b"), "(<= a b)");
    EXPECT_EQ(sexpr("a >= b"), "(>= a b)");
    EXPECT_EQ(sexpr("a == b"), "(== a b)");
    EXPECT_EQ(sexpr("a != b"), "(!= a b)");
    EXPECT_EQ(sexpr("a > -b"), "(> a (neg b))");
    EXPECT_EQ(sexpr("(a < b) == c"), "(== (< a b) c)");
    EXPECT_EQ(sexpr("-p.w[0] ** 2"), "(neg (** (index (. p w) 0) 2))");
}

TEST(ParserExpr, Literals) {
    EXPECT_EQ(sexpr("42"), "42");
    EXPECT_EQ(sexpr("1.0"), "1.0");
    EXPECT_EQ(sexpr("1e-5"), "1e-05");
    EXPECT_EQ(sexpr("3.5e2"), "350.0");
    EXPECT_EQ(sexpr(".5"), "0.5");
    EXPECT_EQ(sexpr("true"), "true");
    EXPECT_EQ(sexpr("false"), "false");
    EXPECT_EQ(sexpr("9223372036854775807"), "9223372036854775807");
    EXPECT_EQ(sexpr("x_1 # comment\n"), "x_1");
}

TEST(ParserExpr, IndexItems) {
    EXPECT_EQ(sexpr("x[:, :, new, 0, 1:3, :-1, -2]"), "(index x : : new 0 1:3 :-1 -2)");
    EXPECT_EQ(sexpr("x[1:, -3:-1]"), "(index x 1: -3:-1)");
    EXPECT_EQ(sexpr("x[0][1]"), "(index (index x 0) 1)");
    SourceFile src("e.rag", "x[:, new, 2, 1:, :-1]");
    Diagnostics d(src);
    auto e = parse_expr(src, d);
    ASSERT_TRUE(e);
    using K = ast::IndexItem::Kind;
    ASSERT_EQ(e->items.size(), 5u);
    EXPECT_EQ(e->items[0].kind, K::keep);
    EXPECT_EQ(e->items[1].kind, K::newaxis);
    EXPECT_EQ(e->items[2].kind, K::index);
    EXPECT_EQ(e->items[2].index, 2);
    EXPECT_EQ(e->items[3].kind, K::slice);
    EXPECT_EQ(e->items[3].lo, 1);
    EXPECT_FALSE(e->items[3].hi);
    EXPECT_FALSE(e->items[4].lo);
    EXPECT_EQ(e->items[4].hi, -1);
}

TEST(ParserExpr, CallsMembersTuples) {
    EXPECT_EQ(sexpr("f()"), "(call f)");
    EXPECT_EQ(sexpr("f(a, b, k=v)"), "(call f a b (kw k v))");
    EXPECT_EQ(sexpr("f(a == b, k=c == d)"), "(call f (== a b) (kw k (== c d)))");
    EXPECT_EQ(sexpr("value_and_grad(loss, wrt=p)(x, p)"),
              "(call (call value_and_grad loss (kw wrt p)) x p)");
    EXPECT_EQ(sexpr("sgd(p, g, lr=0.01)"), "(call sgd p g (kw lr 0.01))");
    EXPECT_EQ(sexpr("loss(*data, p)"), "(call loss (spread data) p)");
    EXPECT_EQ(sexpr("f(*(a, b), c * d)"), "(call f (spread (tuple a b)) (* c d))");
    EXPECT_EQ(sexpr("p.wu"), "(. p wu)");
    EXPECT_EQ(sexpr("f(x).a.b"), "(. (. (call f x) a) b)");
    EXPECT_EQ(sexpr("(a, b)"), "(tuple a b)");
    EXPECT_EQ(sexpr("(a,)"), "(tuple a)");
    EXPECT_EQ(sexpr("(a)"), "a");
    EXPECT_EQ(sexpr("((a, b), c,)"), "(tuple (tuple a b) c)");
}

TEST(ParserExpr, TupleLet) {
    Parsed p("fn f() { let (y, (a, b)) = g(x); let (z,) = h(); let (w) = 1 }");
    EXPECT_EQ(p.diags.str(), "");
    EXPECT_EQ(to_sexpr(p.module), R"((fn f ()
  (let (tuple y (tuple a b)) (call g x))
  (let (tuple z) (call h))
  (let w 1))
)");
    const ast::Pattern& t = p.module.fns[0].body[0].target;
    ASSERT_TRUE(t.is_tuple());
    ASSERT_EQ(t.elems.size(), 2u);
    EXPECT_EQ(t.elems[0].name, "y");
    EXPECT_TRUE(t.elems[1].is_tuple());
}

TEST(ParserSpans, NodesCoverTheirText) {
    Parsed p(kPairProgram);
    ASSERT_EQ(p.module.fns.size(), 3u);
    const ast::FnDecl& loss = p.module.fns[1];
    EXPECT_EQ(at(p, loss.name_span), "20:4");
    EXPECT_EQ(at(p, loss.span), "20:1");
    EXPECT_EQ(at(p, loss.params[0].type.span), "20:12");
    EXPECT_EQ(at(p, loss.params[0].type.dims[1].span), "20:19");
    EXPECT_EQ(at(p, p.module.params[0].name_span), "2:8");
    EXPECT_EQ(at(p, p.module.params[0].fields[2].span), "5:5");
    // return mean(y * y) + mean(pair * pair)
    const ast::Stmt& ret = loss.body[1];
    EXPECT_EQ(at(p, ret.span), "22:5");
    const ast::Expr& sum = *ret.value;
    EXPECT_EQ(sum.op, "+");
    EXPECT_EQ(at(p, sum.span), "22:12");
    EXPECT_EQ(p.src.text().substr(sum.span.begin, sum.span.end - sum.span.begin),
              "mean(y * y) + mean(pair * pair)");
    const ast::Expr& rhs = *sum.operands[1];
    EXPECT_EQ(at(p, rhs.span), "22:26");
    EXPECT_EQ(at(p, rhs.args[0].span), "22:31");
    EXPECT_EQ(p.src.text().substr(rhs.span.begin, rhs.span.end - rhs.span.begin),
              "mean(pair * pair)");
    // let (l, g) = value_and_grad(loss, wrt=p)(x, p)
    const ast::Stmt& let = p.module.fns[2].body[0];
    EXPECT_EQ(at(p, let.target.span), "26:9");
    EXPECT_EQ(at(p, let.target.elems[1].span), "26:13");
    const ast::Expr& outer = *let.value;
    const ast::Expr& inner = *outer.operands[0];
    EXPECT_EQ(p.src.text().substr(inner.span.begin, inner.span.end - inner.span.begin),
              "value_and_grad(loss, wrt=p)");
    EXPECT_EQ(at(p, inner.args[1].span), "26:39");
    EXPECT_EQ(outer.span.end, inner.span.end + 6);
}

TEST(ParserSpans, ParenthesesBelongToTheNode) {
    SourceFile src("e.rag", "(a + b) * c");
    Diagnostics d(src);
    auto e = parse_expr(src, d);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->span.begin, 0u);
    EXPECT_EQ(e->span.end, 11u);
    EXPECT_EQ(e->operands[0]->span.begin, 0u);
    EXPECT_EQ(e->operands[0]->span.end, 7u);
    EXPECT_EQ(e->operands[0]->operands[1]->span.begin, 5u);
}

TEST(ParserErrors, ExactDiagnostics) {
    EXPECT_EQ(errors("fn f(x: f32[]) { return g(*) }"),
              R"(t.rag:1:28: error: expected a tuple to spread after '*'
    fn f(x: f32[]) { return g(*) }
                               ^
)");
    EXPECT_EQ(errors("fn f(x: f32[B) {}"),
              R"(t.rag:1:14: error: expected ']' to close the dimensions
    fn f(x: f32[B) {}
                 ^
)");
    EXPECT_EQ(errors("fn f(x: f32[B, ~N, 384]) -> f32[] { return x + }"),
              R"(t.rag:1:48: error: expected an expression after '+'
    fn f(x: f32[B, ~N, 384]) -> f32[] { return x + }
                                                   ^
)");
    EXPECT_EQ(errors("fn f() { let let = 1 }"), R"(t.rag:1:14: error: 'let' is a keyword, not a name
    fn f() { let let = 1 }
                 ^~~
)");
    EXPECT_EQ(errors("fn f(a: f32[]) { return sum(a, axis=2 }"),
              R"(t.rag:1:39: error: expected ')' to close the argument list
    fn f(a: f32[]) { return sum(a, axis=2 }
                                          ^
)");
    EXPECT_EQ(errors("params P { w: f32[3] = normal(0.02)\n  b: }"),
              R"(t.rag:2:6: error: expected a type such as f32[B, ~N, 384]
      b: }
         ^
)");
    EXPECT_EQ(errors("fn f() { return a < b < c }"),
              R"(t.rag:1:23: error: comparison operators do not chain; add parentheses
    fn f() { return a < b < c }
                          ^
)");
    EXPECT_EQ(errors("fn f() { return $x }"), R"(t.rag:1:17: error: unexpected character '$'
    fn f() { return $x }
                    ^
)");
    EXPECT_EQ(errors("import \"lib.rag"), R"(t.rag:1:8: error: unterminated string
    import "lib.rag
           ^~~~~~~~
)");
    EXPECT_EQ(errors("fn f() { return 123456789012345678901234 }"),
              R"(t.rag:1:17: error: integer literal out of range
    fn f() { return 123456789012345678901234 }
                    ^~~~~~~~~~~~~~~~~~~~~~~~
)");
    EXPECT_EQ(errors("let x = 1"), R"(t.rag:1:1: error: expected 'fn', 'params' or 'import'
    let x = 1
    ^~~
)");
    EXPECT_EQ(errors("fn f(x: f32[]) f32[] {}"),
              R"(t.rag:1:16: error: expected '{' to start the body of fn f
    fn f(x: f32[]) f32[] {}
                   ^~~
)");
    EXPECT_EQ(errors("fn f() { return f(k=1, 2) }"),
              R"(t.rag:1:24: error: positional argument after keyword argument
    fn f() { return f(k=1, 2) }
                           ^
)");
    EXPECT_EQ(errors("fn f() -> f32[] { return x[] }"),
              R"(t.rag:1:28: error: expected an index item such as ':', 'new', 0, 1:3 or ids
    fn f() -> f32[] { return x[] }
                               ^
)");
    EXPECT_EQ(errors("fn f() { let (a, b) 3 }"),
              R"(t.rag:1:21: error: expected '=' after the let pattern
    fn f() { let (a, b) 3 }
                        ^
)");
    EXPECT_EQ(errors("fn f() { return 1e999 }"), R"(t.rag:1:17: error: float literal out of range
    fn f() { return 1e999 }
                    ^~~~~
)");
    EXPECT_EQ(errors("fn (x: f32[]) {}"), R"(t.rag:1:4: error: expected a function name after 'fn'
    fn (x: f32[]) {}
       ^
)");
    EXPECT_EQ(errors("fn f() { let x = 1 2 }"),
              R"(t.rag:1:20: error: expected a statement or '}' to close the body of fn f
    fn f() { let x = 1 2 }
                       ^
)");
    EXPECT_EQ(errors("fn f() {}}"), R"(t.rag:1:10: error: expected 'fn', 'params' or 'import'
    fn f() {}}
             ^
)");
}

TEST(ParserErrors, EndOfFilePointsAfterTheLastToken) {
    EXPECT_EQ(errors("fn f(x: f32[]) -> f32[] {\n    let y = (x   # open\n\n"),
              R"(t.rag:2:15: error: expected ')' to close the parentheses
        let y = (x   # open
                  ^
)");
}

TEST(ParserErrors, TwoBrokenFunctionsReportTwoErrors) {
    Parsed p("fn a(x: f32[]) -> f32[] {\n"
             "  let y = x +\n"
             "}\n"
             "\n"
             "fn b(x f32[]) {\n"
             "  return x\n"
             "}\n"
             "fn c() { return 1 }\n");
    EXPECT_EQ(p.diags.str(), R"(t.rag:3:1: error: expected an expression after '+'
    }
    ^
t.rag:5:8: error: expected ':' after the parameter name
    fn b(x f32[]) {
           ^~~
)");
    ASSERT_EQ(p.module.fns.size(), 1u);
    EXPECT_EQ(p.module.fns[0].name, "c");
}

TEST(ParserErrors, ResynchronisesOnlyAtLineStarts) {
    Parsed p("params P { w f32[] }  fn x() {}\n"
             "  fn g() { return 1 }\n"
             "import\n");
    ASSERT_EQ(p.diags.items().size(), 2u);
    EXPECT_EQ(p.diags.items()[0].message, "expected ':' after the field name");
    EXPECT_EQ(p.diags.items()[1].message, "expected a quoted path after 'import'");
    ASSERT_EQ(p.module.fns.size(), 1u);
    EXPECT_EQ(p.module.fns[0].name, "g");
}

TEST(ParserErrors, ParseExprReportsTrailingInput) {
    EXPECT_EQ(sexpr("a b"), R"(e.rag:1:3: error: expected an operator or the end of the expression
    a b
      ^
)");
    EXPECT_EQ(sexpr(""), R"(e.rag:1:1: error: expected an expression
    
    ^
)");
}

TEST(ParserLimits, DeepNestingIsADiagnostic) {
    const int n = 100000;
    auto deep_error = [](const std::string& text, bool whole_file) {
        SourceFile src("d.rag", text);
        Diagnostics d(src);
        if (whole_file)
            parse(src, d);
        else
            parse_expr(src, d);
        return d.items().size() == 1 ? d.items()[0].message : d.str();
    };
    EXPECT_EQ(deep_error(std::string(n, '(') + "x" + std::string(n, ')'), false),
              "expression nested too deeply");
    EXPECT_EQ(deep_error(std::string(n, '-') + "x", false), "expression nested too deeply");
    std::string chain = "a", calls = "x", pow = "a";
    for (int i = 0; i < n; ++i) chain += "+a", calls += "()", pow += "**a";
    EXPECT_EQ(deep_error(chain, false), "expression nested too deeply");
    EXPECT_EQ(deep_error(calls, false), "expression nested too deeply");
    EXPECT_EQ(deep_error(pow, false), "expression nested too deeply");
    std::string nested_calls;
    for (int i = 0; i < n; ++i) nested_calls += "f(";
    EXPECT_EQ(deep_error(nested_calls, false), "expression nested too deeply");
    EXPECT_EQ(deep_error("fn f(x: " + std::string(n, '(') + ") {}", true),
              "type nested too deeply");
    EXPECT_EQ(deep_error("fn f() { let " + std::string(n, '(') + " }", true),
              "pattern nested too deeply");
    // Reasonable nesting is fine.
    EXPECT_EQ(sexpr(std::string(100, '(') + "x" + std::string(100, ')')), "x");
}

} // namespace
} // namespace rag::frontend
