#include "jit/kir.hpp"

#include "runtime/error.hpp"

#include <cmath>
#include <sstream>

namespace rag::kir {
namespace {

Expr make(Op op, Type t, std::vector<Expr> args, std::int64_t i = 0, double f = 0) {
    return Expr(std::make_shared<const Node>(Node{op, t, i, f, std::move(args)}));
}

bool is_const_int(const Expr& e) {
    return e.node().op == Op::const_int;
}

// Integer literals meet floats as floats; anything else must already agree.
void unify(Expr& a, Expr& b, const char* what) {
    if (a.type() == Type::f32 && is_const_int(b)) b = Expr(double(b.node().i));
    if (b.type() == Type::f32 && is_const_int(a)) a = Expr(double(a.node().i));
    if (a.type() != b.type()) fail("kernel IR: operands of ", what, " have different types");
}

Expr arith(Op op, Expr a, Expr b, const char* what) {
    unify(a, b, what);
    if (a.type() == Type::i1) fail("kernel IR: ", what, " of booleans");
    return make(op, a.type(), {a, b});
}

Expr compare(Op op, Expr a, Expr b, const char* what) {
    unify(a, b, what);
    return make(op, Type::i1, {a, b});
}

Expr logic(Op op, Expr a, Expr b, const char* what) {
    if (a.type() != Type::i1 || b.type() != Type::i1) fail("kernel IR: ", what, " of non-booleans");
    return make(op, Type::i1, {a, b});
}

Expr math(Op op, Expr x, const char* what) {
    if (is_const_int(x)) x = Expr(double(x.node().i));
    if (x.type() != Type::f32) fail("kernel IR: ", what, " of a non-float");
    return make(op, Type::f32, {x});
}

} // namespace

Type value_type(Elem e) {
    return e == Elem::i64 ? Type::i64 : Type::f32;
}

Elem elem_of(DType t) {
    switch (t) {
    case DType::f32:
        return Elem::f32;
    case DType::f64:
        return Elem::f64;
    case DType::f16:
        return Elem::f16;
    case DType::bf16:
        return Elem::bf16;
    case DType::i64:
        return Elem::i64;
    default:
        break;
    }
    fail("internal: no kernel-IR element type stores ", dtype_name(t));
}

std::int64_t elem_bytes(Elem e) {
    return e == Elem::f16 || e == Elem::bf16 ? 2 : e == Elem::f32 ? 4 : 8;
}

std::int64_t array_bytes(const BufferDecl& b, std::span<const std::int64_t> params) {
    const std::int64_t n = evaluate(b.size, params);
    return (n + (b.row ? (n + b.row - 1) / b.row * b.pad() : 0)) * elem_bytes(b.elem);
}

namespace {
std::int64_t aligned_shared_bytes(const BufferDecl& b) {
    return (array_bytes(b, {}) + 63) / 64 * 64;
}
} // namespace

std::vector<std::int64_t> shared_offsets(const Kernel& k) {
    std::vector<std::int64_t> at(k.buffers.size(), -1);
    std::int64_t offset = 0;
    for (std::size_t b = 0; b < k.buffers.size(); ++b)
        if (k.buffers[b].space == Space::shared) {
            at[b] = offset;
            offset += aligned_shared_bytes(k.buffers[b]);
        }
    return at;
}

std::int64_t shared_bytes(const Kernel& k) {
    std::int64_t bytes = 0;
    for (const BufferDecl& b : k.buffers)
        if (b.space == Space::shared) bytes += aligned_shared_bytes(b);
    return bytes;
}

bool multiple_of(const Expr& e, std::int64_t m) {
    const Node& n = e.node();
    switch (n.op) {
    case Op::const_int:
        return n.i % m == 0;
    case Op::add:
    case Op::sub:
        return multiple_of(n.args[0], m) && multiple_of(n.args[1], m);
    case Op::mul:
        return multiple_of(n.args[0], m) || multiple_of(n.args[1], m);
    case Op::rem:
        return multiple_of(n.args[0], m) && multiple_of(n.args[1], m);
    default:
        return false;
    }
}

FragmentLoad fragment_load(const Kernel& k, const Mma& x, bool operand_b) {
    const Matrix& v = operand_b ? x.b : x.a;
    const BufferDecl& buf = k.buffers[std::size_t(v.buf)];
    const Elem half = x.precision == Precision::bf16 ? Elem::bf16 : Elem::f16;
    if (!on_tensor_cores(x) || buf.space != Space::shared || buf.elem != half ||
        !multiple_of(v.offset, 8))
        return FragmentLoad::elements;
    // A register holds two neighbours along A's columns (B's rows): ldmatrix reads rows of
    // 8 of them; with .trans, rows of 8 along the other index.
    const Expr& pairs = operand_b ? v.row : v.col;
    const Expr& other = operand_b ? v.col : v.row;
    auto unit = [](const Expr& s) { return s.node().op == Op::const_int && s.node().i == 1; };
    if (unit(pairs) && multiple_of(other, 8)) return FragmentLoad::ldmatrix;
    if (unit(other) && multiple_of(pairs, 8)) return FragmentLoad::ldmatrix_trans;
    return FragmentLoad::elements;
}

Expr::Expr(std::int64_t v)
    : n_(std::make_shared<const Node>(Node{Op::const_int, Type::i64, v, 0, {}})) {}
Expr::Expr(double v)
    : n_(std::make_shared<const Node>(Node{Op::const_float, Type::f32, 0, v, {}})) {}
Type Expr::type() const {
    return n_->type;
}

Expr operator+(Expr a, Expr b) {
    return arith(Op::add, a, b, "+");
}
Expr operator-(Expr a, Expr b) {
    return arith(Op::sub, a, b, "-");
}
Expr operator*(Expr a, Expr b) {
    return arith(Op::mul, a, b, "*");
}
Expr operator/(Expr a, Expr b) {
    return arith(Op::div, a, b, "/");
}
Expr operator%(Expr a, Expr b) {
    if (a.type() != Type::i64 || b.type() != Type::i64) fail("kernel IR: % of non-integers");
    return make(Op::rem, Type::i64, {a, b});
}
Expr operator-(Expr a) {
    if (a.type() == Type::i64) return Expr(std::int64_t(0)) - a;
    return math(Op::neg, a, "negation");
}
Expr operator<(Expr a, Expr b) {
    return compare(Op::lt, a, b, "<");
}
Expr operator<=(Expr a, Expr b) {
    return compare(Op::le, a, b, "<=");
}
Expr operator>(Expr a, Expr b) {
    return compare(Op::gt, a, b, ">");
}
Expr operator>=(Expr a, Expr b) {
    return compare(Op::ge, a, b, ">=");
}
Expr operator==(Expr a, Expr b) {
    return compare(Op::eq, a, b, "==");
}
Expr operator!=(Expr a, Expr b) {
    return compare(Op::ne, a, b, "!=");
}
Expr operator&&(Expr a, Expr b) {
    return logic(Op::and_, a, b, "&&");
}
Expr operator||(Expr a, Expr b) {
    return logic(Op::or_, a, b, "||");
}
Expr min(Expr a, Expr b) {
    return arith(Op::min, a, b, "min");
}
Expr max(Expr a, Expr b) {
    return arith(Op::max, a, b, "max");
}
Expr clamp(Expr x, Expr lo, Expr hi) {
    return min(max(x, lo), hi);
}
Expr select(Expr c, Expr a, Expr b) {
    if (c.type() != Type::i1) fail("kernel IR: select on a non-boolean");
    unify(a, b, "select");
    return make(Op::select, a.type(), {c, a, b});
}
Expr exp(Expr x) {
    return math(Op::exp, x, "exp");
}
Expr log(Expr x) {
    return math(Op::log, x, "log");
}
Expr sqrt(Expr x) {
    return math(Op::sqrt, x, "sqrt");
}
Expr to_f32(Expr x) {
    if (x.type() == Type::f32) return x;
    return make(Op::to_f32, Type::f32, {x});
}
Expr to_i64(Expr x) {
    if (x.type() == Type::i64) return x;
    return make(Op::to_i64, Type::i64, {x});
}
Expr ceil_div(Expr a, Expr b) {
    return (a + b - 1) / b;
}

std::size_t Kernel::globals() const {
    std::size_t n = 0;
    for (const auto& b : buffers) n += b.space == Space::global;
    return n;
}

Builder::Builder(std::string name) {
    k_.name = std::move(name);
    open_.push_back(&k_.body);
}

Expr Builder::param(const std::string& name) {
    k_.params.push_back(name);
    return make(Op::param, Type::i64, {}, std::int64_t(k_.params.size() - 1));
}

bool on_tensor_cores(const Mma& mma) {
    return mma.precision != Precision::f32 && mma.m % 16 == 0 && mma.n % 8 == 0 && mma.k % 16 == 0;
}

int Builder::buffer(const std::string& name, Elem e) {
    if (!k_.buffers.empty() && k_.buffers.back().space != Space::global)
        fail("kernel IR ", k_.name, ": declare global buffers before scratch and shared arrays");
    k_.buffers.push_back({name, e, Space::global, {}});
    return int(k_.buffers.size() - 1);
}

int Builder::scratch(const std::string& name, Expr size) {
    if (size.type() != Type::i64) fail("kernel IR ", k_.name, ": scratch size must be an integer");
    k_.buffers.push_back({name, Elem::f32, Space::scratch, size});
    return int(k_.buffers.size() - 1);
}

int Builder::shared(const std::string& name, std::int64_t size, Elem e, std::int64_t row) {
    if (e != Elem::f32 && e != Elem::f16 && e != Elem::bf16)
        fail("kernel IR ", k_.name, ": shared array ", name, " must hold f32, f16 or bf16");
    if (row < 0 || row % 8 != 0)
        fail("kernel IR ", k_.name, ": shared array ", name, " padded every ", row,
             " elements (a multiple of 8)");
    const BufferDecl decl{name, e, Space::shared, Expr(size), row};
    const std::int64_t bytes = size < 1 ? 0 : aligned_shared_bytes(decl) + shared_bytes(k_);
    if (size < 1 || bytes > kSharedBytes)
        fail("kernel IR ", k_.name, ": shared array ", name, " of ", size,
             " elements does not fit the ", kSharedBytes, " bytes of shared memory");
    k_.buffers.push_back(decl);
    return int(k_.buffers.size() - 1);
}

std::int64_t fragment_cols(const BufferDecl& b) {
    return b.size.node().i / kFragmentRows;
}

int Builder::fragment(const std::string& name, std::int64_t cols) {
    if (cols != 1 && (cols < 8 || cols % 8 != 0))
        fail("kernel IR ", k_.name, ": fragment ", name, " of ", cols,
             " columns (1, or a multiple of 8)");
    k_.buffers.push_back({name, Elem::f32, Space::fragment, Expr(kFragmentRows * cols)});
    return int(k_.buffers.size() - 1);
}

void Builder::each(int f, const std::function<void(Expr, Expr)>& body) {
    const BufferDecl& d = decl(f);
    if (d.space != Space::fragment) fail("kernel IR ", k_.name, ": each over ", d.name);
    if (threads_depth_ > 0 || each_ >= 0)
        fail("kernel IR ", k_.name, ": each inside a threads loop or another each");
    k_.lets.push_back("r" + std::to_string(k_.lets.size()));
    Expr r = make(Op::let, Type::i64, {}, std::int64_t(k_.lets.size() - 1));
    k_.lets.push_back("c" + std::to_string(k_.lets.size()));
    Expr c = make(Op::let, Type::i64, {}, std::int64_t(k_.lets.size() - 1));
    struct Open {
        int& each;
        ~Open() { each = -1; }
    } open{each_};
    each_ = f;
    nest({Stmt::Kind::each, f, r, c, {}, {}, {}, Loop::serial, {}}, [&] { body(r, c); }, {});
}

Expr Builder::here(int f) const {
    const BufferDecl& d = decl(f);
    if (each_ < 0 || d.space != Space::fragment ||
        (fragment_cols(d) != 1 && fragment_cols(d) != fragment_cols(decl(each_))))
        fail("kernel IR ", k_.name, ": ", d.name,
             " read outside an each over a fragment of its columns");
    return make(Op::here, Type::f32, {}, f);
}

void Builder::put(int f, Expr v) {
    const BufferDecl& d = decl(f);
    if (each_ < 0 || d.space != Space::fragment || fragment_cols(d) != fragment_cols(decl(each_)))
        fail("kernel IR ", k_.name, ": ", d.name,
             " written outside an each over a fragment of its columns");
    if (is_const_int(v)) v = Expr(double(v.node().i));
    if (v.type() != Type::f32) fail("kernel IR ", k_.name, ": ", d.name, " holds f32");
    block().push_back({Stmt::Kind::put, f, v, {}, {}, {}, {}, Loop::serial, {}});
}

void Builder::row_reduce(int vec, int f, Reduce op) {
    if (decl(vec).space != Space::fragment || fragment_cols(decl(vec)) != 1 ||
        decl(f).space != Space::fragment || fragment_cols(decl(f)) == 1)
        fail("kernel IR ", k_.name, ": row_reduce of a fragment into a row vector");
    if (threads_depth_ > 0 || each_ >= 0)
        fail("kernel IR ", k_.name, ": row_reduce inside a threads loop or an each");
    Stmt s{Stmt::Kind::reduce, vec, Expr(std::int64_t(f)), {}, {}, {}, {}, Loop::serial, {}};
    s.reduce = op;
    block().push_back(std::move(s));
}

Expr Builder::pid() const {
    return make(Op::program_id, Type::i64, {});
}

Expr Builder::let(Expr v, const std::string& name) {
    k_.lets.push_back(name.empty() ? "t" + std::to_string(k_.lets.size()) : name);
    const auto id = std::int64_t(k_.lets.size() - 1);
    block().push_back({Stmt::Kind::let, id, v, {}, {}, {}, {}, Loop::serial, {}});
    return make(Op::let, v.type(), {}, id);
}

int Builder::var(Type t, Expr init) {
    k_.vars.push_back(t);
    const int id = int(k_.vars.size() - 1);
    set(id, init);
    return id;
}

Expr Builder::get(int v) const {
    return make(Op::var, k_.vars.at(std::size_t(v)), {}, v);
}

void Builder::set(int v, Expr e) {
    Expr cur = get(v);
    unify(cur, e, "assignment");
    block().push_back({Stmt::Kind::assign, v, e, {}, {}, {}, {}, Loop::serial, {}});
}

Expr Builder::load(int buf, Expr index) const {
    if (index.type() != Type::i64) fail("kernel IR ", k_.name, ": index must be an integer");
    const auto& b = k_.buffers.at(std::size_t(buf));
    if (b.space == Space::fragment)
        fail("kernel IR ", k_.name, ": fragment ", b.name, " is read with here()");
    return make(Op::load, value_type(b.elem), {index}, buf);
}

void Builder::store(int buf, Expr index, Expr v) {
    const auto& b = k_.buffers.at(std::size_t(buf));
    if (b.space == Space::fragment)
        fail("kernel IR ", k_.name, ": fragment ", b.name, " is written with put()");
    if (each_ >= 0 && fragment_cols(decl(each_)) == 1)
        fail("kernel IR ", k_.name, ": a store in an each over a row vector");
    if (value_type(b.elem) == Type::f32 && is_const_int(v)) v = Expr(double(v.node().i));
    if (index.type() != Type::i64 || v.type() != value_type(b.elem))
        fail("kernel IR ", k_.name, ": store to ", b.name, " of the wrong type");
    block().push_back({Stmt::Kind::store, buf, index, v, {}, {}, {}, Loop::serial, {}});
}

void Builder::copy16_async(int dst, Expr di, int src, Expr si) {
    if (decl(dst).space != Space::shared || decl(src).space != Space::global)
        fail("kernel IR ", k_.name, ": copy16_async from ", decl(src).name, " to ", decl(dst).name,
             " (global to shared only)");
    copy16(dst, di, src, si);
    block().back().async = true;
}

void Builder::copy4_async(int dst, Expr di, int src, Expr si) {
    if (elem_bytes(decl(dst).elem) != 4)
        fail("kernel IR ", k_.name, ": copy4_async of ", decl(dst).name, " (4-byte elements only)");
    copy16_async(dst, di, src, si);
    block().back().bytes = 4;
}

void Builder::await_copies(std::int64_t in_flight) {
    if (threads_depth_ > 0 || each_ >= 0)
        fail("kernel IR ", k_.name, ": await_copies inside a threads loop or an each");
    if (in_flight < 0 || in_flight > 7)
        fail("kernel IR ", k_.name, ": await_copies leaves 0 to 7 groups in flight");
    block().push_back({Stmt::Kind::await_copies, in_flight, {}, {}, {}, {}, {}, Loop::serial, {}});
}

void Builder::copy16(int dst, Expr di, int src, Expr si) {
    const BufferDecl &d = decl(dst), &from = decl(src);
    if (d.elem != from.elem || d.space == Space::fragment || from.space == Space::fragment)
        fail("kernel IR ", k_.name, ": copy16 from ", from.name, " to ", d.name,
             " (arrays of one element type)");
    if (di.type() != Type::i64 || si.type() != Type::i64)
        fail("kernel IR ", k_.name, ": index must be an integer");
    if (threads_depth_ == 0) fail("kernel IR ", k_.name, ": copy16 outside a threads loop");
    block().push_back(
        {Stmt::Kind::copy, dst, di, si, Expr(std::int64_t(src)), {}, {}, Loop::serial, {}});
}

void Builder::nest(Stmt s, const std::function<void()>& fill_body,
                   const std::function<void()>& fill_else) {
    // A misuse inside a body throws; the builder then stays as it was before this statement.
    struct Open {
        std::vector<std::vector<Stmt>*>& open;
        Open(std::vector<std::vector<Stmt>*>& o, std::vector<Stmt>* block) : open(o) {
            open.push_back(block);
        }
        ~Open() { open.pop_back(); }
    };
    {
        Open body(open_, &s.body);
        fill_body();
    }
    if (fill_else) {
        Open orelse(open_, &s.orelse);
        fill_else();
    }
    block().push_back(std::move(s));
}

void Builder::loop(Expr lo, Expr hi, const std::function<void(Expr)>& body, Loop kind) {
    if (lo.type() != Type::i64 || hi.type() != Type::i64)
        fail("kernel IR ", k_.name, ": loop bounds must be integers");
    k_.lets.push_back("i" + std::to_string(k_.lets.size()));
    const auto id = std::int64_t(k_.lets.size() - 1);
    Expr index = make(Op::let, Type::i64, {}, id);
    struct Depth { // counts open threads loops, also when a body throws
        int& depth;
        int add;
        ~Depth() { depth -= add; }
    } depth{threads_depth_, kind == Loop::threads};
    threads_depth_ += depth.add;
    nest({Stmt::Kind::loop, id, lo, hi, {}, {}, {}, kind, {}}, [&] { body(index); }, {});
}

void Builder::when(Expr cond, const std::function<void()>& then,
                   const std::function<void()>& otherwise) {
    if (cond.type() != Type::i1) fail("kernel IR ", k_.name, ": condition must be a boolean");
    nest({Stmt::Kind::branch, 0, cond, {}, {}, {}, {}, Loop::serial, {}}, then, otherwise);
}

void Builder::mma(Matrix c, Matrix a, Matrix b, std::int64_t m, std::int64_t n, std::int64_t k,
                  Precision p, bool accumulate) {
    auto fail_mma = [&](const char* why) { fail("kernel IR ", k_.name, ": mma ", why); };
    if (threads_depth_ > 0 || each_ >= 0)
        fail_mma("inside a threads loop or an each (it is a statement of the block)");
    if (m < 1 || n < 1 || k < 1) fail_mma("with an empty extent");
    for (const Matrix* x : {&c, &a, &b}) {
        if (x->buf < 0 || std::size_t(x->buf) >= k_.buffers.size() ||
            k_.buffers[std::size_t(x->buf)].space == Space::global)
            fail_mma("operands must be scratch or shared arrays");
        for (const Expr* e : {&x->offset, &x->row, &x->col})
            if (!e->defined() || e->type() != Type::i64)
                fail_mma("offsets and strides must be integers");
    }
    if (c.buf == a.buf || c.buf == b.buf) fail_mma("accumulates into one of its operands");
    // A fragment operand is the whole fragment, row-major, C on tensor cores.
    auto whole = [&](const Matrix& x, std::int64_t cols) {
        auto is = [](const Expr& e, std::int64_t v) {
            return e.node().op == Op::const_int && e.node().i == v;
        };
        const BufferDecl& d = decl(x.buf);
        return is(x.offset, 0) && is(x.row, cols) && is(x.col, 1) && fragment_cols(d) == cols;
    };
    auto fragment_at = [&](const Matrix& x) { return decl(x.buf).space == Space::fragment; };
    if (fragment_at(b)) fail_mma("with a fragment as B");
    if (fragment_at(a) && !fragment_at(c)) fail_mma("with a fragment A but not C");
    if (fragment_at(c) && (m != kFragmentRows || !whole(c, n) || (fragment_at(a) && !whole(a, k)) ||
                           !on_tensor_cores(Mma{c, a, b, m, n, k, p})))
        fail_mma("into a fragment that is not the whole of C on tensor cores");
    if (k_.buffers[std::size_t(c.buf)].elem != Elem::f32) fail_mma("accumulates into a half array");
    if (!accumulate && fragment_at(c)) fail_mma("without accumulating into a fragment");
    Stmt s{Stmt::Kind::mma, c.buf, {}, {}, {}, {}, {}, Loop::serial, {}};
    s.mma = std::make_shared<const Mma>(Mma{c, a, b, m, n, k, p, accumulate});
    block().push_back(std::move(s));
}

Kernel Builder::finish() {
    if (open_.size() != 1) fail("kernel IR ", k_.name, ": unclosed block");
    return k_;
}

std::optional<std::int64_t> integer_op(Op op, std::int64_t a, std::int64_t b) {
    switch (op) {
    case Op::add:
        return a + b;
    case Op::sub:
        return a - b;
    case Op::mul:
        return a * b;
    case Op::div:
        return b ? std::optional(a / b) : std::nullopt;
    case Op::rem:
        return b ? std::optional(a % b) : std::nullopt;
    case Op::min:
        return std::min(a, b);
    case Op::max:
        return std::max(a, b);
    case Op::lt:
        return a < b;
    case Op::le:
        return a <= b;
    case Op::gt:
        return a > b;
    case Op::ge:
        return a >= b;
    case Op::eq:
        return a == b;
    case Op::ne:
        return a != b;
    case Op::and_:
        return a && b;
    case Op::or_:
        return a || b;
    default:
        return std::nullopt;
    }
}

std::int64_t evaluate(const Expr& e, std::span<const std::int64_t> params) {
    const Node& n = e.node();
    if (n.op == Op::const_int) return n.i;
    if (n.op == Op::param) return params[std::size_t(n.i)];
    const bool arithmetic = n.op == Op::add || n.op == Op::sub || n.op == Op::mul ||
                            n.op == Op::div || n.op == Op::rem || n.op == Op::min ||
                            n.op == Op::max;
    if (arithmetic)
        if (auto v = integer_op(n.op, evaluate(n.args[0], params), evaluate(n.args[1], params)))
            return *v;
    fail("kernel IR: a scratch size may use only parameters, constants and + - * / min max");
}

namespace {

const char* op_name(Op op) {
    static const char* names[] = {"",    "",     "",    "",    "",       "pid", "",    "+",
                                  "-",   "*",    "/",   "%",   "min",    "max", "<",   "<=",
                                  ">",   ">=",   "==",  "!=",  "&&",     "||",  "neg", "exp",
                                  "log", "sqrt", "f32", "i64", "select", "here"};
    return names[int(op)];
}

void print_expr(std::ostream& os, const Kernel& k, const Expr& e) {
    const Node& n = e.node();
    switch (n.op) {
    case Op::const_int:
        os << n.i;
        return;
    case Op::const_float:
        os << n.f << "f";
        return;
    case Op::param:
        os << k.params[std::size_t(n.i)];
        return;
    case Op::let:
        os << k.lets[std::size_t(n.i)];
        return;
    case Op::var:
        os << "v" << n.i;
        return;
    case Op::program_id:
        os << "pid";
        return;
    case Op::load:
        os << k.buffers[std::size_t(n.i)].name << "[";
        print_expr(os, k, n.args[0]);
        os << "]";
        return;
    case Op::here:
        os << k.buffers[std::size_t(n.i)].name << "[r, c]";
        return;
    default:
        break;
    }
    const bool infix = n.args.size() == 2 && n.op != Op::min && n.op != Op::max;
    if (infix) {
        os << "(";
        print_expr(os, k, n.args[0]);
        os << " " << op_name(n.op) << " ";
        print_expr(os, k, n.args[1]);
        os << ")";
        return;
    }
    os << op_name(n.op) << "(";
    for (std::size_t a = 0; a < n.args.size(); ++a) {
        if (a) os << ", ";
        print_expr(os, k, n.args[a]);
    }
    os << ")";
}

void print_block(std::ostream& os, const Kernel& k, const std::vector<Stmt>& body, int depth) {
    const std::string pad(std::size_t(depth * 2), ' ');
    for (const Stmt& s : body) {
        os << pad;
        switch (s.kind) {
        case Stmt::Kind::let:
            os << "let " << k.lets[std::size_t(s.id)] << " = ";
            break;
        case Stmt::Kind::assign:
            os << "v" << s.id << " = ";
            break;
        case Stmt::Kind::store:
            os << k.buffers[std::size_t(s.id)].name << "[";
            print_expr(os, k, s.a);
            os << "] = ";
            print_expr(os, k, s.b);
            os << "\n";
            continue;
        case Stmt::Kind::loop:
            os << (s.loop == Loop::threads ? "threads " : "for ") << k.lets[std::size_t(s.id)]
               << " in ";
            print_expr(os, k, s.a);
            os << " .. ";
            print_expr(os, k, s.b);
            os << ":\n";
            print_block(os, k, s.body, depth + 1);
            continue;
        case Stmt::Kind::mma: {
            const Mma& x = *s.mma;
            static const char* precision[] = {"f32", "f16", "bf16"};
            os << "mma." << precision[int(x.precision)] << " " << x.m << "x" << x.n << "x" << x.k;
            const char* sep = " ";
            for (const Matrix* mat : {&x.c, &x.a, &x.b}) {
                os << sep << k.buffers[std::size_t(mat->buf)].name << "[";
                print_expr(os, k, mat->offset);
                os << " + r ";
                print_expr(os, k, mat->row);
                os << " + c ";
                print_expr(os, k, mat->col);
                os << "]";
                sep = mat == &x.c ? (x.accumulate ? " += " : " = ") : " @ ";
            }
            os << "\n";
            continue;
        }
        case Stmt::Kind::each:
            os << "each " << k.lets[std::size_t(s.a.node().i)] << ", "
               << k.lets[std::size_t(s.b.node().i)] << " of " << k.buffers[std::size_t(s.id)].name
               << ":\n";
            print_block(os, k, s.body, depth + 1);
            continue;
        case Stmt::Kind::put:
            os << k.buffers[std::size_t(s.id)].name << "[r, c] = ";
            break;
        case Stmt::Kind::copy:
            os << k.buffers[std::size_t(s.id)].name << "[";
            print_expr(os, k, s.a);
            os << " ..] = " << k.buffers[std::size_t(s.c.node().i)].name << "[";
            print_expr(os, k, s.b);
            os << " ..] (" << s.bytes << " bytes" << (s.async ? ", async" : "") << ")\n";
            continue;
        case Stmt::Kind::await_copies:
            os << "await_copies, " << s.id << " group(s) left in flight\n";
            continue;
        case Stmt::Kind::reduce:
            os << k.buffers[std::size_t(s.id)].name << " = row_"
               << (s.reduce == Reduce::max ? "max " : "sum ")
               << k.buffers[std::size_t(s.a.node().i)].name << "\n";
            continue;
        case Stmt::Kind::branch:
            os << "if ";
            print_expr(os, k, s.a);
            os << ":\n";
            print_block(os, k, s.body, depth + 1);
            if (!s.orelse.empty()) {
                os << pad << "else:\n";
                print_block(os, k, s.orelse, depth + 1);
            }
            continue;
        }
        print_expr(os, k, s.a);
        os << "\n";
    }
}

} // namespace

std::string print(const Kernel& k) {
    std::ostringstream os;
    os << "kernel " << k.name << "(";
    for (std::size_t p = 0; p < k.params.size(); ++p) os << (p ? ", " : "") << k.params[p];
    os << ")\n";
    static const char* elems[] = {"f32", "f64", "f16", "bf16", "i64"};
    for (const auto& b : k.buffers) {
        static const char* spaces[] = {"global ", "scratch ", "shared ", "fragment "};
        os << "  " << spaces[int(b.space)] << b.name << ": " << elems[int(b.elem)];
        if (b.space != Space::global) {
            os << "[";
            print_expr(os, k, b.size);
            os << "]";
        }
        if (b.row) os << " (padded every " << b.row << ")";
        os << "\n";
    }
    print_block(os, k, k.body, 1);
    return os.str();
}

} // namespace rag::kir
