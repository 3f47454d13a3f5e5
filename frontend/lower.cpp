#include "frontend/lowerer.hpp"

#include "frontend/padded.hpp"
#include "frontend/parser.hpp"
#include "frontend/stdlib.hpp"
#include "frontend/validate.hpp"
#include "ir/autodiff.hpp"
#include "ir/ops/derived_names.hpp"
#include "ir/ops/index_plan.hpp"
#include "runtime/error.hpp"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace rag::frontend {

// ---- types -------------------------------------------------------------------------------

std::string VType::str() const {
    switch (kind) {
    case Kind::tensor:
        return schema.str();
    case Kind::record:
        return record;
    case Kind::tuple: {
        std::string s = "(";
        for (std::size_t k = 0; k < elems.size(); ++k) s += (k ? ", " : "") + elems[k].str();
        return s + (elems.size() == 1 ? ",)" : ")");
    }
    }
    return "?";
}

std::vector<Schema> VType::flatten() const {
    if (kind == Kind::tensor) return {schema};
    std::vector<Schema> out;
    auto add = [&](const VType& t) {
        auto f = t.flatten();
        out.insert(out.end(), f.begin(), f.end());
    };
    for (const auto& [_, f] : fields) add(f);
    for (const auto& e : elems) add(e);
    return out;
}

std::vector<std::pair<std::string, Schema>> VType::leaves() const {
    std::vector<std::pair<std::string, Schema>> out;
    std::function<void(const VType&, const std::string&)> walk = [&](const VType& t,
                                                                     const std::string& at) {
        auto child = [&](const std::string& n) { return at.empty() ? n : at + "." + n; };
        if (t.kind == Kind::tensor) out.push_back({at, t.schema});
        for (const auto& [n, f] : t.fields) walk(f, child(n));
        for (std::size_t k = 0; k < t.elems.size(); ++k) walk(t.elems[k], child(std::to_string(k)));
    };
    walk(*this, "");
    return out;
}

namespace {

// A canonical record name split at its last brackets: `Layer[4]` -> ("Layer", {"4"});
// `Adam[Model]` -> ("Adam", {"Model"}); `Linear[4, 8]` -> ("Linear", {"4", "8"});
// `Linear[4, 8][2]` -> ("Linear[4, 8]", {"2"}); `Adam[Linear[4, 8]]` -> ("Adam",
// {"Linear[4, 8]"}); `Model` -> nullopt.
std::optional<std::pair<std::string, std::vector<std::string>>>
split_record_name(std::string_view name) {
    if (name.empty() || name.back() != ']') return std::nullopt;
    int depth = 0;
    std::size_t open = std::string_view::npos;
    std::vector<std::size_t> commas;
    for (std::size_t k = name.size(); k-- > 0;) {
        if (name[k] == ']') ++depth;
        if (name[k] == '[' && --depth == 0) {
            open = k;
            break;
        }
        if (name[k] == ',' && depth == 1) commas.push_back(k);
    }
    if (open == std::string_view::npos || open == 0) return std::nullopt;
    std::vector<std::string> args;
    std::size_t begin = open + 1;
    for (auto c = commas.rbegin(); c != commas.rend(); ++c) {
        args.push_back(Program::canonical(name.substr(begin, *c - begin)));
        begin = *c + 1;
    }
    args.push_back(Program::canonical(name.substr(begin, name.size() - 1 - begin)));
    return std::pair{std::string(name.substr(0, open)), std::move(args)};
}

bool parse_int(const std::string& s, std::int64_t& v) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && end == s.data() + s.size();
}

std::string dim_str(const ast::DimExpr& d) {
    switch (d.kind) {
    case ast::DimExpr::Kind::fixed:
        return std::to_string(d.extent);
    case ast::DimExpr::Kind::symbolic:
        return d.name;
    case ast::DimExpr::Kind::ragged:
        return "~" + d.name;
    }
    return "?";
}

std::string type_str(const ast::TypeExpr& t) {
    switch (t.kind) {
    case ast::TypeExpr::Kind::tensor: {
        std::string s = t.dtype + "[";
        for (std::size_t k = 0; k < t.dims.size(); ++k) s += (k ? ", " : "") + dim_str(t.dims[k]);
        return s + "]" + (t.array ? "[" + dim_str(*t.array) + "]" : "");
    }
    case ast::TypeExpr::Kind::named:
        return t.name;
    case ast::TypeExpr::Kind::function:
        return "fn";
    case ast::TypeExpr::Kind::tuple: {
        std::string s = "(";
        for (std::size_t k = 0; k < t.elems.size(); ++k)
            s += (k ? ", " : "") + type_str(t.elems[k]);
        return s + ")";
    }
    }
    return "?";
}

VType declared_vtype(const Program& prog, const ast::TypeExpr& t,
                     const std::set<std::string>& batch) {
    if (auto r = prog.record_name(t)) return prog.record_type(*r);
    if (prog.sized_group(t))
        fail(type_str(t), " has no concrete sizes here; call the function instead (sizes bind "
                          "to the arguments' params types)");
    switch (t.kind) {
    case ast::TypeExpr::Kind::named:
        fail("type parameter ", t.name,
             " has no concrete type here; call the function instead (it binds to the argument's "
             "type)");
    case ast::TypeExpr::Kind::function:
        fail("a function parameter (fn) has no value here; call the function from another one, "
             "passing a fn by name");
    case ast::TypeExpr::Kind::tuple: {
        VType v{VType::Kind::tuple, {}, {}, {}, {}};
        for (const auto& e : t.elems) v.elems.push_back(declared_vtype(prog, e, batch));
        return v;
    }
    case ast::TypeExpr::Kind::tensor:
        break;
    }
    auto dt = parse_dtype(t.dtype);
    if (!dt)
        fail("type parameter ", t.dtype,
             " has no concrete type here; call the function instead (dtypes are f16 bf16 f32 "
             "f64 i32 i64 bool)");
    Shape s;
    s.batched = is_batched(t, batch);
    if (s.batched && t.dims[0].kind != ast::DimExpr::Kind::symbolic)
        fail("the first dimension of a ragged type is the batch axis and must be a name, got ",
             dim_str(t.dims[0]));
    for (std::size_t k = s.batched ? 1 : 0; k < t.dims.size(); ++k) {
        const auto& d = t.dims[k];
        if (d.kind == ast::DimExpr::Kind::fixed)
            s.axes.push_back(Axis::fixed_of(d.extent));
        else if (d.kind == ast::DimExpr::Kind::symbolic)
            s.axes.push_back(Axis::symbolic_of(d.name));
        else
            s.axes.push_back(Axis::ragged_of(d.name));
    }
    return VType::tensor({*dt, std::move(s)});
}

