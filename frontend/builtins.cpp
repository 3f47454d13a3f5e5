// The builtin functions of the language (LANGUAGE.md §4) and how each lowers to op-table ops.
// Keyword and positional arguments are matched against a small signature per builtin;
// attributes (axis=, eps=, causal=, map=) must be compile-time constants.
#include "frontend/einsum.hpp"
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
        if (a.spread)
            L.error(a.span, "*: spreading a tuple into arguments works for functions defined "
                            "with fn; builtin " +
                                fname + " takes its arguments one by one");
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
        L.error(m.span, "map must be identity, clip(D), t5_buckets(...), log_buckets(...) or "
                        "buckets(D, ...)");
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
    // Relation tables have a row per offset or bucket: bound them before anything is sized.
    constexpr std::int64_t kMaxRelation = 1 << 20;
    for (const auto& [n, e] : a.named) {
        const std::int64_t v = int_attr(L, *e, n.c_str());
        if (v < 0 || v > kMaxRelation)
            L.error(e->span, name + ": " + n + " must be between 0 and " +
                                 std::to_string(kMaxRelation) + ", got " + std::to_string(v));
        at.set(n, v);
    }
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
    // A top-level fn, or a function passed to this one (`loss: fn`).
    std::optional<LV> fv;
    if (f.kind == ast::Expr::Kind::name) fv = L.function_value(f.name);
    if (!fv || fv->grad_wrt >= 0)
        L.error(f.span, name + " needs the name of a function defined with fn");
    const ast::FnDecl* fn = fv->fn;
    LV out = *fv;
    out.with_value = with_value;
    const ast::Expr& w = *a.get("wrt");
    const auto n = std::int64_t(fn->params.size());
    // An integer counts parameters from the first (0) or, negative, from the last (-1): a
    // generic training step differentiates a loss it knows only by its last argument.
    const bool negative =
        w.kind == ast::Expr::Kind::unary && w.operands[0]->kind == ast::Expr::Kind::integer;
    if (w.kind == ast::Expr::Kind::integer || negative) {
        const std::int64_t k = negative ? n - w.operands[0]->ival : w.ival;
        if (k < 0 || k >= n)
            L.error(w.span, fn->name + " has no parameter " +
                                std::to_string(negative ? -w.operands[0]->ival : w.ival) +
                                " (it has " + std::to_string(n) + ")");
        out.grad_wrt = int(k);
    } else if (w.kind == ast::Expr::Kind::name) {
        for (std::size_t k = 0; k < fn->params.size(); ++k)
            if (fn->params[k].name == w.name) out.grad_wrt = int(k);
        if (out.grad_wrt < 0) L.error(w.span, fn->name + " has no parameter '" + w.name + "'");
    } else {
        L.error(w.span, "wrt must name a parameter of " + fn->name + " or give its position");
    }
    return out;
}

// where(cond, a, b): a literal branch takes the dtype of the other branch (LANGUAGE.md 6.1).
LV where(Lowerer& L, const ast::Expr& call) {
    Args a = match(L, call, "where", {"cond", "a", "b"});
    LV c = L.expr(*a.get("cond")), x = L.expr(*a.get("a")), y = L.expr(*a.get("b"));
    const auto& f = L.builder().function();
    DType like = x.kind == LV::Kind::tensor   ? f.type(x.id).dtype
                 : y.kind == LV::Kind::tensor ? f.type(y.id).dtype
                                              : DType::f32;
    return LV::tensor(
        L.op(call.span, "where",
             {L.tensor_of(c, a.get("cond")->span, DType::boolean),
              L.tensor_of(x, a.get("a")->span, like), L.tensor_of(y, a.get("b")->span, like)}));
}

