#include "ir/op_table.hpp"

#include "runtime/error.hpp"

#include <algorithm>

namespace rag {

const OpTable& OpTable::builtin() {
    static const OpTable table = [] {
        OpTable t;
        register_elementwise_ops(t);
        register_reduction_ops(t);
        register_linalg_ops(t);
        register_shape_ops(t);
        register_nn_ops(t);
        register_attention_ops(t);
        register_biased_attention_ops(t);
        register_relpos_ops(t);
        register_gather_ops(t);
        register_image_ops(t);
        return t;
    }();
    return table;
}

const OpDef* OpTable::find(std::string_view name) const {
    auto it = ops_.find(std::string(name));
    return it == ops_.end() ? nullptr : &it->second;
}

const OpDef& OpTable::at(std::string_view name) const {
    if (const OpDef* op = find(name)) return *op;
    fail("unknown op '", name, "'");
}

void OpTable::add(OpDef def) {
    if (ops_.count(def.name)) fail("op '", def.name, "' registered twice");
    std::string name = def.name;
    ops_.emplace(std::move(name), std::move(def));
}

std::vector<const OpDef*> OpTable::all() const {
    std::vector<const OpDef*> out;
    for (const auto& [_, op] : ops_) out.push_back(&op);
    std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->name < b->name; });
    return out;
}

Schema infer_schema(const OpDef& op, std::span<const Schema> in, const Attrs& at) {
    const int n = int(in.size());
    if (n < op.min_args || (op.max_args >= 0 && n > op.max_args)) {
        if (op.min_args == op.max_args)
            fail(op.name, " takes ", op.min_args, " argument", op.min_args == 1 ? "" : "s",
                 ", got ", n);
        fail(op.name, " takes ", op.min_args, " to ",
             op.max_args < 0 ? std::string("any number of") : std::to_string(op.max_args),
             " arguments, got ", n);
    }
    try {
        return op.type(in, at);
    } catch (const Error& e) {
        // Every message names the op (attribute errors come from shared helpers).
        std::string msg = e.what();
        if (msg.rfind(op.name + ":", 0) == 0 || msg.rfind(op.name + " ", 0) == 0) throw;
        fail(op.name, ": ", msg);
    }
}

RaggedTensor evaluate(std::string_view name, std::span<const RaggedTensor> args, const Attrs& at) {
    const OpDef& op = OpTable::builtin().at(name);
    std::vector<Schema> schemas;
    for (const auto& a : args) schemas.push_back(a.schema());
    Schema want = infer_schema(op, schemas, at);
    RaggedTensor out = op.reference(args, at);
    if (out.schema() != want)
        fail("internal: op ", name, " produced ", out.schema().str(), " but its type rule says ",
             want.str());
    out.structure().validate();
    return out;
}

Val EagerEmitter::add(RaggedTensor t) {
    schemas_.push_back(t.schema());
    values_.push_back(std::move(t));
    return Val{int(values_.size()) - 1};
}

Val EagerEmitter::emit(std::string_view op, std::vector<Val> args, Attrs attrs) {
    std::vector<RaggedTensor> in;
    for (Val v : args) in.push_back(value(v));
    return add(evaluate(op, in, attrs));
}

std::vector<std::optional<RaggedTensor>> evaluate_vjp(std::string_view name,
                                                      std::span<const RaggedTensor> args,
                                                      const Attrs& at, const RaggedTensor& grad) {
    const OpDef& op = OpTable::builtin().at(name);
    if (!op.vjp) fail("op ", name, " is not differentiable");
    EagerEmitter e;
    std::vector<Val> in;
    for (const auto& a : args) in.push_back(e.add(a));
    Val out = e.add(evaluate(name, args, at));
    if (grad.schema() != e.schema(out))
        fail("gradient of ", name, " has schema ", grad.schema().str(), "; expected ",
             e.schema(out).str());
    Val g = e.add(grad);
    auto grads = op.vjp(e, in, out, g, at);
    std::vector<std::optional<RaggedTensor>> result;
    for (std::size_t k = 0; k < args.size(); ++k) {
        if (k < grads.size() && grads[k]) {
            const RaggedTensor& gk = e.value(*grads[k]);
            if (gk.schema() != args[k].schema() || !gk.structure().same_as(args[k].structure()))
                fail("internal: VJP of ", name, " gives input ", k, " a gradient of schema ",
                     gk.schema().str(), " for ", args[k].schema().str());
            result.push_back(gk);
        } else {
            result.push_back(std::nullopt);
        }
    }
    return result;
}

} // namespace rag
