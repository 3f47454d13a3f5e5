#include "ir/autodiff.hpp"

#include "runtime/error.hpp"

#include <optional>

namespace rag::ir {

Function differentiate(const Function& f, int of, const std::vector<int>& wrt) {
    if (of < 0 || std::size_t(of) >= f.outputs.size())
        fail("grad: ", f.name, " has no output ", of);
    const int out = f.outputs[std::size_t(of)];
    const Schema& ot = f.type(out);
    if (!is_floating(ot.dtype) || ot.shape.batched || ot.shape.sample_rank() != 0)
        fail("grad: ", f.name, " must return a floating-point scalar such as f32[], got ",
             ot.str());

    Function g = f;
    g.name = f.name + "_grad";
    // Values that depend on a differentiated input: only those carry gradients.
    std::vector<bool> dep(f.nodes.size(), false);
    for (int k : wrt) dep.at(std::size_t(f.inputs.at(std::size_t(k)))) = true;
    for (std::size_t i = 0; i < f.nodes.size(); ++i)
        for (int a : f.nodes[i].args) dep[i] = dep[i] || dep[std::size_t(a)];

    Builder b(g);
    std::vector<std::optional<int>> adj(f.nodes.size());
    adj[std::size_t(out)] = b.op("ones_like", {out});
    for (std::size_t i = std::size_t(out) + 1; i-- > 0;) {
        const Node n = f.nodes[i]; // a copy: the builder appends to g.nodes
        if (!adj[i] || !dep[i] || n.op == "input" || n.op == "const") continue;
        if (!is_floating(n.type.dtype)) continue;
        const OpDef& op = OpTable::builtin().at(n.op);
        if (!op.vjp)
            fail("grad: cannot differentiate through ", n.op,
                 n.label.empty() ? "" : " (" + n.label + ")");
        std::vector<Val> args;
        for (int a : n.args) args.push_back(Val{a});
        auto grads = op.vjp(b, args, Val{int(i)}, Val{*adj[i]}, n.attrs);
        for (std::size_t k = 0; k < n.args.size() && k < grads.size(); ++k) {
            const std::size_t a = std::size_t(n.args[k]);
            if (!grads[k] || !dep[a] || !is_floating(f.nodes[a].type.dtype)) continue;
            adj[a] = adj[a] ? b.op("add", {*adj[a], grads[k]->id}) : grads[k]->id;
        }
    }
    for (int k : wrt) {
        const int v = f.inputs[std::size_t(k)];
        g.outputs.push_back(adj[std::size_t(v)] ? *adj[std::size_t(v)] : b.op("zeros_like", {v}));
    }
    return eliminate_common_subexpressions(g);
}

} // namespace rag::ir
