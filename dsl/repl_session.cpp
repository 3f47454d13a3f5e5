// `rag repl`: the session: entries, definitions and the colon commands.
#include "dsl/repl_session.hpp"
#include "frontend/lower.hpp"
#include "frontend/parser.hpp"
#include "frontend/stdlib.hpp"
#include "jit/plan.hpp"
#include "jit/ptx.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace rag::repl {

namespace {

const char* help_text =
    R"(Enter definitions, let bindings, expressions or commands. Input continues on
"..." lines while brackets are open.

  params G { ... }   fn f(...) { ... }   import "file.rag"
                         define (a definition with an existing name replaces it)
  let x = EXPR           bind a REPL variable; let (a, b) = EXPR destructures a tuple
  EXPR                   evaluate and print: schema, lengths and the first values
  randn([5, 17, 9], 384) a f32[B, ~N, 384] batch with those lengths, standard normal;
                         lists are ragged axes (equal lists share a name), integers static
                         axes, no list: a dense array; seed=S (default: the number of
                         earlier randn calls without seed=), dtype=f64
  init(G, S)  or  G(S)   the params group G, initialised with seed S (default 0);
                         init(Adam[G], S) its Adam state (zeros, t = 0)

  :type EXPR             the type of EXPR, without evaluating it
  :ir NAME               the IR of fn NAME on its declared types (or :ir EXPR)
  :ptx NAME [sm_80]      the PTX of fn NAME's GPU kernels (default sm_90)
  :load FILE             add a file's definitions
  :load NAME TYPE FILE   bind NAME to params of type TYPE (Model, Adam[Model], ...) read
                         from a safetensors checkpoint
  :save NAME FILE        write the params variable NAME to a safetensors checkpoint (one
                         tensor per dotted field name)
  :time EXPR             evaluate (or let) and print the wall time
  :stats                 compilations and cache hits per evaluated expression
  :vars   :defs          the variables; the definitions' source
  :help   :quit          this text; leave (also Ctrl-D)
  :help NAME             a standard-library group or function (Linear, mlp, ...) and its
                         documentation; every one is in scope without an import
)";

std::string trim(const std::string& s) {
    auto b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// A declaration header on one line: "fn f(\n  x: f32[]\n) -> f32[]" -> "fn f(x: f32[]) -> f32[]".
std::string one_line(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (std::isspace(static_cast<unsigned char>(c))) {
            if (!out.empty() && out.back() != ' ' && out.back() != '(' && out.back() != '[')
                out += ' ';
        } else {
            if ((c == ')' || c == ']' || c == ',') && !out.empty() && out.back() == ' ')
                out.pop_back();
            out += c;
        }
    }
    return trim(out);
}

// Skips spaces and comments.
std::uint32_t skip_trivia(const std::string& s, std::uint32_t i) {
    while (i < s.size()) {
        if (std::isspace(static_cast<unsigned char>(s[i])))
            ++i;
        else if (s[i] == '#')
            while (i < s.size() && s[i] != '\n') ++i;
        else
            break;
    }
    return i;
}

std::string word_at(const std::string& s, std::uint32_t i) {
    std::uint32_t e = i;
    while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
    return s.substr(i, e - i);
}

} // namespace

Session::Session(std::FILE* out, std::FILE* err)
    : out_(out), err_(err ? err : out), base_(Module::compile("", "<repl>")) {}

void Session::say(const std::string& s) {
    std::fputs(s.c_str(), out_);
}

void Session::complain(const std::string& s) {
    had_error_ = true;
    if (err_ != out_) std::fflush(out_); // keeps answers and errors in order on a shared terminal
    std::fputs(s.c_str(), err_);
    std::fflush(err_);
}

void Session::error(const std::string& msg) {
    complain("error: " + msg + "\n");
}

void Session::diag(const SourceFile& src, std::uint32_t begin, std::uint32_t end,
                   const std::string& msg) {
    complain(src.format({{begin, std::max(begin, end)}, msg, nullptr}));
}

