// Padded execution (docs/design.md, "Padded execution"): the same program run on the dense
// envelope B x N_max x ..., the baseline the NestedTensor paper measures against.
//
// Values keep their ragged schemas, but every sample is stored at the envelope extents (the
// host pads inputs and unpads outputs at the call boundary), so compiled code is the very code
// of the ragged specialisation and its cost grows with the padded volume. Entries outside a
// sample hold finite garbage; they never reach a valid result because the Padder rewrites, at
// lowering time and so before autodiff, every op that mixes values along a formerly ragged
// axis: reductions and softmax mask the padding, means divide by the valid count, attention
// runs as masked scores (B, H, N_max, N_max) as padded frameworks do, losses average over valid
// positions only. Gradients of the masked program are then exactly 0 at padded entries, so the
// derived backward ops need no masks of their own.
//
// A mask multiplies (x * m, as padded frameworks mask) when x's padded entries are known to be
// finite, so the JIT fuses it into the neighbouring loop; otherwise it selects (`where`), since
// inf * 0 is NaN. Inputs are padded with zeros, and finite padding survives the ops of
// `padding_finite`; exp, log, div, sqrt, pow and max / min over an all-padding group do not
// promise it.
#pragma once
#include "ir/ir.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace rag::frontend {

class Padder {
  public:
    // Adds one mask input bool[B, ~name] (true inside the sample) per name of `names`.
    Padder(ir::Builder& b, const std::vector<std::string>& names);

    // The ragged axis names of these input schemas, in order of first appearance: one mask
    // input each.
    static std::vector<std::string> mask_names(const std::vector<Schema>& inputs);

    const std::vector<std::string>& names() const { return names_; }
    // The mask inputs, in the order of mask_names.
    const std::vector<int>& mask_inputs() const { return inputs_; }

    // An input (of a differentiated function) whose padded entries may not be finite: the value
    // the caller passes there does not promise it.
    void padding_may_be_nonfinite(int input) { nonfinite_inputs_.insert(input); }
    // Whether every padded entry of x is finite (false when unsure).
    bool padding_finite(int x);

    // Emits `name(args)` with the meaning it has on the valid entries of the padded values.
    // rag::Error for ops padded execution does not support.
    int op(std::string_view name, std::vector<int> args, const Attrs& attrs);

  private:
    const Schema& type(int v) const { return b_.function().type(v); }
    int emit(std::string_view name, std::vector<int> args, Attrs attrs = {});
    int constant(double v, DType t) { return b_.constant(v, t); }
    // The bool[B, ~name] mask: an input's, or for an axis an op derives (`H[::2]`, `H[*2]`),
    // one built from its base axis's mask, emitted once. `like` is a value with axis ~name at
    // per-sample position `axis` (its positions number a grown or scaled axis), or -1.
    int mask_of(const std::string& name, int like = -1, int axis = -1);
    // x with the padding along its per-sample axes `axes` replaced by `fill`.
    int masked(int x, const std::vector<int>& axes, double fill);
    // f32[B]: per sample, the number of valid index tuples over `axes` (per-sample positions).
    int valid_count(int x, const std::vector<int>& axes);
    int envelope_count(int x, const std::vector<int>& axes);
    int count(int x, const std::vector<int>& axes, bool valid);
    // The per-sample positions of x's ragged axes among `axes`.
    std::vector<int> ragged_among(int x, const std::vector<int>& axes) const;
    // c: f32[B] broadcast against a value of `like`'s per-sample rank, as like's dtype.
    int per_sample(int c, int like);
    int reduction(std::string_view name, int x, const Attrs& attrs);
    int causal(int s, int n, const std::string& queries, const std::string& keys);
    int attention(int q, int k, int v, const Attrs& attrs);
    int biased_attention(int q, int k, int v, int bias, const Attrs& attrs);
    int mean_loss(std::string_view name, std::vector<int> args, int positions_of);
    int patches(int x, const Attrs& attrs);
    // f32[B]: per sample, the valid length of ragged axis ~name (or its envelope's).
    int length(const std::string& name, bool valid);

    ir::Builder& b_;
    std::vector<std::string> names_;
    std::vector<int> inputs_;
    std::set<int> nonfinite_inputs_;
    std::set<int> finite_;      // finite padding by construction (a masked sum over a count)
    std::map<int, bool> known_; // padding_finite's answers
    std::map<std::string, int> derived_masks_;
    std::map<std::string, int> causal_masks_; // by axis names, query axis and rank
};

} // namespace rag::frontend
