// The SSA tensor IR. A Function is a straight-line list of nodes; node i defines value %i.
// Every value carries its Schema. Aggregates of the language (params groups, tuples) and calls
// of user functions are resolved by the frontend's lowering (records are flattened into their
// fields, calls are inlined), so the IR holds tensors only: one op per node, every op from the
// op table, plus `input` (attr index) and `const` (attr value, a scalar of the node's dtype).
#pragma once
#include "ir/op_table.hpp"

#include <string>
#include <vector>

namespace rag::ir {

struct Node {
    std::string op;
    std::vector<int> args;
    Attrs attrs;
    Schema type;
    std::string label; // source name (`pair`, `p.wu`) for readable dumps; may be empty
};

struct Function {
    std::string name;
    std::vector<Node> nodes;
    std::vector<int> inputs;  // value ids of the `input` nodes, in parameter order
    std::vector<int> outputs; // value ids returned, in order

    const Schema& type(int v) const { return nodes.at(std::size_t(v)).type; }
    std::vector<Schema> input_types() const;
    std::vector<Schema> output_types() const;
};

// Appends nodes to a Function, inferring each node's schema from the op table.
class Builder : public Emitter {
  public:
    explicit Builder(Function& f) : f_(f) {}
    int input(const Schema& type, std::string label);
    int constant(double value, DType dtype);
    int op(std::string_view name, std::vector<int> args, Attrs attrs = {}, std::string label = {});

    Val emit(std::string_view name, std::vector<Val> args, Attrs attrs = {}) override;
    const Schema& schema(Val v) const override { return f_.type(v.id); }
    Function& function() { return f_; }

  private:
    Function& f_;
};

// Checks SSA order, arities and that every recorded schema is what the op table infers.
// Throws rag::Error describing the first problem.
void verify(const Function& f);

// Stable textual form: `%3 = matmul(%0, %1) : f32[B, ~N, 128]`.
std::string print(const Function& f);

// Removes nodes no output depends on (inputs stay); renumbers values.
Function eliminate_dead_code(const Function& f);

// Replaces each node that repeats an earlier one (same op, arguments and attributes) by that
// one, then removes what became dead. Ops here are pure, so this never changes a result.
Function eliminate_common_subexpressions(const Function& f);

} // namespace rag::ir

namespace rag::ir {

// Copies `callee`'s nodes into `into`, its inputs replaced by `args`; returns the values of its
// outputs in `into`.
std::vector<int> inline_call(Function& into, const Function& callee, const std::vector<int>& args);

} // namespace rag::ir
