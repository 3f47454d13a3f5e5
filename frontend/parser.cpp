// The parser: rag source text -> ast::Module, written with Boost.Spirit X3.
//
// Layout: character-level primitives (names, keywords, numbers, strings: hand-written so that
// keywords, overflow and unterminated strings get precise messages), two directives (`spanned`
// records the span of a rule's node, `deep` bounds recursion), the grammar from the lowest
// precedence up, then the error handler and the entry points.
//
// Errors. Wherever the grammar has committed it uses an X3 expectation point (`a > b`) on a named
// rule, and the name says what was expected in user terms ("')' to close the argument list").
// The handler on `top_decl` turns the expectation_failure into a Diagnostic at the offending
// token and resumes at the next line that starts with `fn`, `params` or `import`, so one file
// reports several errors. A name starting with '!' is a whole message instead of "expected ...";
// `{decl}` in a name is replaced by the declaration being parsed ("fn block").
//
// Limits. Parser recursion (parentheses, unary minus, `**`, tuple types and patterns) and the
// height of expression trees are capped at kMaxDepth, so that no input exhausts the stack here
// or in the passes that walk the tree.
#include "frontend/parser.hpp"

#include <boost/spirit/home/x3.hpp>

#include <algorithm>
#include <charconv>
#include <string_view>

// What an action expected is what its subject expected: `a > b[f]` reports b's rule name.
namespace boost::spirit::x3 {
template <class Subject, class Action> struct get_info<action<Subject, Action>> {
    using result_type = std::string;
    std::string operator()(const action<Subject, Action>& p) const { return what(p.subject); }
};
} // namespace boost::spirit::x3

