#include "jit/plan.hpp"

#include "jit/attention_cpu.hpp"
#include "jit/batched_gemm.hpp"
#include "jit/biased_attention_cpu.hpp"
#include "jit/conv.hpp"
#include "jit/gather.hpp"
#include "jit/layout.hpp"
#include "jit/nn_steps.hpp"
#include "jit/rowwise.hpp"
#include "jit/segmented.hpp"

#include <set>
#include <sstream>

namespace rag::jit {
namespace {

const std::set<std::string, std::less<>> fusable = {
    "neg",   "exp",        "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "relu",
    "gelu",  "silu",       "add", "sub",  "mul",   "div", "pow",  "maximum", "minimum",
    "scale", "unary_grad", "lt",  "le",   "gt",    "ge",  "eq",   "ne",      "where"};

bool is_comparison(std::string_view op) {
    return op == "lt" || op == "le" || op == "gt" || op == "ge" || op == "eq" || op == "ne";
}

// The float type a fused loop computes node n in: its operands' for a comparison (its result
// is bool, held as 0/1), its own otherwise.
DType loop_dtype(const ir::Function& f, const ir::Node& n) {
    return is_comparison(n.op) ? f.type(n.args[0]).dtype : n.type.dtype;
}

bool is_one(const Axis& a) {
    return a.kind == AxisKind::fixed && a.extent == 1;
}

// A batched operand broadcast to `out` along extent-1 axes: gather when its non-ragged axes
// (the row elements) are out's, gather_bcast when it is 1 on all of them.
std::optional<Access> gather_access(const Shape& in, const Shape& out) {
    if (!out.batched || in.sample_rank() != out.sample_rank()) return std::nullopt;
    bool same_row = true, one_row = true;
    for (std::size_t a = 0; a < in.axes.size(); ++a) {
        const Axis &x = in.axes[a], &y = out.axes[a];
        if (!(x == y) && !is_one(x)) return std::nullopt;
        if (y.is_ragged()) continue;
        same_row = same_row && x == y;
        one_row = one_row && is_one(x);
    }
    if (same_row) return Access::gather;
    if (one_row) return Access::gather_bcast;
    return std::nullopt;
}

// How a fused loop over `out` values can read `in`, if it can (shapes only: fusable_node checks
// that every operand is of the loop's float type or bool).
std::optional<Access> access(const Schema& in, const Schema& out) {
    if (in.shape == out.shape) return Access::full;
    if (in.shape.batched) return gather_access(in.shape, out.shape);
    if (in.shape.axes.empty()) return Access::scalar;
    // An unbatched array equal to the trailing static axes of the loop's shape: those axes
    // are the innermost storage positions, so the operand repeats every prod(extents).
    const auto& a = in.shape.axes;
    const auto& o = out.shape.axes;
    if (a.size() > o.size()) return std::nullopt;
    for (std::size_t k = 0; k < a.size(); ++k) {
        const Axis& x = a[k];
        const Axis& y = o[o.size() - a.size() + k];
        if (x.kind != AxisKind::fixed || !(x == y)) return std::nullopt;
    }
    return Access::row;
}

bool fusable_node(const ir::Function& f, const ir::Node& n) {
    if (!fusable.count(n.op)) return false;
    const DType t = loop_dtype(f, n);
    if (t != DType::f32 && t != DType::f64) return false;
    if (n.type.dtype != t && n.type.dtype != DType::boolean) return false;
    // Operands of the loop's type; bool only where a condition is read.
    for (std::size_t k = 0; k < n.args.size(); ++k) {
        const DType a = f.type(n.args[k]).dtype;
        if (a != t && !(a == DType::boolean && n.op == "where" && k == 0)) return false;
    }
    for (int a : n.args)
        if (!access(f.type(a), n.type)) return false;
    // The loop's structure comes from its full and gather operands.
    for (int a : n.args) {
        auto x = access(f.type(a), n.type);
        if (x == Access::full || x == Access::gather || x == Access::gather_bcast) return true;
    }
    return false;
}

} // namespace

bool is_relpos_step(const ir::Function& f, const ir::Node& n) {
    return (n.op == "relpos_attention" || n.op == "relpos_attention_grad") &&
           f.type(n.args[0]).dtype != DType::f64;
}

bool is_fusable_op(std::string_view op) {
    return fusable.count(op) > 0;
}

Plan make_plan(const ir::Function& f) {
    Plan p;
    std::vector<int> group_of(f.nodes.size(), -1);
    std::vector<bool> done(f.nodes.size(), false); // computed by an earlier rowwise step
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
        const ir::Node& n = f.nodes[i];
        if (n.op == "input" || n.op == "const" || done[i]) continue;
        if (fusable_node(f, n)) {
            // Extend the group of the previous step when it has this shape and dtype.
            bool extend = !p.steps.empty() && p.steps.back().kind == Step::Kind::fused;
            if (extend) {
                const FusedGroup& g = p.groups[std::size_t(p.steps.back().index)];
                const Schema& t = f.type(g.nodes.front());
                extend = t.shape == n.type.shape && g.dtype == loop_dtype(f, n);
            }
            if (!extend) {
                p.groups.push_back({{}, {}, {}, loop_dtype(f, n)});
                p.steps.push_back({Step::Kind::fused, int(p.groups.size()) - 1, {}});
            }
            p.groups.back().nodes.push_back(int(i));
            group_of[i] = int(p.groups.size()) - 1;
            continue;
        }
        if (is_rowwise(n) || is_attention(n) || is_biased_attention(n)) {
            // layernorm_grad (attention_grad) wrt=0, 1, 2 of one call: one pass computes them.
            const bool rows = is_rowwise(n);
            Step s{rows ? Step::Kind::rowwise : Step::Kind::attention, int(i), {}};
            for (std::size_t j = i + 1; j < f.nodes.size(); ++j)
                if (rows ? same_norm_grad(n, f.nodes[j]) : same_attention_grad(n, f.nodes[j])) {
                    s.also.push_back(int(j));
                    done[j] = true;
                }
            p.steps.push_back(std::move(s));
            continue;
        }
        const Schema& t = n.type;
        const bool float_type = t.dtype == DType::f32 || t.dtype == DType::f64;
        bool gemm = (float_type && ((n.op == "matmul" && !f.type(n.args[1]).shape.batched) ||
                                    n.op == "matmul_weight_grad")) ||
                    is_batched_gemm(f, n);
        p.steps.push_back({gemm                                    ? Step::Kind::gemm
                           : is_relpos_step(f, n)                  ? Step::Kind::relpos
                           : is_segmented(f, n)                    ? Step::Kind::segmented
                           : layout_kind(f, n) != LayoutKind::none ? Step::Kind::layout
                           : is_gather_step(n)                     ? Step::Kind::gather
                           : is_image_step(f, n)                   ? Step::Kind::image
                           : is_nn_step(n)                         ? Step::Kind::nn
                                                                   : Step::Kind::reference,
                           int(i),
                           {}});
    }
    // Inputs (values from outside the group) and outputs (values used outside or returned).
    std::vector<bool> used_outside(f.nodes.size(), false);
    for (int o : f.outputs) used_outside[std::size_t(o)] = true;
    for (std::size_t i = 0; i < f.nodes.size(); ++i)
        for (int a : f.nodes[i].args)
            if (group_of[std::size_t(a)] < 0 || group_of[std::size_t(a)] != group_of[i])
                used_outside[std::size_t(a)] = true;
    for (std::size_t g = 0; g < p.groups.size(); ++g) {
        FusedGroup& grp = p.groups[g];
        std::set<int> seen;
        for (int v : grp.nodes) {
            const ir::Node& n = f.nodes[std::size_t(v)];
            for (int a : n.args)
                if (group_of[std::size_t(a)] != int(g) && seen.insert(a).second)
                    grp.inputs.push_back({a, *access(f.type(a), n.type)});
            if (used_outside[std::size_t(v)]) grp.outputs.push_back(v);
        }
    }
    return p;
}

