// Elementwise ops: unary math, broadcasting binary arithmetic, comparisons, where, and the
// helpers their VJPs use (sum_to, scale, zeros_like, ones_like, cast).
#include "ir/ops/broadcast.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace rag {
namespace {

using kern::broadcast_apply;
using kern::broadcast_shapes;

struct Unary {
    const char* name;
    const char* doc;
    double (*f)(double);
    double (*df)(double x, double y); // derivative from the input x and the output y
};

double sigmoid(double x) {
    return 1.0 / (1.0 + std::exp(-x));
}
double normal_cdf(double x) {
    return 0.5 * std::erfc(-x / std::numbers::sqrt2);
}

const Unary unary_ops[] = {
    {"neg", "-x", [](double x) { return -x; }, [](double, double) { return -1.0; }},
    {"exp", "e^x", [](double x) { return std::exp(x); }, [](double, double y) { return y; }},
    {"log", "natural logarithm", [](double x) { return std::log(x); },
     [](double x, double) { return 1.0 / x; }},
    {"sqrt", "square root", [](double x) { return std::sqrt(x); },
     [](double, double y) { return 0.5 / y; }},
    {"rsqrt", "1 / sqrt(x)", [](double x) { return 1.0 / std::sqrt(x); },
     [](double x, double y) { return -0.5 * y / x; }},
    {"abs", "|x|", [](double x) { return std::fabs(x); },
     [](double x, double) { return x > 0   ? 1.0
                                   : x < 0 ? -1.0
                                           : 0.0; }},
    {"tanh", "hyperbolic tangent", [](double x) { return std::tanh(x); },
     [](double, double y) { return 1.0 - y * y; }},
    {"sigmoid", "1 / (1 + e^-x)", sigmoid, [](double, double y) { return y * (1.0 - y); }},
    {"relu", "max(x, 0)", [](double x) { return x > 0 ? x : 0.0; },
     [](double x, double) { return x > 0 ? 1.0 : 0.0; }},
    {"gelu", "x * Phi(x), the exact (erf) form", [](double x) { return x * normal_cdf(x); },
     [](double x, double) {
         return normal_cdf(x) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi);
     }},
    {"silu", "x * sigmoid(x)", [](double x) { return x * sigmoid(x); },
     [](double x, double) {
         double s = sigmoid(x);
         return s * (1.0 + x * (1.0 - s));
     }},
};

const Unary* find_unary(std::string_view name) {
    for (const Unary& u : unary_ops)
        if (name == u.name) return &u;
    fail("unary_grad: unknown function '", name, "'");
}

Schema float_same(std::span<const Schema> in, std::string_view op) {
    kern::require_float(in[0], op);
    return in[0];
}

Schema broadcast_rule(std::span<const Schema> in, std::string_view op, DType out) {
    kern::require_same_dtype(in, op);
    std::vector<Shape> shapes;
    for (const auto& s : in) shapes.push_back(s.shape);
    return {out, broadcast_shapes(shapes, op)};
}

void add_unary(OpTable& t, const Unary& u) {
    std::string name = u.name;
    t.add({name, 1, 1, u.doc, [name](auto in, auto&) { return float_same(in, name); },
           [f = u.f](auto in, auto&) { return kern::map_values(in[0], in[0].dtype(), f); },
           [name](Emitter& e, auto in, Val out, Val g, auto&) -> std::vector<std::optional<Val>> {
               return {e.emit("unary_grad", {in[0], out, g}, {{"fn", name}})};
           }});
}

// Gradient of a broadcasting binary op with respect to one operand, before sum_to.
struct Binary {
    const char* name;
    const char* doc;
    double (*f)(double, double);
    double (*da)(double a, double b, double y); // dy/da
    double (*db)(double a, double b, double y); // dy/db
};

