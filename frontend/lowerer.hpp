// Internal to the frontend: the state of lowering one function body (lower.cpp) and the table
// of builtin functions (builtins.cpp) that shares it.
#pragma once
#include "frontend/lower.hpp"

#include <functional>
#include <set>

namespace rag::frontend {

class Padder;

// A language value during lowering.
struct LV {
    enum class Kind { tensor, number, record, tuple, function, error } kind = Kind::error;
    int id = -1;                                    // tensor: IR value
    double num = 0;                                 // number literal (dtype decided by use)
    std::string name;                               // record: params type; function: fn name
    std::vector<std::pair<std::string, LV>> fields; // record
    std::vector<LV> elems;                          // tuple
    // function: the fn `name` resolves to where it was named (a stdlib body that calls a
    // function passed to it must not find a stdlib fn of the same name); a gradient transform
    // of it when grad_wrt >= 0
    const ast::FnDecl* fn = nullptr;
    const SourceFile* fn_file = nullptr;
    int grad_wrt = -1;
    bool with_value = false;

    static LV tensor(int id) {
        return {Kind::tensor, id, 0, {}, {}, {}, nullptr, nullptr, -1, false};
    }
    static LV number(double v) {
        return {Kind::number, -1, v, {}, {}, {}, nullptr, nullptr, -1, false};
    }
    static LV error() { return {}; }
};

// Thrown after a diagnostic was reported, to abandon the current statement.
struct Abandon {};

// Dimension names bound while matching values against a signature.
struct Bindings {
    std::map<std::string, Axis> dims;    // symbolic or ragged declared name -> actual axis
    std::map<std::string, DType> dtypes; // type parameters in dtype position (`T[B, ~N]`)
    std::map<std::string, VType> types;  // type parameters standing for a whole type (`p: P`)
    // At an entry point the arguments are relabelled with the declared ragged names, so any
    // ragged axis may bind to a declared name (extents are then checked per sample).
    bool relabel_ragged = false;
    std::string conflict; // a size name bound to two extents (match_type's message names it)
};

// Results of user-function calls already inlined into one IR function, keyed by the callee and
// its argument values: functions are pure, so a repeated call reuses the first one's values
// (each callee is inlined once per distinct arguments, not once per call site).
struct CallMemo {
    std::map<std::pair<const ast::FnDecl*, std::string>, LV> results;
};

class Lowerer {
  public:
    Lowerer(const Program& prog, Diagnostics& diags, ir::Builder& b, int depth = 0)
        : prog_(prog), diags_(diags), b_(b), depth_(depth), memo_(std::make_shared<CallMemo>()) {}

    // Inlines a call of `fn` with argument values; reports and throws Abandon on errors.
    LV call_fn(const ast::FnDecl& fn, const SourceFile* file, const std::vector<LV>& args, Span at);
    LV expr(const ast::Expr& e);

    // Helpers for builtins.
    [[noreturn]] void error(Span s, const std::string& msg);
    int tensor(const ast::Expr& e);                  // lowers e; must be a tensor
    int tensor_of(const LV& v, Span at, DType like); // a number becomes a const of `like`
    // Reports a function value in v (itself or inside it) where a value is needed.
    void no_function(const LV& v, Span at, const std::string& where);
    int op(Span at, std::string_view name, std::vector<int> args, Attrs attrs = {});
    double constant(const ast::Expr& e, const char* what); // a compile-time number
    VType type_of(const LV& v) const;
    std::vector<int> flatten(const LV& v) const;
    LV materialise(const LV& v); // number literals inside v become f32 constants
    ir::Builder& builder() { return b_; }
    const Program& program() const { return prog_; }
    Diagnostics& diags() { return diags_; }
    int depth() const { return depth_; }
    LV apply_grad(const LV& f, const std::vector<LV>& args, Span at);
    // The function a name denotes here: a `fn`-typed argument, else a top-level fn.
    std::optional<LV> function_value(const std::string& name);
    // Padded execution (frontend/padded.hpp): every op goes through the Padder.
    void set_padder(Padder* p) { padder_ = p; }

  private:
    LV call(const ast::Expr& e);
    LV binary(const ast::Expr& e);
    LV index(const ast::Expr& e);
    LV select(const LV& base, const ast::Expr& e); // p.layers[2], t[0]
    void bind(const ast::Pattern& p, const LV& v);
    // Runs statements; returns the value of a `return` (never inside a loop body).
    std::optional<LV> exec(const std::vector<ast::Stmt>& body, bool in_loop);
    void assign(const ast::Stmt& st);
    void loop(const ast::Stmt& st);
    LV* lookup(const std::string& name); // innermost binding, or null

    const Program& prog_;
    Diagnostics& diags_;
    ir::Builder& b_;
    int depth_;
    const SourceFile* file_ = nullptr;
    std::vector<std::map<std::string, LV>> scopes_ = {{}}; // a function body, then loop bodies
    Padder* padder_ = nullptr;
    std::shared_ptr<CallMemo> memo_; // shared by the Lowerers writing into b_
};

// A builtin function: lowers a call expression whose callee is the builtin's name.
using Builtin = std::function<LV(Lowerer& L, const ast::Expr& call)>;
const Builtin* find_builtin(std::string_view name);

// Matches a type against a declared type, binding names; returns "" or why it does not match.
std::string match_type(const Program& prog, const VType& actual, const ast::TypeExpr& decl,
                       const std::set<std::string>& batch_names, Bindings& b);

} // namespace rag::frontend
