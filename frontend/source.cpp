#include "frontend/source.hpp"

#include <algorithm>

namespace rag {

SourceFile::SourceFile(std::string path, std::string text)
    : path_(std::move(path)), text_(std::move(text)) {
    line_starts_.push_back(0);
    for (std::uint32_t i = 0; i < text_.size(); ++i)
        if (text_[i] == '\n') line_starts_.push_back(i + 1);
}

std::pair<int, int> SourceFile::line_col(std::uint32_t offset) const {
    offset = std::min<std::uint32_t>(offset, std::uint32_t(text_.size()));
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    int line = int(it - line_starts_.begin());
    return {line, int(offset - line_starts_[line - 1]) + 1};
}

std::string SourceFile::line_text(int line) const {
    if (line < 1 || line > int(line_starts_.size())) return "";
    std::uint32_t b = line_starts_[line - 1];
    std::uint32_t e =
        line < int(line_starts_.size()) ? line_starts_[line] - 1 : std::uint32_t(text_.size());
    std::string s = text_.substr(b, e - b);
    if (!s.empty() && s.back() == '\r') s.pop_back();
    return s;
}

namespace {

constexpr int kShownColumns = 120;     // of a long source line, around the caret
constexpr std::size_t kMessage = 1000; // bytes of a message

// Control bytes (NUL included) as \xNN so a diagnostic never carries them.
std::string escaped(unsigned char c) {
    if (c >= 0x20 && c != 0x7F) return std::string(1, char(c));
    const char* hex = "0123456789abcdef";
    return std::string("\\x") + hex[c >> 4] + hex[c & 15];
}

std::string shortened(const std::string& message) {
    std::string out;
    for (std::size_t k = 0; k < message.size() && out.size() < kMessage; ++k)
        out += message[k] == '\n' || message[k] == '\t'
                   ? std::string(1, message[k])
                   : escaped(static_cast<unsigned char>(message[k]));
    if (out.size() >= kMessage) out += "... (" + std::to_string(message.size()) + " bytes)";
    return out;
}

} // namespace

std::string SourceFile::format(const Diagnostic& d) const {
    if (d.span.is_whole_file())
        return path_ + (d.note ? ": note: " : ": error: ") + shortened(d.message) + "\n";
    auto [line, col] = line_col(d.span.begin);
    std::string src = line_text(line);
    auto [end_line, end_col] = line_col(d.span.end);
    const int last = end_line == line ? end_col - 1 : int(src.size()); // last underlined column
    // A long line shows a window around the caret, marked with "..." where it is cut.
    const int from = int(src.size()) > kShownColumns ? std::max(1, col - kShownColumns / 2) : 1;
    const int to = std::min(int(src.size()), from + kShownColumns - 1);
    std::string shown = from > 1 ? "..." : "", marks = from > 1 ? "   " : "";
    for (int c = from; c <= to; ++c) {
        const auto ch = static_cast<unsigned char>(src[std::size_t(c - 1)]);
        const std::string piece = ch == '\t' ? "\t" : escaped(ch);
        shown += piece;
        if (c < col)
            marks += ch == '\t' ? std::string("\t") : std::string(piece.size(), ' ');
        else if (c == col)
            marks += "^" + std::string(piece.size() - 1, '~');
        else if (c <= last)
            marks += std::string(piece.size(), '~');
    }
    if (to < int(src.size())) shown += "...";
    if (col > to) marks += '^'; // at the end of the line
    return path_ + ":" + std::to_string(line) + ":" + std::to_string(col) +
           (d.note ? ": note: " : ": error: ") + shortened(d.message) + "\n    " + shown +
           "\n    " + marks + "\n";
}

void Diagnostics::error(Span s, std::string message, const SourceFile* file) {
    for (const auto& d : items_)
        if (d.span.begin == s.begin && d.span.end == s.end && d.file == file &&
            d.message == message)
            return;
    items_.push_back({s, std::move(message), file});
}

void Diagnostics::note(Span s, std::string message, const SourceFile* file) {
    for (const auto& d : notes_)
        if (d.span.begin == s.begin && d.file == file && d.message == message) return;
    notes_.push_back({s, std::move(message), file, true});
}

std::string Diagnostics::notes_str() const {
    std::string out;
    for (const auto& d : notes_) out += (d.file ? d.file : src_)->format(d);
    return out;
}

std::string Diagnostics::str() const {
    auto sorted = items_;
    std::stable_sort(sorted.begin(), sorted.end(), [](const Diagnostic& a, const Diagnostic& b) {
        return a.span.begin < b.span.begin;
    });
    std::string out;
    for (const auto& d : sorted) out += (d.file ? d.file : src_)->format(d);
    return out;
}

} // namespace rag
