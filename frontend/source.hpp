// Source files and diagnostics. Every diagnostic names file:line:col, shows the source line
// and a caret under the span, and says what was expected.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rag {

// Byte offsets [begin, end) into one source file.
struct Span {
    std::uint32_t begin = 0;
    std::uint32_t end = 0;
    // A diagnostic about the file as a whole (no function of that name): no line, no caret.
    static Span whole_file() { return {UINT32_MAX, UINT32_MAX}; }
    bool is_whole_file() const { return begin == UINT32_MAX; }
};

class SourceFile;

struct Diagnostic {
    Span span;
    std::string message;
    const SourceFile* file = nullptr; // null: the Diagnostics' own file
    bool note = false;                // a note: reported, not an error
};

class SourceFile {
  public:
    SourceFile(std::string path, std::string text);
    const std::string& path() const { return path_; }
    const std::string& text() const { return text_; }
    // 1-based line and column (columns count bytes) of a byte offset.
    std::pair<int, int> line_col(std::uint32_t offset) const;
    std::string line_text(int line) const; // without the newline
    // "path:3:9: error: message\n    let x = y +\n              ^\n"
    std::string format(const Diagnostic& d) const;

  private:
    std::string path_, text_;
    std::vector<std::uint32_t> line_starts_;
};

// Diagnostics collected while compiling one file; the pipeline keeps going where it can so a
// file reports several errors at once.
class Diagnostics {
  public:
    explicit Diagnostics(const SourceFile& src) : src_(&src) {}
    // Reports once: the same message at the same place (an error inside a function that is
    // inlined at several calls) is kept a single time.
    void error(Span s, std::string message, const SourceFile* file = nullptr);
    // A note (such as which of two definitions is used): shown, compilation goes on.
    void note(Span s, std::string message, const SourceFile* file = nullptr);
    bool empty() const { return items_.empty(); } // no errors (notes do not count)
    const std::vector<Diagnostic>& notes() const { return notes_; }
    std::string notes_str() const; // every note formatted
    const std::vector<Diagnostic>& items() const { return items_; }
    const SourceFile& source() const { return *src_; }
    std::string str() const; // every diagnostic formatted, in source order

  private:
    const SourceFile* src_;
    std::vector<Diagnostic> items_, notes_;
};

} // namespace rag
