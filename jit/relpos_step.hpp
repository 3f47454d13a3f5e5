// How compiled functions run relpos_attention and its gradient nodes, on any device: through
// the fused tile kernels instead of the materialising reference. Autodiff emits one
// relpos_attention_grad node per input (attr wrt): the first of them to run computes every
// gradient in one backward pass, from the state its forward left when the forward ran in the
// same call (its O and log-sum-exp), and its siblings take their share.
//
// `State` is one application on one device: State(inputs, attrs), forward() -> O, and
// backward(dO) -> the gradient of every input. Internal to jit/; LLVM-free.
//
// With `self_attention`, attention and attention_grad nodes whose keys are as long as their
// queries in every sample run through the same programs as relative-position attention
// without tables (self_attention_as_relpos); cross-attention is left to the caller.
#pragma once
#include "ir/ir.hpp"

#include <map>
#include <memory>
#include <optional>

namespace rag::jit {

// t's values under another shape of the same sizes (other ragged names): no copy, and values
// on the device stay there.
inline RaggedTensor with_shape(const RaggedTensor& t, const Shape& shape) {
    return t.with_structure(Structure::make(shape, t.batch(), t.structure().sizes()));
}

// `attention(q, k, v)` as `relpos_attention` without tables when every sample's keys are as
// long as its queries: k and v (and a trailing dO) relabelled with q's token axis, and the
// attrs of an (unused) map with attention's causal and scale. nullopt otherwise.
inline std::optional<Attrs> self_attention_as_relpos(std::vector<RaggedTensor>& in,
                                                     const Attrs& at) {
    const RaggedTensor& q = in[0];
    for (const RaggedTensor& t : in) {
        if (t.batch() != q.batch() || t.shape().sample_rank() != 3 ||
            !t.shape().axes[0].is_ragged())
            return std::nullopt;
        for (std::int64_t s = 0; s < q.batch(); ++s)
            if (t.structure().size(s, 0) != q.structure().size(s, 0)) return std::nullopt;
    }
    for (RaggedTensor& t : in) {
        Shape shape = t.shape();
        shape.axes[0].name = q.shape().axes[0].name;
        t = with_shape(t, shape);
    }
    Attrs out{{"map", std::string("clip")}, {"distance", std::int64_t(1)}};
    out.set("causal", at.get_bool("causal", false));
    if (at.has("scale")) out.set("scale", at.get_float("scale"));
    return out;
}

template <class State> class RelposNodes {
  public:
    explicit RelposNodes(bool self_attention = false) : self_attention_(self_attention) {}

    // Runs node i if it is a relpos node (writing vals[i]) and says whether it was.
    bool run(const ir::Function& f, std::size_t i, std::vector<RaggedTensor>& vals) {
        const ir::Node& n = f.nodes[i];
        const bool attention = self_attention_ && (n.op == "attention" || n.op == "attention_grad");
        const bool grad = n.op == "relpos_attention_grad" || n.op == "attention_grad";
        if (!attention && n.op != "relpos_attention" && n.op != "relpos_attention_grad")
            return false;
        // The tile programs keep scores, tables and the log-sum-exp in f32: f64 would silently
        // lose precision, so it runs the f64 reference (relpos) or the f64 host kernels
        // (attention) instead.
        if (f.type(n.args[0]).dtype == DType::f64) return false;
        std::vector<int> args(n.args.begin(), n.args.end() - grad);
        std::vector<RaggedTensor> in;
        for (int a : args) in.push_back(vals[std::size_t(a)]);
        Attrs at = n.attrs;
        RaggedTensor dO = grad ? vals[std::size_t(n.args.back())] : RaggedTensor();
        if (attention) {
            if (grad) in.push_back(dO);
            std::optional<Attrs> as_relpos = self_attention_as_relpos(in, at);
            if (!as_relpos) return false;
            at = *as_relpos;
            if (grad) {
                dO = in.back();
                in.pop_back();
            }
        }
        const Key key{args, Attrs(at).set("wrt", std::int64_t(-1)).str()};
        auto& state = states_[key];
        if (!grad) {
            state = std::make_unique<State>(in, at);
            vals[i] = state->forward();
        } else {
            auto& grads = gradients_[{key, n.args.back()}];
            if (grads.empty()) {
                if (!state) state = std::make_unique<State>(in, at);
                grads = state->backward(dO);
            }
            vals[i] = grads.at(std::size_t(n.attrs.get_int("wrt")));
        }
        if (attention) vals[i] = with_shape(vals[i], n.type.shape); // attention's names again
        return true;
    }

  private:
    using Key = std::pair<std::vector<int>, std::string>; // q, k, v, tables; attrs but wrt
    bool self_attention_;
    std::map<Key, std::unique_ptr<State>> states_;
    std::map<std::pair<Key, int>, std::vector<RaggedTensor>> gradients_; // by (key, dO)
};

} // namespace rag::jit
