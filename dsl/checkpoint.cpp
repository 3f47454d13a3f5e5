// Checkpoints of params records (LANGUAGE 6.5): safetensors files holding one tensor per
// dotted field name (`emb`, `layers.0.wq`, `m.emb`, `t`). Everything here works on the flat
// (name, tensor) list of a record and the field list of its type, so nested groups, arrays and
// Adam state need nothing special.
#include "dsl/module.hpp"

#include "frontend/lower.hpp"
#include "runtime/error.hpp"
#include "runtime/safetensors.hpp"

#include <set>
#include <sstream>

namespace rag {

namespace {

// The metadata key naming the params type a file was saved from (informational: loading
// checks names, dtypes and shapes, not this).
constexpr const char* type_key = "rag.params";

// Every difference between the tensors found and the fields expected, one line each; empty
// when they agree.
std::vector<std::string> differences(const std::vector<std::pair<std::string, RaggedTensor>>& found,
                                     const std::vector<std::pair<std::string, Schema>>& want,
                                     std::string_view type, const char* where) {
    std::vector<std::string> out;
    std::set<std::string> expected;
    for (const auto& [name, schema] : want) {
        expected.insert(name);
        const RaggedTensor* t = nullptr;
        for (const auto& [n, f] : found)
            if (n == name) t = &f;
        if (!t)
            out.push_back("missing '" + name + "' (" + std::string(type) + " expects " +
                          schema.str() + ")");
        else if (!(t->schema() == schema))
            out.push_back("'" + name + "' is " + t->schema().str() + " " + where + ", " +
                          std::string(type) + " expects " + schema.str());
    }
    for (const auto& [n, f] : found)
        if (!expected.count(n))
            out.push_back("extra '" + n + "' (" + f.schema().str() + "), not a field of " +
                          std::string(type));
    return out;
}

[[noreturn]] void mismatch(const std::string& head, const std::vector<std::string>& lines) {
    std::ostringstream os;
    os << head;
    // A wrong file for the type differs everywhere; the first lines say enough.
    constexpr std::size_t shown = 12;
    for (std::size_t k = 0; k < lines.size() && k < shown; ++k) os << "\n  " << lines[k];
    if (lines.size() > shown) os << "\n  ... and " << lines.size() - shown << " more";
    throw Error(os.str());
}

} // namespace

void save_checkpoint(const Value& params, const std::string& path) {
    if (params.kind != Value::Kind::record)
        fail("cannot save a ", params.type_str(), " to ", path,
             ": a checkpoint holds a params record");
    safetensors::save(path, params.fields, {{type_key, params.record}});
}

// The record type's tensors with their dotted names (frontend: nested groups, arrays, Adam).
std::vector<std::pair<std::string, Schema>> Module::param_fields(std::string_view type) const {
    return program().record_type(type).leaves();
}

void Module::save_params(const Value& params, const std::string& path) const {
    if (params.kind != Value::Kind::record)
        fail("cannot save a ", params.type_str(), " to ", path,
             ": a checkpoint holds a params record");
    auto diff =
        differences(params.fields, param_fields(params.record), params.record, "in the value");
    if (!diff.empty())
        mismatch("cannot save to " + path + ": the value does not match " + params.record + ":",
                 diff);
    save_checkpoint(params, path);
}

Value Module::load_params(std::string_view given, const std::string& path) const {
    const std::string type = frontend::Program::canonical(given); // `Linear[4,8]`: one spelling
    const auto want = param_fields(type);
    safetensors::Contents file = safetensors::load(path);
    auto diff = differences(file.tensors, want, type, "in the file");
    if (!diff.empty()) {
        std::string head = path + " does not hold " + std::string(type) + " params";
        for (const auto& [k, v] : file.metadata)
            if (k == type_key && v != type) head += " (it was saved from " + v + ")";
        mismatch(head + ":", diff);
    }
    Value v;
    v.kind = Value::Kind::record;
    v.record = type;
    for (const auto& [name, _] : want)
        for (auto& [n, t] : file.tensors)
            if (n == name) v.fields.emplace_back(name, std::move(t));
    return v;
}

} // namespace rag