// `actual` with the ragged axes renamed as `decl` declares them (they already match).
VType rename(const VType& actual, const ast::TypeExpr& decl) {
    VType out = actual;
    if (actual.kind == VType::Kind::tuple)
        for (std::size_t k = 0; k < out.elems.size(); ++k)
            out.elems[k] = rename(actual.elems[k], decl.elems[k]);
    if (actual.kind != VType::Kind::tensor) return out;
    const std::size_t skip = actual.schema.shape.batched ? 1 : 0;
    for (std::size_t a = 0; a < out.schema.shape.axes.size(); ++a)
        if (out.schema.shape.axes[a].is_ragged())
            out.schema.shape.axes[a].name = decl.dims[a + skip].name;
    return out;
}

} // namespace

bool has_ragged(const ast::TypeExpr& t) {
    for (const auto& d : t.dims)
        if (d.kind == ast::DimExpr::Kind::ragged) return true;
    return false;
}

bool is_batched(const ast::TypeExpr& t, const std::set<std::string>& batch) {
    return has_ragged(t) || (!t.dims.empty() && t.dims[0].kind == ast::DimExpr::Kind::symbolic &&
                             batch.count(t.dims[0].name));
}

std::set<std::string> batch_names(const ast::FnDecl& fn) {
    std::set<std::string> out;
    std::function<void(const ast::TypeExpr&)> visit = [&](const ast::TypeExpr& t) {
        if (t.kind == ast::TypeExpr::Kind::tuple)
            for (const auto& e : t.elems) visit(e);
        if (t.kind == ast::TypeExpr::Kind::tensor && has_ragged(t) && !t.dims.empty() &&
            t.dims[0].kind == ast::DimExpr::Kind::symbolic)
            out.insert(t.dims[0].name);
    };
    for (const auto& p : fn.params) visit(p.type);
    if (fn.result) visit(*fn.result);
    return out;
}

namespace {

// Binds one declared size (`I` of `Linear[I, O]`, or an array extent) to an actual extent;
// false (with the name in b.conflict) if it was bound to another extent.
bool bind_size(const ast::DimExpr& d, std::int64_t v, Bindings& b) {
    if (d.kind == ast::DimExpr::Kind::fixed) return d.extent == v;
    if (d.kind != ast::DimExpr::Kind::symbolic) return false;
    auto [it, fresh] = b.dims.emplace(d.name, Axis::fixed_of(v));
    if (fresh || it->second == Axis::fixed_of(v)) return true;
    b.conflict = d.name;
    return false;
}

// `p: Linear[I, O]` (or `Linear[I, O][L]`) against an actual record type such as
// `Linear[384, 128]`: binds I and O to the actual sizes.
bool match_sizes(const VType& actual, const ast::TypeExpr& decl, Bindings& b) {
    if (actual.kind != VType::Kind::record) return false;
    std::string name = actual.record;
    if (decl.array) {
        auto outer = split_record_name(name);
        if (!outer || outer->second.size() != 1) return false;
        std::int64_t n = 0;
        if (!parse_int(outer->second[0], n) || !bind_size(*decl.array, n, b)) return false;
        name = outer->first;
    }
    auto parts = split_record_name(name);
    if (!parts || parts->first != decl.dtype || parts->second.size() != decl.dims.size())
        return false;
    for (std::size_t k = 0; k < decl.dims.size(); ++k) {
        std::int64_t v = 0;
        if (!parse_int(parts->second[k], v) || !bind_size(decl.dims[k], v, b)) return false;
    }
    return true;
}

std::string mismatch_sizes(Bindings& b, const std::string& mismatch) {
    if (b.conflict.empty()) return mismatch;
    auto it = b.dims.find(b.conflict);
    std::string was =
        it->second.kind == AxisKind::fixed ? std::to_string(it->second.extent) : it->second.name;
    std::string msg =
        mismatch + " (" + b.conflict + " was bound to " + was + " by an earlier argument)";
    b.conflict.clear();
    return msg;
}

} // namespace

std::string match_type(const Program& prog, const VType& actual, const ast::TypeExpr& decl,
                       const std::set<std::string>& batch, Bindings& b) {
    const std::string mismatch = "expected " + type_str(decl) + ", got " + actual.str();
    if (auto r = prog.record_name(decl))
        return actual.kind == VType::Kind::record && actual.record == *r ? "" : mismatch;
    if (prog.sized_group(decl))
        return match_sizes(actual, decl, b) ? "" : mismatch_sizes(b, mismatch);
    if (decl.kind == ast::TypeExpr::Kind::tensor && decl.dtype == "Adam" && decl.dims.size() == 1 &&
        !decl.array && decl.dims[0].kind == ast::DimExpr::Kind::symbolic) {
        // `Adam[P]` with P a type parameter: the state of whatever params type P stands for.
        const std::string& r = actual.record;
        if (actual.kind != VType::Kind::record || r.rfind("Adam[", 0) != 0) return mismatch;
        const std::string& p = decl.dims[0].name;
        const VType params = prog.record_type(r.substr(5, r.size() - 6));
        auto [it, fresh] = b.types.emplace(p, params);
        if (fresh || it->second == params) return "";
        return mismatch + " (" + p + " is " + it->second.str() + " here)";
    }
    switch (decl.kind) {
    case ast::TypeExpr::Kind::named: { // a type parameter (validate() rejects unknown names)
        auto [it, fresh] = b.types.emplace(decl.name, actual);
        if (fresh || it->second == actual) return "";
        return mismatch + " (" + decl.name + " is " + it->second.str() + " here)";
    }
    case ast::TypeExpr::Kind::function:
        return mismatch; // call_fn binds functions before matching
    case ast::TypeExpr::Kind::tuple:
        if (actual.kind != VType::Kind::tuple || actual.elems.size() != decl.elems.size())
            return mismatch;
        for (std::size_t k = 0; k < decl.elems.size(); ++k) {
            auto m = match_type(prog, actual.elems[k], decl.elems[k], batch, b);
            if (!m.empty()) return m;
        }
        return "";
    case ast::TypeExpr::Kind::tensor:
        break;
    }
    if (actual.kind != VType::Kind::tensor) return mismatch;
    const Schema& s = actual.schema;
    if (auto dt = parse_dtype(decl.dtype)) {
        if (*dt != s.dtype) return mismatch;
    } else if (auto it = b.dtypes.find(decl.dtype); it != b.dtypes.end()) {
        if (it->second != s.dtype)
            return mismatch + " (" + decl.dtype + " is " + std::string(dtype_name(it->second)) +
                   " here)";
    } else {
        b.dtypes[decl.dtype] = s.dtype;
    }
    const bool batched = is_batched(decl, batch);
    const std::size_t skip = batched ? 1 : 0;
    if (batched != s.shape.batched ||
        decl.dims.size() - std::min(decl.dims.size(), skip) != s.shape.axes.size() ||
        (batched && decl.dims.empty()))
        return mismatch;
    for (std::size_t a = 0; a < s.shape.axes.size(); ++a) {
        const ast::DimExpr& d = decl.dims[a + skip];
        const Axis& x = s.shape.axes[a];
        switch (d.kind) {
        case ast::DimExpr::Kind::fixed:
            if (x.kind != AxisKind::fixed || x.extent != d.extent) return mismatch;
            break;
        case ast::DimExpr::Kind::symbolic:
        case ast::DimExpr::Kind::ragged: {
            const bool want_ragged = d.kind == ast::DimExpr::Kind::ragged;
            if (x.is_ragged() != want_ragged) return mismatch;
            auto it = b.dims.find(d.name);
            if (want_ragged && b.relabel_ragged) break;
            if (it == b.dims.end()) {
                b.dims[d.name] = x;
            } else if (!(it->second == x)) {
                const std::string was = it->second.kind == AxisKind::fixed
                                            ? std::to_string(it->second.extent)
                                            : it->second.name;
                // "N was bound to N" would say nothing the types do not (a result's check).
                if (was == d.name) return mismatch;
                return mismatch + " (" + d.name + " was bound to " + was +
                       " by an earlier argument)";
            }
        }
        }
    }
    return "";
}

