// The builtin functions of the language (LANGUAGE.md §4) and how each lowers to op-table ops.
// Keyword and positional arguments are matched against a small signature per builtin;
// attributes (axis=, eps=, causal=, map=) must be compile-time constants.
#include "frontend/lowerer.hpp"

#include <cmath>

namespace rag::frontend {
namespace {

// Matches a call's arguments against `sig` ("x", "axis?" optional, "*rest" variadic).
struct Args {
    std::map<std::string, const ast::Expr*> named;
    std::vector<const ast::Expr*> rest;
    const ast::Expr* get(const std::string& n) const {
        auto it = named.find(n);
        return it == named.end() ? nullptr : it->second;
    }
};

Args match(Lowerer& L, const ast::Expr& call, const std::string& fname,
           std::vector<std::string> sig) {
    Args out;
    std::size_t pos = 0;
    bool variadic = !sig.empty() && sig.back().front() == '*';
    std::vector<std::string> names;
    for (auto s : sig) {
        if (s.front() == '*') continue;
        names.push_back(s.back() == '?' ? s.substr(0, s.size() - 1) : s);
    }
    for (const auto& a : call.args) {
        if (a.keyword.empty()) {
            if (pos < names.size())
                out.named[names[pos++]] = a.value.get();
            else if (variadic)
                out.rest.push_back(a.value.get());
            else
                L.error(a.span, fname + " takes at most " + std::to_string(names.size()) +
                                    " argument" + (names.size() == 1 ? "" : "s"));
            continue;
        }
        if (std::find(names.begin(), names.end(), a.keyword) == names.end())
            L.error(a.span, fname + " has no argument '" + a.keyword + "'");
        if (out.named.count(a.keyword))
            L.error(a.span, fname + ": argument '" + a.keyword + "' given twice");
        out.named[a.keyword] = a.value.get();
    }
    for (const auto& s : sig)
        if (s.front() != '*' && s.back() != '?' && !out.named.count(s))
            L.error(call.span, fname + ": missing argument '" + s + "'");
    return out;
}

std::int64_t int_attr(Lowerer& L, const ast::Expr& e, const char* what) {
    double v = L.constant(e, what);
    if (v != std::floor(v)) L.error(e.span, std::string(what) + " must be an integer");
    if (std::fabs(v) > 9.0e15) L.error(e.span, std::string(what) + " is out of range");
    return std::int64_t(v);
}

bool bool_attr(Lowerer& L, const ast::Expr& e, const char* what) {
    if (e.kind != ast::Expr::Kind::boolean)
        L.error(e.span, std::string(what) + " must be true or false");
    return e.bval;
}

LV simple(Lowerer& L, const ast::Expr& call, const std::string& op,
          std::vector<std::string> tensors, std::vector<std::pair<std::string, char>> attrs = {}) {
    std::vector<std::string> sig = tensors;
    for (const auto& [n, _] : attrs) sig.push_back(n + "?");
    Args a = match(L, call, op, sig);
    std::vector<int> ins;
    DType like = DType::f32;
    std::vector<LV> vals;
    for (const auto& t : tensors) vals.push_back(L.expr(*a.get(t)));
    for (const auto& v : vals)
        if (v.kind == LV::Kind::tensor) {
            like = L.builder().function().type(v.id).dtype;
            break;
        }
    for (std::size_t k = 0; k < vals.size(); ++k)
        ins.push_back(L.tensor_of(vals[k], a.get(tensors[k])->span, like));
    Attrs at;
    for (const auto& [n, kind] : attrs) {
        const ast::Expr* e = a.get(n);
        if (!e) continue;
        if (kind == 'i')
            at.set(n, int_attr(L, *e, n.c_str()));
        else if (kind == 'f')
            at.set(n, L.constant(*e, n.c_str()));
        else
            at.set(n, bool_attr(L, *e, n.c_str()));
    }
    return LV::tensor(L.op(call.span, op, ins, at));
}

// map=identity | clip(D) | t5_buckets(num=, max_distance=) | log_buckets(size=, max_position=)
//   | buckets(D, r_-D, ..., r_D): a general monotone map, the row of each offset -D..D
void relpos_map_attrs(Lowerer& L, const ast::Expr& m, Attrs& at) {
    const ast::Expr* callee = m.kind == ast::Expr::Kind::call ? m.operands[0].get() : &m;
    if (callee->kind != ast::Expr::Kind::name)
        L.error(m.span, "map must be identity, clip(D), t5_buckets(...) or log_buckets(...)");
    const std::string& name = callee->name;
    at.set("map", name);
    std::vector<std::string> sig;
    if (name == "identity")
        sig = {};
    else if (name == "clip")
        sig = {"distance"};
    else if (name == "t5_buckets")
        sig = {"num?", "max_distance?"};
    else if (name == "log_buckets")
        sig = {"size?", "max_position?"};
    else if (name == "buckets")
        sig = {"distance", "*rows"};
    else
        L.error(m.span, "unknown map '" + name +
                            "': expected identity, clip, t5_buckets, log_buckets or buckets");
    if (m.kind != ast::Expr::Kind::call) {
        if (name == "clip") L.error(m.span, "clip needs its distance: clip(16)");
        if (name == "buckets")
            L.error(m.span, "buckets needs D and 2D + 1 rows: buckets(1, 0, 1, 1)");
        return;
    }
    Args a = match(L, m, name, sig);
    for (const auto& [n, e] : a.named) at.set(n, int_attr(L, *e, n.c_str()));
    if (name == "buckets") {
        std::vector<std::int64_t> rows;
        for (const auto* r : a.rest) rows.push_back(int_attr(L, *r, "a bucket row"));
        at.set("table", rows);
    }
}

LV make_grad(Lowerer& L, const ast::Expr& call, bool with_value) {
    const std::string name = with_value ? "value_and_grad" : "grad";
    Args a = match(L, call, name, {"f", "wrt"});
    const ast::Expr& f = *a.get("f");
    auto [fn, _] = L.program().find_fn(f.kind == ast::Expr::Kind::name ? f.name : "");
    if (!fn) L.error(f.span, name + " needs the name of a function defined with fn");
    const ast::Expr& w = *a.get("wrt");
    LV out;
    out.kind = LV::Kind::function;
    out.name = fn->name;
    out.with_value = with_value;
    if (w.kind == ast::Expr::Kind::integer) {
        if (w.ival < 0 || std::size_t(w.ival) >= fn->params.size())
            L.error(w.span, fn->name + " has no parameter " + std::to_string(w.ival));
        out.grad_wrt = int(w.ival);
    } else if (w.kind == ast::Expr::Kind::name) {
        for (std::size_t k = 0; k < fn->params.size(); ++k)
            if (fn->params[k].name == w.name) out.grad_wrt = int(k);
        if (out.grad_wrt < 0) L.error(w.span, fn->name + " has no parameter '" + w.name + "'");
    } else {
        L.error(w.span, "wrt must name a parameter of " + fn->name);
    }
    if (out.grad_wrt < 0 || std::size_t(out.grad_wrt) >= fn->params.size())
        L.error(w.span, fn->name + " has no parameter " + std::to_string(out.grad_wrt));
    return out;
}

LV sgd(Lowerer& L, const ast::Expr& call) {
    Args a = match(L, call, "sgd", {"params", "grads", "lr"});
    LV p = L.expr(*a.get("params")), g = L.expr(*a.get("grads"));
    double lr = L.constant(*a.get("lr"), "lr");
    Attrs scale;
    scale.set("c", -lr);
    std::function<LV(const LV&, const LV&)> step = [&](const LV& x, const LV& dx) -> LV {
        if (L.type_of(x) != L.type_of(dx))
            L.error(call.span, "sgd: gradients " + L.type_of(dx).str() +
                                   " do not match parameters " + L.type_of(x).str());
        if (x.kind == LV::Kind::tensor)
            return LV::tensor(
                L.op(call.span, "add", {x.id, L.op(call.span, "scale", {dx.id}, scale)}));
        LV out = x;
        for (std::size_t k = 0; k < x.fields.size(); ++k)
            out.fields[k].second = step(x.fields[k].second, dx.fields[k].second);
        for (std::size_t k = 0; k < x.elems.size(); ++k)
            out.elems[k] = step(x.elems[k], dx.elems[k]);
        return out;
    };
    return step(p, g);
}

const std::map<std::string, Builtin, std::less<>>& table() {
    static const std::map<std::string, Builtin, std::less<>> t = [] {
        std::map<std::string, Builtin, std::less<>> m;
        for (const char* u : {"exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "relu",
                              "gelu", "silu", "zeros_like", "ones_like"})
            m[u] = [op = std::string(u)](Lowerer& L, const ast::Expr& c) {
                return simple(L, c, op, {"x"});
            };
        for (const char* b : {"maximum", "minimum"})
            m[b] = [op = std::string(b)](Lowerer& L, const ast::Expr& c) {
                return simple(L, c, op, {"a", "b"});
            };
        m["where"] = [](Lowerer& L, const ast::Expr& c) {
            return simple(L, c, "where", {"cond", "a", "b"});
        };
        for (const char* r : {"sum", "mean", "max", "min"})
            m[r] = [op = std::string(r)](Lowerer& L, const ast::Expr& c) {
                return simple(L, c, op, {"x"}, {{"axis", 'i'}});
            };
        for (const char* r : {"softmax", "logsumexp"})
            m[r] = [op = std::string(r)](Lowerer& L, const ast::Expr& c) {
                Args a = match(L, c, op, {"x", "axis"});
                Attrs at;
                at.set("axis", int_attr(L, *a.get("axis"), "axis"));
                return LV::tensor(L.op(c.span, op, {L.tensor(*a.get("x"))}, at));
            };
        m["layernorm"] = [](Lowerer& L, const ast::Expr& c) {
            return simple(L, c, "layernorm", {"x", "g", "b"}, {{"eps", 'f'}});
        };
        m["rmsnorm"] = [](Lowerer& L, const ast::Expr& c) {
            return simple(L, c, "rmsnorm", {"x", "g"}, {{"eps", 'f'}});
        };
        m["dropout"] = [](Lowerer& L, const ast::Expr& c) {
            Args a = match(L, c, "dropout", {"x", "p", "seed"});
            Attrs at;
            at.set("p", L.constant(*a.get("p"), "p"));
            at.set("seed", int_attr(L, *a.get("seed"), "seed"));
            return LV::tensor(L.op(c.span, "dropout", {L.tensor(*a.get("x"))}, at));
        };
        m["transpose"] = [](Lowerer& L, const ast::Expr& c) {
            Args a = match(L, c, "transpose", {"x", "a", "b"});
            Attrs at;
            at.set("a", int_attr(L, *a.get("a"), "a"));
            at.set("b", int_attr(L, *a.get("b"), "b"));
            return LV::tensor(L.op(c.span, "transpose", {L.tensor(*a.get("x"))}, at));
        };
        m["reshape"] = [](Lowerer& L, const ast::Expr& c) {
            Args a = match(L, c, "reshape", {"x", "*dims"});
            std::vector<std::int64_t> dims;
            for (const auto* d : a.rest) dims.push_back(int_attr(L, *d, "a reshape extent"));
            Attrs at;
            at.set("shape", dims);
            return LV::tensor(L.op(c.span, "reshape", {L.tensor(*a.get("x"))}, at));
        };
        m["concat"] = [](Lowerer& L, const ast::Expr& c) {
            Args a = match(L, c, "concat", {"xs", "axis"});
            LV xs = L.expr(*a.get("xs"));
            if (xs.kind != LV::Kind::tuple)
                L.error(a.get("xs")->span, "concat takes a tuple of tensors: concat((a, b), axis)");
            std::vector<int> ins;
            for (const auto& x : xs.elems)
                ins.push_back(L.tensor_of(x, a.get("xs")->span, DType::f32));
            Attrs at;
            at.set("axis", int_attr(L, *a.get("axis"), "axis"));
            return LV::tensor(L.op(c.span, "concat", ins, at));
        };
        m["mse"] = [](Lowerer& L, const ast::Expr& c) { return simple(L, c, "mse", {"a", "b"}); };
        m["cross_entropy"] = [](Lowerer& L, const ast::Expr& c) {
            return simple(L, c, "cross_entropy", {"logits", "labels"});
        };
        m["pad"] = [](Lowerer& L, const ast::Expr& c) {
            return simple(L, c, "pad", {"x"}, {{"value", 'f'}});
        };
        m["mask"] = [](Lowerer& L, const ast::Expr& c) { return simple(L, c, "mask", {"x"}); };
        m["lengths"] = [](Lowerer& L, const ast::Expr& c) {
            return simple(L, c, "lengths", {"x"}, {{"axis", 'i'}});
        };
        m["attention"] = [](Lowerer& L, const ast::Expr& c) {
            return simple(L, c, "attention", {"q", "k", "v"}, {{"causal", 'b'}, {"scale", 'f'}});
        };
        m["relpos_attention"] = [](Lowerer& L, const ast::Expr& c) {
            Args a = match(L, c, "relpos_attention",
                           {"q", "k", "v", "map", "aq?", "ak?", "bias?", "causal?", "scale?"});
            std::vector<int> ins;
            for (const char* n : {"q", "k", "v"}) ins.push_back(L.tensor(*a.get(n)));
            Attrs at;
            relpos_map_attrs(L, *a.get("map"), at);
            for (const char* n : {"aq", "ak", "bias"}) {
                at.set(n, a.get(n) != nullptr);
                if (a.get(n)) ins.push_back(L.tensor(*a.get(n)));
            }
            if (auto* e = a.get("causal")) at.set("causal", bool_attr(L, *e, "causal"));
            if (auto* e = a.get("scale")) at.set("scale", L.constant(*e, "scale"));
            return LV::tensor(L.op(c.span, "relpos_attention", ins, at));
        };
        m["sgd"] = sgd;
        m["grad"] = [](Lowerer& L, const ast::Expr& c) { return make_grad(L, c, false); };
        m["value_and_grad"] = [](Lowerer& L, const ast::Expr& c) { return make_grad(L, c, true); };
        return m;
    }();
    return t;
}

} // namespace

const Builtin* find_builtin(std::string_view name) {
    auto it = table().find(name);
    return it == table().end() ? nullptr : &it->second;
}

} // namespace rag::frontend
