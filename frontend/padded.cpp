#include "frontend/padded.hpp"

#include "ir/ops/derived_names.hpp"
#include "runtime/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace rag::frontend {

namespace {

// A fill that no valid entry loses to in a max and that vanishes under exp, yet stays finite:
// a group that is all padding (an empty sample) then gives finite garbage, not NaN, and
// garbage times a zero gradient stays zero.
double very_negative(DType t) {
    switch (t) {
    case DType::f16:
        return -65504.0;
    case DType::f64:
        return -1e300;
    default:
        return -1e30;
    }
}

int logical(const Schema& s, int per_sample) {
    return per_sample + (s.shape.batched ? 1 : 0);
}

// Ops that keep finite padded entries finite (barring overflow of finite values, which the
// ragged program would meet as well on the valid entries they mirror).
bool keeps_finite(std::string_view op) {
    static const std::set<std::string, std::less<>> ops = {
        "add",        "sub",     "mul",       "neg",     "abs",        "scale",
        "relu",       "gelu",    "silu",      "sigmoid", "tanh",       "maximum",
        "minimum",    "matmul",  "transpose", "index",   "reshape",    "concat",
        "cast",       "where",   "layernorm", "rmsnorm", "softmax",    "logsumexp",
        "attention",  "sum",     "mean",      "max",     "min",        "ones_like",
        "zeros_like", "dropout", "lengths",   "conv2d",  "avg_pool2d", "upsample2d"};
    return ops.count(op) > 0;
}

} // namespace

bool Padder::padding_finite(int x) {
    if (auto it = known_.find(x); it != known_.end()) return it->second;
    const ir::Node& n = b_.function().nodes[std::size_t(x)];
    bool finite;
    if (n.op == "const") {
        finite = std::isfinite(n.attrs.get_float("value"));
    } else if (!is_floating(n.type.dtype) || finite_.count(x)) {
        finite = true;
    } else if (n.op == "input") {
        finite = nonfinite_inputs_.count(x) == 0;
    } else {
        finite = keeps_finite(n.op);
        for (int a : n.args) finite = finite && padding_finite(a);
    }
    known_[x] = finite;
    return finite;
}

std::vector<std::string> Padder::mask_names(const std::vector<Schema>& inputs) {
    std::vector<std::string> names;
    for (const Schema& s : inputs)
        for (const Axis& a : s.shape.axes)
            if (a.is_ragged() && std::find(names.begin(), names.end(), a.name) == names.end())
                names.push_back(a.name);
    return names;
}

Padder::Padder(ir::Builder& b, const std::vector<std::string>& names) : b_(b), names_(names) {
    for (const auto& n : names_)
        inputs_.push_back(
            b_.input(Schema{DType::boolean, Shape{true, {Axis::ragged_of(n)}}}, "mask ~" + n));
}

int Padder::emit(std::string_view name, std::vector<int> args, Attrs attrs) {
    return b_.op(name, std::move(args), std::move(attrs));
}

int Padder::mask_of(const std::string& name, int like, int axis) {
    for (std::size_t k = 0; k < names_.size(); ++k)
        if (names_[k] == name) return inputs_[k];
    if (auto it = derived_masks_.find(name); it != derived_masks_.end()) return it->second;
    auto step = last_step(name);
    if (step && step->kind == DerivedStep::Kind::slice) {
        // Position i of base[e::s] is position s i + e of base, valid exactly when i is below
        // the slice's length; at the envelope the slice's extent is the derived axis's.
        const std::string spec = ":, " + (step->a ? std::to_string(step->a) : std::string()) +
                                 "::" + std::to_string(step->s);
        return derived_masks_[name] = emit("index", {mask_of(step->base)}, {{"spec", spec}});
    }
    const auto factors = product_factors(name);
    if ((step || factors) && like >= 0) {
        // base[+g], base[*m] and (a*b) are valid below L + g, m L and L_a L_b, L the valid
        // count of the axes they derive from: compare the positions along like's axis (its
        // other axes summed away: only the positions are read) with it.
        int line = like;
        for (int q = type(like).shape.sample_rank() - 1; q >= 0; --q)
            if (q != axis) line = emit("sum", {line}, {{"axis", std::int64_t(q + 1)}});
        const int pos = emit("cast", {emit("positions", {line}, {{"axis", std::int64_t(1)}})},
                             {{"dtype", std::string("f32")}});
        int L;
        if (factors) {
            L = emit("mul", {length(factors->first, true), length(factors->second, true)});
        } else {
            L = length(step->base, true);
            L = step->kind == DerivedStep::Kind::grow
                    ? emit("add", {L, constant(double(step->a), DType::f32)})
                    : emit("scale", {L}, {{"c", double(step->a)}});
        }
        const int bound = emit("index", {L}, {{"spec", std::string(":, new")}});
        return derived_masks_[name] = emit("lt", {pos, bound});
    }
    fail("padded execution: the ragged axis ~", name,
         " is not an axis of any argument, so its valid extents are unknown");
}