// ---- programs -----------------------------------------------------------------------------

std::pair<const ast::FnDecl*, const SourceFile*> Program::find_fn(std::string_view name) const {
    for (const auto& u : units)
        for (const auto& f : u.module.fns)
            if (f.name == name) return {&f, u.src.get()};
    return {nullptr, nullptr};
}

std::pair<const ast::FnDecl*, const SourceFile*> Program::find_fn(std::string_view name,
                                                                  const SourceFile* from) const {
    bool lib = false;
    for (const auto& u : units) lib = lib || (u.stdlib && u.src.get() == from);
    if (lib)
        for (const auto& u : units)
            if (u.stdlib)
                for (const auto& f : u.module.fns)
                    if (f.name == name) return {&f, u.src.get()};
    return find_fn(name);
}

const ast::ParamsDecl* Program::find_params(std::string_view name) const {
    for (const auto& u : units)
        for (const auto& p : u.module.params)
            if (p.name == name) return &p;
    return nullptr;
}

std::vector<std::string> Program::fn_names() const {
    std::vector<std::string> out;
    if (!units.empty())
        for (const auto& f : units[0].module.fns) out.push_back(f.name);
    return out;
}

VType Program::params_type(const ast::ParamsDecl& p) const {
    return record_type(p.name);
}

std::optional<std::string> Program::record_name(const ast::TypeExpr& t) const {
    if (t.kind == ast::TypeExpr::Kind::named)
        return find_params(t.name) ? std::optional(t.name) : std::nullopt;
    if (t.kind != ast::TypeExpr::Kind::tensor || parse_dtype(t.dtype)) return std::nullopt;
    const ast::ParamsDecl* g = find_params(t.dtype);
    if (g && !g->sizes.empty()) {
        // `Linear[384, 128]`, `Linear[384, 128][4]`; with a size name it is a pattern that
        // signatures match (sized_group), not a type.
        std::string n = t.dtype + "[";
        for (std::size_t k = 0; k < t.dims.size(); ++k) {
            if (t.dims[k].kind != ast::DimExpr::Kind::fixed) return std::nullopt;
            n += (k ? ", " : "") + std::to_string(t.dims[k].extent);
        }
        n += "]";
        if (!t.array) return n;
        if (t.array->kind != ast::DimExpr::Kind::fixed) return std::nullopt;
        return n + "[" + std::to_string(t.array->extent) + "]";
    }
    if (t.dims.size() != 1 || t.array) return std::nullopt;
    const ast::DimExpr& d = t.dims[0];
    if (t.dtype == "Adam" && d.kind == ast::DimExpr::Kind::symbolic && find_params(d.name))
        return "Adam[" + d.name + "]";
    if (g && d.kind == ast::DimExpr::Kind::fixed)
        return t.dtype + "[" + std::to_string(d.extent) + "]";
    return std::nullopt;
}

const ast::ParamsDecl* Program::sized_group(const ast::TypeExpr& t) const {
    if (t.kind != ast::TypeExpr::Kind::tensor || parse_dtype(t.dtype) || record_name(t))
        return nullptr;
    const ast::ParamsDecl* g = find_params(t.dtype);
    return g && !g->sizes.empty() ? g : nullptr;
}

std::string Program::canonical(std::string_view name) {
    std::string out;
    for (char c : name) {
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
        out += c;
        if (c == ',') out += ' ';
    }
    return out;
}

