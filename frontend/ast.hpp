// The abstract syntax of the rag language (LANGUAGE.md). Every node keeps its source span.
// Produced by the parser, read by the checker; nothing here knows about tensors at run time.
#pragma once
#include "frontend/source.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rag::ast {

struct DimExpr {
    enum class Kind { fixed, symbolic, ragged } kind = Kind::fixed;
    std::int64_t extent = 0; // fixed
    std::string name;        // symbolic, ragged (without the ~)
    // `~N[1:]`: the axis slicing ~N makes, as written; the loader folds them into `name` with
    // the canonical derived name (frontend/lower.cpp).
    // `~H[+2]` (grown by 2) and `~H[*2]` (scaled by 2) name what convolutions and upsampling
    // make (ir/ops/derived_names.hpp).
    struct Slice {
        std::optional<std::int64_t> lo, hi;
        std::int64_t step = 1;
        std::optional<std::int64_t> grow, scale;
    };
    std::vector<Slice> slices;
    Span span;
};

struct TypeExpr {
    enum class Kind {
        tensor,  // dtype[dims]: `f32[B, ~N, 384]`, `f32[]`, `T[B, ~N, C]` (T a type parameter)
        named,   // a params group: `PairBlock`
        tuple,   // `(f32[], PairBlock)`
        function // `fn`: a function passed by name (`loss: fn`), bound where the call is inlined
    } kind = Kind::tensor;
    // tensor: "f32", ... or a type parameter name. The same syntax names params types:
    // `Layer[4]` (an array), `Adam[Model]`, `Linear[384, 128]` (a group with sizes).
    std::string dtype;
    std::vector<DimExpr> dims; // tensor
    // `Linear[384, 128][4]`: an array of a sized params group (the second brackets).
    std::optional<DimExpr> array;
    std::string name;            // named
    std::vector<TypeExpr> elems; // tuple
    Span span;
};

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

// One item of `x[...]`.
struct IndexItem {
    enum class Kind {
        keep,
        newaxis,
        index,
        slice,
        gather // `table[ids]`: an integer tensor expression selects rows
    } kind = Kind::keep;
    std::int64_t index = 0;           // index
    std::optional<std::int64_t> lo;   // slice
    std::optional<std::int64_t> hi;   // slice
    std::optional<std::int64_t> step; // slice: `a:b:s`
    ExprPtr ids;                      // gather
    Span span;
};

struct Arg {
    std::string keyword; // empty: positional
    bool spread = false; // `*data`: the elements of a tuple, as positional arguments
    ExprPtr value;
    Span span;
};

struct Expr {
    enum class Kind {
        integer,  // ival
        floating, // fval
        boolean,  // bval
        string,   // name: a double-quoted literal without the quotes (einsum's spec,
                  // padding="same": arguments of builtins that name choices)
        name,     // name
        unary,    // op ("-"), operands[0]
        binary,   // op ("+" "-" "*" "/" "@" "**" "<" "<=" ">" ">=" "==" "!="), operands[0..1]
        call,   // operands[0] is the callee (a name, or a call: value_and_grad(f, wrt=p)(x)), args
        index,  // operands[0][items]
        member, // operands[0].name
        tuple   // (a, b, ...): operands
    } kind = Kind::name;
    Span span;
    std::int64_t ival = 0;
    double fval = 0;
    bool bval = false;
    std::string name;
    std::string op;
    std::vector<ExprPtr> operands;
    std::vector<Arg> args;
    std::vector<IndexItem> items;
};

// The target of a `let`: a name, or a tuple of targets `(y, (a, b))`.
struct Pattern {
    std::string name; // empty for a tuple
    std::vector<Pattern> elems;
    Span span;
    bool is_tuple() const { return name.empty(); }
};

struct Stmt {
    enum class Kind {
        let,    // let target = value
        assign, // name = value: rebinds a variable bound earlier, keeping its type
        ret,    // return value
        loop    // for var in value { body }: once per element of a params array or tuple
    } kind = Kind::let;
    Pattern target; // let, assign (a name), loop (the loop variable)
    ExprPtr value;
    std::vector<Stmt> body; // loop
    Span span;
};

struct Param {
    std::string name;
    TypeExpr type;
    Span span;
};

struct FnDecl {
    std::string name;
    std::vector<std::string> type_params; // fn scale[T](...)
    std::vector<Param> params;
    std::optional<TypeExpr> result;
    std::vector<Stmt> body;
    Span span;      // the whole declaration
    Span name_span; // the name
};

struct ParamField {
    std::string name;
    TypeExpr type;
    ExprPtr init; // `normal(0.02)`, `zeros`, `ones`, `uniform(-0.1, 0.1)`; may be null
    Span span;
};

struct ParamsDecl {
    std::string name;
    // `params Linear[I, O] { w: f32[I, O] }`: size parameters, bound to integers where the
    // group is used (`Linear[384, 128]`). Empty for a group of fixed sizes.
    std::vector<std::string> sizes;
    std::vector<ParamField> fields;
    Span span;
    Span name_span;
};

struct Import {
    std::string path;
    Span span;
};

struct Module {
    std::vector<Import> imports;
    std::vector<ParamsDecl> params;
    std::vector<FnDecl> fns; // in source order
};

} // namespace rag::ast
