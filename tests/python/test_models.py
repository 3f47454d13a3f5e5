"""Model structure (LANGUAGE.md 6.4-6.5): nested params groups, arrays of them, `for` over
layers with assignment, runtime scalars, Adam with AdamW semantics and clip_norm, each against
a NumPy float64 reference."""
import re

import numpy as np
import pytest
import rag

from conftest import singles

MODEL = """
params Layer {
    w: f32[4, 4] = normal(0.3)
    g: f32[4] = ones
}
params Model {
    emb: f32[3, 4] = normal(0.5)
    layers: Layer[3]
    head: f32[4, 2] = normal(0.5)
}
fn layer(h: f32[B, ~N, 4], l: Layer) -> f32[B, ~N, 4] { return h + tanh(h @ l.w) * l.g }
fn forward(x: f32[B, ~N, 3], p: Model) -> f32[B, ~N, 2] {
    let h = x @ p.emb
    for l in p.layers { h = layer(h, l) }
    return h @ p.head
}
fn unrolled(x: f32[B, ~N, 3], p: Model) -> f32[B, ~N, 2] {
    let h = layer(layer(layer(x @ p.emb, p.layers[0]), p.layers[1]), p.layers[2])
    return h @ p.head
}
fn second(p: Model) -> f32[4, 4] { return p.layers[1].w }
fn loss(x: f32[B, ~N, 3], p: Model) -> f32[] { return mean(forward(x, p) ** 2) }
fn gradient(x: f32[B, ~N, 3], p: Model) -> Model { return grad(loss, wrt=p)(x, p) }
fn sgd_step(x: f32[B, ~N, 3], p: Model, lr: f32[]) -> (f32[], Model) {
    let (l, g) = value_and_grad(loss, wrt=p)(x, p)
    return (l, sgd(p, g, lr=lr))
}
fn adam_step(x: f32[B, ~N, 3], p: Model, s: Adam[Model], lr: f32[], wd: f32[])
        -> (f32[], Model, Adam[Model]) {
    let (l, g) = value_and_grad(loss, wrt=p)(x, p)
    let (p2, s2) = adam(p, g, s, lr=lr, b1=0.8, b2=0.95, eps=1e-6, weight_decay=wd)
    return (l, p2, s2)
}
fn clipped(x: f32[B, ~N, 3], p: Model, m: f32[]) -> (Model, f32[]) {
    return clip_norm(grad(loss, wrt=p)(x, p), m)
}
"""


def batch(lengths, width, seed):
    return rag.ragged(singles(np.random.default_rng(seed), lengths, width))


@pytest.fixture(scope="module")
def model():
    return rag.compile(MODEL, "model.rag")


def np_params(p):
    return {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}


def np_forward(xs, q):
    out = []
    for x in xs:
        h = x @ q["emb"]
        for k in range(3):
            h = h + np.tanh(h @ q[f"layers.{k}.w"]) * q[f"layers.{k}.g"]
        out.append(h @ q["head"])
    return out


def np_loss(xs, q):
    ys = np_forward(xs, q)
    return sum(float((y**2).sum()) for y in ys) / sum(y.size for y in ys)


def np_grad(xs, q, eps=1e-6):
    g = {}
    for k, v in q.items():
        d = np.zeros_like(v)
        for i in np.ndindex(v.shape):
            up = {**q, k: v.copy()}
            dn = {**q, k: v.copy()}
            up[k][i] += eps
            dn[k][i] -= eps
            d[i] = (np_loss(xs, up) - np_loss(xs, dn)) / (2 * eps)
        g[k] = d
    return g


def test_nested_names_are_dotted_and_layers_differ(model):
    p = model.init("Model", seed=0)
    assert list(p.keys()) == ["emb", "layers.0.w", "layers.0.g", "layers.1.w", "layers.1.g",
                              "layers.2.w", "layers.2.g", "head"]
    w = [np.asarray(p[f"layers.{k}.w"]) for k in range(3)]
    assert not np.array_equal(w[0], w[1]) and not np.array_equal(w[1], w[2])
    np.testing.assert_array_equal(np.asarray(model.second(p)), w[1])