int Padder::length(const std::string& name, bool valid) {
    int m = emit("cast", {mask_of(name)}, {{"dtype", std::string("f32")}});
    if (!valid) m = emit("ones_like", {m});
    return emit("sum", {m}, {{"axis", std::int64_t(1)}});
}

// patches(x) of a padded image numbers its patches over the envelope's grid (N_max / p
// columns), so an image's own patches are not a prefix of ~P. As the padded baseline of the
// benchmark does (bench/images/torch_images.py), the grid's patches are gathered into the
// image's own row-major order: its patch t (t < P_b) is grid patch (t / w_b) GW + t % w_b,
// with w_b its patch columns and GW the grid's; the rest keep their place (padding). The
// arithmetic runs in f32, exact below 2^24 patches.
int Padder::patches(int x, const Attrs& attrs) {
    const int grid = emit("patches", {x}, attrs);
    const std::string P = type(grid).shape.axes[0].name;
    const auto factors = product_factors(P);
    if (!factors) fail("padded execution: internal error, patches axis ~", P);
    const int w = length(factors->second, true), GW = length(factors->second, false);
    auto col = [&](int c) { return emit("index", {c}, {{"spec", std::string(":, new")}}); };
    const int t = emit("cast", {emit("positions", {grid}, {{"axis", std::int64_t(1)}})},
                       {{"dtype", std::string("f32")}});
    const int w1 = col(emit("maximum", {w, constant(1, DType::f32)}));
    const int row =
        emit("cast", {emit("cast", {emit("div", {t, w1})}, {{"dtype", std::string("i64")}})},
             {{"dtype", std::string("f32")}}); // trunc = floor: t >= 0
    const int own = emit("add", {t, emit("mul", {row, col(emit("sub", {GW, w}))})});
    // t (not grid) stands for ~P's positions: mask_of need not sum the patch values away.
    const int at = emit("where", {mask_of(P, t, 0), own, t});
    return emit("gather", {grid, emit("cast", {at}, {{"dtype", std::string("i64")}})});
}

std::vector<int> Padder::ragged_among(int x, const std::vector<int>& axes) const {
    std::vector<int> out;
    for (int p : axes)
        if (type(x).shape.axes[std::size_t(p)].is_ragged()) out.push_back(p);
    return out;
}

// Masks multiply, as padded frameworks mask (and as bench/peers/models.py does): x * m, plus
// (1 - m) * fill for a nonzero fill, with m the [B, ~name] mask as x's dtype placed at axis p.
// Both are elementwise ops whose mask operand the JIT reads by broadcast inside the fused loop
// of x's producer or consumer, so masking costs one multiply(-add) per element, not a separate
// pass (`where` is not a fused op). inf * 0 is NaN, though: an x whose padding may not be
// finite, an infinite fill (max / min) or an integer x keeps `where`, which selects.
int Padder::masked(int x, const std::vector<int>& axes, double fill) {
    const Schema s = type(x);
    const bool multiply = is_floating(s.dtype) && std::isfinite(fill) && padding_finite(x);
    for (int p : ragged_among(x, axes)) {
        // The [B, ~name] mask placed at per-sample axis p: [B, 1, .., ~name, .., 1].
        std::string spec = ":";
        for (int q = 0; q < s.shape.sample_rank(); ++q) spec += q == p ? ", :" : ", new";
        auto place = [&](int m) { return emit("index", {m}, {{"spec", spec}}); };
        const int mask = mask_of(s.shape.axes[std::size_t(p)].name, x, p);
        if (!multiply) {
            x = emit("where", {place(mask), x, constant(fill, s.dtype)});
            continue;
        }
        const int m = emit("cast", {mask}, {{"dtype", std::string(dtype_name(s.dtype))}});
        x = emit("mul", {x, place(m)});
        if (fill != 0) {
            const int outside = emit("sub", {constant(1, s.dtype), m});
            x = emit("add", {x, place(emit("scale", {outside}, {{"c", fill}}))});
        }
    }
    return x;
}

