// The kernel IR (ARCHITECTURE.md decision 5): a small loop-level language in which
// hand-scheduled kernels (relative-position attention) are written once as tile programs and
// lowered by LLVM both to CPU code (jit/kir_llvm.cpp) and to PTX.
//
// A kernel is a body run once per *program instance* pid in [0, grid), as a thread block on a
// GPU and a loop iteration on a CPU core. Instances are independent: each writes its own
// outputs, so any schedule gives the same bits. Inside, the body has
//   - i64 scalar parameters (lengths, strides: runtime data, never baked into code),
//   - global buffers of a storage element type (loads widen to f32 or i64, stores narrow),
//   - scratch arrays: f32 per program instance, their size an expression of the parameters,
//   - shared arrays per program instance of a constant size, f32 or a half type (a GPU
//     block's shared memory, 113 KiB in all, dynamic past 48; scratch like any other on the CPU):
//     loads widen and stores round, as for global buffers,
//   - immutable lets, mutable scalar variables, stores, counted loops and conditionals,
//   - matrix multiply-accumulates over scratch or shared tiles (`mma`): tensor cores on the GPU,
//   - fragments: f32 tiles of kFragmentRows rows per program instance held in registers on
//     the GPU (each warp owns 16 rows, in the mma accumulator's layout) and scratch on the CPU,
//     written by `mma`, read and written element-wise by `each`, reduced along rows by
//     `row_reduce`; a one-column fragment is a row vector (a value per row).
// A loop marked `threads` promises that its iterations are independent and touch disjoint
// scratch: the GPU lowering spreads it over the block's threads (with a barrier after it), the
// CPU lowering runs it in order. This header knows nothing of LLVM.
#pragma once
#include "runtime/dtype.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace rag::kir {

enum class Type : std::uint8_t { i1, i64, f32 };
enum class Elem : std::uint8_t { f32, f64, f16, bf16, i64 };
Type value_type(Elem e); // what a load of e gives: f32 for floats, i64 for i64
// The element type that stores dtype t (f32, f64, f16, bf16, i64); others are an internal error.
Elem elem_of(DType t);
std::int64_t elem_bytes(Elem e);

enum class Op : std::uint8_t {
    const_int,
    const_float,
    param,
    let,
    var,
    program_id,
    load, // leaves
    add,
    sub,
    mul,
    div,
    rem,
    min,
    max,
    lt,
    le,
    gt,
    ge,
    eq,
    ne,
    and_,
    or_, // binary
    neg,
    exp,
    log,
    sqrt,
    to_f32,
    to_i64, // unary
    select, // ternary
    here,   // inside `each`: the current element of a fragment (i: the buffer)
};

struct Node;
// An expression: an immutable tree shared by value.
class Expr {
  public:
    Expr() = default;
    Expr(std::int64_t v); // NOLINT: integer literals are i64 constants
    Expr(int v) : Expr(std::int64_t(v)) {}
    Expr(double v); // NOLINT: floating literals are f32 constants
    explicit Expr(std::shared_ptr<const Node> n) : n_(std::move(n)) {}

    const Node& node() const { return *n_; }
    Type type() const;
    bool defined() const { return bool(n_); }

  private:
    std::shared_ptr<const Node> n_;
};

struct Node {
    Op op;
    Type type;
    std::int64_t i = 0; // constant value, or the index of the param, let, var or buffer
    double f = 0;
    std::vector<Expr> args;
};

Expr operator+(Expr a, Expr b);
Expr operator-(Expr a, Expr b);
Expr operator*(Expr a, Expr b);
Expr operator/(Expr a, Expr b); // i64: truncating; f32: IEEE
Expr operator%(Expr a, Expr b); // i64 only
Expr operator-(Expr a);
Expr operator<(Expr a, Expr b);
Expr operator<=(Expr a, Expr b);
Expr operator>(Expr a, Expr b);
Expr operator>=(Expr a, Expr b);
Expr operator==(Expr a, Expr b);
Expr operator!=(Expr a, Expr b);
Expr operator&&(Expr a, Expr b);
Expr operator||(Expr a, Expr b);
Expr min(Expr a, Expr b);
Expr max(Expr a, Expr b);
Expr clamp(Expr x, Expr lo, Expr hi);
Expr select(Expr c, Expr a, Expr b);
Expr exp(Expr x);
Expr log(Expr x);
Expr sqrt(Expr x);
Expr to_f32(Expr x);
Expr to_i64(Expr x); // truncating
Expr ceil_div(Expr a, Expr b);

enum class Loop : std::uint8_t { serial, threads };
enum class Space : std::uint8_t { global, scratch, shared, fragment };

// The rows of every fragment: one program instance's 4 warps of 16 rows on the GPU.
inline constexpr std::int64_t kFragmentRows = 64;
enum class Reduce : std::uint8_t { max, sum };