namespace rag::frontend {
namespace {

namespace x3 = boost::spirit::x3;
using It = const char*;
using Failure = x3::expectation_failure<It>;

constexpr int kMaxDepth = 256;

bool is_alpha(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
bool is_ident_char(char c) {
    return is_alpha(c) || is_digit(c);
}
bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool is_keyword(std::string_view s) {
    for (std::string_view k :
         {"fn", "let", "return", "for", "params", "import", "new", "true", "false"})
        if (s == k) return true;
    return false;
}

It skip_trivia(It p, It end) {
    while (p < end) {
        if (is_space(*p))
            ++p;
        else if (*p == '#')
            while (p < end && *p != '\n') ++p;
        else
            break;
    }
    return p;
}

// ---- Parser state, reached from every rule through the X3 context.

struct Node { // an expression under construction; height bounds the finished tree
    ast::Expr e;
    int height = 1;
};
struct ArgNode {
    ast::Arg arg;
    int height = 1;
};
struct CallSuffix {
    std::vector<ast::Arg> args;
    int height = 0;
    Span span;
};
struct IndexSuffix {
    std::vector<ast::IndexItem> items;
    Span span;
};
struct Name { // a declared or member name with its span
    std::string name;
    Span span;
};

Span& span_of(Node& n) {
    return n.e.span;
}
Span& span_of(ArgNode& a) {
    return a.arg.span;
}
template <class T> Span& span_of(T& t) {
    return t.span;
}

ast::ExprPtr share(Node&& n) {
    return std::make_shared<const ast::Expr>(std::move(n.e));
}

struct State {
    It base, end; // the whole text; spans are offsets from base
    Diagnostics& diags;
    ast::Module module;
    std::string decl; // "fn block": the declaration being parsed, for messages
    int depth = 0;

    Span span(It b, It e) const { return {std::uint32_t(b - base), std::uint32_t(e - base)}; }
    void report(const Failure& f);
    It resync(It decl_start, It where) const;
};
struct state_tag;
template <class Ctx> State& state(const Ctx& ctx) {
    return x3::get<state_tag>(ctx);
}

// ---- Primitives.

// A name, `[A-Za-z_][A-Za-z0-9_]*` that is not a keyword. With `keyword_is_error`, a keyword in
// its place is reported ("'let' is a keyword, not a name") instead of failing quietly.
struct ident_parser : x3::parser<ident_parser> {
    using attribute_type = std::string;
    bool keyword_is_error = false;
    constexpr ident_parser(bool k) : keyword_is_error(k) {}
    template <class Ctx, class RCtx, class Attr>
    bool parse(It& first, const It& last, const Ctx& ctx, RCtx&, Attr& attr) const {
        x3::skip_over(first, last, ctx);
        if (first == last || !is_alpha(*first)) return false;
        It p = first;
        while (p < last && is_ident_char(*p)) ++p;
        std::string s(first, p);
        if (is_keyword(s)) {
            if (keyword_is_error) throw Failure(first, "!'" + s + "' is a keyword, not a name");
            return false;
        }
        x3::traits::move_to(s, attr);
        first = p;
        return true;
    }
};

struct keyword_parser : x3::parser<keyword_parser> {
    using attribute_type = x3::unused_type;
    std::string_view word;
    constexpr keyword_parser(const char* w) : word(w) {}
    template <class Ctx, class RCtx, class Attr>
    bool parse(It& first, const It& last, const Ctx& ctx, RCtx&, Attr&) const {
        x3::skip_over(first, last, ctx);
        if (std::size_t(last - first) < word.size() || std::string_view(first, word.size()) != word)
            return false;
        if (first + word.size() < last && is_ident_char(first[word.size()])) return false;
        first += word.size();
        return true;
    }
};

// An integer (dimension, index): optionally signed, never followed by a name character or '.'.
struct int_parser : x3::parser<int_parser> {
    using attribute_type = std::int64_t;
    bool allow_sign;
    constexpr int_parser(bool s) : allow_sign(s) {}
    template <class Ctx, class RCtx, class Attr>
    bool parse(It& first, const It& last, const Ctx& ctx, RCtx&, Attr& attr) const {
        x3::skip_over(first, last, ctx);
        It p = first;
        if (allow_sign && p < last && *p == '-') ++p;
        if (p == last || !is_digit(*p)) return false;
        while (p < last && is_digit(*p)) ++p;
        if (p < last && (is_ident_char(*p) || *p == '.')) return false;
        std::int64_t v = 0;
        if (std::from_chars(first, p, v).ec != std::errc())
            throw Failure(first, "!integer literal out of range");
        x3::traits::move_to(v, attr);
        first = p;
        return true;
    }
};

// A number literal in an expression: `42`, `1.0`, `1e-5`, `3.5e2`, `.5`.
struct number_parser : x3::parser<number_parser> {
    using attribute_type = Node;
    template <class Ctx, class RCtx, class Attr>
    bool parse(It& first, const It& last, const Ctx& ctx, RCtx&, Attr& attr) const {
        x3::skip_over(first, last, ctx);
        auto digit_at = [&](It q) { return q < last && is_digit(*q); };
        It p = first;
        if (!digit_at(p) && !(p < last && *p == '.' && digit_at(p + 1))) return false;
        bool is_float = false;
        while (digit_at(p)) ++p;
        if (p < last && *p == '.' && digit_at(p + 1)) {
            is_float = true;
            for (++p; digit_at(p);) ++p;
        }
        if (p < last && (*p == 'e' || *p == 'E')) {
            It q = p + 1;
            if (q < last && (*q == '+' || *q == '-')) ++q;
            if (digit_at(q)) {
                is_float = true;
                for (p = q; digit_at(p);) ++p;
            }
        }
        if (p < last && is_ident_char(*p)) throw Failure(first, "!malformed number literal");
        Node n;
        if (is_float) {
            n.e.kind = ast::Expr::Kind::floating;
            if (std::from_chars(first, p, n.e.fval).ec != std::errc())
                throw Failure(first, "!float literal out of range");
        } else {
            n.e.kind = ast::Expr::Kind::integer;
            if (std::from_chars(first, p, n.e.ival).ec != std::errc())
                throw Failure(first, "!integer literal out of range");
        }
        x3::traits::move_to(n, attr);
        first = p;
        return true;
    }
};

// A double-quoted string on one line, without escapes (import paths).
struct string_parser : x3::parser<string_parser> {
    using attribute_type = std::string;
    template <class Ctx, class RCtx, class Attr>
    bool parse(It& first, const It& last, const Ctx& ctx, RCtx&, Attr& attr) const {
        x3::skip_over(first, last, ctx);
        if (first == last || *first != '"') return false;
        It p = first + 1;
        while (p < last && *p != '"' && *p != '\n') ++p;
        if (p == last || *p != '"') throw Failure(first, "!unterminated string");
        std::string s(first + 1, p);
        x3::traits::move_to(s, attr);
        first = p + 1;
        return true;
    }
};

// Fails at the next token with `what` ("expected <what>", or a whole message after '!').
struct fail_parser : x3::parser<fail_parser> {
    using attribute_type = x3::unused_type;
    const char* what;
    constexpr fail_parser(const char* w) : what(w) {}
    template <class Ctx, class RCtx, class Attr>
    bool parse(It& first, const It& last, const Ctx& ctx, RCtx&, Attr&) const {
        x3::skip_over(first, last, ctx);
        throw Failure(first, what);
    }
};

// spanned[p]: the enclosing rule's node gets the span of the text p matched.
template <class Subject>
struct spanned_directive : x3::unary_parser<Subject, spanned_directive<Subject>> {
    static bool const is_pass_through_unary = true;
    constexpr spanned_directive(const Subject& s)
        : x3::unary_parser<Subject, spanned_directive<Subject>>(s) {}
    template <class Ctx, class RCtx, class Attr>
    bool parse(It& first, const It& last, const Ctx& ctx, RCtx& rctx, Attr& attr) const {
        It save = first;
        x3::skip_over(first, last, ctx);
        It start = first;
        if (!this->subject.parse(first, last, ctx, rctx, attr)) {
            first = save;
            return false;
        }
        span_of(rctx) = state(ctx).span(start, first);
        return true;
    }
};
struct spanned_gen {
    template <class S> constexpr auto operator[](const S& s) const {
        return spanned_directive<typename x3::extension::as_parser<S>::value_type>{
            x3::as_parser(s)};
    }
};
constexpr spanned_gen spanned{};

// deep(msg)[p]: p is one level of recursion; more than kMaxDepth levels is an error.
template <class Subject>
struct deep_directive : x3::unary_parser<Subject, deep_directive<Subject>> {
    static bool const is_pass_through_unary = true;
    const char* message;
    constexpr deep_directive(const Subject& s, const char* m)
        : x3::unary_parser<Subject, deep_directive<Subject>>(s), message(m) {}
    template <class Ctx, class RCtx, class Attr>
    bool parse(It& first, const It& last, const Ctx& ctx, RCtx& rctx, Attr& attr) const {
        State& st = state(ctx);
        if (st.depth >= kMaxDepth) {
            x3::skip_over(first, last, ctx);
            throw Failure(first, message);
        }
        struct Level {
            int& d;
            explicit Level(int& depth) : d(depth) { ++d; }
            ~Level() { --d; }
        } level(st.depth);
        return this->subject.parse(first, last, ctx, rctx, attr);
    }
};
struct deep {
    const char* message;
    template <class S> constexpr auto operator[](const S& s) const {
        return deep_directive<typename x3::extension::as_parser<S>::value_type>{x3::as_parser(s),
                                                                                message};
    }
};

// A rule whose name is what the user is told was expected when `p` does not match.
struct named_id;
template <class Attr = x3::unused_type, class P>
constexpr auto named(const char* what, const P& p) {
    return x3::rule<named_id, Attr>{what} = x3::as_parser(p);
}

constexpr ident_parser ident{false}, decl_ident{true};
constexpr int_parser uint_{false}, sint_{true};
constexpr number_parser number{};
constexpr string_parser string_lit{};
keyword_parser kw(const char* w) {
    return {w};
}

// ---- Node builders (used by the semantic actions).

template <class Ctx> void check_height(const Ctx& ctx, const Node& n) {
    if (n.height > kMaxDepth)
        throw Failure(state(ctx).base + n.e.span.begin, "!expression nested too deeply");
}

template <class Ctx> Node wrap(const Ctx& ctx, ast::Expr::Kind kind, Node&& inner, Span span) {
    Node n;
    n.e.kind = kind;
    n.e.span = span;
    n.height = inner.height + 1;
    n.e.operands.push_back(share(std::move(inner)));
    check_height(ctx, n);
    return n;
}

auto const set = [](auto& ctx) { x3::_val(ctx) = std::move(x3::_attr(ctx)); };

auto fold(const char* op) {
    return [op](auto& ctx) {
        Node& v = x3::_val(ctx);
        Node& rhs = x3::_attr(ctx);
        Node n = wrap(ctx, ast::Expr::Kind::binary, std::move(v), {v.e.span.begin, rhs.e.span.end});
        n.e.op = op;
        n.height = std::max(n.height, rhs.height + 1);
        n.e.operands.push_back(share(std::move(rhs)));
        check_height(ctx, n);
        v = std::move(n);
    };
}

auto const neg = [](auto& ctx) {
    Node& v = x3::_val(ctx);
    v = wrap(ctx, ast::Expr::Kind::unary, std::move(x3::_attr(ctx)), x3::_attr(ctx).e.span);
    v.e.op = "-";
};

auto const to_tuple = [](auto& ctx) {
    Node& v = x3::_val(ctx);
    v = wrap(ctx, ast::Expr::Kind::tuple, std::move(v), v.e.span);
};

auto const push_elem = [](auto& ctx) {
    Node& v = x3::_val(ctx);
    v.height = std::max(v.height, x3::_attr(ctx).height + 1);
    v.e.operands.push_back(share(std::move(x3::_attr(ctx))));
    check_height(ctx, v);
};

auto const apply_call = [](auto& ctx) {
    Node& v = x3::_val(ctx);
    CallSuffix& s = x3::_attr(ctx);
    bool keyword_seen = false;
    for (const auto& a : s.args) {
        if (!a.keyword.empty())
            keyword_seen = true;
        else if (keyword_seen)
            throw Failure(state(ctx).base + a.span.begin,
                          "!positional argument after keyword argument");
    }
    Node n = wrap(ctx, ast::Expr::Kind::call, std::move(v), {v.e.span.begin, s.span.end});
    n.height = std::max(n.height, s.height + 1);
    n.e.args = std::move(s.args);
    check_height(ctx, n);
    v = std::move(n);
};

auto const apply_index = [](auto& ctx) {
    Node& v = x3::_val(ctx);
    IndexSuffix& s = x3::_attr(ctx);
    v = wrap(ctx, ast::Expr::Kind::index, std::move(v), {v.e.span.begin, s.span.end});
    v.e.items = std::move(s.items);
};

auto const apply_member = [](auto& ctx) {
    Node& v = x3::_val(ctx);
    Name& s = x3::_attr(ctx);
    v = wrap(ctx, ast::Expr::Kind::member, std::move(v), {v.e.span.begin, s.span.end});
    v.e.name = std::move(s.name);
};

auto literal_bool(bool b) {
    return [b](auto& ctx) {
        x3::_val(ctx).e.kind = ast::Expr::Kind::boolean;
        x3::_val(ctx).e.bval = b;
    };
}

auto const string_expr = [](auto& ctx) {
    x3::_val(ctx).e.kind = ast::Expr::Kind::string;
    x3::_val(ctx).e.name = std::move(x3::_attr(ctx));
};

auto const name_expr = [](auto& ctx) {
    x3::_val(ctx).e.kind = ast::Expr::Kind::name;
    x3::_val(ctx).e.name = std::move(x3::_attr(ctx));
};

// Applies f(val, attr): the short form of most actions below.
template <class F> auto act(F f) {
    return [f](auto& ctx) { f(x3::_val(ctx), x3::_attr(ctx)); };
}

// ---- The grammar.
//
// Every `a > b` reports what(b) when b fails, so b is always a named rule, a rule, an action on one
// (see get_info below) or an optional/kleene that cannot fail. Note that `>>` binds tighter than
// `>`: after a commit point the sequence goes on with `>`.

template <class P> auto operand(const char* what, const P& p) {
    return named<Node>(what, p);
}
template <class P> auto binop(const char* op, const char* what, const P& next) {
    return (x3::lit(op) > operand(what, next))[fold(op)];
}

auto const skipper = x3::ascii::space | (x3::lit('#') >> *(x3::char_ - x3::eol));

x3::rule<struct expr_id, Node> const expr = "an expression";
x3::rule<struct sum_id, Node> const sum = "an expression";
x3::rule<struct prod_id, Node> const prod = "an expression";
x3::rule<struct unary_id, Node> const unary = "an expression";
x3::rule<struct power_id, Node> const power = "an expression";
x3::rule<struct postfix_id, Node> const postfix = "an expression";
x3::rule<struct primary_id, Node> const primary = "an expression";
x3::rule<struct arg_id, ArgNode> const arg = "an argument";
x3::rule<struct call_suffix_id, CallSuffix> const call_suffix = "an argument list";
x3::rule<struct index_suffix_id, IndexSuffix> const index_suffix = "an index";
x3::rule<struct index_item_id, ast::IndexItem> const index_item =
    "an index item such as ':', 'new', 0, 1:3 or ids";
x3::rule<struct member_suffix_id, Name> const member_suffix = "a field name";
x3::rule<struct type_id, ast::TypeExpr> const type = "a type such as f32[B, ~N, 384]";
x3::rule<struct dim_id, ast::DimExpr> const dim = "a dimension such as B, ~N or 384";
x3::rule<struct pattern_id, ast::Pattern> const pattern = "a name or a tuple of names";
x3::rule<struct decl_name_id, Name> const decl_name = "a name";
x3::rule<struct stmt_id, ast::Stmt> const stmt = "a statement";
x3::rule<struct param_id, ast::Param> const param = "a parameter such as x: f32[B, ~N, 384]";
x3::rule<struct field_id, ast::ParamField> const field = "a field such as w: f32[384, 128]";
x3::rule<struct fn_decl_id, ast::FnDecl> const fn_decl = "a function";
x3::rule<struct params_decl_id, ast::ParamsDecl> const params_decl = "a params block";
x3::rule<struct import_decl_id, ast::Import> const import_decl = "an import";

// Expressions, lowest precedence first. Comparisons do not chain.
auto const cmp_op = x3::lit("<=") | ">=" | "==" | "!=" | '<' | '>';
auto const expr_def = spanned
    [sum[set] >>
     -(binop("<=", "an expression after '<='", sum) | binop(">=", "an expression after '>='", sum) |
       binop("==", "an expression after '=='", sum) | binop("!=", "an expression after '!='", sum) |
       binop("<", "an expression after '<'", sum) | binop(">", "an expression after '>'", sum)) >>
     -(&cmp_op >> fail_parser{"!comparison operators do not chain; add parentheses"})];
auto const sum_def = spanned[prod[set] >> *(binop("+", "an expression after '+'", prod) |
                                            binop("-", "an expression after '-'", prod))];
auto const prod_def = spanned[unary[set] >> *(binop("*", "an expression after '*'", unary) |
                                              binop("/", "an expression after '/'", unary) |
                                              binop("@", "an expression after '@'", unary))];
// `-x ** 2` is `-(x ** 2)`; `2 ** -1` and `a ** b ** c` = `a ** (b ** c)` recurse through unary.
auto const unary_def =
    spanned[deep{"!expression nested too deeply"}
                [(x3::lit('-') > operand("an expression after '-'", unary))[neg] | power[set]]];
auto const power_def = spanned[postfix[set] >> -binop("**", "an expression after '**'", unary)];
auto const postfix_def =
    spanned[primary[set] >>
            *(call_suffix[apply_call] | index_suffix[apply_index] | member_suffix[apply_member])];
auto const primary_def =
    spanned[number[set] | kw("true")[literal_bool(true)] | kw("false")[literal_bool(false)] |
            ident[name_expr] | string_lit[string_expr] |
            ((x3::lit('(') > operand("an expression after '('", expr)[set]) >
             -(x3::lit(',')[to_tuple] >> -((expr[push_elem] % ',') >> -x3::lit(','))) >
             named("')' to close the parentheses", ')'))];

auto const push_arg = act([](CallSuffix& s, ArgNode& a) {
    s.height = std::max(s.height, a.height);
    s.args.push_back(std::move(a.arg));
});
auto const call_suffix_def =
    spanned[(x3::lit('(') >>
             -(arg[push_arg] >>
               *(x3::lit(',') > named<ArgNode>("an argument after ','", arg)[push_arg]))) >
            named("')' to close the argument list", ')')];
auto const set_arg_value = act([](ArgNode& a, Node& n) {
    a.height = n.height;
    a.arg.value = share(std::move(n));
});
auto const arg_def =
    spanned[((ident >> x3::lit('=') >> !x3::lit('='))[act([](ArgNode& a, std::string& k) {
                 a.arg.keyword = std::move(k);
             })] > operand("an expression after '='", expr)[set_arg_value]) |
            (x3::lit('*')[([](auto& ctx) { x3::_val(ctx).arg.spread = true; })] >
             operand("a tuple to spread after '*'", expr)[set_arg_value]) |
            expr[set_arg_value]];

auto const push_item =
    act([](IndexSuffix& s, ast::IndexItem& i) { s.items.push_back(std::move(i)); });
auto const index_suffix_def =
    spanned[(x3::lit('[') > index_item[push_item]) > *(x3::lit(',') > index_item[push_item]) >
            named("']' to close the index", ']')];
using Item = ast::IndexItem::Kind;
auto const slice_hi =
    act([](ast::IndexItem& i, std::int64_t v) { i.kind = Item::slice, i.hi = v; });
auto const slice_step = act([](ast::IndexItem& i, std::int64_t v) { i.step = v; });
auto const to_slice = [](auto& ctx) { x3::_val(ctx).kind = Item::slice; };
// `a:b:s` after its first ':' and optional bound: an optional second ':' and step.
auto const step_part = -(x3::lit(':')[to_slice] >> -sint_[slice_step]);
auto const item_end = &(x3::lit(',') | ']' | ':');
auto const index_item_def =
    spanned[(x3::lit(':')[([](auto& ctx) { x3::_val(ctx).kind = Item::keep; })] >>
             -sint_[slice_hi] >> step_part) |
            kw("new")[([](auto& ctx) { x3::_val(ctx).kind = Item::newaxis; })] |
            (sint_[act(
                 [](ast::IndexItem& i, std::int64_t v) { i.kind = Item::index, i.index = v; })] >>
             item_end >> -(x3::lit(':')[([](auto& ctx) {
                               auto& i = x3::_val(ctx);
                               i.kind = Item::slice, i.lo = i.index;
                           })] >>
                           -sint_[slice_hi] >> step_part)) |
            expr[act([](ast::IndexItem& i, Node& n) {
                i.kind = Item::gather, i.ids = share(std::move(n));
            })]];
auto const member_suffix_def =
    spanned[x3::lit('.') > named<std::string>("a field name after '.'", ident)[act(
                               [](Name& m, std::string& s) { m.name = std::move(s); })]];

// Types: `f32[B, ~N, 384]`, `T[...]`, `PairBlock`, `(f32[], PairBlock)`; `(T)` is T.
// `~N[1:]`: the axis a slice of ~N makes, named as index's type rule names it (one canonical
// name per length rule, so `~N[:-1]` is `~N[1:]`).
using DimSlice = ast::DimExpr::Slice;
auto const axis_slice = x3::rule<struct axis_slice_id, DimSlice>{"a slice"} =
    (x3::lit('+') >> uint_[act([](DimSlice& s, std::int64_t v) { s.grow = v; })]) |
    (x3::lit('*') >> uint_[act([](DimSlice& s, std::int64_t v) { s.scale = v; })]) |
    -sint_[act([](DimSlice& s, std::int64_t v) { s.lo = v; })] >> x3::lit(':') >>
        -sint_[act([](DimSlice& s, std::int64_t v) { s.hi = v; })] >>
        -(x3::lit(':') >> sint_[act([](DimSlice& s, std::int64_t v) { s.step = v; })]);
using Dim = ast::DimExpr::Kind;
using Type = ast::TypeExpr::Kind;
auto const dim_def =
    spanned[uint_[act([](ast::DimExpr& d, std::int64_t v) { d.kind = Dim::fixed, d.extent = v; })] |
            // `>>` binds tighter than `>`: the parentheses keep the expectation on the name
            // alone, so its failure names it rather than an unnamed sequence.
            ((x3::lit('~') > named<std::string>("a name after '~'",
                                                ident)[act([](ast::DimExpr& d, std::string& s) {
                  d.kind = Dim::ragged, d.name = std::move(s);
              })]) >>
             *(x3::lit('[') > named<DimSlice>("a slice such as 1:, :-1, ::2, +2 or *2",
                                              axis_slice)[act([](ast::DimExpr& d, DimSlice& s) {
                   d.slices.push_back(s);
               })] > named("']' to close the slice", ']'))) |
            ident[act([](ast::DimExpr& d, std::string& s) {
                d.kind = Dim::symbolic, d.name = std::move(s);
            })]];
auto const push_dim =
    act([](ast::TypeExpr& t, ast::DimExpr& d) { t.dims.push_back(std::move(d)); });
auto const tensor_type = (ident >> x3::lit('['))[act([](ast::TypeExpr& t, std::string& s) {
                             t.kind = Type::tensor, t.dtype = std::move(s);
                         })] > -(dim[push_dim] >> *(x3::lit(',') > dim[push_dim])) >
                         named("']' to close the dimensions", ']') >
                         // `Linear[384, 128][4]`: an array of a sized params group.
                         -(x3::lit('[') >
                           named<ast::DimExpr>("an array extent",
                                               dim)[act([](ast::TypeExpr& t, ast::DimExpr& d) {
                               t.array = std::move(d);
                           })] > named("']' to close the array extent", ']'));
auto const named_type = ident[act(
    [](ast::TypeExpr& t, std::string& s) { t.kind = Type::named, t.name = std::move(s); })];
auto const to_tuple_type = [](auto& ctx) {
    ast::TypeExpr t;
    t.kind = Type::tuple;
    t.elems.push_back(std::move(x3::_val(ctx)));
    x3::_val(ctx) = std::move(t);
};
auto const push_type =
    act([](ast::TypeExpr& t, ast::TypeExpr& e) { t.elems.push_back(std::move(e)); });
auto const tuple_type = (x3::lit('(') > type[set]) >
                        -(x3::lit(',')[to_tuple_type] >>
                          -((type[push_type] % ',') >> -x3::lit(','))) >
                        named("')' to close the tuple type", ')');
auto const fn_type = kw("fn")[([](auto& ctx) { x3::_val(ctx).kind = Type::function; })];
auto const type_def =
    spanned[deep{"!type nested too deeply"}[fn_type | tensor_type | named_type | tuple_type]];

// Statements. A `let` target is a name or a tuple of targets; `(a)` is a.
auto const to_tuple_pattern = [](auto& ctx) {
    ast::Pattern p;
    p.elems.push_back(std::move(x3::_val(ctx)));
    x3::_val(ctx) = std::move(p);
};
auto const push_pattern =
    act([](ast::Pattern& p, ast::Pattern& e) { p.elems.push_back(std::move(e)); });
auto const tuple_pattern = (x3::lit('(') > pattern[set]) >
                           -(x3::lit(',')[to_tuple_pattern] >>
                             -((pattern[push_pattern] % ',') >> -x3::lit(','))) >
                           named("')' to close the tuple pattern", ')');
auto const name_pattern =
    decl_ident[act([](ast::Pattern& p, std::string& s) { p.name = std::move(s); })];
auto const pattern_def = spanned[deep{"!pattern nested too deeply"}[tuple_pattern | name_pattern]];

auto const set_target = act(
    [](ast::Stmt& s, ast::Pattern& p) { s.kind = ast::Stmt::Kind::let, s.target = std::move(p); });
auto const set_value = act([](ast::Stmt& s, Node& n) { s.value = share(std::move(n)); });
auto const let_stmt = kw("let") > named<ast::Pattern>("a name or a tuple of names after 'let'",
                                                      pattern)[set_target] >
                      named("'=' after the let pattern", '=') >
                      operand("an expression after '='", expr)[set_value];
auto const
    return_stmt = kw("return")[([](auto& ctx) { x3::_val(ctx).kind = ast::Stmt::Kind::ret; })] >
                  operand("an expression after 'return'", expr)[set_value];
auto const assign_stmt = (decl_ident >> x3::lit('=') >>
                          !x3::lit('='))[act([](ast::Stmt& s, std::string& n) {
                             s.kind = ast::Stmt::Kind::assign, s.target.name = std::move(n);
                         })] > operand("an expression after '='", expr)[set_value];
auto const push_body = act([](ast::Stmt& s, ast::Stmt& b) { s.body.push_back(std::move(b)); });
auto const for_stmt =
    kw("for")[([](auto& ctx) { x3::_val(ctx).kind = ast::Stmt::Kind::loop; })] >
    named<std::string>("a loop variable after 'for'",
                       decl_ident)[act([](ast::Stmt& s, std::string& n) { s.target.name = n; })] >
    named("'in' after the loop variable", kw("in")) >
    operand("an expression after 'in'", expr)[set_value] >
    named("'{' to start the loop body",
          '{') > deep{"!loops nested too deeply"}[*(stmt[push_body] >> -x3::lit(';'))] >
    named("a statement or '}' to close the loop body", '}');
auto const stmt_def = spanned[let_stmt | return_stmt | for_stmt | assign_stmt];

// Declarations. Their names go into State::decl for the messages that name them.
auto const decl_name_def =
    spanned[decl_ident[act([](Name& n, std::string& s) { n.name = std::move(s); })]];
auto declared(const char* keyword) {
    return [keyword](auto& ctx) {
        auto& d = x3::_val(ctx);
        d.name = x3::_attr(ctx).name, d.name_span = x3::_attr(ctx).span;
        state(ctx).decl = keyword + (" " + d.name);
    };
}
auto const param_def =
    spanned[decl_ident[act([](ast::Param& p, std::string& s) { p.name = std::move(s); })] >
            named("':' after the parameter name", ':') >
            type[act([](ast::Param& p, ast::TypeExpr& t) { p.type = std::move(t); })]];
auto const push_param =
    act([](ast::FnDecl& f, ast::Param& p) { f.params.push_back(std::move(p)); });
auto const push_tparam =
    act([](ast::FnDecl& f, std::string& s) { f.type_params.push_back(std::move(s)); });
auto const type_params = x3::lit('[') >
                         named<std::string>("a type parameter name", decl_ident)[push_tparam] >
                         *(x3::lit(',') >
                           named<std::string>("a type parameter name", decl_ident)[push_tparam]) >
                         named("']' to close the type parameters", ']');
auto const push_stmt = act([](ast::FnDecl& f, ast::Stmt& s) { f.body.push_back(std::move(s)); });
auto const fn_decl_def =
    spanned[kw("fn") > named<Name>("a function name after 'fn'", decl_name)[declared("fn")] >
            -type_params > named("'(' to start the parameter list of {decl}", '(') >
            -(param[push_param] >> *(x3::lit(',') > param[push_param])) >
            named("')' to close the parameter list of {decl}", ')') >
            -(x3::lit("->") >
              type[act([](ast::FnDecl& f, ast::TypeExpr& t) { f.result = std::move(t); })]) >
            named("'{' to start the body of {decl}", '{') > *(stmt[push_stmt] >> -x3::lit(';')) >
            named("a statement or '}' to close the body of {decl}", '}')];

auto const field_def =
    spanned[decl_ident[act([](ast::ParamField& f, std::string& s) { f.name = std::move(s); })] >
            named("':' after the field name", ':') >
            type[act([](ast::ParamField& f, ast::TypeExpr& t) { f.type = std::move(t); })] >
            -(x3::lit('=') >
              operand("an initialiser such as normal(0.02) after '='", expr)[act(
                  [](ast::ParamField& f, Node& n) { f.init = share(std::move(n)); })])];
auto const top_keyword = kw("fn") | kw("params") | kw("import");
auto const push_size =
    act([](ast::ParamsDecl& p, std::string& s) { p.sizes.push_back(std::move(s)); });
auto const size_params = x3::lit('[') >
                         named<std::string>("a size parameter name", decl_ident)[push_size] >
                         *(x3::lit(',') >
                           named<std::string>("a size parameter name", decl_ident)[push_size]) >
                         named("']' to close the size parameters", ']');
auto const push_field =
    act([](ast::ParamsDecl& p, ast::ParamField& f) { p.fields.push_back(std::move(f)); });
auto const params_decl_def =
    spanned[kw("params") > named<Name>("a name after 'params'", decl_name)[declared("params")] >
            -size_params > named("'{' to start the fields of {decl}", '{') >
            *(!top_keyword >> field[push_field] >> -(x3::lit(',') | x3::lit(';'))) >
            named("a field or '}' to close {decl}", '}')];

auto const import_decl_def =
    spanned[kw("import") > named<std::string>("a quoted path after 'import'", string_lit)[act(
                               [](ast::Import& i, std::string& s) { i.path = std::move(s); })]] >>
    -x3::lit(';');

BOOST_SPIRIT_DEFINE(expr, sum, prod, unary, power, postfix, primary, arg, call_suffix, index_suffix,
                    index_item, member_suffix, type, dim, pattern, decl_name, stmt, param, field,
                    fn_decl, params_decl, import_decl)

// A top-level declaration. On a syntax error: report it, skip to the next line starting with
// `fn`, `params` or `import`, and try again there.
struct top_decl_id {
    template <class Exception, class Ctx>
    x3::error_handler_result on_error(It& first, const It&, const Exception& x,
                                      const Ctx& ctx) const {
        State& st = state(ctx);
        st.report(x);
        first = st.resync(first, x.where());
        return x3::error_handler_result::retry;
    }
};
auto const push_to_module = [](auto member) {
    return
        [member](auto& ctx) { (state(ctx).module.*member).push_back(std::move(x3::_attr(ctx))); };
};
auto const top_decl = x3::rule<top_decl_id>{"a declaration"} =
    fn_decl[push_to_module(&ast::Module::fns)] | params_decl[push_to_module(&ast::Module::params)] |
    import_decl[push_to_module(&ast::Module::imports)] |
    (!x3::eoi >> fail_parser{"'fn', 'params' or 'import'"});

// ---- Error reporting.

// The extent of the token at p, for the caret and underline of a diagnostic.
It token_end(It p, It end) {
    if (p == end) return p;
    auto two = [&](const char* op) { return end - p >= 2 && p[0] == op[0] && p[1] == op[1]; };
    It q = p;
    if (is_ident_char(*p) || (*p == '.' && q + 1 < end && is_digit(q[1]))) {
        while (q < end &&
               (is_ident_char(*q) || *q == '.' ||
                ((*q == '+' || *q == '-') && (q[-1] == 'e' || q[-1] == 'E') && is_digit(*p))))
            ++q;
        return q;
    }
    if (*p == '"') {
        for (++q; q < end && *q != '"' && *q != '\n';) ++q;
        return q < end && *q == '"' ? q + 1 : q;
    }
    for (const char* op : {"**", "->", "<=", ">=", "==", "!="})
        if (two(op)) return p + 2;
    auto u = static_cast<unsigned char>(*p);
    int len = u < 0xC0 ? 1 : u < 0xE0 ? 2 : u < 0xF0 ? 3 : 4;
    for (q = p + 1; q < end && q - p < len && (static_cast<unsigned char>(*q) & 0xC0) == 0x80;) ++q;
    return q;
}

bool starts_token(It p, It end) {
    if (is_ident_char(*p)) return true;
    if (*p == '!') return p + 1 < end && p[1] == '=';
    return std::string_view("\"()[]{},:;.=<>+-*/@~").find(*p) != std::string_view::npos;
}

std::string quote_char(It p, It end) {
    auto u = static_cast<unsigned char>(*p);
    if (u >= 0x20 && u < 0x7F) return std::string("'") + *p + "'";
    It e = token_end(p, end);
    if (u >= 0xC0 && e - p > 1) return "'" + std::string(p, e) + "'";
    const char* hex = "0123456789abcdef";
    return std::string("'\\x") + hex[u >> 4] + hex[u & 15] + "'";
}

void State::report(const Failure& f) {
    It p = skip_trivia(f.where(), end);
    std::string which = f.which(), message;
    if (!which.empty() && which[0] == '!') {
        message = which.substr(1);
    } else if (p < end && !starts_token(p, end)) {
        message = "unexpected character " + quote_char(p, end);
    } else {
        if (auto at = which.find("{decl}"); at != std::string::npos) which.replace(at, 6, decl);
        message = "expected " + which;
    }
    Span s = span(p, token_end(p, end));
    if (p == end) { // at the end of the file: point just after the last token
        It last_token_end = base;
        for (It q = base; (q = skip_trivia(q, end)) < end; q = token_end(q, end))
            last_token_end = token_end(q, end);
        s = span(last_token_end, last_token_end);
    }
    diags.error(s, std::move(message));
}

It State::resync(It decl_start, It where) const {
    It from = std::max(skip_trivia(where, end), skip_trivia(decl_start, end) + 1);
    auto starts_decl = [&](It q) {
        for (std::string_view k : {"fn", "params", "import"})
            if (std::size_t(end - q) >= k.size() && std::string_view(q, k.size()) == k &&
                (q + k.size() == end || !is_ident_char(q[k.size()])))
                return true;
        return false;
    };
    auto line_start = [&](It q) {
        while (q > base && (q[-1] == ' ' || q[-1] == '\t')) --q;
        return q == base || q[-1] == '\n';
    };
    It q = std::min(from, end);
    if (q < end && line_start(q) && starts_decl(q)) return q;
    while ((q = std::find(q, end, '\n')) < end) {
        while (++q < end && (*q == ' ' || *q == '\t')) {
        }
        if (starts_decl(q)) return q;
    }
    return end;
}

} // namespace

ast::Module parse(const SourceFile& src, Diagnostics& diags) {
    const std::string& text = src.text();
    State st{text.data(), text.data() + text.size(), diags, {}, {}, 0};
    It first = st.base;
    if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) first += 3; // byte order mark
    try {
        if (text.size() > UINT32_MAX) throw Failure(first, "!file too large");
        x3::parse(first, st.end, x3::with<state_tag>(st)[x3::skip(skipper)[*top_decl]]);
        if (skip_trivia(first, st.end) != st.end)
            throw Failure(first, "'fn', 'params' or 'import'");
    } catch (const Failure& f) {
        st.report(f);
    } catch (const std::exception& e) {
        diags.error({}, std::string("internal parser error: ") + e.what());
    }
    return std::move(st.module);
}

ast::ExprPtr parse_expr(const SourceFile& src, Diagnostics& diags) {
    const std::string& text = src.text();
    State st{text.data(), text.data() + text.size(), diags, {}, {}, 0};
    It first = st.base;
    Node n;
    try {
        if (text.size() > UINT32_MAX) throw Failure(first, "!input too large");
        auto const whole = x3::eps > operand("an expression", expr) >
                           named("an operator or the end of the expression", x3::eoi);
        if (x3::parse(first, st.end, x3::with<state_tag>(st)[x3::skip(skipper)[whole]], n))
            return share(std::move(n));
    } catch (const Failure& f) {
        st.report(f);
    } catch (const std::exception& e) {
        diags.error({}, std::string("internal parser error: ") + e.what());
    }
    return nullptr;
}

} // namespace rag::frontend