int Padder::count(int x, const std::vector<int>& axes, bool valid) {
    const Schema s = type(x);
    int c = -1;
    double factor = 1;
    for (int p : axes) {
        const Axis& a = s.shape.axes[std::size_t(p)];
        int n;
        if (a.kind == AxisKind::fixed) {
            factor *= double(a.extent);
            continue;
        } else if (a.is_ragged()) {
            int m = emit("cast", {mask_of(a.name, x, p)}, {{"dtype", std::string("f32")}});
            if (!valid) m = emit("ones_like", {m});
            n = emit("sum", {m}, {{"axis", std::int64_t(1)}});
        } else {
            n = emit("cast", {emit("lengths", {x}, {{"axis", std::int64_t(logical(s, p))}})},
                     {{"dtype", std::string("f32")}});
        }
        c = c < 0 ? n : emit("mul", {c, n});
    }
    if (c < 0) fail("padded execution: internal error, a count over no ragged axis");
    if (factor != 1) c = emit("scale", {c}, {{"c", factor}});
    return c;
}

int Padder::valid_count(int x, const std::vector<int>& axes) {
    return count(x, axes, true);
}

int Padder::envelope_count(int x, const std::vector<int>& axes) {
    return count(x, axes, false);
}

int Padder::per_sample(int c, int like) {
    const Schema l = type(like); // a copy: emitting grows the node list
    std::string spec = ":";
    for (int q = 0; q < l.shape.sample_rank(); ++q) spec += ", new";
    if (l.shape.sample_rank() > 0) c = emit("index", {c}, {{"spec", spec}});
    if (l.dtype != DType::f32) c = emit("cast", {c}, {{"dtype", std::string(dtype_name(l.dtype))}});
    return c;
}

// sum / mean / max / min: the padding becomes the reduction's identity; a mean divides by the
// number of valid entries of its group (at least 1, so an empty group stays 0 as in ragged).
int Padder::reduction(std::string_view name, int x, const Attrs& attrs) {
    const Schema s = type(x);
    std::vector<int> axes;
    bool global = !attrs.has("axis");
    if (global || (s.shape.batched && (attrs.get_int("axis") == 0 ||
                                       attrs.get_int("axis") == -s.shape.logical_rank()))) {
        for (int p = 0; p < s.shape.sample_rank(); ++p) axes.push_back(p);
    } else {
        std::int64_t a = attrs.get_int("axis");
        if (a < 0) a += s.shape.logical_rank();
        if (a >= 1 && a < s.shape.logical_rank()) axes.push_back(int(a - 1));
    }
    if (!s.shape.batched || ragged_among(x, axes).empty()) return emit(name, {x}, attrs);
    double fill = 0;
    if (name == "max" || name == "min") {
        if (!is_floating(s.dtype))
            fail("padded execution: ", name, " of integers over a ragged axis is not supported");
        fill = name == "max" ? -std::numeric_limits<double>::infinity()
                             : std::numeric_limits<double>::infinity();
    }
    const int xm = masked(x, axes, fill);
    if (name != "mean") return emit(name, {xm}, attrs);
    int r = emit("sum", {xm}, attrs);
    int c = valid_count(x, axes);
    if (global) c = emit("sum", {c});
    c = emit("maximum", {c, constant(1, DType::f32)});
    if (!global) {
        const int out = emit("div", {r, per_sample(c, r)}); // over a count >= 1
        if (padding_finite(r)) finite_.insert(out);
        return out;
    }
    if (s.dtype != DType::f32) c = emit("cast", {c}, {{"dtype", std::string(dtype_name(s.dtype))}});
    return emit("div", {r, c});
}

