#include "frontend/stdlib.hpp"

#include "frontend/validate.hpp"
#include "runtime/error.hpp"

#include <algorithm>

namespace rag::frontend {

const std::vector<Program::Unit>& stdlib_units() {
    static const std::vector<Program::Unit> units = [] {
        Program lib;
        for (const auto& [path, text] : stdlib_sources()) {
            auto src = std::make_shared<SourceFile>(path, text);
            Diagnostics d(*src);
            Program one = load_program(src, d, false);
            if (!d.empty()) fail("the standard library does not parse:\n", d.str());
            for (auto& u : one.units) lib.units.push_back(std::move(u));
        }
        Diagnostics d(*lib.units.at(0).src);
        validate(lib, d);
        if (!d.empty()) fail("the standard library is invalid:\n", d.str());
        for (auto& u : lib.units) u.stdlib = true;
        return lib.units;
    }();
    return units;
}

namespace {

// The text of a declaration up to its body's `{`, on one line.
std::string signature(const std::string& text, Span s) {
    std::string out;
    bool space = false;
    for (std::size_t k = s.begin; k < s.end && text[k] != '{'; ++k) {
        const char c = text[k];
        if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
            space = !out.empty();
            continue;
        }
        if (space && c != ')' && c != ']' && c != ',' && !(out.back() == '(' || out.back() == '['))
            out += ' ';
        space = false;
        out += c;
    }
    return out;
}

// The `#` lines right above offset `at`, without the `# `.
std::string doc_above(const std::string& text, std::size_t at) {
    std::vector<std::string> lines;
    std::size_t end = text.rfind('\n', at == 0 ? 0 : at - 1);
    while (end != std::string::npos && end > 0) {
        std::size_t begin = text.rfind('\n', end - 1);
        begin = begin == std::string::npos ? 0 : begin + 1;
        std::string line = text.substr(begin, end - begin);
        std::size_t k = line.find_first_not_of(" \t");
        if (k == std::string::npos || line[k] != '#') break;
        line = line.substr(k + 1);
        if (!line.empty() && line[0] == ' ') line = line.substr(1);
        lines.insert(lines.begin(), line);
        if (begin == 0) break;
        end = begin - 1;
    }
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    return out;
}

// Every line of `text` indented by four spaces (a Markdown code block), ending in a newline.
std::string indented(const std::string& text) {
    std::string out;
    for (std::size_t k = 0; k < text.size();) {
        std::size_t nl = text.find('\n', k);
        if (nl == std::string::npos) nl = text.size();
        out += "    " + text.substr(k, nl - k) + "\n";
        k = nl + 1;
    }
    return out;
}

} // namespace

std::vector<StdlibEntry> stdlib_entries() {
    std::vector<StdlibEntry> out;
    for (const auto& u : stdlib_units()) {
        const std::string& text = u.src->text();
        // In source order: params and fns interleave.
        std::vector<std::pair<std::uint32_t, StdlibEntry>> here;
        for (const auto& p : u.module.params)
            here.push_back({p.span.begin,
                            {"params", p.name, text.substr(p.span.begin, p.span.end - p.span.begin),
                             doc_above(text, p.span.begin), u.src->path()}});
        for (const auto& f : u.module.fns)
            here.push_back({f.span.begin,
                            {"fn", f.name, signature(text, f.span), doc_above(text, f.span.begin),
                             u.src->path()}});
        std::stable_sort(here.begin(), here.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        for (auto& [_, e] : here) out.push_back(std::move(e));
    }
    return out;
}

std::string stdlib_markdown() {
    std::string out =
        "# The standard library\n\n"
        "Generated from `stdlib/*.rag` by `rag check --stdlib --markdown` (a test checks that\n"
        "this page matches). Every name below is in scope in every program without an import;\n"
        "a program's own definition of a name shadows the library's (a note says so).\n";
    std::string file;
    for (const auto& e : stdlib_entries()) {
        if (e.file != file) {
            file = e.file;
            out += "\n## `" + file + "`\n";
        }
        out += "\n### " + e.name + "\n\n" + indented(e.signature) + "\n" + e.doc;
    }
    return out;
}

std::string stdlib_text() {
    std::string out;
    for (const auto& e : stdlib_entries()) {
        out += e.signature + "\n" + indented(e.doc) + "\n";
    }
    return out;
}

} // namespace rag::frontend