const Binary binary_ops[] = {
    {"add", "a + b", [](double a, double b) { return a + b; }, nullptr, nullptr},
    {"sub", "a - b", [](double a, double b) { return a - b; }, nullptr, nullptr},
    {"mul", "a * b", [](double a, double b) { return a * b; }, nullptr, nullptr},
    {"div", "a / b", [](double a, double b) { return a / b; }, nullptr, nullptr},
    {"pow", "a ** b", [](double a, double b) { return std::pow(a, b); },
     [](double a, double b, double) { return b == 0 ? 0.0 : b * std::pow(a, b - 1); },
     [](double a, double, double y) { return a > 0 ? y * std::log(a) : 0.0; }},
    {"maximum", "elementwise max; ties send the gradient to a",
     [](double a, double b) { return a >= b ? a : b; },
     [](double a, double b, double) { return a >= b ? 1.0 : 0.0; },
     [](double a, double b, double) { return a >= b ? 0.0 : 1.0; }},
    {"minimum", "elementwise min; ties send the gradient to a",
     [](double a, double b) { return a <= b ? a : b; },
     [](double a, double b, double) { return a <= b ? 1.0 : 0.0; },
     [](double a, double b, double) { return a <= b ? 0.0 : 1.0; }},
};

const Binary* find_binary(std::string_view name) {
    for (const Binary& b : binary_ops)
        if (name == b.name) return &b;
    fail("binary_grad: unknown function '", name, "'");
}

std::vector<std::optional<Val>> binary_vjp(Emitter& e, std::string_view name,
                                           std::span<const Val> in, Val out, Val g) {
    // Only an operand that was broadcast needs its cotangent summed back.
    auto sum_to = [&](Val v, Val like) {
        return e.schema(v) == e.schema(like) ? v : e.emit("sum_to", {v, like});
    };
    Val a = in[0], b = in[1];
    if (name == "add") return {sum_to(g, a), sum_to(g, b)};
    if (name == "sub") return {sum_to(g, a), sum_to(e.emit("neg", {g}), b)};
    if (name == "mul") return {sum_to(e.emit("mul", {g, b}), a), sum_to(e.emit("mul", {g, a}), b)};
    if (name == "div") {
        Val ga = e.emit("div", {g, b});
        return {sum_to(ga, a), sum_to(e.emit("neg", {e.emit("mul", {ga, out})}), b)};
    }
    auto part = [&](std::int64_t wrt) {
        return e.emit("binary_grad", {a, b, out, g}, {{"fn", std::string(name)}, {"wrt", wrt}});
    };
    return {sum_to(part(0), a), sum_to(part(1), b)};
}

void add_binary(OpTable& t, const Binary& op) {
    std::string name = op.name;
    t.add({name, 2, 2, op.doc,
           [name](auto in, auto&) {
               kern::require_float(in[0], name);
               return broadcast_rule(in, name, in[0].dtype);
           },
           [name, f = op.f](auto in, auto&) {
               return broadcast_apply(in, in[0].dtype(), name,
                                      [f](const double* x) { return f(x[0], x[1]); });
           },
           [name](Emitter& e, auto in, Val out, Val g, auto&) {
               return binary_vjp(e, name, in, out, g);
           }});
}

void add_comparison(OpTable& t, const char* name, const char* doc, bool (*f)(double, double)) {
    std::string n = name;
    t.add({n,
           2,
           2,
           doc,
           [n](auto in, auto&) { return broadcast_rule(in, n, DType::boolean); },
           [n, f](auto in, auto&) {
               return broadcast_apply(in, DType::boolean, n,
                                      [f](const double* x) { return f(x[0], x[1]) ? 1.0 : 0.0; });
           },
           {}});
}

DType cast_dtype(const Attrs& at) {
    auto d = parse_dtype(at.get_str("dtype"));
    if (!d) fail("cast: unknown dtype '", at.get_str("dtype"), "'");
    return *d;
}