// f32(x), i64(x), ...: elementwise casts; a literal becomes a constant of that dtype.
LV cast(Lowerer& L, const ast::Expr& call, DType to) {
    const std::string name(dtype_name(to));
    Args a = match(L, call, name, {"x"});
    LV x = L.expr(*a.get("x"));
    if (x.kind == LV::Kind::number) return LV::tensor(L.builder().constant(x.num, to));
    int id = L.tensor_of(x, a.get("x")->span, to);
    if (L.builder().function().type(id).dtype == to) return LV::tensor(id);
    Attrs at;
    at.set("dtype", name);
    return LV::tensor(L.op(call.span, "cast", {id}, at));
}

// A hyper-parameter: a number (a constant of the code) or a runtime scalar tensor such as an
// `lr: f32[]` argument, as a scalar of `dtype` (cast when it has another float dtype).
int hyper_value(Lowerer& L, const LV& v, Span span, DType dtype, const char* what) {
    if (v.kind == LV::Kind::number) return L.builder().constant(v.num, dtype);
    int id = L.tensor_of(v, span, dtype);
    const Schema& s = L.builder().function().type(id);
    if (s.shape.batched || !s.shape.axes.empty() || !is_floating(s.dtype))
        L.error(span,
                std::string(what) + " must be a number or a float scalar (f32[]), got " + s.str());
    if (s.dtype == dtype) return id;
    Attrs at;
    at.set("dtype", std::string(dtype_name(dtype)));
    return L.op(span, "cast", {id}, at);
}

int hyper(Lowerer& L, const ast::Expr* e, double dflt, DType dtype, const char* what) {
    if (!e) return L.builder().constant(dflt, dtype);
    return hyper_value(L, L.expr(*e), e->span, dtype, what);
}

// Applies fn to the matching tensors of params-shaped values (records, tuples), in order.
void for_each_leaf(Lowerer& L, Span at, const char* what, std::vector<LV*> vals,
                   const std::function<void(std::vector<LV*>&)>& fn) {
    for (std::size_t k = 1; k < vals.size(); ++k)
        if (L.type_of(*vals[k]) != L.type_of(*vals[0]))
            L.error(at, std::string(what) + ": " + L.type_of(*vals[k]).str() +
                            " does not match the parameters " + L.type_of(*vals[0]).str());
    if (vals[0]->kind == LV::Kind::tensor) return fn(vals);
    if (vals[0]->kind == LV::Kind::number || vals[0]->kind == LV::Kind::error ||
        vals[0]->kind == LV::Kind::function)
        L.error(at, std::string(what) + " needs tensors or params groups, got " +
                        L.type_of(*vals[0]).str());
    auto children = [&](LV* v) {
        std::vector<LV*> out;
        for (auto& [_, f] : v->fields) out.push_back(&f);
        for (auto& e : v->elems) out.push_back(&e);
        return out;
    };
    std::vector<std::vector<LV*>> kids;
    for (LV* v : vals) kids.push_back(children(v));
    for (std::size_t i = 0; i < kids[0].size(); ++i) {
        std::vector<LV*> row;
        for (auto& k : kids) row.push_back(k[i]);
        for_each_leaf(L, at, what, row, fn);
    }
}

LV sgd(Lowerer& L, const ast::Expr& call) {
    Args a = match(L, call, "sgd", {"params", "grads", "lr"});
    LV p = L.expr(*a.get("params")), g = L.expr(*a.get("grads"));
    LV out = p;
    const LV rate = L.expr(*a.get("lr"));
    std::optional<double> fixed; // a constant lr scales by a constant
    if (rate.kind == LV::Kind::number) fixed = rate.num;
    std::map<DType, int> lr; // per parameter dtype, emitted once
    for_each_leaf(L, call.span, "sgd", {&out, &g}, [&](std::vector<LV*>& v) {
        const int x = v[0]->id, dx = v[1]->id;
        if (fixed) {
            Attrs scale;
            scale.set("c", -*fixed);
            *v[0] = LV::tensor(L.op(call.span, "add", {x, L.op(call.span, "scale", {dx}, scale)}));
            return;
        }
        const DType dt = L.builder().function().type(x).dtype;
        if (!lr.count(dt)) lr[dt] = hyper_value(L, rate, a.get("lr")->span, dt, "lr");
        *v[0] = LV::tensor(L.op(call.span, "sub", {x, L.op(call.span, "mul", {dx, lr[dt]})}));
    });
    return out;
}

