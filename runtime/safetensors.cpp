#include "runtime/safetensors.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <unistd.h>

namespace rag::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; rag stores tensors in host order");

namespace {

// The safetensors library refuses headers above 100 MB; so does rag, before allocating.
constexpr std::uint64_t max_header = 100u << 20;
// JSON nesting deeper than this is not a safetensors header (and would recurse without bound).
constexpr int max_depth = 16;

const char* file_dtype(DType t) {
    switch (t) {
    case DType::f16:
        return "F16";
    case DType::bf16:
        return "BF16";
    case DType::f32:
        return "F32";
    case DType::f64:
        return "F64";
    case DType::i32:
        return "I32";
    case DType::i64:
        return "I64";
    case DType::boolean:
        return "BOOL";
    }
    return "?";
}

std::optional<DType> dtype_of_file(std::string_view s) {
    for (DType t : all_dtypes)
        if (s == file_dtype(t)) return t;
    return std::nullopt;
}

// ---- the JSON subset of a header: objects, arrays, strings, non-negative integers ----------

struct Json {
    enum class Kind { object, array, string, integer } kind = Kind::object;
    std::string str;
    std::uint64_t num = 0;
    std::vector<std::pair<std::string, Json>> members;
    std::vector<Json> elems;
};

class JsonReader {
  public:
    JsonReader(std::string_view text, const std::string& path) : s_(text), path_(path) {}

    Json document() {
        Json v = value(0);
        skip_space();
        if (i_ != s_.size()) bad("unexpected text after the header object");
        return v;
    }

  private:
    [[noreturn]] void bad(const std::string& why) const {
        fail(path_, ": not a valid safetensors file: header JSON at byte ", i_, ": ", why);
    }
    void skip_space() {
        while (i_ < s_.size() &&
               (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
            ++i_;
    }
    bool eat(char c) {
        skip_space();
        if (i_ < s_.size() && s_[i_] == c) {
            ++i_;
            return true;
        }
        return false;
    }
    void expect(char c, const char* what) {
        if (!eat(c)) bad(std::string("expected ") + what);
    }

    Json value(int depth) {
        if (depth > max_depth) bad("nested too deeply");
        skip_space();
        if (i_ >= s_.size()) bad("ends early");
        const char c = s_[i_];
        Json v;
        if (c == '{') {
            ++i_;
            v.kind = Json::Kind::object;
            if (eat('}')) return v;
            do {
                skip_space();
                if (i_ >= s_.size() || s_[i_] != '"') bad("expected a name in quotes");
                std::string key = string();
                for (const auto& [k, _] : v.members)
                    if (k == key) bad("the name '" + key + "' appears twice");
                expect(':', "':'");
                v.members.emplace_back(std::move(key), value(depth + 1));
            } while (eat(','));
            expect('}', "',' or '}'");
        } else if (c == '[') {
            ++i_;
            v.kind = Json::Kind::array;
            if (eat(']')) return v;
            do v.elems.push_back(value(depth + 1));
            while (eat(','));
            expect(']', "',' or ']'");
        } else if (c == '"') {
            v.kind = Json::Kind::string;
            v.str = string();
        } else if (c >= '0' && c <= '9') {
            v.kind = Json::Kind::integer;
            v.num = integer();
        } else {
            bad(c == '-' ? "negative numbers have no place in a header"
                         : "expected an object, array, string or non-negative integer");
        }
        return v;
    }

    std::uint64_t integer() {
        std::uint64_t n = 0;
        const std::size_t start = i_;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
            const auto d = std::uint64_t(s_[i_] - '0');
            if (n > (std::numeric_limits<std::uint64_t>::max() - d) / 10) bad("integer too large");
            n = n * 10 + d;
            ++i_;
        }
        if (i_ - start > 1 && s_[start] == '0') bad("integers have no leading zeros");
        if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
            bad("expected an integer");
        return n;
    }

    unsigned hex4() {
        if (s_.size() - i_ < 4) bad("ends inside a \\u escape");
        unsigned v = 0;
        for (int k = 0; k < 4; ++k) {
            const char h = s_[i_++];
            v <<= 4;
            if (h >= '0' && h <= '9')
                v |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f')
                v |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F')
                v |= unsigned(h - 'A' + 10);
            else
                bad("bad \\u escape");
        }
        return v;
    }

    static void put_utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) {
            out += char(cp);
        } else if (cp < 0x800) {
            out += char(0xc0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            out += char(0xe0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3f));
            out += char(0x80 | (cp & 0x3f));
        } else {
            out += char(0xf0 | (cp >> 18));
            out += char(0x80 | ((cp >> 12) & 0x3f));
            out += char(0x80 | ((cp >> 6) & 0x3f));
            out += char(0x80 | (cp & 0x3f));
        }
    }