namespace {

constexpr std::int64_t kMaxArray = 4096;           // elements of one params array
constexpr std::size_t kMaxRecordTensors = 1 << 20; // tensors in one record type

std::int64_t array_extent(std::string_view name, const std::vector<std::string>& args) {
    std::int64_t v = 0;
    if (args.size() != 1 || !parse_int(args[0], v)) fail("unknown type '", name, "'");
    if (v < 1 || v > kMaxArray)
        fail("params array ", name, ": the extent must be between 1 and ", kMaxArray);
    return v;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
}

// `t` with the size names of a sized group replaced by their values.
ast::TypeExpr substitute(ast::TypeExpr t, const std::map<std::string, std::int64_t>& sizes) {
    auto fix = [&](ast::DimExpr& d) {
        if (d.kind != ast::DimExpr::Kind::symbolic) return;
        if (auto it = sizes.find(d.name); it != sizes.end())
            d.kind = ast::DimExpr::Kind::fixed, d.extent = it->second;
    };
    for (auto& d : t.dims) fix(d);
    if (t.array) fix(*t.array);
    for (auto& e : t.elems) e = substitute(e, sizes);
    return t;
}

// The group a record name instantiates with its sizes (`Linear[384, 128]` -> Linear, {I: 384,
// O: 128}; `Model` -> Model, {}); nullopt for arrays and Adam state. rag::Error for a wrong
// number of sizes or a size out of range.
struct Instance {
    const ast::ParamsDecl* decl;
    std::map<std::string, std::int64_t> sizes;
};
constexpr std::int64_t kMaxSize = std::int64_t(1) << 32;
std::optional<Instance> group_instance(const Program& prog, std::string_view name) {
    auto parts = split_record_name(name);
    if (!parts) {
        const ast::ParamsDecl* p = prog.find_params(name);
        if (!p) fail("no params group named '", name, "'");
        if (!p->sizes.empty())
            fail("params ", name, " needs its sizes: write ", name, "[", join(p->sizes), "]");
        return Instance{p, {}};
    }
    const auto& [head, args] = *parts;
    const ast::ParamsDecl* p = head == "Adam" ? nullptr : prog.find_params(head);
    if (!p) return std::nullopt;
    if (p->sizes.empty()) {
        if (args.size() != 1)
            fail("params ", head, " has no sizes: ", head, "[n] is an array of n, got '", name,
                 "'");
        return std::nullopt;
    }
    if (args.size() != p->sizes.size())
        fail("params ", head, " takes ", p->sizes.size(), " size", p->sizes.size() == 1 ? "" : "s",
             " [", join(p->sizes), "], got ", args.size(), " in '", name, "'");
    Instance out{p, {}};
    for (std::size_t k = 0; k < args.size(); ++k) {
        std::int64_t v = 0;
        if (!parse_int(args[k], v) || v < 1 || v > kMaxSize)
            fail("params ", name, ": size ", p->sizes[k],
                 " must be an integer from 1 to 2^32, got ", args[k]);
        out.sizes[p->sizes[k]] = v;
    }
    return out;
}

VType record_type_at(const Program& prog, std::string_view name, int depth, std::size_t& tensors) {
    if (depth > 32)
        fail("params groups nest too deeply at '", name, "' (does a group contain itself?)");
    auto count = [&](std::size_t n) {
        tensors += n;
        if (tensors > kMaxRecordTensors)
            fail("params type ", name, " has more than ", kMaxRecordTensors, " tensors");
    };
    VType v{VType::Kind::record, {}, std::string(name), {}, {}};
    auto inst = group_instance(prog, name);
    if (!inst) {
        const auto parts = split_record_name(name);
        const auto& [head, args] = *parts;
        if (head == "Adam") {
            if (args.size() != 1) fail("unknown type '", name, "'");
            VType p = record_type_at(prog, args[0], depth + 1, tensors);
            count(p.flatten().size() + 1);
            v.fields = {{"m", p}, {"v", p}, {"t", VType::tensor({DType::i64, Shape{false, {}}})}};
            return v;
        }
        const std::int64_t n = array_extent(name, args);
        VType elem = record_type_at(prog, head, depth + 1, tensors);
        count(elem.flatten().size() * std::size_t(n - 1));
        for (std::int64_t k = 0; k < n; ++k) v.fields.push_back({std::to_string(k), elem});
        return v;
    }
    const ast::ParamsDecl* p = inst->decl;
    for (const auto& field : p->fields) {
        const ast::TypeExpr ft = substitute(field.type, inst->sizes);
        const auto& f = field;
        if (auto r = prog.record_name(ft)) {
            v.fields.push_back({f.name, record_type_at(prog, *r, depth + 1, tensors)});
            continue;
        }
        if (prog.sized_group(ft))
            fail("params field ", p->name, ".", f.name, ": ", type_str(ft),
                 " needs integer sizes here",
                 p->sizes.empty() ? ""
                                  : " (the sizes of " + p->name + " are " + join(p->sizes) + ")");
        if (ft.kind != ast::TypeExpr::Kind::tensor)
            fail("params field ", p->name, ".", f.name, ": ",
                 ft.kind == ast::TypeExpr::Kind::named
                     ? "unknown type '" + ft.name + "'"
                     : std::string("must be a tensor, a params group or an array of one"));
        if (!parse_dtype(ft.dtype))
            fail("params field ", p->name, ".", f.name, ": unknown dtype '", ft.dtype,
                 "' (dtypes are f16 bf16 f32 f64 i32 i64 bool; Name[n] is an array of params "
                 "group Name)");
        VType t = declared_vtype(prog, ft, {});
        std::int64_t elems = 1;
        for (const auto& a : t.schema.shape.axes) {
            if (a.kind != AxisKind::fixed)
                fail("params field ", p->name, ".", f.name, " must have static dimensions, got ",
                     type_str(ft),
                     p->sizes.empty() ? ""
                                      : " (sizes of " + p->name + " are " + join(p->sizes) + ")");
            if (a.extent > (std::int64_t(1) << 32) / std::max<std::int64_t>(elems, 1))
                fail("params field ", p->name, ".", f.name, " is too large to allocate (",
                     type_str(ft), ")");
            elems *= std::max<std::int64_t>(a.extent, 1);
        }
        count(1);
        v.fields.push_back({f.name, t});
    }
    return v;
}

void leaves_at(const Program& prog, std::string_view name, const std::string& prefix, bool zeros,
               std::vector<Program::Leaf>& out) {
    auto inst = group_instance(prog, name);
    if (!inst) {
        const auto parts = split_record_name(name);
        const auto& [head, args] = *parts;
        if (head == "Adam") {
            leaves_at(prog, args[0], prefix + "m.", true, out);
            leaves_at(prog, args[0], prefix + "v.", true, out);
            out.push_back({prefix + "t", {DType::i64, Shape{false, {}}}, nullptr});
            return;
        }
        const std::int64_t n = array_extent(name, args);
        for (std::int64_t k = 0; k < n; ++k)
            leaves_at(prog, head, prefix + std::to_string(k) + ".", zeros, out);
        return;
    }
    for (const auto& f : inst->decl->fields) {
        const ast::TypeExpr ft = substitute(f.type, inst->sizes);
        if (auto r = prog.record_name(ft)) {
            leaves_at(prog, *r, prefix + f.name + ".", zeros, out);
            continue;
        }
        out.push_back({prefix + f.name, declared_vtype(prog, ft, {}).schema, zeros ? nullptr : &f});
    }
}

} // namespace

VType Program::record_type(std::string_view name) const {
    std::size_t tensors = 0;
    return record_type_at(*this, canonical(name), 0, tensors);
}

std::vector<Program::Leaf> Program::record_leaves(std::string_view name) const {
    record_type(name); // validates
    std::vector<Leaf> out;
    leaves_at(*this, canonical(name), "", false, out);
    return out;
}

namespace {

// `~N[:-1]` in a type names the axis index's type rule makes: the canonical derived name.
void fold_slices(ast::TypeExpr& t, const SourceFile* src, Diagnostics& diags) {
    for (auto& e : t.elems) fold_slices(e, src, diags);
    for (auto& d : t.dims) {
        for (const auto& sl : d.slices) {
            if (sl.grow) {
                d.name = grow_axis_name(d.name, *sl.grow);
                continue;
            }
            if (sl.scale) {
                if (*sl.scale < 1) {
                    diags.error(d.span, "a scale must be a positive integer", src);
                    break;
                }
                d.name = scale_axis_name(d.name, *sl.scale);
                continue;
            }
            if (sl.step < 1) {
                diags.error(
                    d.span,
                    "a slice step must be a positive integer, got " + std::to_string(sl.step), src);
                break;
            }
            d.name = derived_axis_name(d.name, AxisSelect{true, sl.lo, sl.hi, sl.step, 0});
        }
        d.slices.clear();
    }
}

void load_unit(Program& prog, std::shared_ptr<SourceFile> src, Diagnostics& diags, int depth) {
    for (const auto& u : prog.units)
        if (u.src->path() == src->path()) return; // imported twice (or a cycle)
    Diagnostics local(*src);
    ast::Module m = parse(*src, local);
    for (auto& p : m.params)
        for (auto& f : p.fields) fold_slices(f.type, src.get(), local);
    for (auto& f : m.fns) {
        for (auto& p : f.params) fold_slices(p.type, src.get(), local);
        if (f.result) fold_slices(*f.result, src.get(), local);
    }
    for (const auto& d : local.items()) diags.error(d.span, d.message, src.get());
    prog.units.push_back({src, m});
    namespace fs = std::filesystem;
    for (const auto& imp : m.imports) {
        fs::path path = fs::path(src->path()).parent_path() / imp.path;
        std::string text;
        try {
            text = read_source(path.string());
        } catch (const Error& e) {
            diags.error(imp.span, "cannot import '" + imp.path + "': " + e.what(), src.get());
            continue;
        }
        if (depth > 32) {
            diags.error(imp.span, "imports nest more than 32 deep", src.get());
            continue;
        }
        load_unit(prog, std::make_shared<SourceFile>(path.string(), std::move(text)), diags,
                  depth + 1);
    }
}

LV make_inputs(ir::Builder& b, const VType& t, const std::string& label) {
    switch (t.kind) {
    case VType::Kind::tensor:
        return LV::tensor(b.input(t.schema, label));
    case VType::Kind::record: {
        LV r;
        r.kind = LV::Kind::record;
        r.name = t.record;
        for (const auto& [name, ft] : t.fields)
            r.fields.push_back({name, make_inputs(b, ft, label + "." + name)});
        return r;
    }
    case VType::Kind::tuple: {
        LV r;
        r.kind = LV::Kind::tuple;
        for (std::size_t k = 0; k < t.elems.size(); ++k)
            r.elems.push_back(make_inputs(b, t.elems[k], label + "." + std::to_string(k)));
        return r;
    }
    }
    return LV::error();
}

LV unflatten(const VType& t, const std::vector<int>& ids, std::size_t& pos) {
    if (t.kind == VType::Kind::tensor) return LV::tensor(ids.at(pos++));
    LV r;
    r.kind = t.kind == VType::Kind::record ? LV::Kind::record : LV::Kind::tuple;
    r.name = t.record;
    for (const auto& [name, ft] : t.fields) r.fields.push_back({name, unflatten(ft, ids, pos)});
    for (const auto& e : t.elems) r.elems.push_back(unflatten(e, ids, pos));
    return r;
}

} // namespace