def test_for_loop_matches_unrolled_and_reference(model):
    p = model.init("Model", seed=1)
    x = batch([3, 0, 5], 3, seed=2)
    got = model.forward(x, p).to_list()
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(model.unrolled(x, p).to_list()))
    want = np_forward([np.asarray(s, dtype=np.float64) for s in x.to_list()], np_params(p))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_gradient_is_a_nested_group_matching_finite_differences(model):
    p = model.init("Model", seed=3)
    x = batch([2, 4], 3, seed=4)
    g = model.gradient(x, p)
    assert isinstance(g, rag.Params) and g.name == "Model" and list(g.keys()) == list(p.keys())
    want = np_grad([np.asarray(s, dtype=np.float64) for s in x.to_list()], np_params(p))
    for k in p.keys():
        np.testing.assert_allclose(np.asarray(g[k]), want[k], rtol=2e-3, atol=2e-5, err_msg=k)


def test_runtime_lr_compiles_once_and_matches_sgd(model):
    p = model.init("Model", seed=5)
    x = batch([3, 2], 3, seed=6)
    g = model.gradient(x, p)
    for lr in (0.1, 0.01):
        _, q = model.sgd_step(x, p, np.float32(lr))
        for k in p.keys():
            want = np.asarray(p[k]) - np.float32(lr) * np.asarray(g[k])
            np.testing.assert_allclose(np.asarray(q[k]), want, rtol=1e-6, atol=1e-7, err_msg=k)
    assert model.stats()["sgd_step"]["compilations"] == 1


def adamw_reference(p, g, m, v, t, lr, b1, b2, eps, wd):
    """torch.optim.AdamW's update, in float64."""
    t = t + 1
    out_p, out_m, out_v = {}, {}, {}
    for k in p:
        q = p[k] * (1 - lr * wd)
        out_m[k] = b1 * m[k] + (1 - b1) * g[k]
        out_v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
        denom = np.sqrt(out_v[k]) / np.sqrt(1 - b2**t) + eps
        out_p[k] = q - lr / (1 - b1**t) * out_m[k] / denom
    return out_p, out_m, out_v, t


def test_adam_matches_numpy_adamw_over_steps(model):
    p = model.init("Model", seed=7)
    s = model.init("Adam[Model]", seed=0)
    assert list(s.keys())[:2] == ["m.emb", "m.layers.0.w"] and list(s.keys())[-1] == "t"
    assert int(np.asarray(s["t"])) == 0
    x = batch([4, 1, 3], 3, seed=8)
    rp = np_params(p)
    rm = {k: np.zeros_like(v) for k, v in rp.items()}
    rv = {k: np.zeros_like(v) for k, v in rp.items()}
    rt = 0
    for lr, wd in [(1e-2, 0.0), (3e-2, 0.1), (5e-3, 0.5)]:
        g = {k: np.asarray(v, dtype=np.float64) for k, v in model.gradient(x, p).items()}
        _, p, s = model.adam_step(x, p, s, np.float32(lr), np.float32(wd))
        rp, rm, rv, rt = adamw_reference(rp, g, rm, rv, rt, lr, 0.8, 0.95, 1e-6, wd)
        assert int(np.asarray(s["t"])) == rt
        for k in rp:
            np.testing.assert_allclose(np.asarray(p[k]), rp[k], rtol=1e-4, atol=1e-6, err_msg=k)
            np.testing.assert_allclose(np.asarray(s["m." + k]), rm[k], rtol=1e-4, atol=1e-7)
            np.testing.assert_allclose(np.asarray(s["v." + k]), rv[k], rtol=1e-4, atol=1e-9)
        rp = np_params(p)  # continue from rag's parameters so errors do not compound
    assert model.stats()["adam_step"]["compilations"] == 1