// adam(p, g, s, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0) -> (p', s'), as
// PyTorch's AdamW: t += 1; p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). The step's scalars are computed
// once; each field is one run of elementwise ops, which the CPU JIT fuses into one loop that
// reads p, g, m, v once and writes p, m, v.
LV adam(Lowerer& L, const ast::Expr& call) {
    Args a = match(L, call, "adam",
                   {"params", "grads", "state", "lr?", "b1?", "b2?", "eps?", "weight_decay?"});
    LV p = L.expr(*a.get("params")), g = L.expr(*a.get("grads")), st = L.expr(*a.get("state"));
    const std::string want = "Adam[" + L.type_of(p).str() + "]";
    if (st.kind != LV::Kind::record || st.name != want || st.fields.size() != 3)
        L.error(a.get("state")->span, "adam: the state must be " + want +
                                          " (the host makes one "
                                          "with init(\"" +
                                          want + "\")), got " + L.type_of(st).str());
    const Span at = call.span;
    auto& f = L.builder().function();
    auto op = [&](const char* name, std::vector<int> args) { return L.op(at, name, args); };
    // t + 1, counted in f64 (exact to 2^53 steps; the op table has no integer arithmetic).
    auto cast_to = [&](int id, DType dt) {
        Attrs c;
        c.set("dtype", std::string(dtype_name(dt)));
        return L.op(at, "cast", {id}, c);
    };
    const int t64 = op(
        "add", {cast_to(st.fields[2].second.id, DType::f64), L.builder().constant(1, DType::f64)});
    const int t = cast_to(t64, DType::i64);
    struct Scalars {
        int keep, step, root_bc2, b1, one_b1, b2, one_b2, eps;
    };
    std::map<DType, Scalars> scalars; // per parameter dtype
    auto scalars_for = [&](DType dt) -> const Scalars& {
        if (auto it = scalars.find(dt); it != scalars.end()) return it->second;
        auto h = [&](const char* n, double d) { return hyper(L, a.get(n), d, dt, n); };
        const int lr = h("lr", 1e-3), b1 = h("b1", 0.9), b2 = h("b2", 0.999);
        const int eps = h("eps", 1e-8), wd = h("weight_decay", 0.0);
        const int tf = dt == DType::f64 ? t64 : cast_to(t64, dt);
        const int one = L.builder().constant(1, dt);
        const int bc1 = op("sub", {one, op("pow", {b1, tf})});
        const int bc2 = op("sub", {one, op("pow", {b2, tf})});
        Scalars s{op("sub", {one, op("mul", {lr, wd})}),
                  op("div", {lr, bc1}),
                  op("sqrt", {bc2}),
                  b1,
                  op("sub", {one, b1}),
                  b2,
                  op("sub", {one, b2}),
                  eps};
        return scalars.emplace(dt, s).first->second;
    };
    LV np = p, m = st.fields[0].second, v = st.fields[1].second;
    for_each_leaf(L, at, "adam", {&np, &g, &m, &v}, [&](std::vector<LV*>& x) {
        const Scalars& s = scalars_for(f.type(x[0]->id).dtype);
        const int pid = x[0]->id, gid = x[1]->id;
        const int m2 = op("add", {op("mul", {s.b1, x[2]->id}), op("mul", {s.one_b1, gid})});
        const int v2 =
            op("add", {op("mul", {s.b2, x[3]->id}), op("mul", {s.one_b2, op("mul", {gid, gid})})});
        const int denom = op("add", {op("div", {op("sqrt", {v2}), s.root_bc2}), s.eps});
        const int p2 =
            op("sub", {op("mul", {pid, s.keep}), op("mul", {s.step, op("div", {m2, denom})})});
        *x[0] = LV::tensor(p2), *x[2] = LV::tensor(m2), *x[3] = LV::tensor(v2);
    });
    LV ns = st;
    ns.fields[0].second = m, ns.fields[1].second = v, ns.fields[2].second = LV::tensor(t);
    LV out;
    out.kind = LV::Kind::tuple;
    out.elems = {np, ns};
    return out;
}