// A matrix view of a scratch or shared array: element (r, c) at offset + r row + c col.
struct Matrix {
    int buf;
    Expr offset, row, col;
};
// What an mma rounds its operands to before multiplying; products and sums are f32.
enum class Precision : std::uint8_t { f32, f16, bf16 };
// C(i, j) += sum over l < k of round(A(i, l)) round(B(l, j)), for i < m and j < n; without
// `accumulate`, C(i, j) = the sum (C's old values are never read, so it needs no zeroing).
struct Mma {
    Matrix c, a, b;
    std::int64_t m, n, k;
    Precision precision;
    bool accumulate = true;
};
// Whether the GPU runs an mma on tensor cores (mma.sync m16n8k16, one 16 x 8 tile of C per
// warp at a time): half precision and m, n, k multiples of 16, 8, 16. Otherwise its threads
// compute C's elements with f32 FMAs, each in the order of the CPU.
bool on_tensor_cores(const Mma& mma);

struct Stmt {
    enum class Kind : std::uint8_t {
        let,
        assign,
        store,
        loop,
        branch,
        mma,
        each,
        put,
        reduce,
        copy,
        await_copies
    } kind;
    // let / var / buffer index; the loop's index let; each, put, reduce: the fragment written
    std::int64_t id = 0;
    // let: a; assign: a; store: index a, value b; loop: lo a, hi b; if: a; each: the lets of
    // row a and column b; put: value a; reduce: the fragment reduced, a constant, in a; copy:
    // destination index a, source index b, source buffer (a constant) c; await_copies: the
    // groups left in flight in id
    Expr a, b, c;
    std::vector<Stmt> body, orelse;
    Loop loop = Loop::serial;
    std::shared_ptr<const Mma> mma; // kind mma
    Reduce reduce = Reduce::sum;    // kind reduce
    bool async = false;             // kind copy: issued now, complete at an await_copies
    std::int64_t bytes = 16;        // kind copy: 16, or 4 (copy4_async: one f32)
};

struct BufferDecl {
    std::string name;
    Elem elem;
    Space space;
    Expr size; // scratch, shared: elements per program instance, from params and constants
    // Shared arrays: rows of `row` elements, each followed by 16 bytes of padding in memory
    // (0: none). Indices stay logical; the lowerings place element x at physical(x).
    std::int64_t row = 0;

    std::int64_t pad() const { return row ? 16 / elem_bytes(elem) : 0; } // elements per row
    std::int64_t physical(std::int64_t x) const { return row ? x + x / row * pad() : x; }
};

// The most shared memory one program instance may declare. Past kStaticSharedBytes, the GPU's
// static limit per block, the NVPTX lowering places the arrays in dynamic shared memory, which
// the launch asks for (sm_80 allows 163 KiB a block, sm_90 227 KiB). 113 KiB: an H100's or
// H200's 228 KiB then holds two blocks (1 KiB reserved a block), as many as the tile programs'
// registers allow; the largest at d = 64 takes 110 KiB (a backward pass with both relation
// projection tiles).
inline constexpr std::int64_t kStaticSharedBytes = 48 * 1024;
inline constexpr std::int64_t kSharedBytes = 113 * 1024;

struct Kernel {
    std::string name;
    std::vector<std::string> params; // i64 scalars
    std::vector<BufferDecl> buffers; // globals first, in launch order, then scratch
    std::vector<Type> vars;          // mutable scalars, zero until assigned
    std::vector<std::string> lets;   // names, for printing
    std::vector<Stmt> body;

    std::size_t globals() const; // how many buffers a launch passes
};

// Whether buffer b is carved from the per-instance scratch region: scratch arrays on every
// target, shared arrays too on the CPU (the GPU places those in shared memory instead).
inline bool in_scratch_region(const BufferDecl& b, bool gpu) {
    return b.space == Space::scratch ||
           (!gpu && (b.space == Space::shared || b.space == Space::fragment));
}
// The columns of a fragment (its size over kFragmentRows).
std::int64_t fragment_cols(const BufferDecl& b);
// The bytes of a scratch or shared array per program instance.
std::int64_t array_bytes(const BufferDecl& b, std::span<const std::int64_t> params);
// Where each shared array of k starts in the block's shared memory (64-byte aligned, in
// declaration order; -1 for other buffers), and the bytes they take in all.
std::vector<std::int64_t> shared_offsets(const Kernel& k);
std::int64_t shared_bytes(const Kernel& k);

// How the GPU gathers an mma operand's fragments on tensor cores. `ldmatrix` (m8n8, 16-bit):
// one instruction per four 8 x 8 matrices of A or two of B, each 8-element row read as 16
// bytes, where the operand is a shared array of the mma's half type whose rows along the
// fragment's pairs (A's columns, B's rows) are contiguous and 16-byte aligned; `.trans` where
// the other index is the contiguous one. Otherwise element by element, two scalar loads per
// register. Decided from the kernel alone (multiple_of), so the lowering and the bank
// analysis agree.
enum class FragmentLoad : std::uint8_t { elements, ldmatrix, ldmatrix_trans };
FragmentLoad fragment_load(const Kernel& k, const Mma& x, bool operand_b);
// Whether e is a multiple of m whatever the parameters, lets and loads (conservative: integer
// constants, and sums, differences, products and remainders built from multiples).
bool multiple_of(const Expr& e, std::int64_t m);

