// Internal to `rag repl` (repl*.cpp): the session state and the value helpers it shares.
//
// A session keeps the accumulated definitions as source text (one chunk per `params`, `fn` or
// `import`) and a Module compiled from them; REPL variables are Values. An expression is
// evaluated by synthesising `fn __repl_K(v1: <type of v1>, ...) {\nreturn\nEXPR\n}` after the
// definitions, compiling that source as a Module and calling __repl_K with the variables'
// values; the expression sits on its own line so diagnostics map back onto the user's input.
#pragma once
#include "dsl/module.hpp"
#include "frontend/source.hpp"

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rag::frontend {
struct Program;
}

namespace rag::repl {

// ---- values (repl_values.cpp) -------------------------------------------------------------

// Session-wide names for ragged extents: a ragged axis is named by its per-sample lengths, so
// the same lengths get the same name (N, M, L, K, N2, ...) in every value of the session.
class RaggedNames {
  public:
    Value canon(const Value& v);
    RaggedTensor canon(const RaggedTensor& t);

  private:
    std::vector<std::pair<std::vector<std::int64_t>, std::string>> names_;
};

// One line: "f32[B, ~N, 384] B=3 N=[5, 17, 9]  [0.1, ...] (11904 values)"; a scalar is its number.
std::string show_tensor(const RaggedTensor& t, bool values);
// The lines printing a value named `name` (may be empty): tensors as above, records as their
// fields' schemas, tuples one element per line ("name.0: ...").
std::vector<std::string> show_value(const Value& v, const std::string& name, bool values);
// The declared type that binds exactly this value in a synthesised signature. Ragged names are
// renamed in order of appearance (N, M, L, K, N2, ...) through `ragged`, so a signature does
// not depend on the session's names and equal schemas give equal signatures.
std::string type_decl(const Value& v, std::map<std::string, std::string>& ragged);
std::string type_decl(const Value& v);
// The value with its ragged axes renamed (the argument as the signature names it).
Value rename_ragged(const Value& v, const std::map<std::string, std::string>& names);
// The k-th ragged name: N, M, L, K, N2, M2, ...
std::string ragged_name(std::size_t k);
bool has_ragged(const Value& v);
bool has_batched_dense(const Value& v, std::int64_t& batch);

// A host-side helper call found in an expression: randn(...), init(G, seed), G(seed).
struct HelperCall {
    std::uint32_t begin = 0, end = 0; // the call's span in the text
    std::string callee;               // "randn", "init" or a params group name
    std::string args;                 // the text between the parentheses
    std::uint32_t args_begin = 0;
};
// Finds helper calls outside comments; `groups` are the params group names; names in `shadow`
// (user functions of the same name) are left alone.
std::vector<HelperCall> find_helpers(const std::string& text, const std::set<std::string>& groups,
                                     const std::set<std::string>& shadow);

// The arguments of a helper: positional numbers or integer lists, and key=value. Throws
// HelperError on malformed text.
struct HelperArg {
    std::string keyword;
    bool is_list = false;
    std::vector<std::int64_t> list; // is_list
    std::string atom;               // a number or a name
    std::uint32_t begin = 0, end = 0;
};
struct HelperError {
    std::uint32_t begin, end;
    std::string message;
};
std::vector<HelperArg> parse_helper_args(const std::string& text, std::uint32_t base);

// randn: a batch from lengths lists (ragged axes; equal lists share a name) and integer extents
// (static axes); without a list, a dense array. Values are standard normal, CounterRng(seed,
// "randn"), numbered sample by sample in row-major order.
struct RandnAxis {
    bool ragged = false;
    std::int64_t extent = 0;           // static
    std::vector<std::int64_t> lengths; // ragged: one per sample
};
RaggedTensor randn(const std::vector<RandnAxis>& axes, DType dtype, std::uint64_t seed);

// Bracket depth of a partial entry, ignoring comments and strings (> 0: more lines needed).
int open_brackets(const std::string& text);

// ---- the session (repl_session.cpp, repl_eval.cpp) ----------------------------------------

class Session {
  public:
    // Answers go to `out`; errors to `err` (null: `out` too).
    explicit Session(std::FILE* out, std::FILE* err = nullptr);
    // One complete entry (a definition, `let`, expression or :command). Never throws.
    void handle(const std::string& entry);
    bool finished() const { return quit_; }
    bool had_error() const { return had_error_; }
    // Names for completion: commands, variables, functions, params groups.
    std::vector<std::string> completions() const;

