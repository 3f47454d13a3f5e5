"""The standard library's layers (stdlib/*.rag), each called on a ragged batch and checked
against a per-sample NumPy float64 reference; gradients (with respect to every parameter and
the floating inputs) against float64 central differences of that reference. The layers compute
in f32 (params groups are f32), so the tolerances are f32's. Small sizes keep the finite
differences cheap: C = 4 features, H = 2 heads, F = 6 hidden units."""
import math

import numpy as np
import pytest
import rag

from test_grad import central  # float64 central differences, step 1e-6

LENS = (3, 1, 5)      # a ragged batch (5: past t5's and DeBERTa's exact buckets); every sample attends within itself only
MEM_LENS = (2, 5, 1)  # cross-attention memories


# ---- float64 references, one sample at a time ----------------------------------------------

def layernorm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def rmsnorm(x, g, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def silu(x):
    return x / (1 + np.exp(-x))


def softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def mha(x, mem, p, pre, heads=2, causal=False):
    n, c = x.shape
    d = c // heads
    q = (x @ p[pre + "wq"]).reshape(n, heads, d)
    k = (mem @ p[pre + "wk"]).reshape(len(mem), heads, d)
    v = (mem @ p[pre + "wv"]).reshape(len(mem), heads, d)
    out = np.zeros((n, heads, d))
    for h in range(heads):
        s = q[:, h] @ k[:, h].T / math.sqrt(d)
        if causal:
            s = np.where(np.tril(np.ones((n, len(mem)), bool)), s, -np.inf)
        out[:, h] = softmax(s) @ v[:, h]
    return out.reshape(n, c) @ p[pre + "wo"]


def mlp(x, p, pre):
    h = gelu(x @ p[pre + "fc1.w"] + p[pre + "fc1.b"])
    return h @ p[pre + "fc2.w"] + p[pre + "fc2.b"]


def ln(x, p, pre):
    return layernorm(x, p[pre + "g"], p[pre + "b"])


def layer(x, p, pre_norm, causal):
    att = lambda h: mha(h, h, p, "att.", causal=causal)  # noqa: E731
    if pre_norm:
        h = x + att(ln(x, p, "ln1."))
        return h + mlp(ln(h, p, "ln2."), p, "mlp.")
    h = ln(x + att(x), p, "ln1.")
    return ln(h + mlp(h, p, "mlp."), p, "ln2.")


def t5_row(delta, num, max_distance=128):
    rel = -delta                       # T5 buckets j - i
    half, exact = num // 2, num // 4
    base, n = (half if rel > 0 else 0), abs(rel)
    if n < exact:
        return base + n
    x = math.log(n / exact) / math.log(max_distance / exact) * (half - exact)
    return base + min(half - 1, exact + math.floor(x))


def log_row(delta, size, max_position=512):
    mid, a = size // 2, abs(delta)
    if a <= mid:
        b = delta
    else:
        lp = math.ceil(math.log(a / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
        b = lp if delta > 0 else -lp
    return min(max(b + size, 0), 2 * size - 1)


ROW = {  # phi(i - j) for R rows
    "shaw": lambda d, R: min(max(d, -(R - 1) // 2), (R - 1) // 2) + (R - 1) // 2,
    "xl": lambda d, R: d + (R + 1) // 2 - 1,
    "t5": lambda d, R: t5_row(d, R),
    "deberta": lambda d, R: log_row(d, R // 2),
}


def relpos(x, p, kind, R, heads=2):
    n, c = x.shape
    d = c // heads
    q, k, v = ((x @ p[w]).reshape(n, heads, d) for w in ("wq", "wk", "wv"))
    out = np.zeros((n, heads, d))
    for h in range(heads):
        s = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                r = ROW[kind](i - j, R)
                s[i, j] = (q[i, h] @ k[j, h] + q[i, h] @ p["aq"][r, h] + k[j, h] @ p["ak"][r, h]
                           + p["bias"][r, h]) / math.sqrt(d)
        out[:, h] = softmax(s) @ v[:, h]
    return out.reshape(n, c) @ p["wo"]


def decoder(x, mem, p):
    h = ln(x + mha(x, x, p, "self_att.", causal=True), p, "ln1.")
    h = ln(h + mha(h, mem, p, "cross_att."), p, "ln2.")
    return ln(h + mlp(h, p, "mlp."), p, "ln3.")


# ---- the layers under test -----------------------------------------------------------------
# name: (rag call, params type, rag inputs, result type, reference(inputs, params) per sample)
X = ("x", "f32[B, ~N, 4]")
LAYERS = {
    "linear": ("linear(x, p)", "Linear[4, 3]", [X], "f32[B, ~N, 3]",
               lambda i, p: i["x"] @ p["w"] + p["b"]),
    "linear_nobias": ("linear_nobias(x, p)", "LinearNoBias[4, 3]", [X], "f32[B, ~N, 3]",
                      lambda i, p: i["x"] @ p["w"]),
    "mean_pool_linear": ("mean_pool_linear(x, p)", "Linear[4, 3]", [X], "f32[B, 3]",
                         lambda i, p: i["x"].mean(0) @ p["w"] + p["b"]),
    "embed": ("embed(ids, p)", "Embedding[7, 4]", [("ids", "i32[B, ~N]")], "f32[B, ~N, 4]",
              lambda i, p: p["table"][i["ids"]]),
    "embed_positions": ("embed_positions(ids, p)", "Embedding[7, 4]", [("ids", "i64[B, ~N]")],
                        "f32[B, ~N, 4]", lambda i, p: p["table"][np.arange(len(i["ids"]))]),
    "add_positions": ("add_positions(x, p)", "Embedding[7, 4]", [X], "f32[B, ~N, 4]",
                      lambda i, p: i["x"] + p["table"][np.arange(len(i["x"]))]),
    "layer_norm": ("layer_norm(x, p)", "LayerNorm[4]", [X], "f32[B, ~N, 4]",
                   lambda i, p: layernorm(i["x"], p["g"], p["b"])),
    "rms_norm": ("rms_norm(x, p)", "RMSNorm[4]", [X], "f32[B, ~N, 4]",
                 lambda i, p: rmsnorm(i["x"], p["g"])),
    "mlp": ("mlp(x, p)", "MLP[4, 6]", [X], "f32[B, ~N, 4]", lambda i, p: mlp(i["x"], p, "")),
    "swiglu": ("swiglu(x, p)", "SwiGLU[4, 6]", [X], "f32[B, ~N, 4]",
               lambda i, p: (silu(i["x"] @ p["gate"]) * (i["x"] @ p["up"])) @ p["down"]),
    "self_attention": ("self_attention(x, p)", "MultiHeadAttention[4, 2]", [X], "f32[B, ~N, 4]",
                       lambda i, p: mha(i["x"], i["x"], p, "")),
    "causal_self_attention": ("causal_self_attention(x, p)", "MultiHeadAttention[4, 2]", [X],
                              "f32[B, ~N, 4]",
                              lambda i, p: mha(i["x"], i["x"], p, "", causal=True)),
    "cross_attention": ("cross_attention(x, mem, p)", "MultiHeadAttention[4, 2]",
                        [X, ("mem", "f32[B, ~M, 4]")], "f32[B, ~N, 4]",
                        lambda i, p: mha(i["x"], i["mem"], p, "")),
    "transformer_layer": ("transformer_layer(x, p)", "TransformerLayer[4, 2, 6]", [X],
                          "f32[B, ~N, 4]", lambda i, p: layer(i["x"], p, False, False)),
    "transformer_layer_pre": ("transformer_layer_pre(x, p)", "TransformerLayer[4, 2, 6]", [X],
                              "f32[B, ~N, 4]", lambda i, p: layer(i["x"], p, True, False)),
    "causal_transformer_layer": ("causal_transformer_layer(x, p)", "TransformerLayer[4, 2, 6]",
                                 [X], "f32[B, ~N, 4]", lambda i, p: layer(i["x"], p, False, True)),
    "causal_transformer_layer_pre": ("causal_transformer_layer_pre(x, p)",
                                     "TransformerLayer[4, 2, 6]", [X], "f32[B, ~N, 4]",
                                     lambda i, p: layer(i["x"], p, True, True)),
    "transformer_layer_from": (
        "transformer_layer_from(x, att, p)", "TransformerLayer[4, 2, 6]",
        [X, ("att", "f32[B, ~N, 4]")], "f32[B, ~N, 4]",
        lambda i, p: ln((h := ln(i["x"] + i["att"], p, "ln1.")) + mlp(h, p, "mlp."), p, "ln2.")),
    "decoder_layer": ("decoder_layer(x, mem, p)", "DecoderLayer[4, 2, 6]",
                      [X, ("mem", "f32[B, ~M, 4]")], "f32[B, ~N, 4]",
                      lambda i, p: decoder(i["x"], i["mem"], p)),
}
for _kind, _R in (("shaw", 5), ("xl", 9), ("t5", 8), ("deberta", 8)):
    LAYERS[_kind + "_attention"] = (
        f"{_kind}_attention(x, p)", f"RelPosAttention[4, 2, 2, {_R}]", [X], "f32[B, ~N, 4]",
        lambda i, p, k=_kind, R=_R: relpos(i["x"], p, k, R))


# Per-sample extents of the ragged axes the layers' inputs use, by name.
EXTENTS = {"N": LENS, "M": MEM_LENS, "H": (5, 4, 7), "W": (3, 6, 4)}


def axes(t):
    """The per-sample axes of a type: `f32[B, ~N, ~N, 4]` gives ['~N', '~N', '4']."""
    return [a.strip() for a in t[t.index("[") + 1:t.rindex("]")].split(", ")][1:]


def ragged_axes(t):
    return [i for i, a in enumerate(axes(t)) if a.startswith("~")]


def sample_shape(t, b):
    return tuple(EXTENTS[a[1:]][b] if a.startswith("~") else int(a) for a in axes(t))


def batch(values, t):
    """Per-sample float64 (or integer) arrays as the rag argument of type t."""
    values = [v.astype(v.dtype if v.dtype.kind == "i" else np.float32) for v in values]
    if ragged_axes(t):
        return rag.ragged(values, ragged_axes=ragged_axes(t))
    return rag.tensor(np.stack(values), batched=True)


def layer_tests(layers):
    """The forward and gradient tests of a table of layers, name: (rag call, params type, rag
    inputs, result type, reference(inputs, params) per sample; its inputs also hold the sample's
    index as "_b"). Returns the fixture and the two tests, for a test module to bind."""

    def source(name):
        call, ptype, inputs, out, _ = layers[name]
        sig = ", ".join(f"{n}: {t}" for n, t in inputs)
        names = ", ".join(n for n, _ in inputs)
        return f"""
fn run({sig}, p: {ptype}) -> {out} {{ return {call} }}
fn loss({sig}, p: {ptype}, r: {out}) -> f32[] {{ return sum(run({names}, p) * r) }}
fn dp({sig}, p: {ptype}, r: {out}) -> {ptype} {{ return grad(loss, wrt=p)({names}, p, r) }}
""" + "".join(
            f"fn d_{n}({sig}, p: {ptype}, r: {out}) -> {t} {{ return grad(loss, wrt={n})({names}, p, r) }}\n"
            for n, t in inputs if t.startswith("f32") and "~" in t)

    def make_inputs(name, rng):
        out = {}
        for n, t in layers[name][2]:
            shapes = [sample_shape(t, b) for b in range(len(LENS))]
            if t.startswith("i"):
                dt = np.int32 if t.startswith("i32") else np.int64
                out[n] = [rng.integers(0, 7, size=sh).astype(dt) for sh in shapes]
            else:
                out[n] = [rng.standard_normal(sh) for sh in shapes]
        return out

    def reference(name, ins, p):
        return [layers[name][4](dict({n: v[b] for n, v in ins.items()}, _b=b), p)
                for b in range(len(LENS))]

    @pytest.fixture(scope="module", params=sorted(layers))
    def case(request):
        name = request.param
        m = rag.compile(source(name), f"stdlib_{name}.rag")
        rng = np.random.default_rng(sorted(layers).index(name))
        # Parameters of O(1) (not the layers' small initial values), so every term matters.
        p = {k: (rng.standard_normal(v.shape) * 0.5 + (1.0 if k.endswith("g") else 0.0))
             for k, v in m.init(layers[name][1]).items()}
        ins = make_inputs(name, rng)
        return name, m, p, ins, rng

    def args(name, ins):
        return [batch(ins[n], t) for n, t in layers[name][2]]

    def test_forward_matches_float64_reference(case):
        name, m, p, ins, _ = case
        out = m.run(*args(name, ins), {k: v.astype(np.float32) for k, v in p.items()})
        got = out.to_list() if "~" in out.schema else list(out.numpy())
        for g, want in zip(got, reference(name, ins, p)):
            np.testing.assert_allclose(g, want, rtol=2e-4, atol=2e-5)

    def test_gradients_match_float64_finite_differences(case):
        name, m, p, ins, rng = case
        want_out = reference(name, ins, p)
        r = [rng.standard_normal(np.shape(o)) for o in want_out]
        r_rag = batch(r, layers[name][3])
        p32 = {k: v.astype(np.float32) for k, v in p.items()}
        a = args(name, ins)

        def loss():
            return sum(float(np.sum(o * ri)) for o, ri in zip(reference(name, ins, p), r))

        g = m.dp(*a, p32, r_rag)
        assert sorted(g.keys()) == sorted(p)
        for k in p:
            np.testing.assert_allclose(g[k], central(loss, p[k]), rtol=2e-3, atol=2e-4,
                                       err_msg=f"{name}: d/d{k}")
        for n, t in layers[name][2]:
            if not (t.startswith("f32") and "~" in t):
                continue
            gx = getattr(m, "d_" + n)(*a, p32, r_rag).to_list()
            for b, arr in enumerate(ins[n]):
                np.testing.assert_allclose(gx[b], central(loss, arr), rtol=2e-3, atol=2e-4,
                                           err_msg=f"{name}: d/d{n}[{b}]")

    return case, test_forward_matches_float64_reference, test_gradients_match_float64_finite_differences


case, test_forward_matches_float64_reference, test_gradients_match_float64_finite_differences = \
    layer_tests(LAYERS)


# ---- losses: generic over the dtype, so checked in f64 -------------------------------------
LOSS_SRC = """
fn bce(x: f64[B, ~N], y: f64[B, ~N]) -> f64[] { return bce_with_logits(x, y) }
fn l1(a: f64[B, ~N, 3], b: f64[B, ~N, 3]) -> f64[] { return l1_loss(a, b) }
fn hub(a: f64[B, ~N, 3], b: f64[B, ~N, 3]) -> f64[] { return huber_loss(a, b) }
fn ntl(logits: f64[B, ~N[1:], 5], ids: i32[B, ~N]) -> f64[] { return next_token_loss(logits, ids) }
fn d_bce(x: f64[B, ~N], y: f64[B, ~N]) -> f64[B, ~N] { return grad(bce, wrt=x)(x, y) }
fn d_l1(a: f64[B, ~N, 3], b: f64[B, ~N, 3]) -> f64[B, ~N, 3] { return grad(l1, wrt=a)(a, b) }
fn d_hub(a: f64[B, ~N, 3], b: f64[B, ~N, 3]) -> f64[B, ~N, 3] { return grad(hub, wrt=a)(a, b) }
fn d_ntl(logits: f64[B, ~N[1:], 5], ids: i32[B, ~N]) -> f64[B, ~N[1:], 5] {
    return grad(ntl, wrt=logits)(logits, ids)
}
fn bce32(x: f32[B, ~N], y: f32[B, ~N]) -> f32[] { return bce_with_logits(x, y) }
"""


def ref_bce(xs, ys):
    x, y = np.concatenate(xs), np.concatenate(ys)
    return np.mean(np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0) - x * y)


def ref_l1(a, b):
    return np.mean(np.abs(np.concatenate(a) - np.concatenate(b)))


def ref_huber(a, b):
    d = np.abs(np.concatenate(a) - np.concatenate(b))
    return np.mean(np.where(d < 1, 0.5 * d * d, d - 0.5))


def ref_ntl(logits, ids):
    total, count = 0.0, 0
    for lg, i in zip(logits, ids):
        for t in range(len(i) - 1):
            row = lg[t]
            total += np.log(np.sum(np.exp(row - row.max()))) + row.max() - row[i[t + 1]]
            count += 1
    return total / max(count, 1)


@pytest.fixture(scope="module")
def losses():
    return rag.compile(LOSS_SRC, "stdlib_losses.rag")


def test_losses_match_float64_reference_and_differences(losses):
    rng = np.random.default_rng(11)
    lens = (3, 0, 5)
    x = [rng.standard_normal(n) * 3 for n in lens]
    y = [rng.uniform(0, 1, n) for n in lens]
    a = [rng.standard_normal((n, 3)) * 1.5 for n in lens]
    b = [rng.standard_normal((n, 3)) for n in lens]
    ids = [rng.integers(0, 5, n).astype(np.int32) for n in (4, 1, 6)]
    lg = [rng.standard_normal((max(len(i) - 1, 0), 5)) for i in ids]
    R = rag.ragged
    cases = [
        ("bce", [x, y], ref_bce), ("l1", [a, b], ref_l1), ("hub", [a, b], ref_huber),
        ("ntl", [lg, ids], ref_ntl),
    ]
    for name, args, ref in cases:
        got = float(getattr(losses, name)(*[R(v) for v in args]))
        assert got == pytest.approx(ref(*args), rel=1e-12, abs=1e-14), name
        g = getattr(losses, "d_" + name)(*[R(v) for v in args]).to_list()
        for s, arr in enumerate(args[0]):
            fd = central(lambda: ref(*args), arr)
            np.testing.assert_allclose(g[s], fd, rtol=1e-6, atol=1e-8, err_msg=f"{name}[{s}]")
    # The same function specialises on f32 too.
    got32 = float(losses.bce32(R([v.astype(np.float32) for v in x]),
                               R([v.astype(np.float32) for v in y])))
    assert got32 == pytest.approx(ref_bce(x, y), rel=1e-5)
