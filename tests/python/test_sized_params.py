"""Params groups with sizes (`params Linear[I, O]`, used as `Linear[384, 128]`): canonical type
names, initialisation keys, arrays, Adam state, checkpoints, size binding in generic
signatures and its errors (tests/golden/errors/sized_group_*.rag hold the load-time ones)."""
import numpy as np
import pytest
import rag

SRC = """
params Proj[I, O] {
    w: f32[I, O] = normal(0.5)
    b: f32[O] = uniform(-0.5, 0.5)
}
params Pair[C] {
    a: Proj[C, 3]
    b: Proj[3, C]
}
params Model {
    first: Proj[4, 3]
    stack: Pair[4][2]
    g: f32[4] = ones
}
fn proj(x: f32[B, ~N, I], p: Proj[I, O]) -> f32[B, ~N, O] { return x @ p.w + p.b }
fn width(x: f32[B, ~N, I], p: Proj[I, O]) -> f32[B, ~N, 1] {
    return zeros_like(x[:, :, 0:1]) + O * 10 + I
}
fn forward(x: f32[B, ~N, 4], m: Model) -> f32[B, ~N, 4] {
    let h = x
    for l in m.stack { h = proj(proj(h, l.a), l.b) }
    return h * m.g
}
fn step(x: f32[B, ~N, 4], m: Model, s: Adam[Model]) -> (f32[], Model, Adam[Model]) {
    let (l, g) = value_and_grad(loss, wrt=m)(x, m)
    let (m, s) = adam(m, g, s, lr=0.01)
    return (l, m, s)
}
fn loss(x: f32[B, ~N, 4], m: Model) -> f32[] { return mean(forward(x, m) * forward(x, m)) }
fn one(x: f32[B, ~N, 4], p: Proj[4, 3]) -> f32[B, ~N, 3] { return proj(x, p) }
"""


@pytest.fixture(scope="module")
def m():
    return rag.compile(SRC, "sized.rag")


def xs(rng, c=4):
    return rag.ragged([rng.standard_normal((n, c)).astype(np.float32) for n in (3, 1, 5)])


def test_instance_names_are_canonical(m):
    a = m.init("Proj[4,3]", seed=1)
    b = m.init("Proj[ 4 , 3 ]", seed=1)
    assert a.name == b.name == "Proj[4, 3]"
    assert list(a.keys()) == ["w", "b"] and a["w"].shape == (4, 3) and a["b"].shape == (3,)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_init_keys_name_the_instance(m):
    # Each stream is keyed by "<canonical type>.<dotted field>": the instance's sizes are part
    # of the key, so Proj[4, 3] and the Model field of that type draw different values.
    top = m.init("Proj[4, 3]", seed=0)
    model = m.init("Model", seed=0)
    assert not np.array_equal(top["w"], model["first.w"])
    assert [k for k in model.keys()] == [
        "first.w", "first.b", "stack.0.a.w", "stack.0.a.b", "stack.0.b.w", "stack.0.b.b",
        "stack.1.a.w", "stack.1.a.b", "stack.1.b.w", "stack.1.b.b", "g"]
    assert model["stack.0.b.w"].shape == (3, 4)
    assert not np.array_equal(model["stack.0.a.w"], model["stack.1.a.w"])
    arr = m.init("Pair[4][2]", seed=0)
    assert arr.name == "Pair[4][2]" and list(arr.keys())[0] == "0.a.w"


def test_sizes_bind_and_are_constants_in_the_body(m):
    rng = np.random.default_rng(0)
    x = xs(rng)
    p = m.init("Proj[4, 3]", seed=3)
    out = m.one(x, p)
    for xi, yi in zip(x.to_list(), out.to_list()):
        ref = xi.astype(np.float64) @ p["w"].astype(np.float64) + p["b"]
        np.testing.assert_allclose(yi, ref, rtol=1e-5, atol=1e-6)
    w = m.width(x, p)
    assert all(np.all(s == 34.0) for s in w.to_list())   # O * 10 + I


def test_adam_state_and_checkpoint_of_a_model_with_instances(m, tmp_path):
    rng = np.random.default_rng(1)
    x = xs(rng)
    p = m.init("Model", seed=0)
    s = m.init("Adam[Model]")
    assert "m.stack.1.b.w" in s and s.name == "Adam[Model]"
    l0, p, s = m.step(x, p, s)
    l1, p, s = m.step(x, p, s)
    assert float(l1) < float(l0)
    m.save_params(p, str(tmp_path / "p.safetensors"))
    q = m.load_params("Model", str(tmp_path / "p.safetensors"))
    for k in p:
        np.testing.assert_array_equal(p[k], q[k])
    # An instance round-trips on its own under its canonical name.
    one = m.init("Proj[3, 4]", seed=2)
    m.save_params(one, str(tmp_path / "one.safetensors"))
    back = m.load_params("Proj[3,4]", str(tmp_path / "one.safetensors"))
    assert back.name == "Proj[3, 4]"
    np.testing.assert_array_equal(back["w"], one["w"])
    with pytest.raises(rag.Error):
        m.load_params("Proj[4, 3]", str(tmp_path / "one.safetensors"))


def test_adam_of_an_instance(m):
    s = m.init("Adam[Proj[4, 3]]")
    assert s.name == "Adam[Proj[4, 3]]" and list(s.keys()) == ["m.w", "m.b", "v.w", "v.b", "t"]


@pytest.mark.parametrize("name,msg", [
    ("Proj", "params Proj needs its sizes: write Proj[I, O]"),
    ("Proj[4]", "params Proj takes 2 sizes [I, O], got 1 in 'Proj[4]'"),
    ("Proj[4, 0]", "params Proj[4, 0]: size O must be an integer from 1 to 2^32, got 0"),
    ("Model[2, 3]", "params Model has no sizes: Model[n] is an array of n, got 'Model[2, 3]'"),
])
def test_bad_instance_names(m, name, msg):
    with pytest.raises(rag.Error, match=msg.replace("[", r"\[").replace("]", r"\]").replace("^", r"\^")):
        m.init(name)


def test_mismatched_sizes_at_a_call():
    src = SRC + """
fn bad(x: f32[B, ~N, 5], p: Proj[4, 3]) -> f32[B, ~N, 3] { return proj(x, p) }
"""
    with pytest.raises(rag.CompileError) as e:
        rag.compile(src, "bad.rag")
    assert ("bad.rag:32:67: error: proj: argument p: expected Proj[I, O], got Proj[4, 3] "
            "(I was bound to 5 by an earlier argument)") in str(e.value)
