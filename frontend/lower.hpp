// Lowering: checked AST -> SSA IR, specialised on argument schemas. This is also the schema
// checker: every expression's schema is inferred through the op table's type rules, and type
// errors become diagnostics at the expression's span.
//
// Decisions: calls of user functions are inlined; params groups and tuples are flattened into
// their tensors, so the IR holds tensors only; `grad`/`value_and_grad` lower the function on its
// own, differentiate that IR (ir/autodiff) and inline the result.
#pragma once
#include "frontend/ast.hpp"
#include "ir/ir.hpp"

#include <map>
#include <optional>
#include <set>

namespace rag::frontend {

// The type of a language value: a tensor schema, a params record, or a tuple.
struct VType {
    enum class Kind { tensor, record, tuple } kind = Kind::tensor;
    Schema schema;                                     // tensor
    std::string record;                                // record: the params group's name
    std::vector<std::pair<std::string, VType>> fields; // record
    std::vector<VType> elems;                          // tuple

    static VType tensor(Schema s) { return {Kind::tensor, std::move(s), {}, {}, {}}; }
    std::string str() const;
    std::vector<Schema> flatten() const; // the tensors, in order
    // The tensors of a record or tuple with their dotted names (`layers.2.wq`), in order.
    std::vector<std::pair<std::string, Schema>> leaves() const;
    bool operator==(const VType&) const = default;
};

// A parsed program: the main file and the files it imports, each with its syntax tree.
struct Program {
    struct Unit {
        std::shared_ptr<SourceFile> src;
        ast::Module module;
        bool stdlib = false; // a file of the standard library (frontend/stdlib.hpp)
    };
    std::vector<Unit> units; // [0] is the main file

    // The declaration and the file it is in; nullptr if there is none.
    std::pair<const ast::FnDecl*, const SourceFile*> find_fn(std::string_view name) const;
    // The function a call in file `from` means: the standard library's own functions call each
    // other even where a program shadows their names; anywhere else, find_fn(name).
    std::pair<const ast::FnDecl*, const SourceFile*> find_fn(std::string_view name,
                                                             const SourceFile* from) const;
    const ast::ParamsDecl* find_params(std::string_view name) const;
    std::vector<std::string> fn_names() const;         // of the main file, in source order
    VType params_type(const ast::ParamsDecl& p) const; // rag::Error if a field is not static

    // A record type by name: a params group `Model`, an array of one `Layer[4]`, or Adam state
    // `Adam[Model]`. rag::Error if there is none.
    VType record_type(std::string_view name) const;
    // The name of the record type `t` denotes (`Model`, `Layer[4]`, `Adam[Model]`,
    // `Linear[384, 128]`, `Linear[384, 128][2]`), if any.
    std::optional<std::string> record_name(const ast::TypeExpr& t) const;
    // The group of a sized-group pattern such as `Linear[I, O]` in a signature (a size is a
    // name, bound where the function is called); null for anything else.
    const ast::ParamsDecl* sized_group(const ast::TypeExpr& t) const;
    // A record name in canonical spelling: no spaces except one after each comma
    // (`Linear[4,8]` -> `Linear[4, 8]`). Init keys, checkpoints and caches use this spelling.
    static std::string canonical(std::string_view name);
    // Every tensor of a record type with its dotted name, schema and declaring field (null
    // for Adam state, which starts at zero), in flattening order.
    struct Leaf {
        std::string name;
        Schema schema;
        const ast::ParamField* field = nullptr;
    };
    std::vector<Leaf> record_leaves(std::string_view name) const;
};

// The text of a source file: a regular file of at most kMaxSourceBytes (rag::Error otherwise:
// missing, a directory, a device such as /dev/urandom, too large).
constexpr std::uintmax_t kMaxSourceBytes = 16u << 20;
std::string read_source(const std::string& path);

// Parses `src` and its imports, then appends the standard library (frontend/stdlib.hpp) unless
// `with_stdlib` is false. Diagnostics go to `diags` (for the file they are in).
Program load_program(std::shared_ptr<SourceFile> src, Diagnostics& diags, bool with_stdlib = true);

struct Lowered {
    ir::Function fn;
    std::vector<VType> params; // specialised parameter types (tensor ragged names as declared)
    VType result;
    // Padded execution: the ragged axis names whose bool[B, ~name] masks follow the inputs.
    std::vector<std::string> masks;
};

// Lowers `fn` specialised on `args` (runtime types; nullopt: the declared types). Returns
// nullopt after reporting diagnostics. `padded`: the program for the dense envelope, with one
// mask input per ragged axis name after the arguments (frontend/padded.hpp).
std::optional<Lowered> lower(const Program& prog, std::string_view fn,
                             const std::optional<std::vector<VType>>& args, Diagnostics& diags,
                             bool padded = false);

// The names used as the batch axis in a signature (first dim of each ragged type).
std::set<std::string> batch_names(const ast::FnDecl& fn);
bool has_ragged(const ast::TypeExpr& t);
// A declared tensor type is batched when it has a ragged dimension or its first dimension is
// one of the signature's batch names.
bool is_batched(const ast::TypeExpr& t, const std::set<std::string>& batch);

// A function without a concrete type of its own: it has type parameters (`fn f[T]`) or a
// sized-group parameter with size names (`p: Linear[I, O]`); checked where it is called.
bool is_generic(const Program& prog, const ast::FnDecl& fn);

// Type-checks every non-generic function on its declared types.
void check(const Program& prog, Diagnostics& diags);

} // namespace rag::frontend