// Integer to integer (and to or from bool) directly, so i64 values beyond 2^53 survive; every
// other pair goes through double, whose stores follow the rules in the doc line
// (runtime/dtype.hpp's store_from_f64), except i64 to f32, converted directly so it rounds
// once.
RaggedTensor cast_kernel(const RaggedTensor& x, DType to) {
    const DType from = x.dtype();
    const bool int_from = !is_floating(from), int_to = !is_floating(to);
    if (!(int_from && int_to) && !(from == DType::i64 && to == DType::f32)) return x.astype(to);
    RaggedTensor y = RaggedTensor::zeros(to, x.structure_ptr());
    auto load = [&](std::int64_t k) -> std::int64_t {
        switch (from) {
        case DType::i32:
            return static_cast<const std::int32_t*>(x.data())[k];
        case DType::i64:
            return static_cast<const std::int64_t*>(x.data())[k];
        default:
            return static_cast<const std::uint8_t*>(x.data())[k] != 0;
        }
    };
    for (std::int64_t k = 0; k < x.numel(); ++k) {
        const std::int64_t v = load(k);
        switch (to) {
        case DType::i32:
            static_cast<std::int32_t*>(y.mutable_data())[k] =
                std::int32_t(std::clamp<std::int64_t>(v, std::numeric_limits<std::int32_t>::min(),
                                                      std::numeric_limits<std::int32_t>::max()));
            break;
        case DType::i64:
            static_cast<std::int64_t*>(y.mutable_data())[k] = v;
            break;
        case DType::f32:
            static_cast<float*>(y.mutable_data())[k] = float(v);
            break;
        default:
            static_cast<std::uint8_t*>(y.mutable_data())[k] = v != 0;
            break;
        }
    }
    return y;
}

} // namespace