// ---- definitions --------------------------------------------------------------------------

std::string Session::combine(std::vector<Chunk>& chunks) const {
    std::string out;
    for (auto& c : chunks) {
        if (!out.empty()) out += "\n\n";
        c.begin = std::uint32_t(out.size());
        out += c.text;
    }
    return out;
}

void Session::define(const std::shared_ptr<SourceFile>& src, bool from_file) {
    Diagnostics d(*src);
    ast::Module m = frontend::parse(*src, d);
    if (!d.empty()) {
        complain(d.str());
        complain(from_file ? "(nothing loaded; the definitions are as before)\n"
                           : "(not defined; the definitions are as before)\n");
        return;
    }
    std::vector<Chunk> added;
    auto text_of = [&](Span s) { return src->text().substr(s.begin, s.end - s.begin); };
    for (const auto& imp : m.imports) {
        std::string text = text_of(imp.span);
        namespace fs = std::filesystem;
        if (from_file && fs::path(imp.path).is_relative())
            text = "import \"" +
                   (fs::path(src->path()).parent_path() / imp.path).lexically_normal().string() +
                   "\"";
        added.push_back({"import " + imp.path, text, src, imp.span.begin, 0});
    }
    for (const auto& p : m.params)
        added.push_back({"params " + p.name, text_of(p.span), src, p.span.begin, 0});
    for (const auto& f : m.fns)
        added.push_back({"fn " + f.name, text_of(f.span), src, f.span.begin, 0});
    std::stable_sort(added.begin(), added.end(), [](const Chunk& a, const Chunk& b) {
        return a.origin_begin < b.origin_begin;
    });
    if (added.empty()) {
        error("nothing to define");
        return;
    }
    std::vector<Chunk> chunks = chunks_;
    std::vector<std::string> replaced;
    for (const auto& a : added) {
        auto it = std::find_if(chunks.begin(), chunks.end(),
                               [&](const Chunk& c) { return c.key == a.key; });
        if (it == chunks.end()) {
            chunks.push_back(a);
            continue;
        }
        if (std::find_if(chunks_.begin(), chunks_.end(),
                         [&](const Chunk& c) { return c.key == a.key; }) != chunks_.end())
            replaced.push_back(a.key);
        *it = a;
    }
    if (!install(std::move(chunks))) {
        complain(from_file ? "(nothing loaded; the definitions are as before)\n"
                           : "(not defined; the definitions are as before)\n");
        return;
    }
    // Typed definitions are shown as `<fn NAME>` in later diagnostics; a file keeps its lines.
    for (auto& c : chunks_)
        if (c.origin == src && !from_file) {
            c.origin = std::make_shared<SourceFile>("<" + c.key + ">", c.text);
            c.origin_begin = 0;
        }
    auto is_replaced = [&](const std::string& key) {
        return std::find(replaced.begin(), replaced.end(), key) != replaced.end();
    };
    if (from_file) {
        std::string line = "loaded " + src->path() + ":";
        std::string kind;
        for (const auto& a : added) {
            std::string k = a.key.substr(0, a.key.find(' ')),
                        name = a.key.substr(a.key.find(' ') + 1);
            line += k == kind ? ", " : std::string(kind.empty() ? " " : "; ") + k + " ";
            kind = k;
            line += name;
        }
        say(line + "\n");
        if (!replaced.empty()) {
            std::string r = "replaced";
            for (std::size_t k = 0; k < replaced.size(); ++k) r += (k ? ", " : ": ") + replaced[k];
            say(r + "\n");
        }
        return;
    }
    for (const auto& a : added) {
        std::string shown = a.key;
        if (a.key.rfind("fn ", 0) == 0) shown = one_line(a.text.substr(0, a.text.find('{')));
        if (a.key.rfind("params ", 0) == 0) {
            auto g = base_->program().find_params(a.key.substr(7));
            shown += " (" + std::to_string(g ? g->fields.size() : 0) + " fields)";
        }
        say((is_replaced(a.key) ? "redefined " : "defined ") + shown + "\n");
    }
}

