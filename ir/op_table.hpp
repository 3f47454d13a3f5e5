// The op table: every builtin op described once. An entry holds its type rule over schemas
// (how it creates, keeps or consumes ragged axes), its reference kernel on packed storage
// (plain C++, the oracle every other tier must agree with), and its VJP written as ops through
// an Emitter, so the same rule serves eager gradients here and the IR autodiff transform.
// Adding an op is one entry in one ir/ops/*.cpp file plus its tests.
#pragma once
#include "ir/attrs.hpp"
#include "runtime/tensor.hpp"

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rag {

// A value inside an Emitter: a tensor (eager) or an SSA value (IR).
struct Val {
    int id = -1;
};

// Where VJP rules emit the ops of a gradient.
class Emitter {
  public:
    virtual ~Emitter() = default;
    virtual Val emit(std::string_view op, std::vector<Val> args, Attrs attrs = {}) = 0;
    virtual const Schema& schema(Val v) const = 0;
};

using TypeRule = std::function<Schema(std::span<const Schema> in, const Attrs& at)>;
using Kernel = std::function<RaggedTensor(std::span<const RaggedTensor> in, const Attrs& at)>;
// Gradients of every input given the output and its cotangent; nullopt: no gradient flows
// to that input (labels, conditions, structure-only arguments).
using Vjp = std::function<std::vector<std::optional<Val>>(Emitter& e, std::span<const Val> in,
                                                          Val out, Val grad, const Attrs& at)>;

struct OpDef {
    std::string name;
    int min_args = 1;
    int max_args = 1; // -1: variadic
    std::string doc;  // one line, for `:help` and the docs
    TypeRule type;
    Kernel reference;
    Vjp vjp; // empty: the op is not differentiable (integer results, backward kernels)
    // Inputs that only supply structure or indices (sum_to's `like`, labels): no gradient.
    std::vector<int> no_grad_args = {};
};

class OpTable {
  public:
    static const OpTable& builtin();
    const OpDef* find(std::string_view name) const;
    const OpDef& at(std::string_view name) const; // rag::Error for an unknown op
    void add(OpDef def);
    std::vector<const OpDef*> all() const; // sorted by name

  private:
    std::unordered_map<std::string, OpDef> ops_;
};

// Checks arity and applies the type rule (rag::Error on a type error).
Schema infer_schema(const OpDef& op, std::span<const Schema> in, const Attrs& at);

// Runs one op on the reference tier: type rule, kernel, then checks that the result has the
// inferred schema and a valid structure.
RaggedTensor evaluate(std::string_view op, std::span<const RaggedTensor> args,
                      const Attrs& at = {});
inline RaggedTensor evaluate(std::string_view op, std::initializer_list<RaggedTensor> args,
                             const Attrs& at = {}) {
    return evaluate(op, std::span<const RaggedTensor>(args.begin(), args.size()), at);
}

// An Emitter that evaluates every emitted op at once on the reference tier.
class EagerEmitter : public Emitter {
  public:
    Val add(RaggedTensor t);
    const RaggedTensor& value(Val v) const { return values_.at(std::size_t(v.id)); }
    Val emit(std::string_view op, std::vector<Val> args, Attrs attrs = {}) override;
    const Schema& schema(Val v) const override { return schemas_.at(std::size_t(v.id)); }

  private:
    std::vector<RaggedTensor> values_;
    std::vector<Schema> schemas_;
};

// Eager VJP of one op application: the cotangent of each input (nullopt where none flows).
std::vector<std::optional<RaggedTensor>> evaluate_vjp(std::string_view op,
                                                      std::span<const RaggedTensor> args,
                                                      const Attrs& at, const RaggedTensor& grad);

// Registration, one function per ir/ops/*.cpp file.
void register_elementwise_ops(OpTable& t);
void register_reduction_ops(OpTable& t);
void register_linalg_ops(OpTable& t);
void register_shape_ops(OpTable& t);
void register_nn_ops(OpTable& t);
void register_attention_ops(OpTable& t);
void register_biased_attention_ops(OpTable& t);
void register_relpos_ops(OpTable& t);
void register_gather_ops(OpTable& t);
void register_image_ops(OpTable& t);

} // namespace rag
