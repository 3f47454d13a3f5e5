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

std::string SourceFile::format(const Diagnostic& d) const {
    auto [line, col] = line_col(d.span.begin);
    std::string src = line_text(line);
    std::string out = path_ + ":" + std::to_string(line) + ":" + std::to_string(col) +
                      ": error: " + d.message + "\n    " + src + "\n    ";
    for (int c = 1; c < col; ++c)
        out += (c - 1 < int(src.size()) && src[c - 1] == '\t') ? '\t' : ' ';
    out += '^';
    // Underline the rest of the span on this line.
    auto [end_line, end_col] = line_col(d.span.end);
    int last = end_line == line ? end_col - 1 : int(src.size());
    for (int c = col + 1; c <= last; ++c) out += '~';
    return out + "\n";
}

void Diagnostics::error(Span s, std::string message, const SourceFile* file) {
    for (const auto& d : items_)
        if (d.span.begin == s.begin && d.span.end == s.end && d.file == file &&
            d.message == message)
            return;
    items_.push_back({s, std::move(message), file});
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