bool Session::install(std::vector<Chunk> chunks) {
    std::string source = combine(chunks);
    std::shared_ptr<Module> m;
    try {
        m = Module::compile(source, "<repl>");
    } catch (const CompileError& e) {
        std::string why = remap(source, chunks, nullptr, {});
        complain(why.empty() ? e.what() : why);
        return false;
    }
    chunks_ = std::move(chunks);
    base_ = m;
    for (const auto& [_, c] : cache_)
        for (const auto& [fn, st] : c.module->stats()) {
            FnStats& r = retired_[fn];
            r.compilations += st.compilations;
            r.cache_hits += st.cache_hits;
            r.compile_seconds += st.compile_seconds;
        }
    cache_.clear();
    return true;
}

// ---- entries and commands -----------------------------------------------------------------

void Session::handle(const std::string& text) {
    auto src = std::make_shared<SourceFile>("<input>", text);
    try {
        std::uint32_t i = skip_trivia(text, 0);
        if (i < text.size() && text[i] == ':')
            command(src);
        else
            entry(src, 0);
    } catch (const Error& e) {
        error(e.what());
    } catch (const HelperError& e) {
        diag(*src, e.begin, e.end, e.message);
    } catch (const std::exception& e) {
        error(std::string("internal: ") + e.what());
    }
    std::fflush(out_);
}

void Session::entry(const std::shared_ptr<SourceFile>& src, std::uint32_t begin) {
    const std::string& s = src->text();
    std::uint32_t i = skip_trivia(s, begin);
    if (i >= s.size()) return;
    std::string w = word_at(s, i);
    if (w == "fn" || w == "params" || w == "import") {
        if (begin > 0) {
            diag(*src, i, i + std::uint32_t(w.size()), "definitions go on a line of their own");
            return;
        }
        define(src, false);
    } else if (w == "let") {
        let(src, i + 3);
    } else if (w == "return") {
        diag(*src, i, i + 6, "return belongs inside a fn; to see a value, type the expression");
    } else {
        expression(src, i);
    }
}