void register_elementwise_ops(OpTable& t) {
    for (const Unary& u : unary_ops) add_unary(t, u);
    for (const Binary& b : binary_ops) add_binary(t, b);
    add_comparison(t, "lt", "a < b", [](double a, double b) { return a < b; });
    add_comparison(t, "le", "a <= b", [](double a, double b) { return a <= b; });
    add_comparison(t, "gt", "a > b", [](double a, double b) { return a > b; });
    add_comparison(t, "ge", "a >= b", [](double a, double b) { return a >= b; });
    add_comparison(t, "eq", "a == b", [](double a, double b) { return a == b; });
    add_comparison(t, "ne", "a != b", [](double a, double b) { return a != b; });

    t.add({"where", 3, 3, "where(cond, a, b): a where cond is true, else b; broadcasts",
           [](auto in, auto&) {
               if (in[0].dtype != DType::boolean)
                   fail("where: the condition must be bool, got ", in[0].str());
               kern::require_same_dtype(in.subspan(1), "where");
               std::vector<Shape> shapes{in[0].shape, in[1].shape, in[2].shape};
               return Schema{in[1].dtype, broadcast_shapes(shapes, "where")};
           },
           [](auto in, auto&) {
               return broadcast_apply(in, in[1].dtype(), "where",
                                      [](const double* x) { return x[0] != 0 ? x[1] : x[2]; });
           },
           [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
               Val zero = e.emit("zeros_like", {g});
               return {std::nullopt, e.emit("sum_to", {e.emit("where", {in[0], g, zero}), in[1]}),
                       e.emit("sum_to", {e.emit("where", {in[0], zero, g}), in[2]})};
           }});

    t.add({"sum_to",
           2,
           2,
           "sum_to(g, like): g summed over the axes along which like broadcast",
           [](auto in, auto&) {
               // like must broadcast to g's shape.
               std::vector<Shape> shapes{in[0].shape, in[1].shape};
               if (broadcast_shapes(shapes, "sum_to") != in[0].shape)
                   fail("sum_to: ", in[1].str(), " does not broadcast to ", in[0].str());
               return in[1];
           },
           [](auto in, auto&) { return kern::sum_to(in[0].astype(in[1].dtype()), in[1]); },
           [](Emitter& e, auto in, Val, Val g, auto&) -> std::vector<std::optional<Val>> {
               // sum_to's adjoint broadcasts g back: g + zeros shaped like the first input.
               return {e.emit("add", {e.emit("zeros_like", {in[0]}), g}), std::nullopt};
           },
           {1}});

    t.add({"unary_grad",
           3,
           3,
           "unary_grad(x, y, g, fn=name): g * fn'(x) given y = fn(x)",
           [](auto in, auto& at) {
               find_unary(at.get_str("fn"));
               return in[2];
           },
           [](auto in, auto& at) {
               const Unary* u = find_unary(at.get_str("fn"));
               auto x = in[0].to_f64(), y = in[1].to_f64(), g = in[2].to_f64();
               for (std::size_t k = 0; k < g.size(); ++k) g[k] *= u->df(x[k], y[k]);
               return RaggedTensor::from_f64(in[2].dtype(), in[2].structure_ptr(), g);
           },
           {}});

    t.add({"binary_grad",
           4,
           4,
           "binary_grad(a, b, y, g, fn=name, wrt=0|1): g * dy/da (or dy/db), broadcast shape",
           [](auto in, auto& at) {
               find_binary(at.get_str("fn"));
               return in[3];
           },
           [](auto in, auto& at) {
               const Binary* op = find_binary(at.get_str("fn"));
               auto d = at.get_int("wrt") == 0 ? op->da : op->db;
               return broadcast_apply(in, in[3].dtype(), "binary_grad",
                                      [d](const double* x) { return x[3] * d(x[0], x[1], x[2]); });
           },
           {}});

    t.add({"scale", 1, 1, "scale(x, c=number): c * x",
           [](auto in, auto& at) {
               at.get_float("c");
               return float_same(in, "scale");
           },
           [](auto in, auto& at) {
               double c = at.get_float("c");
               return kern::map_values(in[0], in[0].dtype(), [c](double x) { return c * x; });
           },
           [](Emitter& e, auto, Val, Val g, auto& at) -> std::vector<std::optional<Val>> {
               return {e.emit("scale", {g}, at)};
           }});

    for (auto [name, value] : {std::pair{"zeros_like", 0.0}, std::pair{"ones_like", 1.0}}) {
        t.add({name, 1, 1, "a tensor of the same schema and structure filled with a constant",
               [](auto in, auto&) { return in[0]; },
               [value](auto in, auto&) {
                   return kern::map_values(in[0], in[0].dtype(), [value](double) { return value; });
               },
               [](Emitter&, auto, Val, Val, auto&) -> std::vector<std::optional<Val>> {
                   return {std::nullopt};
               }});
    }

    t.add({"cast", 1, 1,
           "cast(x, dtype=f16|bf16|f32|f64|i32|i64|bool): convert the element type. Float to "
           "integer truncates toward zero, NaN gives 0, values beyond the integer's range "
           "(infinities included) saturate to its limits; i64 to i32 saturates too; integers "
           "and bool to float are exact where the float holds them (else round to nearest even); "
           "to bool is x != 0 (NaN gives true); f64 to f16/bf16 rounds through f32. Gradients "
           "flow only from a float result to a float input (cast back to its dtype)",
           [](auto in, auto& at) {
               return Schema{cast_dtype(at), in[0].shape};
           },
           [](auto in, auto& at) { return cast_kernel(in[0], cast_dtype(at)); },
           [](Emitter& e, auto in, Val out, Val g, auto&) -> std::vector<std::optional<Val>> {
               const DType from = e.schema(in[0]).dtype;
               if (!is_floating(from) || !is_floating(e.schema(out).dtype)) return {std::nullopt};
               return {e.emit("cast", {g}, {{"dtype", std::string(dtype_name(from))}})};
           }});
}

} // namespace rag
