// How compiled functions run relpos_attention and its gradient nodes, on any device: through
// the fused tile kernels instead of the materialising reference. Autodiff emits one
// relpos_attention_grad node per input (attr wrt): the first of them to run computes every
// gradient in one backward pass, from the state its forward left when the forward ran in the
// same call (its O and log-sum-exp), and its siblings take their share.
//
// `State` is one application on one device: State(inputs, attrs), forward() -> O, and
// backward(dO) -> the gradient of every input. Internal to jit/; LLVM-free.
#pragma once
#include "ir/ir.hpp"

#include <map>
#include <memory>

namespace rag::jit {

template <class State> class RelposNodes {
  public:
    // Runs node i if it is a relpos node (writing vals[i]) and says whether it was.
    bool run(const ir::Function& f, std::size_t i, std::vector<RaggedTensor>& vals) {
        const ir::Node& n = f.nodes[i];
        const bool grad = n.op == "relpos_attention_grad";
        if (!grad && n.op != "relpos_attention") return false;
        std::vector<int> args(n.args.begin(), n.args.end() - grad);
        std::vector<RaggedTensor> in;
        for (int a : args) in.push_back(vals[std::size_t(a)]);
        const Key key{args, Attrs(n.attrs).set("wrt", std::int64_t(-1)).str()};
        auto& state = states_[key];
        if (!grad) {
            state = std::make_unique<State>(in, n.attrs);
            vals[i] = state->forward();
            return true;
        }
        auto& grads = gradients_[{key, n.args.back()}];
        if (grads.empty()) {
            if (!state) state = std::make_unique<State>(in, n.attrs);
            grads = state->backward(vals[std::size_t(n.args.back())]);
        }
        vals[i] = grads.at(std::size_t(n.attrs.get_int("wrt")));
        return true;
    }

  private:
    using Key = std::pair<std::vector<int>, std::string>; // q, k, v, tables; attrs but wrt
    std::map<Key, std::unique_ptr<State>> states_;
    std::map<std::pair<Key, int>, std::vector<RaggedTensor>> gradients_; // by (key, dO)
};

} // namespace rag::jit