std::string read_source(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto status = fs::status(path, ec);
    if (ec || !fs::exists(status)) fail("no file ", path);
    if (fs::is_directory(status)) fail(path, " is a directory, not a .rag file");
    if (!fs::is_regular_file(status)) fail(path, " is not a regular file");
    const auto size = fs::file_size(path, ec);
    if (ec) fail("cannot read ", path);
    if (size > kMaxSourceBytes)
        fail(path, " has ", size, " bytes; source files are at most ", kMaxSourceBytes);
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open ", path);
    std::string text(size, '\0');
    in.read(text.data(), std::streamsize(size));
    if (std::size_t(in.gcount()) != size) fail("cannot read ", path);
    return text;
}

Program load_program(std::shared_ptr<SourceFile> src, Diagnostics& diags, bool with_stdlib) {
    Program prog;
    load_unit(prog, std::move(src), diags, 0);
    if (with_stdlib)
        for (const auto& u : stdlib_units()) prog.units.push_back(u);
    return prog;
}

// ---- the lowerer --------------------------------------------------------------------------

void Lowerer::error(Span s, const std::string& msg) {
    diags_.error(s, msg, file_);
    throw Abandon{};
}

// Inlining repeats a callee's nodes at every distinct call; past this the program is refused
// rather than exhausting memory (each callee is inlined once per distinct arguments).
constexpr std::size_t kMaxNodes = 2'000'000;

int Lowerer::op(Span at, std::string_view name, std::vector<int> args, Attrs attrs) {
    if (b_.function().nodes.size() > kMaxNodes)
        error(at, "the program is too large: over " + std::to_string(kMaxNodes) +
                      " operations after inlining every call (deeply nested calls of calls?)");
    try {
        if (padder_) return padder_->op(name, std::move(args), attrs);
        return b_.op(name, std::move(args), std::move(attrs));
    } catch (const Error& e) {
        error(at, e.what());
    }
}

namespace {
// The first function value in v (itself, or inside a tuple or record), if any.
const LV* find_function(const LV& v) {
    if (v.kind == LV::Kind::function) return &v;
    for (const auto& [_, f] : v.fields)
        if (const LV* x = find_function(f)) return x;
    for (const auto& e : v.elems)
        if (const LV* x = find_function(e)) return x;
    return nullptr;
}
} // namespace

void Lowerer::no_function(const LV& v, Span at, const std::string& where) {
    if (const LV* f = find_function(v)) {
        const std::string name =
            f->grad_wrt < 0 ? f->name
                            : "grad(" + f->name + ", wrt=" + std::to_string(f->grad_wrt) + ")";
        error(at, "'" + name + "' is a function, not a value: call it, " + name +
                      "(...), or pass it to a parameter of function type (" + where + ")");
    }
}

int Lowerer::tensor_of(const LV& v, Span at, DType like) {
    if (v.kind == LV::Kind::tensor) return v.id;
    if (v.kind == LV::Kind::number) return b_.constant(v.num, like);
    if (v.kind == LV::Kind::error) throw Abandon{};
    no_function(v, at, "a tensor is expected here");
    error(at, "expected a tensor, got " + type_of(v).str());
}

int Lowerer::tensor(const ast::Expr& e) {
    return tensor_of(expr(e), e.span, DType::f32);
}

double Lowerer::constant(const ast::Expr& e, const char* what) {
    LV v = expr(e);
    if (v.kind != LV::Kind::number) error(e.span, std::string(what) + " must be a constant number");
    return v.num;
}

VType Lowerer::type_of(const LV& v) const {
    switch (v.kind) {
    case LV::Kind::tensor:
        return VType::tensor(b_.function().type(v.id));
    case LV::Kind::number:
        return VType::tensor({DType::f32, Shape{false, {}}});
    case LV::Kind::record: {
        VType t{VType::Kind::record, {}, v.name, {}, {}};
        for (const auto& [n, f] : v.fields) t.fields.push_back({n, type_of(f)});
        return t;
    }
    case LV::Kind::tuple: {
        VType t{VType::Kind::tuple, {}, {}, {}, {}};
        for (const auto& e : v.elems) t.elems.push_back(type_of(e));
        return t;
    }
    case LV::Kind::function:
    case LV::Kind::error:
        break;
    }
    return VType::tensor({});
}

LV Lowerer::materialise(const LV& v) {
    if (v.kind == LV::Kind::number) return LV::tensor(b_.constant(v.num, DType::f32));
    LV out = v;
    for (auto& [_, f] : out.fields) f = materialise(f);
    for (auto& e : out.elems) e = materialise(e);
    return out;
}

std::vector<int> Lowerer::flatten(const LV& v) const {
    if (v.kind == LV::Kind::tensor) return {v.id};
    std::vector<int> out;
    for (const auto& [_, f] : v.fields) {
        auto x = flatten(f);
        out.insert(out.end(), x.begin(), x.end());
    }
    for (const auto& e : v.elems) {
        auto x = flatten(e);
        out.insert(out.end(), x.begin(), x.end());
    }
    return out;
}

LV* Lowerer::lookup(const std::string& name) {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s)
        if (auto it = s->find(name); it != s->end()) return &it->second;
    return nullptr;
}

