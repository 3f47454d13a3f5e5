#include "ir/autodiff.hpp"

#include "runtime/error.hpp"

#include <algorithm>
#include <optional>

namespace rag::ir {

namespace {

// Appends to g the reverse pass over its first `n` nodes (the forward), from the adjoints in
// `seeds` (node, adjoint value); returns the adjoint of each node in `wrt` (nullopt where no
// seed depends on it). Only values that depend on a `wrt` node carry gradients.
std::vector<std::optional<int>> reverse(Function& g, std::size_t n,
                                        const std::vector<std::pair<int, int>>& seeds,
                                        const std::vector<int>& wrt) {
    std::vector<bool> dep(n, false);
    for (int v : wrt) dep.at(std::size_t(v)) = true;
    for (std::size_t i = 0; i < n; ++i)
        for (int a : g.nodes[i].args) dep[i] = dep[i] || dep[std::size_t(a)];
    Builder b(g);
    std::vector<std::optional<int>> adj(n);
    std::size_t last = 0;
    for (auto [node, a] : seeds) {
        const auto v = std::size_t(node);
        adj[v] = adj[v] ? b.op("add", {*adj[v], a}) : a;
        last = std::max(last, v);
    }
    for (std::size_t i = last + 1; i-- > 0;) {
        const Node node = g.nodes[i]; // a copy: the builder appends to g.nodes
        if (!adj[i] || !dep[i] || node.op == "input" || node.op == "const") continue;
        if (!is_floating(node.type.dtype)) continue;
        const OpDef& op = OpTable::builtin().at(node.op);
        if (!op.vjp)
            fail("grad: cannot differentiate through ", node.op,
                 node.label.empty() ? "" : " (" + node.label + ")");
        std::vector<Val> args;
        for (int a : node.args) args.push_back(Val{a});
        auto grads = op.vjp(b, args, Val{int(i)}, Val{*adj[i]}, node.attrs);
        for (std::size_t k = 0; k < node.args.size() && k < grads.size(); ++k) {
            const std::size_t a = std::size_t(node.args[k]);
            if (!grads[k] || !dep[a] || !is_floating(g.nodes[a].type.dtype)) continue;
            adj[a] = adj[a] ? b.op("add", {*adj[a], grads[k]->id}) : grads[k]->id;
        }
    }
    std::vector<std::optional<int>> out;
    for (int v : wrt) out.push_back(adj[std::size_t(v)]);
    return out;
}

} // namespace

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
    const std::size_t n = g.nodes.size();
    // The seed dL/dL = 1 is a constant, not ones_like(L): nothing then reads L's value, so a
    // gradient that does not return L never computes the loss's last step (a cross entropy's
    // log-sum-exp over every row, say).
    const int seed = Builder(g).constant(1.0, ot.dtype);
    std::vector<int> inputs;
    for (int k : wrt) inputs.push_back(f.inputs.at(std::size_t(k)));
    auto adj = reverse(g, n, {{out, seed}}, inputs);
    Builder b(g);
    for (std::size_t k = 0; k < inputs.size(); ++k)
        g.outputs.push_back(adj[k] ? *adj[k] : b.op("zeros_like", {inputs[k]}));
    return eliminate_common_subexpressions(g);
}

Function vjp(const Function& f, const std::vector<int>& seeded, const std::vector<int>& wrt) {
    Function g = f;
    g.name = f.name + "_vjp";
    g.outputs.clear();
    const std::size_t n = g.nodes.size();
    Builder b(g);
    std::vector<std::pair<int, int>> seeds;
    for (int k : seeded) {
        const int out = f.outputs.at(std::size_t(k));
        if (!is_floating(f.type(out).dtype))
            fail("vjp: output ", k, " of ", f.name, " is ", f.type(out).str(),
                 ", not floating point: it takes no cotangent");
        seeds.emplace_back(out, b.input(f.type(out), "cotangent " + std::to_string(k)));
    }
    std::vector<int> inputs;
    for (int k : wrt) inputs.push_back(f.inputs.at(std::size_t(k)));
    auto adj = reverse(g, n, seeds, inputs);
    for (std::size_t k = 0; k < inputs.size(); ++k)
        g.outputs.push_back(adj[k] ? *adj[k] : b.op("zeros_like", {inputs[k]}));
    return g;
}

SplitVjp split_vjp(const Function& f, const Function& g) {
    const std::size_t n = f.nodes.size(); // g's nodes [0, n) are f's (see vjp)
    std::vector<bool> residual(n, false);
    for (std::size_t i = n; i < g.nodes.size(); ++i)
        for (int a : g.nodes[i].args)
            if (std::size_t(a) < n) residual[std::size_t(a)] = true;
    for (int o : g.outputs)
        if (std::size_t(o) < n) residual[std::size_t(o)] = true;

    SplitVjp s;
    s.forward = f;
    s.forward.name = f.name + "_forward";
    s.backward.name = f.name + "_backward";
    Builder b(s.backward);
    std::vector<int> map(g.nodes.size(), -1);
    for (std::size_t i = 0; i < n; ++i) {
        if (!residual[i]) continue;
        s.forward.outputs.push_back(int(i));
        const Node& node = g.nodes[i];
        map[i] = b.input(node.type, "saved " + (node.label.empty() ? node.op : node.label));
        ++s.residuals;
    }
    for (std::size_t i = n; i < g.nodes.size(); ++i) {
        const Node& node = g.nodes[i];
        if (node.op == "input") {
            map[i] = b.input(node.type, node.label);
            continue;
        }
        Node copy = node;
        for (int& a : copy.args) a = map[std::size_t(a)];
        s.backward.nodes.push_back(std::move(copy));
        map[i] = int(s.backward.nodes.size()) - 1;
    }
    for (int o : g.outputs) s.backward.outputs.push_back(map[std::size_t(o)]);
    s.backward = eliminate_common_subexpressions(s.backward);
    return s;
}

} // namespace rag::ir