  private:
    // A definition as source text; `origin` is the text it came from (for diagnostics).
    struct Chunk {
        std::string key;  // "fn NAME", "params NAME", "import PATH"
        std::string text; // the declaration
        std::shared_ptr<SourceFile> origin;
        std::uint32_t origin_begin = 0;
        std::uint32_t begin = 0; // offset in the combined source (set by combine())
    };
    // The user's expression inside a synthesised source: [begin, end) there maps to
    // `entry_begin` in `entry`.
    struct ExprSite {
        std::uint32_t begin = 0, end = 0;
        const SourceFile* entry = nullptr;
        std::uint32_t entry_begin = 0;
    };
    // A compiled expression: the module holding __repl_K and the values to call it with.
    struct Prepared {
        std::optional<Value> direct; // the expression is just a variable
        std::shared_ptr<Module> module;
        std::string fn;
        std::vector<Value> args;
        std::string source;
        ExprSite site;
    };
    struct Compiled {
        std::shared_ptr<Module> module;
        std::string fn;
        std::string source;
        std::string label; // the expression, for :stats
    };

    void say(const std::string& s);
    void complain(const std::string& s); // an error's text: to err_, and remembered
    void error(const std::string& msg);
    void diag(const SourceFile& src, std::uint32_t begin, std::uint32_t end,
              const std::string& msg);

    // Definitions.
    std::string combine(std::vector<Chunk>& chunks) const;
    void define(const std::shared_ptr<SourceFile>& src, bool from_file);
    bool install(std::vector<Chunk> chunks); // compiles; on success the new state
    // The diagnostics of compiling `source` (plus `extra`, e.g. lowering one function), each
    // shown where the user wrote it: in the entry, in the definition's origin, or in the file.
    std::string
    remap(const std::string& source, const std::vector<Chunk>& chunks, const ExprSite* site,
          const std::function<void(const frontend::Program&, Diagnostics&)>& extra) const;

    // Expressions.
    std::optional<Prepared> prepare(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin,
                                    std::uint32_t end, bool for_type);
    std::optional<Value> evaluate(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin,
                                  std::uint32_t end);
    std::optional<Value> helper_value(const HelperCall& h, bool for_type);

    // Entries.
    void let(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin);
    void expression(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin);
    void command(const std::shared_ptr<SourceFile>& entry);
    void entry(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin);
    void cmd_type(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin);
    void cmd_ir(const std::shared_ptr<SourceFile>& entry, std::uint32_t begin);
    void cmd_ptx(const std::string& arg); // NAME [arch]
    void cmd_load(const std::string& path);
    void cmd_save(const std::string& name, const std::string& path);
    void cmd_load_params(const std::string& name, const std::string& type, const std::string& path);
    void cmd_stats();
    void cmd_vars();
    void cmd_defs();

    std::FILE* out_;
    std::FILE* err_;
    bool quit_ = false;
    bool had_error_ = false;
    std::vector<Chunk> chunks_;
    std::shared_ptr<Module> base_; // the definitions alone
    std::map<std::string, Value> vars_;
    RaggedNames names_;
    std::map<std::string, Compiled> cache_;  // by signature + expression, until definitions change
    std::map<std::string, FnStats> retired_; // stats of modules dropped from the cache
    std::map<std::string, std::string> labels_; // __repl_K -> expression
    int next_fn_ = 0;
    std::uint64_t randn_calls_ = 0;
};

} // namespace rag::repl