void Lowerer::bind(const ast::Pattern& p, const LV& v) {
    if (!p.is_tuple()) {
        scopes_.back()[p.name] = v;
        return;
    }
    if (v.kind == LV::Kind::error) {
        for (const auto& e : p.elems) bind(e, v);
        return;
    }
    if (v.kind != LV::Kind::tuple || v.elems.size() != p.elems.size()) {
        for (const auto& e : p.elems) bind(e, LV::error());
        error(p.span, "cannot destructure " + type_of(v).str() + " into " +
                          std::to_string(p.elems.size()) + " names");
    }
    for (std::size_t k = 0; k < p.elems.size(); ++k) bind(p.elems[k], v.elems[k]);
}

LV Lowerer::call_fn(const ast::FnDecl& fn, const SourceFile* file, const std::vector<LV>& args,
                    Span at) {
    if (depth_ > 48)
        error(at, "calls nested too deeply at " + fn.name + " (recursion is not supported)");
    if (args.size() != fn.params.size())
        error(at, fn.name + " takes " + std::to_string(fn.params.size()) + " argument" +
                      (fn.params.size() == 1 ? "" : "s") + ", got " + std::to_string(args.size()));
    const auto batch = batch_names(fn);
    Bindings bound;
    Lowerer inner(prog_, diags_, b_, depth_ + 1);
    inner.padder_ = padder_;
    inner.file_ = file;
    inner.memo_ = memo_;
    std::string key;
    for (std::size_t k = 0; k < args.size(); ++k) {
        const ast::Param& p = fn.params[k];
        LV a = args[k];
        if (a.kind == LV::Kind::error) throw Abandon{};
        const bool fn_param = p.type.kind == ast::TypeExpr::Kind::function;
        if (fn_param != (a.kind == LV::Kind::function))
            error(at, fn.name + ": argument " + p.name + ": expected " + type_str(p.type) +
                          ", got " + (fn_param ? type_of(a).str() : "a function"));
        if (fn_param) {
            inner.scopes_.back()[p.name] = a;
            key += std::to_string(reinterpret_cast<std::uintptr_t>(a.fn)) + "/" +
                   std::to_string(a.grad_wrt) + (a.with_value ? "v;" : ";");
            continue;
        }
        if (a.kind == LV::Kind::number && p.type.kind == ast::TypeExpr::Kind::tensor) {
            auto dt = parse_dtype(p.type.dtype);
            auto it = bound.dtypes.find(p.type.dtype);
            a = LV::tensor(b_.constant(a.num, dt                         ? *dt
                                              : it != bound.dtypes.end() ? it->second
                                                                         : DType::f32));
        }
        auto msg = match_type(prog_, type_of(a), p.type, batch, bound);
        if (!msg.empty()) error(at, fn.name + ": argument " + p.name + ": " + msg);
        inner.scopes_.back()[p.name] = a;
        for (int id : flatten(a)) key += std::to_string(id) + ",";
        key += ";";
    }
    if (auto hit = memo_->results.find({&fn, key}); hit != memo_->results.end()) return hit->second;
    // A dimension or size name bound to a static extent is that integer in the body
    // (`reshape(q, H, C / H)` in a function over `MultiHeadAttention[C, H]`).
    for (const auto& [name, axis] : bound.dims)
        if (axis.kind == AxisKind::fixed)
            inner.scopes_.back().emplace(name, LV::number(double(axis.extent)));
    std::optional<LV> result = inner.exec(fn.body, false);
    if (!result) inner.error(fn.name_span, "fn " + fn.name + " ends without a return");
    if (fn.result) {
        auto msg = match_type(prog_, inner.type_of(*result), *fn.result, batch, bound);
        if (!msg.empty())
            inner.error(fn.result->span,
                        fn.name + " returns a value that does not match its declared type: " + msg);
    }
    memo_->results[{&fn, key}] = *result;
    return *result;
}

std::optional<LV> Lowerer::exec(const std::vector<ast::Stmt>& body, bool in_loop) {
    bool failed = false;
    for (const auto& st : body) {
        try {
            switch (st.kind) {
            case ast::Stmt::Kind::ret: {
                if (in_loop)
                    error(st.span, "return inside a for loop: assign to a variable bound before "
                                   "the loop and return after it");
                LV v = expr(*st.value);
                if (failed) throw Abandon{};
                no_function(v, st.value->span, "a function returns tensors and params");
                return v;
            }
            case ast::Stmt::Kind::let:
                bind(st.target, expr(*st.value));
                break;
            case ast::Stmt::Kind::assign:
                assign(st);
                break;
            case ast::Stmt::Kind::loop:
                loop(st);
                break;
            }
        } catch (const Abandon&) {
            failed = true;
            if (st.kind == ast::Stmt::Kind::ret) break;
            if (st.kind == ast::Stmt::Kind::assign) {
                if (LV* slot = lookup(st.target.name)) *slot = LV::error();
            } else if (st.kind == ast::Stmt::Kind::let) {
                try {
                    bind(st.target, LV::error());
                } catch (const Abandon&) {
                }
            }
        }
    }
    if (failed) throw Abandon{};
    return std::nullopt;
}

void Lowerer::assign(const ast::Stmt& st) {
    const std::string& name = st.target.name;
    LV* slot = lookup(name);
    if (!slot)
        error(st.span, "'" + name + "' is not bound: introduce it with let before assigning to it");
    LV v = expr(*st.value);
    slot = lookup(name); // the value may have added bindings
    if (slot->kind == LV::Kind::error || v.kind == LV::Kind::error) throw Abandon{};
    if (v.kind == LV::Kind::number && slot->kind == LV::Kind::tensor)
        v = LV::tensor(tensor_of(v, st.value->span, b_.function().type(slot->id).dtype));
    const VType want = type_of(*slot), got = type_of(v);
    if (!(want == got) || (slot->kind == LV::Kind::function) != (v.kind == LV::Kind::function))
        error(st.value->span, "cannot assign " + got.str() + " to '" + name + "' of type " +
                                  want.str() + ": a variable keeps its type");
    *slot = v;
}

namespace {
bool is_array(const LV& v) {
    return v.kind == LV::Kind::record && !v.name.empty() && v.name.back() == ']' &&
           v.name.rfind("Adam[", 0) != 0;
}
} // namespace

void Lowerer::loop(const ast::Stmt& st) {
    LV seq = expr(*st.value);
    std::vector<LV> items;
    if (is_array(seq))
        for (const auto& [_, f] : seq.fields) items.push_back(f);
    else if (seq.kind == LV::Kind::tuple)
        items = seq.elems;
    else
        error(st.value->span,
              "for iterates over a params array (such as p.layers) or a tuple, got " +
                  type_of(seq).str());
    for (const auto& item : items) {
        scopes_.emplace_back();
        scopes_.back()[st.target.name] = item;
        bool failed = false;
        try {
            exec(st.body, true);
        } catch (const Abandon&) {
            failed = true; // reported once, in the first iteration that fails
        }
        scopes_.pop_back();
        if (failed) throw Abandon{};
    }
}