std::string print(const Plan& p, const ir::Function& f) {
    std::ostringstream os;
    for (const Step& s : p.steps) {
        if (s.kind != Step::Kind::fused) {
            const ir::Node& n = f.nodes[std::size_t(s.index)];
            os << (s.kind == Step::Kind::gemm        ? "gemm      %"
                   : s.kind == Step::Kind::segmented ? "segmented %"
                   : s.kind == Step::Kind::rowwise   ? "rowwise   %"
                   : s.kind == Step::Kind::attention ? "attention %"
                   : s.kind == Step::Kind::gather
                       ? (n.op == "positions" ? "positions %" : "gather    %")
                   : s.kind == Step::Kind::relpos ? "relpos    %"
                   : s.kind == Step::Kind::image  ? "image     %"
                   : s.kind == Step::Kind::nn     ? "nn        %"
                   : s.kind == Step::Kind::layout
                       ? (layout_kind(f, n) == LayoutKind::view    ? "view      %"
                          : layout_kind(f, n) == LayoutKind::slice ? "slice     %"
                                                                   : "permute   %")
                       : "reference %")
               << s.index;
            for (int a : s.also) os << " %" << a;
            os << " = " << n.op << "\n";
            continue;
        }
        const FusedGroup& g = p.groups[std::size_t(s.index)];
        os << "fused     ";
        for (std::size_t k = 0; k < g.nodes.size(); ++k)
            os << (k ? " " : "") << f.nodes[std::size_t(g.nodes[k])].op;
        os << "  in:";
        for (const auto& in : g.inputs)
            os << " %" << in.value
               << (in.access == Access::full           ? ""
                   : in.access == Access::row          ? "(row)"
                   : in.access == Access::gather       ? "(gather)"
                   : in.access == Access::gather_bcast ? "(gather bcast)"
                                                       : "(scalar)");
        os << "  out:";
        for (int o : g.outputs) os << " %" << o;
        os << "\n";
    }
    return os.str();
}

} // namespace rag::jit