// clip_norm(g, max_norm) -> (g', norm): norm the l2 norm over every tensor of g, g' = g scaled
// by min(1, max_norm / norm).
LV clip_norm(Lowerer& L, const ast::Expr& call) {
    Args a = match(L, call, "clip_norm", {"grads", "max_norm"});
    LV g = L.expr(*a.get("grads"));
    const Span at = call.span;
    auto op = [&](const char* name, std::vector<int> args) { return L.op(at, name, args); };
    auto& f = L.builder().function();
    int sq = -1; // the sum of squares, in f32 (f64 when a tensor is f64)
    DType acc = DType::f32;
    LV probe = g;
    for_each_leaf(L, at, "clip_norm", {&probe}, [&](std::vector<LV*>& x) {
        if (f.type(x[0]->id).dtype == DType::f64) acc = DType::f64;
    });
    for_each_leaf(L, at, "clip_norm", {&probe}, [&](std::vector<LV*>& x) {
        int id = x[0]->id;
        if (!is_floating(f.type(id).dtype))
            L.error(at, "clip_norm: gradients must be floating point, got " + f.type(id).str());
        if (f.type(id).dtype != acc) {
            Attrs c;
            c.set("dtype", std::string(dtype_name(acc)));
            id = L.op(at, "cast", {id}, c);
        }
        const int s = op("sum", {op("mul", {id, id})});
        sq = sq < 0 ? s : op("add", {sq, s});
    });
    if (sq < 0) L.error(at, "clip_norm: no gradients");
    const int norm = op("sqrt", {sq});
    const int scale =
        op("minimum", {L.builder().constant(1, acc),
                       op("div", {hyper(L, a.get("max_norm"), 0, acc, "max_norm"), norm})});
    std::map<DType, int> scaled; // the scale per gradient dtype
    LV out = g;
    for_each_leaf(L, at, "clip_norm", {&out}, [&](std::vector<LV*>& x) {
        const DType dt = f.type(x[0]->id).dtype;
        if (!scaled.count(dt)) {
            Attrs c;
            c.set("dtype", std::string(dtype_name(dt)));
            scaled[dt] = dt == acc ? scale : L.op(at, "cast", {scale}, c);
        }
        *x[0] = LV::tensor(op("mul", {x[0]->id, scaled[dt]}));
    });
    LV r;
    r.kind = LV::Kind::tuple;
    r.elems = {out, LV::tensor(norm)};
    return r;
}

// An int or a pair of ints (`stride=2`, `stride=(2, 1)`): [along H, along W].
std::vector<std::int64_t> pair_attr(Lowerer& L, const ast::Expr& e, const char* what) {
    if (e.kind == ast::Expr::Kind::tuple) {
        if (e.operands.size() != 2)
            L.error(e.span, std::string(what) + " takes one integer or a pair (along H, along W)");
        return {int_attr(L, *e.operands[0], what), int_attr(L, *e.operands[1], what)};
    }
    const std::int64_t v = int_attr(L, e, what);
    return {v, v};
}