LV Lowerer::apply_grad(const LV& f, const std::vector<LV>& args, Span at) {
    const ast::FnDecl* fn = f.fn;
    const SourceFile* file = f.fn_file;
    if (std::size_t(f.grad_wrt) >= args.size())
        error(at, f.name + " is differentiated with respect to argument " +
                      std::to_string(f.grad_wrt) + " but is called with " +
                      std::to_string(args.size()));
    ir::Function sub;
    sub.name = f.name;
    ir::Builder sb(sub);
    std::vector<LV> sub_args;
    std::vector<int> flat_args;
    std::vector<int> sub_inputs; // the inputs of sub that flat_args feed
    std::vector<int> wrt;
    for (std::size_t k = 0; k < args.size(); ++k) {
        if (args[k].kind == LV::Kind::error) throw Abandon{};
        VType t = type_of(args[k]);
        LV in = make_inputs(sb, t, fn->params.size() > k ? fn->params[k].name : "arg");
        auto ids = flatten(in);
        for (std::size_t j = 0; j < ids.size(); ++j)
            if (int(k) == f.grad_wrt) wrt.push_back(int(flat_args.size() + j));
        auto outer = args[k].kind == LV::Kind::number
                         ? std::vector<int>{tensor_of(args[k], at, DType::f32)}
                         : flatten(args[k]);
        flat_args.insert(flat_args.end(), outer.begin(), outer.end());
        sub_inputs.insert(sub_inputs.end(), ids.begin(), ids.end());
        sub_args.push_back(in);
    }
    // Padded: the differentiated function takes the masks too, after its arguments.
    std::optional<Padder> sub_padder;
    if (padder_) {
        sub_padder.emplace(sb, padder_->names());
        for (std::size_t j = 0; j < sub_inputs.size(); ++j)
            if (!padder_->padding_finite(flat_args[j]))
                sub_padder->padding_may_be_nonfinite(sub_inputs[j]);
        flat_args.insert(flat_args.end(), padder_->mask_inputs().begin(),
                         padder_->mask_inputs().end());
    }
    Lowerer inner(prog_, diags_, sb, depth_ + 1);
    inner.padder_ = sub_padder ? &*sub_padder : nullptr;
    inner.file_ = file_;
    LV r = inner.call_fn(*fn, file, sub_args, at);
    if (r.kind != LV::Kind::tensor)
        error(at, f.name + " must return a scalar tensor to be differentiated, got " +
                      inner.type_of(r).str());
    sub.outputs = {r.id};
    ir::Function d;
    try {
        d = ir::differentiate(sub, 0, wrt);
    } catch (const Error& e) {
        error(at, e.what());
    }
    auto outs = ir::inline_call(b_.function(), d, flat_args);
    std::size_t pos = 1;
    LV grad = unflatten(type_of(args[std::size_t(f.grad_wrt)]), outs, pos);
    if (!f.with_value) return grad;
    LV t;
    t.kind = LV::Kind::tuple;
    t.elems = {LV::tensor(outs[0]), grad};
    return t;
}

LV Lowerer::expr(const ast::Expr& e) {
    using K = ast::Expr::Kind;
    switch (e.kind) {
    case K::integer:
        return LV::number(double(e.ival));
    case K::floating:
        return LV::number(e.fval);
    case K::boolean:
        return LV::number(e.bval ? 1.0 : 0.0);
    case K::name: {
        if (LV* v = lookup(e.name)) {
            if (v->kind == LV::Kind::error) throw Abandon{};
            return *v;
        }
        if (auto f = function_value(e.name)) return *f;
        if (find_builtin(e.name))
            error(e.span, "builtin " + e.name + " must be called: " + e.name + "(...)");
        error(e.span, "unknown name '" + e.name + "'");
    }
    case K::unary: {
        LV v = expr(*e.operands[0]);
        if (v.kind == LV::Kind::number) return LV::number(-v.num);
        return LV::tensor(op(e.span, "neg", {tensor_of(v, e.operands[0]->span, DType::f32)}));
    }
    case K::binary:
        return binary(e);
    case K::call:
        return call(e);
    case K::index:
        return index(e);
    case K::member: {
        LV base = expr(*e.operands[0]);
        if (base.kind == LV::Kind::record) {
            for (const auto& [n, f] : base.fields)
                if (n == e.name) return f;
            error(e.span, base.name + " has no field '" + e.name + "'");
        }
        no_function(base, e.operands[0]->span, "'." + e.name + "' needs a params value");
        error(e.span, "'." + e.name + "' needs a params value, got " + type_of(base).str());
    }
    case K::string:
        error(e.span, "a string is only an argument of a builtin that takes one: einsum's spec "
                      "(einsum(\"bikc,bjkc->bijc\", a, b)) or conv2d's padding=\"same\"");
    case K::tuple: {
        LV t;
        t.kind = LV::Kind::tuple;
        for (const auto& x : e.operands) t.elems.push_back(expr(*x));
        return t;
    }
    }
    error(e.span, "unsupported expression");
}

LV Lowerer::binary(const ast::Expr& e) {
    static const std::map<std::string, std::string, std::less<>> ops = {
        {"+", "add"}, {"-", "sub"}, {"*", "mul"}, {"/", "div"}, {"**", "pow"}, {"@", "matmul"},
        {"<", "lt"},  {"<=", "le"}, {">", "gt"},  {">=", "ge"}, {"==", "eq"},  {"!=", "ne"}};
    LV a = expr(*e.operands[0]);
    LV b = expr(*e.operands[1]);
    auto it = ops.find(e.op);
    if (it == ops.end()) error(e.span, "unknown operator " + e.op);
    if (a.kind == LV::Kind::number && b.kind == LV::Kind::number) {
        double x = a.num, y = b.num;
        if (e.op == "+") return LV::number(x + y);
        if (e.op == "-") return LV::number(x - y);
        if (e.op == "*") return LV::number(x * y);
        if (e.op == "/") return LV::number(x / y);
        if (e.op == "**") return LV::number(std::pow(x, y));
        if (e.op == "<") return LV::number(x < y);
        if (e.op == "<=") return LV::number(x <= y);
        if (e.op == ">") return LV::number(x > y);
        if (e.op == ">=") return LV::number(x >= y);
        if (e.op == "==") return LV::number(x == y);
        if (e.op == "!=") return LV::number(x != y);
        error(e.span, "'@' needs tensors");
    }
    // A literal takes the dtype of the tensor on the other side.
    DType like = a.kind == LV::Kind::tensor   ? b_.function().type(a.id).dtype
                 : b.kind == LV::Kind::tensor ? b_.function().type(b.id).dtype
                                              : DType::f32;
    int x = tensor_of(a, e.operands[0]->span, like);
    int y = tensor_of(b, e.operands[1]->span, like);
    return LV::tensor(op(e.span, it->second, {x, y}));
}