def test_clip_norm_scales_by_the_global_norm(model):
    p = model.init("Model", seed=9)
    x = batch([3, 3], 3, seed=10)
    g = {k: np.asarray(v, dtype=np.float64) for k, v in model.gradient(x, p).items()}
    norm = np.sqrt(sum(float((v**2).sum()) for v in g.values()))
    for max_norm in (norm / 4, norm * 4):
        c, n = model.clipped(x, p, np.float32(max_norm))
        assert float(np.asarray(n)) == pytest.approx(norm, rel=1e-5)
        scale = min(1.0, max_norm / norm)
        for k in g:
            np.testing.assert_allclose(np.asarray(c[k]), g[k] * scale, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("body, message", [
    ("let h = x\n for l in p.layers { h = sum(h) }\n return h",
     "cannot assign f32[] to 'h' of type f32[B, ~N, 3]"),
    ("for l in p.layers { y = x }\n return x", "'y' is not bound"),
    ("for l in p.layers { return x }\n return x", "return inside a for loop"),
    ("for l in x { let y = l }\n return x", "for iterates over a params array"),
    ("return x + p.layers[3].g", "index 3 is out of range for Layer[3]"),
])
def test_structure_errors_point_at_the_source(body, message):
    src = MODEL + "fn bad(x: f32[B, ~N, 3], p: Model) -> f32[B, ~N, 3] {\n " + body + "\n}\n"
    with pytest.raises(rag.Error, match=r"model\.rag:\d+:\d+: error: .*" + re.escape(message)):
        rag.compile(src, "model.rag")


def test_nested_calls_inline_once_per_distinct_arguments():
    # 41 functions each calling the next twice: exponential if every call site were inlined.
    src = "fn f0(x: f32[B, ~N, 2]) -> f32[B, ~N, 2] { return x * 2.0 }\n"
    for k in range(1, 41):
        src += (f"fn f{k}(x: f32[B, ~N, 2]) -> f32[B, ~N, 2] "
                f"{{ let a = f{k-1}(x)\n let b = f{k-1}(x)\n return a + b }}\n")
    m = rag.compile(src, "deep.rag")
    x = batch([2, 1], 2, seed=0)
    np.testing.assert_allclose(np.concatenate(m.f5(x).to_list()),
                               np.concatenate(x.to_list()) * 2 * 2**5, rtol=1e-6)


TOKENS = """
fn embed(ids: i32[B, ~N], tok: f32[10, 3], pos: f32[8, 3]) -> f32[B, ~N, 3] {
    return tok[ids] + pos[positions(ids, axis=1)]
}
fn shifted(x: f32[B, ~N, 3]) -> f32[B, ~N[1:], 3] { return x[:, 1:] - x[:, :-1] }
fn every_other(x: f32[B, ~N, 3]) -> f32[B, ~N[::2], 3] { return x[:, ::2] }
fn relu_where(x: f32[B, ~N, 3]) -> f32[B, ~N, 3] { return where(x > 0.0, x, 0.0) }
fn casts(ids: i32[B, ~N]) -> (f32[B, ~N], i64[B, ~N]) { return (f32(ids) * 0.5, i64(ids)) }
fn table_grad(ids: i32[B, ~N], tok: f32[10, 3]) -> f32[10, 3] {
    return grad(gathered, wrt=tok)(ids, tok)
}
fn gathered(ids: i32[B, ~N], tok: f32[10, 3]) -> f32[] { return sum(tok[ids] * tok[ids]) }
"""


def test_token_ids_positions_slices_and_casts_match_numpy():
    m = rag.compile(TOKENS, "tokens.rag")
    rng = np.random.default_rng(0)
    lengths = [3, 0, 7, 1]
    ids = [rng.integers(0, 10, n).astype(np.int32) for n in lengths]
    tok = rng.standard_normal((10, 3)).astype(np.float32)
    pos = rng.standard_normal((8, 3)).astype(np.float32)
    r_ids = rag.ragged(ids, ragged_axes="~N")
    for got, i in zip(m.embed(r_ids, tok, pos).to_list(), ids):
        np.testing.assert_allclose(got, tok[i] + pos[: len(i)], rtol=1e-6)
    xs = [rng.standard_normal((n, 3)).astype(np.float32) for n in lengths]
    x = rag.ragged(xs)
    for got, a in zip(m.shifted(x).to_list(), xs):
        np.testing.assert_array_equal(np.asarray(got).reshape(-1, 3), a[1:] - a[:-1])
    for got, a in zip(m.every_other(x).to_list(), xs):
        np.testing.assert_array_equal(np.asarray(got).reshape(-1, 3), a[::2])
    for got, a in zip(m.relu_where(x).to_list(), xs):
        np.testing.assert_array_equal(got, np.maximum(a, 0))
    halves, wide = m.casts(r_ids)
    for h, w, i in zip(halves.to_list(), wide.to_list(), ids):
        np.testing.assert_array_equal(h, i.astype(np.float32) * 0.5)
        assert np.asarray(w).dtype == np.int64 and np.array_equal(w, i)
    want = np.zeros((10, 3))
    for i in ids:
        np.add.at(want, i, 2 * tok[i].astype(np.float64))
    np.testing.assert_allclose(np.asarray(m.table_grad(r_ids, tok)), want, rtol=1e-6)


def test_out_of_range_ids_name_sample_position_id_and_v():
    m = rag.compile(TOKENS, "tokens.rag")
    ids = rag.ragged([np.array([1, 2], np.int32), np.array([3, 12, 0], np.int32)],
                     ragged_axes="~N")
    with pytest.raises(rag.Error, match=r"sample 1.*id 12.*V = 10"):
        m.embed(ids, np.zeros((10, 3), np.float32), np.zeros((8, 3), np.float32))