// conv2d(x, w, bias=, stride=1, padding=0, dilation=1, groups=1); padding is an int, a pair, or
// "same" (stride 1; PyTorch's split of d (k - 1): the smaller half before).
LV conv2d(Lowerer& L, const ast::Expr& call) {
    Args a = match(L, call, "conv2d",
                   {"x", "w", "bias?", "stride?", "padding?", "dilation?", "groups?"});
    std::vector<int> ins{L.tensor(*a.get("x")), L.tensor(*a.get("w"))};
    if (a.get("bias")) ins.push_back(L.tensor(*a.get("bias")));
    Attrs at;
    const auto stride = a.get("stride") ? pair_attr(L, *a.get("stride"), "stride")
                                        : std::vector<std::int64_t>{1, 1};
    const auto dil = a.get("dilation") ? pair_attr(L, *a.get("dilation"), "dilation")
                                       : std::vector<std::int64_t>{1, 1};
    std::vector<std::int64_t> pad{0, 0, 0, 0};
    if (const ast::Expr* p = a.get("padding")) {
        if (p->kind == ast::Expr::Kind::string) {
            if (p->name != "same")
                L.error(p->span,
                        "padding must be an integer, a pair or \"same\", got \"" + p->name + "\"");
            if (stride[0] != 1 || stride[1] != 1)
                L.error(p->span, "padding=\"same\" needs stride 1 (as in PyTorch)");
            const Schema& w = L.builder().function().type(ins[1]);
            if (w.shape.batched || w.shape.axes.size() != 4 ||
                w.shape.axes[2].kind != AxisKind::fixed || w.shape.axes[3].kind != AxisKind::fixed)
                L.error(
                    a.get("w")->span,
                    "conv2d: the weight must be a dense [Cout, Cin/groups, kh, kw] array, got " +
                        w.str());
            for (int d = 0; d < 2; ++d) {
                const std::int64_t total =
                    dil[std::size_t(d)] * (w.shape.axes[std::size_t(2 + d)].extent - 1);
                pad[std::size_t(2 * d)] = total / 2;
                pad[std::size_t(2 * d + 1)] = total - total / 2;
            }
        } else {
            auto p2 = pair_attr(L, *p, "padding");
            pad = {p2[0], p2[0], p2[1], p2[1]};
        }
    }
    at.set("stride", stride);
    at.set("padding", pad);
    at.set("dilation", dil);
    at.set("groups", a.get("groups") ? int_attr(L, *a.get("groups"), "groups") : 1);
    return LV::tensor(L.op(call.span, "conv2d", ins, at));
}