void Session::command(const std::shared_ptr<SourceFile>& src) {
    const std::string& s = src->text();
    std::uint32_t i = skip_trivia(s, 0) + 1;
    std::uint32_t name_begin = i;
    while (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    const std::string name = s.substr(name_begin, i - name_begin);
    const std::uint32_t rest = skip_trivia(s, i);
    const std::string arg = trim(s.substr(rest));
    auto need = [&](const char* what) {
        if (!arg.empty()) return true;
        error(":" + name + " needs " + what);
        return false;
    };
    if (name == "quit" || name == "q" || name == "exit") {
        quit_ = true;
    } else if (name == "help" || name == "h" || name == "?") {
        if (arg.empty()) return say(help_text);
        for (const auto& e : frontend::stdlib_entries())
            if (e.name == arg) return say(e.signature + "\n" + e.doc);
        error("no standard-library name '" + arg + "' (rag check --stdlib lists them)");
    } else if (name == "type" || name == "t") {
        if (need("an expression")) cmd_type(src, rest);
    } else if (name == "ir") {
        if (need("a function name or an expression")) cmd_ir(src, rest);
    } else if (name == "ptx") {
        if (need("a function name")) cmd_ptx(arg);
    } else if (name == "load" || name == "l") {
        if (!need("a file, or NAME TYPE FILE")) return;
        std::istringstream in(arg);
        std::vector<std::string> words;
        for (std::string w; in >> w;) words.push_back(w);
        if (words.size() == 3 && !std::filesystem::exists(arg))
            cmd_load_params(words[0], words[1], words[2]);
        else
            cmd_load(arg);
    } else if (name == "save") {
        if (!need("NAME FILE")) return;
        std::istringstream in(arg);
        std::vector<std::string> words;
        for (std::string w; in >> w;) words.push_back(w);
        if (words.size() != 2) {
            error(":save takes NAME FILE: a params variable and the checkpoint to write");
            return;
        }
        cmd_save(words[0], words[1]);
    } else if (name == "time") {
        if (!need("an expression or a let")) return;
        auto t0 = std::chrono::steady_clock::now();
        entry(src, rest);
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count();
        char buf[64];
        std::snprintf(buf, sizeof buf, "wall time: %.3f ms\n", ms);
        say(buf);
    } else if (name == "stats") {
        cmd_stats();
    } else if (name == "vars") {
        cmd_vars();
    } else if (name == "defs") {
        cmd_defs();
    } else {
        diag(*src, name_begin - 1, i, "unknown command ':" + name + "'; :help lists the commands");
    }
}

void Session::cmd_type(const std::shared_ptr<SourceFile>& src, std::uint32_t begin) {
    // A function's type is its signature (a function is not a value an expression gives).
    if (auto [fn, file] = base_->program().find_fn(trim(src->text().substr(begin))); fn && file) {
        const std::string decl = file->text().substr(fn->span.begin, fn->span.end - fn->span.begin);
        say(one_line(decl.substr(0, decl.find('{'))) + "\n");
        return;
    }
    auto p = prepare(src, begin, std::uint32_t(src->text().size()), true);
    if (!p) return;
    if (p->direct) {
        say(type_decl(*p->direct) + "\n");
        return;
    }
    Diagnostics d(*p->module->program().units.at(0).src);
    auto lowered = frontend::lower(p->module->program(), p->fn, std::nullopt, d);
    if (!lowered) {
        complain(d.str());
        return;
    }
    say(lowered->result.str() + "\n");
}

void Session::cmd_ir(const std::shared_ptr<SourceFile>& src, std::uint32_t begin) {
    const std::string arg = trim(src->text().substr(begin));
    if (base_->program().find_fn(arg).first) {
        try {
            say(base_->ir(arg));
        } catch (const CompileError& e) {
            std::vector<Chunk> chunks = chunks_;
            std::string source = combine(chunks);
            std::string why =
                remap(source, chunks, nullptr, [&](const frontend::Program& prog, Diagnostics& d) {
                    frontend::lower(prog, arg, std::nullopt, d);
                });
            complain(why.empty() ? e.what() : why);
        }
        return;
    }
    auto p = prepare(src, begin, std::uint32_t(src->text().size()), true);
    if (!p) return;
    if (p->direct) {
        error(":ir shows a function (or an expression over variables); " + arg +
              " is a variable of type " + type_decl(*p->direct));
        return;
    }
    say(p->module->ir(p->fn, p->args));
}

void Session::cmd_ptx(const std::string& arg) {
    std::istringstream words(arg);
    std::string fn, arch = "sm_90";
    words >> fn >> arch;
    if (!base_->program().find_fn(fn).first) {
        error("no function named '" + fn + "'");
        return;
    }
    Diagnostics d(*base_->program().units.at(0).src);
    auto lowered = frontend::lower(base_->program(), fn, std::nullopt, d);
    if (!lowered) {
        complain(d.str());
        return;
    }
    try {
        const jit::Plan plan = jit::make_plan(lowered->fn);
        say(jit::describe(jit::fused_ptx(lowered->fn, plan, arch), lowered->fn, plan));
    } catch (const Error& e) {
        error(std::string(":ptx: ") + e.what());
    }
}

void Session::cmd_load(const std::string& path) {
    if (std::filesystem::is_directory(path)) {
        error(path + " is a directory: :load takes a .rag file (or NAME TYPE FILE)");
        return;
    }
    std::ifstream in(path);
    if (!in) {
        error("cannot open '" + path + "' (:load FILE, or :load NAME TYPE FILE for a checkpoint)");
        return;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    define(std::make_shared<SourceFile>(path, ss.str()), true);
}

void Session::cmd_save(const std::string& name, const std::string& path) {
    auto it = vars_.find(name);
    if (it == vars_.end()) {
        error("no variable named '" + name + "'");
        return;
    }
    if (it->second.kind != Value::Kind::record) {
        error(name + " is a " + type_decl(it->second) + ", not params; :save writes params");
        return;
    }
    base_->save_params(it->second, path);
    say("saved " + name + " (" + it->second.record + ") to " + path + "\n");
}

void Session::cmd_load_params(const std::string& name, const std::string& type,
                              const std::string& path) {
    if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') ||
        word_at(name, 0) != name) {
        error(":load NAME TYPE FILE: '" + name + "' is not a variable name");
        return;
    }
    Value v = base_->load_params(type, path);
    vars_[name] = v;
    for (const auto& line : show_value(v, name, false)) say(line + "\n");
}

void Session::cmd_stats() {
    std::vector<std::pair<std::string, FnStats>> rows; // by expression, in order of first use
    auto add = [&](const std::string& fn, const FnStats& st) {
        auto l = labels_.find(fn);
        std::string label = l == labels_.end() ? fn : l->second;
        auto it =
            std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first == label; });
        if (it == rows.end()) it = rows.insert(rows.end(), {label, FnStats{}});
        it->second.compilations += st.compilations;
        it->second.cache_hits += st.cache_hits;
        it->second.compile_seconds += st.compile_seconds;
    };
    std::map<int, std::pair<std::string, FnStats>> ordered;
    auto number = [](const std::string& fn) { return std::atoi(fn.c_str() + fn.rfind('_') + 1); };
    for (const auto& [fn, st] : retired_) ordered[number(fn)] = {fn, st};
    for (const auto& [_, c] : cache_)
        for (const auto& [fn, st] : c.module->stats()) ordered[number(fn)] = {fn, st};
    for (const auto& [_, r] : ordered) add(r.first, r.second);
    if (rows.empty()) {
        say("nothing evaluated yet\n");
        return;
    }
    for (const auto& [label, st] : rows) {
        char buf[128];
        std::snprintf(buf, sizeof buf, ": compilations=%d cache_hits=%d compile_ms=%.3f\n",
                      st.compilations, st.cache_hits, st.compile_seconds * 1e3);
        say(label + buf);
    }
}

