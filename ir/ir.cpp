#include "ir/ir.hpp"

#include "runtime/error.hpp"

#include <map>
#include <sstream>

namespace rag::ir {

std::vector<Schema> Function::input_types() const {
    std::vector<Schema> out;
    for (int v : inputs) out.push_back(type(v));
    return out;
}

std::vector<Schema> Function::output_types() const {
    std::vector<Schema> out;
    for (int v : outputs) out.push_back(type(v));
    return out;
}

int Builder::input(const Schema& type, std::string label) {
    Attrs a;
    a.set("index", std::int64_t(f_.inputs.size()));
    f_.nodes.push_back({"input", {}, std::move(a), type, std::move(label)});
    int id = int(f_.nodes.size()) - 1;
    f_.inputs.push_back(id);
    return id;
}

int Builder::constant(double value, DType dtype) {
    Attrs a;
    a.set("value", value);
    f_.nodes.push_back({"const", {}, std::move(a), Schema{dtype, Shape{false, {}}}, {}});
    return int(f_.nodes.size()) - 1;
}

int Builder::op(std::string_view name, std::vector<int> args, Attrs attrs, std::string label) {
    const OpDef& def = OpTable::builtin().at(name);
    std::vector<Schema> in;
    for (int a : args) in.push_back(f_.type(a));
    Schema t = infer_schema(def, in, attrs);
    f_.nodes.push_back(
        {std::string(name), std::move(args), std::move(attrs), std::move(t), std::move(label)});
    return int(f_.nodes.size()) - 1;
}

Val Builder::emit(std::string_view name, std::vector<Val> args, Attrs attrs) {
    std::vector<int> ids;
    for (Val v : args) ids.push_back(v.id);
    return Val{op(name, std::move(ids), std::move(attrs))};
}

void verify(const Function& f) {
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
        const Node& n = f.nodes[i];
        for (int a : n.args)
            if (a < 0 || std::size_t(a) >= i)
                fail("verify ", f.name, ": %", i, " uses %", a, " before it is defined");
        if (n.op == "input" || n.op == "const") continue;
        std::vector<Schema> in;
        for (int a : n.args) in.push_back(f.type(a));
        Schema t = infer_schema(OpTable::builtin().at(n.op), in, n.attrs);
        if (t != n.type)
            fail("verify ", f.name, ": %", i, " = ", n.op, " records ", n.type.str(),
                 " but its type rule gives ", t.str());
    }
    for (int o : f.outputs)
        if (o < 0 || std::size_t(o) >= f.nodes.size()) fail("verify ", f.name, ": bad output %", o);
    for (std::size_t k = 0; k < f.inputs.size(); ++k)
        if (f.nodes.at(std::size_t(f.inputs[k])).op != "input")
            fail("verify ", f.name, ": input ", k, " is not an input node");
}

std::string print(const Function& f) {
    std::ostringstream os;
    os << "fn " << f.name << "(";
    for (std::size_t k = 0; k < f.inputs.size(); ++k) {
        const Node& n = f.nodes[std::size_t(f.inputs[k])];
        os << (k ? ", " : "") << "%" << f.inputs[k] << ": " << n.type.str();
        if (!n.label.empty()) os << " " << n.label;
    }
    os << ") -> (";
    for (std::size_t k = 0; k < f.outputs.size(); ++k)
        os << (k ? ", " : "") << f.type(f.outputs[k]).str();
    os << ") {\n";
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
        const Node& n = f.nodes[i];
        if (n.op == "input") continue;
        os << "  %" << i << " = " << n.op;
        if (n.op == "const") {
            os << " " << n.attrs.get_float("value");
        } else {
            os << "(";
            for (std::size_t a = 0; a < n.args.size(); ++a)
                os << (a ? ", " : "") << "%" << n.args[a];
            os << ")";
            if (!n.attrs.entries().empty()) os << " {" << n.attrs.str() << "}";
        }
        os << " : " << n.type.str();
        if (!n.label.empty()) os << "  # " << n.label;
        os << "\n";
    }
    os << "  return ";
    for (std::size_t k = 0; k < f.outputs.size(); ++k) os << (k ? ", " : "") << "%" << f.outputs[k];
    os << "\n}\n";
    return os.str();
}

Function eliminate_common_subexpressions(const Function& f) {
    Function out = f;
    std::map<std::string, int> seen;
    std::vector<int> same(f.nodes.size());
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
        Node& n = out.nodes[i];
        same[i] = int(i);
        for (int& a : n.args) a = same[std::size_t(a)];
        if (n.op == "input") continue;
        std::string key = n.op + "|" + n.attrs.str() + "|" + n.type.str();
        for (int a : n.args) key += "|" + std::to_string(a);
        auto [it, fresh] = seen.try_emplace(key, int(i));
        if (!fresh) same[i] = it->second;
    }
    for (int& o : out.outputs) o = same[std::size_t(o)];
    return eliminate_dead_code(out);
}

Function eliminate_dead_code(const Function& f) {
    std::vector<bool> live(f.nodes.size(), false);
    for (int o : f.outputs) live[std::size_t(o)] = true;
    for (int i : f.inputs) live[std::size_t(i)] = true;
    for (std::size_t i = f.nodes.size(); i-- > 0;)
        if (live[i])
            for (int a : f.nodes[i].args) live[std::size_t(a)] = true;
    Function out;
    out.name = f.name;
    std::vector<int> remap(f.nodes.size(), -1);
    for (std::size_t i = 0; i < f.nodes.size(); ++i) {
        if (!live[i]) continue;
        Node n = f.nodes[i];
        for (int& a : n.args) a = remap[std::size_t(a)];
        remap[i] = int(out.nodes.size());
        out.nodes.push_back(std::move(n));
    }
    for (int v : f.inputs) out.inputs.push_back(remap[std::size_t(v)]);
    for (int v : f.outputs) out.outputs.push_back(remap[std::size_t(v)]);
    return out;
}

} // namespace rag::ir

namespace rag::ir {

std::vector<int> inline_call(Function& into, const Function& callee, const std::vector<int>& args) {
    if (args.size() != callee.inputs.size())
        fail("inline ", callee.name, ": ", args.size(), " arguments for ", callee.inputs.size(),
             " inputs");
    std::vector<int> map(callee.nodes.size(), -1);
    for (std::size_t k = 0; k < args.size(); ++k) map[std::size_t(callee.inputs[k])] = args[k];
    for (std::size_t i = 0; i < callee.nodes.size(); ++i) {
        if (map[i] >= 0) continue;
        Node n = callee.nodes[i];
        for (int& a : n.args) a = map[std::size_t(a)];
        into.nodes.push_back(std::move(n));
        map[i] = int(into.nodes.size()) - 1;
    }
    std::vector<int> out;
    for (int o : callee.outputs) out.push_back(map[std::size_t(o)]);
    return out;
}

} // namespace rag::ir