// Writes kernels as C++ code: each call appends to the innermost open block.
class Builder {
  public:
    explicit Builder(std::string name);

    Expr param(const std::string& name);
    int buffer(const std::string& name, Elem e);     // a global buffer, passed at launch
    int scratch(const std::string& name, Expr size); // an f32 array per program instance
    // An array of `size` elements of e (f32, f16 or bf16) per program instance in the GPU's
    // shared memory (scratch on the CPU); with `row` (a multiple of 8), padded after every
    // `row` elements (BufferDecl::row): the 16-byte rows ldmatrix reads from 8 consecutive
    // rows of a tile then fall in distinct banks when the tile is `row` wide.
    int shared(const std::string& name, std::int64_t size, Elem e = Elem::f32,
               std::int64_t row = 0);
    Expr pid() const;

    Expr let(Expr v, const std::string& name = "");
    int var(Type t, Expr init);
    Expr get(int var) const;
    void set(int var, Expr v);
    Expr load(int buf, Expr index) const;
    void store(int buf, Expr index, Expr v);
    void add_to(int buf, Expr index, Expr v) { store(buf, index, load(buf, index) + v); }
    // dst[di + x] = src[si + x] for the x < 16 / element bytes of one 16-byte vector, dst and
    // src of one element type (no conversion), inside a threads loop. The GPU moves them as
    // one 16-byte load and store when multiple_of shows both indices are multiples of the
    // count (global buffers are 16-byte aligned at every launch: check_kir_launch), else
    // element by element.
    void copy16(int dst, Expr di, int src, Expr si);
    // copy16 from a global buffer into a shared array, asynchronously on the GPU (cp.async): the
    // copy lands at an await_copies, and until then no thread may touch its destination. The
    // CPU copies at once. An unaligned copy (see copy16) is made at once on the GPU too.
    void copy16_async(int dst, Expr di, int src, Expr si);
    // The same for one 4-byte element (an f32: small rows such as lse, D or bias rows, which
    // are not 16-byte aligned), from a global buffer into a shared array.
    void copy4_async(int dst, Expr di, int src, Expr si);
    // The async copies this thread issued since the last await_copies form one group; waits
    // until at most `in_flight` groups are still in flight, then for the whole block (a
    // barrier), so every landed copy is visible to every thread. A statement of the whole
    // program instance (not inside a threads loop). Double buffering: issue tile t + 1, then
    // await_copies(1) lands tile t.
    void await_copies(std::int64_t in_flight);
    void loop(Expr lo, Expr hi, const std::function<void(Expr)>& body, Loop kind = Loop::serial);
    void when(Expr cond, const std::function<void()>& then,
              const std::function<void()>& otherwise = {});
    // C += A B over scratch or shared tiles (see Mma): a statement of the whole program
    // instance, so not inside a `threads` loop; C is a different array from A and B. C may be
    // a fragment (the whole of it: m = kFragmentRows, n its columns, on tensor cores), and
    // then A too (the whole of one with k columns; the GPU reuses its registers).
    // `accumulate` false: C = A B (an array C only, not a fragment).
    void mma(Matrix c, Matrix a, Matrix b, std::int64_t m, std::int64_t n, std::int64_t k,
             Precision p, bool accumulate = true);

    // A fragment of kFragmentRows x cols f32 (cols a multiple of 8, or 1: a row vector),
    // undefined until written.
    int fragment(const std::string& name, std::int64_t cols);
    // body(r, c) for every element of fragment f (c = 0 for a row vector), independent of
    // each other like the iterations of a threads loop: here() and put() of fragments with f's
    // columns address the element (r, c), of row vectors row r (read-only unless f is one).
    // A statement of the whole instance (not inside a threads loop or another each).
    void each(int f, const std::function<void(Expr r, Expr c)>& body);
    Expr here(int f) const;
    void put(int f, Expr v);
    // vec(r) = the max or sum of f(r, c) over c, for every row: a statement of the instance.
    void row_reduce(int vec, int f, Reduce op);
    const BufferDecl& decl(int buf) const { return k_.buffers.at(std::size_t(buf)); }
    Kernel finish(); // checks the kernel (rag::Error naming the kernel on misuse)

  private:
    std::vector<Stmt>& block() { return *open_.back(); }
    void nest(Stmt s, const std::function<void()>& fill_body,
              const std::function<void()>& fill_else);

    Kernel k_;
    std::vector<std::vector<Stmt>*> open_;
    int threads_depth_ = 0; // threads loops open around the current block
    int each_ = -1;         // the fragment of the open `each`, if any
};

// The value of an expression over parameters and constants (scratch sizes, on the host).
std::int64_t evaluate(const Expr& e, std::span<const std::int64_t> params);
// A binary integer op on the host (arithmetic, min, max, comparisons and logic as 0 or 1);
// nullopt for any other op and for a division or remainder by zero.
std::optional<std::int64_t> integer_op(Op op, std::int64_t a, std::int64_t b);
std::string print(const Kernel& k);

} // namespace rag::kir