void Session::cmd_vars() {
    if (vars_.empty()) say("no variables\n");
    for (const auto& [name, v] : vars_)
        for (const auto& line : show_value(v, name, false)) say(line + "\n");
}

void Session::cmd_defs() {
    if (chunks_.empty()) say("no definitions\n");
    for (std::size_t k = 0; k < chunks_.size(); ++k) say((k ? "\n" : "") + chunks_[k].text + "\n");
}

std::vector<std::string> Session::completions() const {
    std::vector<std::string> out = {":help", ":save", ":quit",  ":type",  ":ir",    ":ptx",
                                    ":load", ":time", ":stats", ":vars",  ":defs",  "randn",
                                    "init",  "let",   "fn",     "params", "import", "return"};
    for (const char* b : {"exp",
                          "log",
                          "sqrt",
                          "rsqrt",
                          "abs",
                          "tanh",
                          "sigmoid",
                          "relu",
                          "gelu",
                          "silu",
                          "maximum",
                          "minimum",
                          "where",
                          "sum",
                          "mean",
                          "max",
                          "min",
                          "softmax",
                          "logsumexp",
                          "layernorm",
                          "rmsnorm",
                          "dropout",
                          "transpose",
                          "reshape",
                          "concat",
                          "mse",
                          "cross_entropy",
                          "pad",
                          "mask",
                          "lengths",
                          "attention",
                          "relpos_attention",
                          "grad",
                          "value_and_grad",
                          "sgd"})
        out.push_back(b);
    for (const auto& [n, _] : vars_) out.push_back(n);
    for (const auto& c : chunks_) out.push_back(c.key.substr(c.key.find(' ') + 1));
    return out;
}

} // namespace rag::repl