// Causal attention keeps key j for query i iff j <= i (both counted from the sample's start,
// so padding never comes between): scores s with queries on logical axis n and keys on n + 1
// lose the rest. The comparison runs on [B, 1.., ~N, ~M] positions as f32 (a fused loop), not
// on every head's scores.
int Padder::causal(int s, int n, const std::string& queries, const std::string& keys) {
    const Schema st = type(s);
    auto placed = [&](const std::string& name, int at) {
        int pos = emit("positions", {mask_of(name)}, {{"axis", std::int64_t(1)}});
        pos = emit("cast", {pos}, {{"dtype", std::string("f32")}});
        std::string spec = ":";
        for (int a = 1; a < st.shape.logical_rank(); ++a) spec += a == at ? ", :" : ", new";
        return emit("index", {pos}, {{"spec", spec}});
    };
    // One mask per shape and axis pair serves every layer of the function.
    const std::string key = queries + "|" + keys + "|" + std::to_string(n) + "|" +
                            std::to_string(st.shape.logical_rank());
    auto it = causal_masks_.find(key);
    if (it == causal_masks_.end())
        it =
            causal_masks_.emplace(key, emit("le", {placed(keys, n + 1), placed(queries, n)})).first;
    return emit("where", {it->second, s, constant(very_negative(st.dtype), st.dtype)});
}

// softmax(q k^T * scale) v as padded frameworks run it: scores materialised over the envelope
// (B, H, N_max, M_max), padded keys masked out before the softmax.
int Padder::attention(int q, int k, int v, const Attrs& attrs) {
    const Schema qs = type(q); // a copy: emitting grows the node list
    const double D = double(qs.shape.axes.back().extent);
    const double scale = attrs.get_float("scale", 1.0 / std::sqrt(D));
    auto T = [&](int x, std::int64_t a, std::int64_t b) {
        return emit("transpose", {x}, {{"a", a}, {"b", b}});
    };
    int qt = T(q, 1, 2);              // [B, H, ~N, D]
    int kt = T(T(k, 1, 2), 2, 3);     // [B, H, D, ~M]
    int s = emit("matmul", {qt, kt}); // [B, H, ~N, ~M]
    s = emit("scale", {s}, {{"c", scale}});
    s = masked(s, {2}, very_negative(qs.dtype));
    if (attrs.get_bool("causal", false))
        s = causal(s, 2, qs.shape.axes[0].name, type(k).shape.axes[0].name);
    int p = emit("softmax", {s}, {{"axis", std::int64_t(3)}});
    int o = emit("matmul", {p, T(v, 1, 2)}); // [B, H, ~N, Dv]; padded keys have p = 0
    return T(o, 1, 2);                       // [B, ~N, H, Dv]
}

// attention with a bias as padded frameworks run it: the logits of every row materialised over
// the envelope ([B, H, N_max, M_max] on singles, [B, N_max, H, N_max, N_max] on pair states),
// the bias added, padded keys masked out before the softmax.
int Padder::biased_attention(int q, int k, int v, int bias, const Attrs& attrs) {
    const Schema qs = type(q); // a copy: emitting grows the node list
    const double D = double(qs.shape.axes.back().extent);
    const double scale = attrs.get_float("scale", 1.0 / std::sqrt(D));
    const std::int64_t r = attrs.get_int("axis", 1) - 1; // 1 on pair states: rows lead
    auto T = [&](int x, std::int64_t a, std::int64_t b) {
        return emit("transpose", {x}, {{"a", a}, {"b", b}});
    };
    int qt = T(q, r + 1, r + 2);                  // [B, (R,) H, ~N, D]
    int kt = T(T(k, r + 1, r + 2), r + 2, r + 3); // [B, (R,) H, D, ~M]
    int s = emit("scale", {emit("matmul", {qt, kt})}, {{"c", scale}});
    int b = T(T(bias, 1, 3), 2, 3);                                        // [B, H, ~N, ~M]
    if (r == 1) b = emit("index", {b}, {{"spec", std::string(":, new")}}); // [B, 1, H, ~N, ~M]
    s = masked(emit("add", {s, b}), {int(r + 2)}, very_negative(qs.dtype));
    if (attrs.get_bool("causal", false))
        s = causal(s, int(r + 2), qs.shape.axes[std::size_t(r)].name,
                   type(k).shape.axes[std::size_t(r)].name);
    int p = emit("softmax", {s}, {{"axis", r + 3}});
    int o = emit("matmul", {p, T(v, r + 1, r + 2)}); // padded keys have p = 0
    return T(o, r + 1, r + 2);
}