LV Lowerer::select(const LV& base, const ast::Expr& e) {
    const bool array = is_array(base);
    if (e.items.size() != 1 || e.items[0].kind != ast::IndexItem::Kind::index)
        error(e.span, std::string(array ? "a params array" : "a tuple") +
                          " takes one integer index: " + (array ? "p.layers[2]" : "t[0]"));
    const std::int64_t n = std::int64_t(array ? base.fields.size() : base.elems.size());
    std::int64_t k = e.items[0].index;
    if (k < -n || k >= n)
        error(e.items[0].span, "index " + std::to_string(k) + " is out of range for " +
                                   type_of(base).str() + " of " + std::to_string(n) + " elements");
    if (k < 0) k += n;
    return array ? base.fields[std::size_t(k)].second : base.elems[std::size_t(k)];
}

LV Lowerer::index(const ast::Expr& e) {
    LV v = expr(*e.operands[0]);
    if (is_array(v) || v.kind == LV::Kind::tuple) return select(v, e);
    int base = tensor_of(v, e.operands[0]->span, DType::f32);
    for (const auto& it : e.items) {
        if (it.kind != ast::IndexItem::Kind::gather) continue;
        if (e.items.size() != 1)
            error(it.span, "an index tensor must be the only item: table[ids] gathers rows");
        int ids = tensor(*it.ids);
        return LV::tensor(op(e.span, "gather", {base, ids}));
    }
    std::string spec;
    for (std::size_t k = 0; k < e.items.size(); ++k) {
        const auto& it = e.items[k];
        if (k) spec += ", ";
        switch (it.kind) {
        case ast::IndexItem::Kind::keep:
            spec += ":";
            break;
        case ast::IndexItem::Kind::newaxis:
            spec += "new";
            break;
        case ast::IndexItem::Kind::index:
            spec += std::to_string(it.index);
            break;
        case ast::IndexItem::Kind::slice:
            if (it.step && *it.step <= 0)
                error(it.span,
                      "a slice step must be a positive integer, got " + std::to_string(*it.step));
            spec += (it.lo ? std::to_string(*it.lo) : "") + ":" +
                    (it.hi ? std::to_string(*it.hi) : "") +
                    (it.step && *it.step != 1 ? ":" + std::to_string(*it.step) : "");
            break;
        case ast::IndexItem::Kind::gather:
            break;
        }
    }
    Attrs at;
    at.set("spec", spec);
    return LV::tensor(op(e.span, "index", {base}, at));
}

LV Lowerer::call(const ast::Expr& e) {
    const ast::Expr& callee = *e.operands[0];
    if (callee.kind == ast::Expr::Kind::name && !lookup(callee.name) &&
        !prog_.find_fn(callee.name).first) {
        if (const Builtin* b = find_builtin(callee.name)) return (*b)(*this, e);
    }
    LV f = expr(callee);
    if (f.kind != LV::Kind::function)
        error(callee.span, "this is not a function: " + type_of(f).str());
    std::vector<LV> args;
    for (const auto& a : e.args) {
        if (!a.keyword.empty())
            error(a.span,
                  "keyword argument '" + a.keyword + "': user functions take positional arguments");
        LV v = expr(*a.value);
        if (!a.spread) {
            args.push_back(v);
            continue;
        }
        if (v.kind != LV::Kind::tuple)
            error(a.span, "*: spreads a tuple into arguments, got " + type_of(v).str());
        args.insert(args.end(), v.elems.begin(), v.elems.end());
    }
    if (f.grad_wrt >= 0) return apply_grad(f, args, e.span);
    return call_fn(*f.fn, f.fn_file, args, e.span);
}

std::optional<LV> Lowerer::function_value(const std::string& name) {
    if (LV* v = lookup(name)) {
        if (v->kind == LV::Kind::function) return *v;
        return std::nullopt;
    }
    auto [fn, file] = prog_.find_fn(name, file_);
    if (!fn) return std::nullopt;
    LV f;
    f.kind = LV::Kind::function;
    f.name = name;
    f.fn = fn;
    f.fn_file = file;
    return f;
}

// ---- entry points -------------------------------------------------------------------------

std::optional<Lowered> lower(const Program& prog, std::string_view name,
                             const std::optional<std::vector<VType>>& args, Diagnostics& diags,
                             bool padded) {
    auto [fn, file] = prog.find_fn(name);
    if (!fn) {
        diags.error(Span::whole_file(), "no function named '" + std::string(name) + "'");
        return std::nullopt;
    }
    ir::Function f;
    f.name = std::string(name);
    ir::Builder b(f);
    Lowerer L(prog, diags, b);
    Lowered out;
    try {
        const auto batch = batch_names(*fn);
        if (args && args->size() != fn->params.size()) {
            diags.error(fn->name_span,
                        fn->name + " takes " + std::to_string(fn->params.size()) +
                            " arguments, got " + std::to_string(args->size()),
                        file);
            return std::nullopt;
        }
        Bindings bound;
        bound.relabel_ragged = true;
        std::vector<LV> inputs;
        for (std::size_t k = 0; k < fn->params.size(); ++k) {
            const ast::Param& p = fn->params[k];
            VType t;
            try {
                if (!args) {
                    t = declared_vtype(prog, p.type, batch);
                } else {
                    auto msg = match_type(prog, (*args)[k], p.type, batch, bound);
                    if (!msg.empty()) fail("argument ", p.name, ": ", msg);
                    t = rename((*args)[k], p.type);
                }
            } catch (const Error& e) {
                diags.error(p.type.span, e.what(), file);
                return std::nullopt;
            }
            out.params.push_back(t);
            inputs.push_back(make_inputs(b, t, p.name));
        }
        std::optional<Padder> padder;
        if (padded) {
            out.masks = Padder::mask_names(f.input_types());
            padder.emplace(b, out.masks);
            L.set_padder(&*padder);
        }
        LV r = L.materialise(L.call_fn(*fn, file, inputs, fn->name_span));
        f.outputs = L.flatten(r);
        out.result = L.type_of(r);
        ir::verify(f);
    } catch (const Abandon&) {
        return std::nullopt;
    } catch (const Error& e) {
        diags.error(fn->name_span, std::string("internal error: ") + e.what(), file);
        return std::nullopt;
    }
    out.fn = ir::eliminate_common_subexpressions(f);
    return out;
}

void check(const Program& prog, Diagnostics& diags) {
    const std::size_t before = diags.items().size();
    validate(prog, diags);
    if (diags.items().size() != before) return; // lowering would repeat the same problems
    for (const auto& u : prog.units)
        if (!u.stdlib) // generic; checked where called (and by tests/python/test_stdlib.py)
            for (const auto& fn : u.module.fns)
                if (!is_generic(prog, fn)) lower(prog, fn.name, std::nullopt, diags);
}

bool is_generic(const Program& prog, const ast::FnDecl& fn) {
    if (!fn.type_params.empty()) return true;
    std::function<bool(const ast::TypeExpr&)> sized = [&](const ast::TypeExpr& t) {
        if (prog.sized_group(t) || t.kind == ast::TypeExpr::Kind::function) return true;
        for (const auto& e : t.elems)
            if (sized(e)) return true;
        return false;
    };
    for (const auto& p : fn.params)
        if (sized(p.type)) return true;
    return false;
}

} // namespace rag::frontend