    std::string string() {
        ++i_; // the opening quote
        std::string out;
        while (true) {
            if (i_ >= s_.size()) bad("ends inside a string");
            const char c = s_[i_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) bad("control character inside a string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (i_ >= s_.size()) bad("ends inside a string");
            const char e = s_[i_++];
            switch (e) {
            case '"':
            case '\\':
            case '/':
                out += e;
                break;
            case 'b':
                out += '\b';
                break;
            case 'f':
                out += '\f';
                break;
            case 'n':
                out += '\n';
                break;
            case 'r':
                out += '\r';
                break;
            case 't':
                out += '\t';
                break;
            case 'u': {
                unsigned cp = hex4();
                if (cp >= 0xd800 && cp < 0xdc00) { // a surrogate pair
                    if (s_.size() - i_ < 2 || s_[i_] != '\\' || s_[i_ + 1] != 'u')
                        bad("unpaired surrogate in a \\u escape");
                    i_ += 2;
                    const unsigned lo = hex4();
                    if (lo < 0xdc00 || lo >= 0xe000) bad("unpaired surrogate in a \\u escape");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else if (cp >= 0xdc00 && cp < 0xe000) {
                    bad("unpaired surrogate in a \\u escape");
                }
                put_utf8(out, cp);
                break;
            }
            default:
                bad(std::string("bad escape \\") + e);
            }
        }
    }

    std::string_view s_;
    const std::string& path_;
    std::size_t i_ = 0;
};

void quote(std::string& out, std::string_view s) {
    out += '"';
    for (char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
            out += buf;
        } else {
            out += c;
        }
    }
    out += '"';
}

// One tensor's header entry, checked against the data section of `data_size` bytes.
struct Entry {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin, end;
};

[[noreturn]] void entry_error(const std::string& path, const std::string& name,
                              const std::string& why) {
    fail(path, ": tensor '", name, "': ", why);
}

Entry read_entry(const std::string& path, const std::string& name, const Json& v) {
    auto bad = [&](const std::string& why) { entry_error(path, name, why); };
    if (v.kind != Json::Kind::object) bad("expected an object with dtype, shape, data_offsets");
    const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [k, m] : v.members) {
        if (k == "dtype")
            dtype = &m;
        else if (k == "shape")
            shape = &m;
        else if (k == "data_offsets")
            offsets = &m;
        else
            bad("unknown key '" + k + "' (expected dtype, shape, data_offsets)");
    }
    if (!dtype || !shape || !offsets) bad("needs dtype, shape and data_offsets");
    Entry e{name, DType::f32, {}, 0, 0};
    if (dtype->kind != Json::Kind::string) bad("dtype is not a string");
    auto t = dtype_of_file(dtype->str);
    if (!t)
        bad("dtype '" + dtype->str +
            "' is not one rag reads (F16, BF16, F32, F64, I32, I64, BOOL)");
    e.dtype = *t;
    if (shape->kind != Json::Kind::array) bad("shape is not a list of integers");
    // The element count stays below 2^62 here; the byte count is then compared with the file.
    std::uint64_t numel = 1;
    for (const Json& d : shape->elems) {
        if (d.kind != Json::Kind::integer) bad("shape is not a list of integers");
        if (d.num > (std::uint64_t(1) << 62)) bad("an extent is too large");
        if (d.num && numel > (std::uint64_t(1) << 62) / d.num) bad("the shape is too large");
        numel *= d.num;
        e.shape.push_back(std::int64_t(d.num));
    }
    if (offsets->kind != Json::Kind::array || offsets->elems.size() != 2 ||
        offsets->elems[0].kind != Json::Kind::integer ||
        offsets->elems[1].kind != Json::Kind::integer)
        bad("data_offsets is not [begin, end]");
    e.begin = offsets->elems[0].num;
    e.end = offsets->elems[1].num;
    if (e.end < e.begin) bad("data_offsets end before they begin");
    const std::uint64_t want = numel * dtype_size(e.dtype);
    if (e.end - e.begin != want)
        fail(path, ": tensor '", name, "': shape and dtype ", dtype->str, " need ", want,
             " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin);
    return e;
}

} // namespace