// cross_entropy / mse average over every position: with the padding set to 0 each padded
// position adds a known constant (log K for cross-entropy, 0 for mse), which is taken out
// again, and the mean is over the valid positions.
int Padder::mean_loss(std::string_view name, std::vector<int> args, int positions_of) {
    const Schema ps = type(positions_of);
    std::vector<int> axes;
    for (int p = 0; p < ps.shape.sample_rank(); ++p) axes.push_back(p);
    if (!ps.shape.batched || ragged_among(positions_of, axes).empty()) return emit(name, args);
    const DType dt = type(args[0]).dtype;
    auto as_dt = [&](int c) {
        return dt == DType::f32 ? c : emit("cast", {c}, {{"dtype", std::string(dtype_name(dt))}});
    };
    args[0] = masked(args[0], ragged_among(positions_of, axes), 0);
    if (name == "mse") args[1] = masked(args[1], ragged_among(positions_of, axes), 0);
    const int all = emit(name, args);
    const int T = as_dt(emit("sum", {envelope_count(positions_of, axes)}));
    const int V = as_dt(emit("sum", {valid_count(positions_of, axes)}));
    int total = emit("mul", {all, T});
    if (name == "cross_entropy") {
        const double logK = std::log(double(type(args[0]).shape.axes.back().extent));
        total = emit("sub", {total, emit("scale", {emit("sub", {T, V})}, {{"c", logK}})});
    }
    return emit("div", {total, emit("maximum", {V, constant(1, dt)})});
}

int Padder::op(std::string_view name, std::vector<int> args, const Attrs& attrs) {
    if (name == "sum" || name == "mean" || name == "max" || name == "min")
        return reduction(name, args[0], attrs);
    if (name == "softmax" || name == "logsumexp") {
        const Schema& s = type(args[0]);
        if (s.shape.batched && attrs.has("axis")) {
            std::int64_t a = attrs.get_int("axis");
            if (a < 0) a += s.shape.logical_rank();
            if (a >= 1 && a < s.shape.logical_rank())
                args[0] = masked(args[0], {int(a - 1)}, very_negative(s.dtype));
        }
        return emit(name, args, attrs);
    }
    if (name == "attention") return attention(args.at(0), args.at(1), args.at(2), attrs);
    if (name == "cross_entropy") return mean_loss(name, args, args.at(1));
    if (name == "mse") return mean_loss(name, args, args.at(0));
    if (name == "matmul" && args.size() == 2 && type(args[1]).shape.batched) {
        // A per-sample product contracting a's last axis: padded entries there must add 0.
        const Schema& a = type(args[0]);
        if (a.shape.batched && a.shape.sample_rank() > 0)
            args[0] = masked(args[0], {a.shape.sample_rank() - 1}, 0);
        return emit(name, args, attrs);
    }
    if (name == "lengths") {
        const Schema& s = type(args.at(0));
        std::int64_t a = attrs.get_int("axis");
        if (a < 0) a += s.shape.logical_rank();
        if (s.shape.batched && a >= 1 && a < s.shape.logical_rank() &&
            s.shape.axes[std::size_t(a - 1)].is_ragged())
            return emit("cast", {valid_count(args[0], {int(a - 1)})},
                        {{"dtype", std::string("i64")}});
        return emit(name, args, attrs);
    }
    if (name == "biased_attention")
        return biased_attention(args.at(0), args.at(1), args.at(2), args.at(3), attrs);
    if (name == "pad" || name == "unpad" || name == "mask" || name == "relpos_attention")
        fail("padded execution does not support ", name, " yet");
    // A window reads zeros (max pooling: -inf) outside its image, as the ragged op does, so
    // its input's padding is masked first; a window inside the image then reads what the
    // ragged op reads, and the derived result axes are valid up to the same per-image lengths.
    // Nearest upsampling reads valid pixels only for valid results.
    if (name == "conv2d" || name == "avg_pool2d" || name == "max_pool2d") {
        const bool max = name == "max_pool2d";
        args[0] = masked(args[0], {1, 2}, max ? -std::numeric_limits<double>::infinity() : 0.0);
        return emit(name, std::move(args), attrs);
    }
    if (name == "patches") return patches(args.at(0), attrs);
    return emit(name, std::move(args), attrs);
}

} // namespace rag::frontend
