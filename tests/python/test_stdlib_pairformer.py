"""The standard library's Pairformer layers (stdlib/pairformer.rag) on ragged single and pair
states, each against a per-sample NumPy float64 reference written from AlphaFold 3's algorithms,
and their gradients (every parameter, s and z) against float64 central differences of it (the
machinery of test_stdlib.py). Small sizes keep the differences cheap: 4 channels, 2 heads."""
import functools

import numpy as np

from test_pair_attention import ref_single
from test_shared_dropout import reference as dropout_reference
from test_stdlib import LENS, layer_tests, ln, silu


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def tri_mul(z, p, pre, outgoing):
    x = ln(z, p, pre + "ln.")
    a = sigmoid(x @ p[pre + "a_gate"]) * (x @ p[pre + "a_proj"])
    b = sigmoid(x @ p[pre + "b_gate"]) * (x @ p[pre + "b_proj"])
    t = np.einsum("ikc,jkc->ijc" if outgoing else "kic,kjc->ijc", a, b)
    return sigmoid(x @ p[pre + "gate"]) * (ln(t, p, pre + "ln_out.") @ p[pre + "out"])


def tri_att(z, p, pre, ending, heads=2):
    """Starting node: row i, query x_ij over keys x_ik, bias (x W)_jk. Ending node: column j,
    query x_ij over keys x_kj, bias (x W)_ik (AlphaFold 3's orientation), written on the
    transposed state: its row j holds column j."""
    x = ln(z, p, pre + "ln.")
    bias = x @ p[pre + "bias"]
    xr = x.transpose(1, 0, 2) if ending else x
    n, _, c = x.shape
    q, k, v = ((xr @ p[pre + w]).reshape(n, n, heads, c // heads) for w in ("wq", "wk", "wv"))
    o = np.stack([ref_single(q[r], k[r], v[r], bias) for r in range(n)]).reshape(n, n, c)
    out = (sigmoid(xr @ p[pre + "gate"]) * o) @ p[pre + "wo"]
    return out.transpose(1, 0, 2) if ending else out


def att_pair_bias(s, z, p, pre, heads=2):
    x = ln(s, p, pre + "ln.")
    bias = ln(z, p, pre + "ln_z.") @ p[pre + "bias"]
    n, c = s.shape
    q, k, v = ((x @ p[pre + w]).reshape(n, heads, c // heads) for w in ("wq", "wk", "wv"))
    o = ref_single(q, k, v, bias).reshape(n, c)
    return (sigmoid(x @ p[pre + "gate"]) * o) @ p[pre + "wo"]


def transition(x, p, pre):
    h = ln(x, p, pre + "ln.")
    return (silu(h @ p[pre + "ff.gate"]) * (h @ p[pre + "ff.up"])) @ p[pre + "ff.down"]


@functools.lru_cache(maxsize=None)
def masks(seed, shared, channels):
    """dropout(p = 0.25, seed, shared_axis) of ones: the scaled masks of every sample of LENS."""
    return dropout_reference([np.ones((n, n, channels)) for n in LENS], 0.25, seed, shared)


def block(s, z, p, b=None, single_heads=2, pair_heads=1):
    """AlphaFold 3's block order; b: the sample's index, for the training form's masks (seeds
    1 to 4, row-wise but for the ending node's column-wise one)."""
    drop = [(lambda u: u) if b is None else
            (lambda u, m=masks(seed, shared, z.shape[-1])[b]: u * m)
            for seed, shared in ((1, 1), (2, 1), (3, 1), (4, 2))]
    z = z + drop[0](tri_mul(z, p, "mul_out.", True))
    z = z + drop[1](tri_mul(z, p, "mul_in.", False))
    z = z + drop[2](tri_att(z, p, "att_start.", False, pair_heads))
    z = z + drop[3](tri_att(z, p, "att_end.", True, pair_heads))
    z = z + transition(z, p, "pair.")
    s = s + att_pair_bias(s, z, p, "single_att.", single_heads)
    return s + transition(s, p, "single."), z


S4, Z4 = ("s", "f32[B, ~N, 4]"), ("z", "f32[B, ~N, ~N, 4]")
PAIR4 = "f32[B, ~N, ~N, 4]"
# Two channels keep the block's float64 differences cheap (~300 of them, not ~850 at 4).
BLOCK = "PairformerBlock[2, 2, 2, 1, 3, 3]"
S2, Z2 = ("s", "f32[B, ~N, 2]"), ("z", "f32[B, ~N, ~N, 2]")
LAYERS = {  # the four triangle updates of a pair state: name: (params type, reference, flag)
    name: (f"{name}(z, p)", ptype, [Z4], PAIR4, lambda i, p, f=ref, a=flag: f(i["z"], p, "", a))
    for name, ptype, ref, flag in (
        ("triangle_multiplication_outgoing", "TriangleMultiplication[4, 3]", tri_mul, True),
        ("triangle_multiplication_incoming", "TriangleMultiplication[4, 3]", tri_mul, False),
        ("triangle_attention_starting", "TriangleAttention[4, 2]", tri_att, False),
        ("triangle_attention_ending", "TriangleAttention[4, 2]", tri_att, True))
}
LAYERS.update({
    "attention_pair_bias": (
        "attention_pair_bias(s, z, p)", "AttentionPairBias[4, 3, 2]",
        [S4, ("z", "f32[B, ~N, ~N, 3]")], "f32[B, ~N, 4]",
        lambda i, p: att_pair_bias(i["s"], i["z"], p, "")),
    "transition": ("transition(s, p)", "Transition[4, 6]", [S4], "f32[B, ~N, 4]",
                   lambda i, p: transition(i["s"], p, "")),
    "pair_transition": ("pair_transition(z, p)", "Transition[4, 5]", [Z4], PAIR4,
                        lambda i, p: transition(i["z"], p, "")),
})
# One output of each form (each block costs a compile with three gradients): the single
# state of the plain block, which reads its whole pair track through the pair bias, and the
# pair state of the training form with its four masks.
for _fn, _k, _t in (("pairformer_block", 0, S2[1]), ("pairformer_block_dropout", 1, Z2[1])):
    LAYERS[f"{_fn}.{'sz'[_k]}"] = (
        f"{_fn}(s, z, p)[{_k}]", BLOCK, [S2, Z2], _t,
        lambda i, p, k=_k, d=_fn.endswith("dropout"): block(i["s"], i["z"], p,
                                                             i["_b"] if d else None)[k])

case, test_forward_matches_float64_reference, test_gradients_match_float64_finite_differences = \
    layer_tests(LAYERS)