// max_pool2d / avg_pool2d(x, k, stride=k, padding=0).
LV pool2d(Lowerer& L, const ast::Expr& call, const std::string& op) {
    Args a = match(L, call, op, {"x", "k", "stride?", "padding?"});
    Attrs at;
    const auto k = pair_attr(L, *a.get("k"), "k");
    at.set("kernel", k);
    at.set("stride", a.get("stride") ? pair_attr(L, *a.get("stride"), "stride") : k);
    const auto p = a.get("padding") ? pair_attr(L, *a.get("padding"), "padding")
                                    : std::vector<std::int64_t>{0, 0};
    at.set("padding", std::vector<std::int64_t>{p[0], p[0], p[1], p[1]});
    return LV::tensor(L.op(call.span, op, {L.tensor(*a.get("x"))}, at));
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
        m["where"] = where;
        for (const char* r : {"sum", "mean", "max", "min"})
            m[r] = [op = std::string(r)](Lowerer& L, const ast::Expr& c) {
                Args a = match(L, c, op, {"x", "axis?"});
                const ast::Expr* ax = a.get("axis");
                if (!ax || ax->kind != ast::Expr::Kind::tuple)
                    return simple(L, c, op, {"x"}, {{"axis", 'i'}});
                // axis=(2, 3): one axis after another, the last first so the others keep their
                // numbers; exact for mean too, as every sample is a rectangle over its axes.
                int x = L.tensor(*a.get("x"));
                const int rank = L.builder().function().type(x).shape.logical_rank();
                std::vector<std::int64_t> axes;
                for (const auto& e : ax->operands) {
                    std::int64_t v = int_attr(L, *e, "axis");
                    axes.push_back(v < 0 ? v + rank : v);
                }
                std::sort(axes.rbegin(), axes.rend());
                if (axes.empty() || std::adjacent_find(axes.begin(), axes.end()) != axes.end())
                    L.error(ax->span, op + ": axis=(...) needs distinct axes");
                for (std::int64_t v : axes) {
                    Attrs at;
                    at.set("axis", v);
                    x = L.op(c.span, op, {x}, at);
                }
                return LV::tensor(x);
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
            Args a = match(L, c, "dropout", {"x", "p", "seed", "shared_axis?"});
            Attrs at;
            at.set("p", L.constant(*a.get("p"), "p"));
            at.set("seed", int_attr(L, *a.get("seed"), "seed"));
            if (auto* e = a.get("shared_axis"))
                at.set("shared_axis", int_attr(L, *e, "shared_axis"));
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
        // attention(q, k, v, bias=, axis=, causal=, scale=): with a bias (or axis=2, pair
        // states) it is the biased_attention op, else the plain one.
        m["attention"] = [](Lowerer& L, const ast::Expr& c) {
            Args a =
                match(L, c, "attention", {"q", "k", "v", "bias?", "axis?", "causal?", "scale?"});
            std::vector<int> ins;
            for (const char* n : {"q", "k", "v"}) ins.push_back(L.tensor(*a.get(n)));
            Attrs at;
            if (auto* e = a.get("causal")) at.set("causal", bool_attr(L, *e, "causal"));
            if (auto* e = a.get("scale")) at.set("scale", L.constant(*e, "scale"));
            const std::int64_t axis = a.get("axis") ? int_attr(L, *a.get("axis"), "axis") : 1;
            if (axis != 1 && axis != 2)
                L.error(a.get("axis")->span, "attention: axis must be 1 (singles) or 2 (along "
                                             "the second axis of pair states), got " +
                                                 std::to_string(axis));
            if (!a.get("bias")) {
                if (axis == 2)
                    L.error(c.span,
                            "attention(axis=2) on pair states needs bias= ([B, ~N, ~N, H])");
                return LV::tensor(L.op(c.span, "attention", ins, at));
            }
            ins.push_back(L.tensor(*a.get("bias")));
            at.set("axis", axis);
            return LV::tensor(L.op(c.span, "biased_attention", ins, at));
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
        m["conv2d"] = conv2d;
        for (const char* p : {"max_pool2d", "avg_pool2d"})
            m[p] = [op = std::string(p)](Lowerer& L, const ast::Expr& c) {
                return pool2d(L, c, op);
            };
        m["upsample2d"] = [](Lowerer& L, const ast::Expr& c) {
            Args a = match(L, c, "upsample2d", {"x", "scale?"});
            Attrs at;
            at.set("scale", a.get("scale") ? int_attr(L, *a.get("scale"), "scale") : 2);
            return LV::tensor(L.op(c.span, "upsample2d", {L.tensor(*a.get("x"))}, at));
        };
        m["patches"] = [](Lowerer& L, const ast::Expr& c) {
            Args a = match(L, c, "patches", {"x", "p"});
            Attrs at;
            at.set("size", int_attr(L, *a.get("p"), "p"));
            return LV::tensor(L.op(c.span, "patches", {L.tensor(*a.get("x"))}, at));
        };
        m["einsum"] = einsum;
        m["sgd"] = sgd;
        m["adam"] = adam;
        m["clip_norm"] = clip_norm;
        for (DType d : {DType::f16, DType::bf16, DType::f32, DType::f64, DType::i32, DType::i64})
            m[std::string(dtype_name(d))] = [d](Lowerer& L, const ast::Expr& c) {
                return cast(L, c, d);
            };
        m["positions"] = [](Lowerer& L, const ast::Expr& c) {
            Args a = match(L, c, "positions", {"x", "axis?"});
            Attrs at;
            at.set("axis", a.get("axis") ? int_attr(L, *a.get("axis"), "axis") : 1);
            return LV::tensor(L.op(c.span, "positions", {L.tensor(*a.get("x"))}, at));
        };
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
