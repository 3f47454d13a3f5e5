#include "ir/interpreter.hpp"

#include "runtime/error.hpp"

namespace rag::ir {

std::vector<RaggedTensor> bind_inputs(const Function& f, const std::vector<RaggedTensor>& inputs) {
    if (inputs.size() != f.inputs.size())
        fail(f.name, " takes ", f.inputs.size(), " tensors, got ", inputs.size());
    std::vector<RaggedTensor> vals(f.nodes.size());
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
        const Node& n = f.nodes[i];
        if (n.op == "input") {
            std::size_t k = std::size_t(n.attrs.get_int("index"));
            if (inputs[k].schema() != n.type)
                fail(f.name, ": argument ", k, (n.label.empty() ? "" : " (" + n.label + ")"),
                     " has schema ", inputs[k].schema().str(), ", expected ", n.type.str());
            vals[i] = inputs[k];
        } else if (n.op == "const") {
            vals[i] = RaggedTensor::dense(
                DenseArray::from_f64(n.type.dtype, {}, {n.attrs.get_float("value")}));
        }
    }
    return vals;
}

std::vector<RaggedTensor> interpret(const Function& f, const std::vector<RaggedTensor>& inputs) {
    std::vector<RaggedTensor> vals = bind_inputs(f, inputs);
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
        const Node& n = f.nodes[i];
        if (n.op != "input" && n.op != "const") {
            std::vector<RaggedTensor> args;
            for (int a : n.args) args.push_back(vals[std::size_t(a)]);
            vals[i] = evaluate(n.op, args, n.attrs);
        }
    }
    std::vector<RaggedTensor> out;
    for (int o : f.outputs) out.push_back(vals[std::size_t(o)]);
    return out;
}

} // namespace rag::ir