Contents parse(std::string_view bytes, const std::string& path) {
    if (bytes.size() < 8)
        fail(path, ": not a safetensors file: ", bytes.size(),
             " bytes, fewer than the 8 of the "
             "header size");
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    if (n > max_header)
        fail(path, ": not a safetensors file: header size ", n, " is over the ", max_header,
             "-byte limit");
    if (n > bytes.size() - 8)
        fail(path, ": truncated safetensors file: header of ", n, " bytes but only ",
             bytes.size() - 8, " follow the size");
    const std::string_view header = bytes.substr(8, n);
    const std::string_view data = bytes.substr(8 + n);
    Json doc = JsonReader(header, path).document();
    if (doc.kind != Json::Kind::object)
        fail(path, ": not a safetensors file: header is not an object");
    Contents out;
    std::vector<Entry> entries;
    for (const auto& [name, v] : doc.members) {
        if (name == "__metadata__") {
            if (v.kind != Json::Kind::object) fail(path, ": __metadata__ is not an object");
            for (const auto& [k, s] : v.members) {
                if (s.kind != Json::Kind::string)
                    fail(path, ": __metadata__ value of '", k, "' is not a string");
                out.metadata.emplace_back(k, s.str);
            }
            continue;
        }
        entries.push_back(read_entry(path, name, v));
    }
    // The tensors' bytes tile the data section exactly: no gaps, no overlaps, nothing after.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t at = 0;
    for (const Entry& e : entries) {
        if (e.begin != at)
            fail(path, ": tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end, "] ",
                 e.begin < at ? "overlap the tensor before" : "leave a gap after the tensor before",
                 " (which ends at ", at, ")");
        if (e.end > data.size())
            fail(path, ": truncated safetensors file: tensor '", e.name, "' ends at byte ", e.end,
                 " of a data section of ", data.size(), " bytes");
        at = e.end;
    }
    if (at != data.size())
        fail(path, ": not a valid safetensors file: ", data.size() - at,
             " bytes after the last tensor");
    for (const Entry& e : entries) {
        DenseArray a{e.dtype, e.shape, {}};
        a.bytes.resize(std::size_t(e.end - e.begin));
        if (!a.bytes.empty()) std::memcpy(a.bytes.data(), data.data() + e.begin, a.bytes.size());
        out.tensors.emplace_back(e.name, RaggedTensor::dense(a));
    }
    return out;
}

Contents load(const std::string& path) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) fail("cannot read checkpoint ", path, ": ", ec.message());
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open checkpoint ", path);
    std::string bytes(size, '\0');
    in.read(bytes.data(), std::streamsize(size));
    if (std::size_t(in.gcount()) != size) fail("cannot read checkpoint ", path, ": short read");
    return parse(bytes, path);
}

void save(const std::string& path, const Named& tensors, const Metadata& metadata) {
    std::string header = "{";
    if (!metadata.empty()) {
        header += "\"__metadata__\":{";
        for (std::size_t k = 0; k < metadata.size(); ++k) {
            if (k) header += ',';
            quote(header, metadata[k].first);
            header += ':';
            quote(header, metadata[k].second);
        }
        header += '}';
    }
    std::uint64_t offset = 0;
    for (std::size_t k = 0; k < tensors.size(); ++k) {
        const auto& [name, t] = tensors[k];
        if (name == "__metadata__") fail(path, ": '__metadata__' cannot name a tensor");
        for (std::size_t j = 0; j < k; ++j)
            if (tensors[j].first == name) fail(path, ": two tensors named '", name, "'");
        if (t.shape().ragged_count() > 0)
            fail("cannot save '", name, "' (", t.schema().str(), ") to ", path,
                 ": it is ragged; a checkpoint holds dense tensors (params fields)");
        if (t.shape().batched)
            fail("cannot save '", name, "' (", t.schema().str(), ") to ", path,
                 ": it has a batch axis; a checkpoint holds unbatched tensors (params fields)");
        const std::uint64_t nbytes = std::uint64_t(t.numel()) * dtype_size(t.dtype());
        if (header.size() > 1) header += ',';
        quote(header, name);
        header += ":{\"dtype\":\"";
        header += file_dtype(t.dtype());
        header += "\",\"shape\":[";
        for (int a = 0; a < t.structure().rank(); ++a)
            header += (a ? "," : "") + std::to_string(t.structure().size(0, a));
        header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
                  std::to_string(offset + nbytes) + "]}";
        offset += nbytes;
    }
    header += '}';
    while (header.size() % 8) header += ' ';

    // Write beside the target and rename, so a reader never sees half a checkpoint and a failed
    // save leaves the old file as it was.
    // Unique per process and per call, so concurrent saves to one path never share a temp file.
    static std::atomic<unsigned> serial{0};
    const std::string tmp =
        path + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(serial++);
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
    if (!f) fail("cannot write checkpoint ", path, ": ", std::strerror(errno));
    bool ok = true;
    const std::uint64_t n = header.size();
    ok &= std::fwrite(&n, 8, 1, f.get()) == 1;
    ok &= std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
    for (const auto& [_, t] : tensors) {
        const std::size_t nbytes = std::size_t(t.numel()) * dtype_size(t.dtype());
        if (nbytes) ok &= std::fwrite(t.data(), 1, nbytes, f.get()) == nbytes;
    }
    ok &= std::fflush(f.get()) == 0;
    ok &= ::fsync(fileno(f.get())) == 0;
    const int err = errno;
    ok &= std::fclose(f.release()) == 0;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int why = ok ? errno : err;
        std::remove(tmp.c_str());
        fail("cannot write checkpoint ", path, ": ", std::strerror(why));
    }
}

} // namespace rag::safetensors
