"""The standard library's generic training steps (stdlib/train.rag): type parameters that stand
for a params type (`p: P`, `s: Adam[P]`) or any type (`data: D`), a function passed by name
(`loss: fn`), spreading a tuple into arguments (`*data`) and `wrt=-1`. Each step against a NumPy
float64 reference and bitwise against the same step written out by hand; the errors each new
form can raise."""
import numpy as np
import pytest
import rag

from conftest import singles
from test_models import adamw_reference, np_params

MODEL = """
params Layer {
    w: f32[3, 3] = normal(0.4)
}
params Model {
    layers: Layer[2]
    head: f32[3, 2] = normal(0.5)
}
fn forward(x: f32[B, ~N, 3], p: Model) -> f32[B, ~N, 2] {
    let h = x
    for l in p.layers { h = h + tanh(h @ l.w) }
    return h @ p.head
}
fn loss(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> f32[] {
    return mean((forward(x, p) - y) ** 2)
}
fn gradient(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> Model {
    return grad(loss, wrt=p)(x, y, p)
}
fn generic_clipped(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model, s: Adam[Model], lr: f32[],
                   wd: f32[], max_norm: f32[]) -> (f32[], Model, Adam[Model]) {
    return adam_train_step_clipped(loss, (x, y), p, s, lr, wd, max_norm)
}
fn by_hand_clipped(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model, s: Adam[Model], lr: f32[],
                   wd: f32[], max_norm: f32[]) -> (f32[], Model, Adam[Model]) {
    let (l, g) = value_and_grad(loss, wrt=p)(x, y, p)
    let (g, norm) = clip_norm(g, max_norm)
    let (p, s) = adam(p, g, s, lr=lr, weight_decay=wd)
    return (l, p, s)
}
fn generic_adam(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model, s: Adam[Model], lr: f32[])
        -> (f32[], Model, Adam[Model]) {
    return adam_train_step(loss, (x, y), p, s, lr, 0.1)
}
fn generic_sgd(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model, lr: f32[]) -> (f32[], Model) {
    return sgd_train_step(loss, (x, y), p, lr)
}
fn by_hand_sgd(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model, lr: f32[]) -> (f32[], Model) {
    let (l, g) = value_and_grad(loss, wrt=p)(x, y, p)
    return (l, sgd(p, g, lr=lr))
}
"""


@pytest.fixture(scope="module")
def m():
    return rag.compile(MODEL, "train.rag")


def data(seed, lengths=(4, 1, 6)):
    rng = np.random.default_rng(seed)
    return (rag.ragged(singles(rng, list(lengths), 3)), rag.ragged(singles(rng, list(lengths), 2)))


def f64(params):
    return {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}


def test_clipped_adam_step_matches_numpy_adamw_and_the_hand_written_step(m):
    p = m.init("Model", seed=3)
    s = m.init("Adam[Model]")
    x, y = data(4)
    rp, rm, rv, rt = np_params(p), None, None, 0
    rm = {k: np.zeros_like(v) for k, v in rp.items()}
    rv = {k: np.zeros_like(v) for k, v in rp.items()}
    for lr, wd, clip_to in [(1e-2, 0.0, 0.25), (3e-2, 0.1, 1e3), (5e-3, 0.5, 0.05)]:
        hyper = (np.float32(lr), np.float32(wd), np.float32(clip_to))
        g = f64(m.gradient(x, y, p))
        norm = np.sqrt(sum(float((v**2).sum()) for v in g.values()))
        g = {k: v * min(1.0, clip_to / norm) for k, v in g.items()}
        l1, p1, s1 = m.generic_clipped(x, y, p, s, *hyper)
        l2, p2, s2 = m.by_hand_clipped(x, y, p, s, *hyper)
        assert np.asarray(l1).tobytes() == np.asarray(l2).tobytes()
        for k in p1.keys():
            assert np.asarray(p1[k]).tobytes() == np.asarray(p2[k]).tobytes(), k
        for k in s1.keys():
            assert np.asarray(s1[k]).tobytes() == np.asarray(s2[k]).tobytes(), k
        rp, rm, rv, rt = adamw_reference(rp, g, rm, rv, rt, lr, 0.9, 0.999, 1e-8, wd)
        assert int(np.asarray(s1["t"])) == rt
        for k in rp:
            np.testing.assert_allclose(np.asarray(p1[k]), rp[k], rtol=1e-4, atol=1e-6, err_msg=k)
        p, s, rp = p1, s1, np_params(p1)
    assert m.stats()["generic_clipped"]["compilations"] == 1


def test_unclipped_adam_step_takes_a_constant_weight_decay(m):
    p = m.init("Model", seed=5)
    s = m.init("Adam[Model]")
    x, y = data(6)
    g = f64(m.gradient(x, y, p))
    zeros = {k: np.zeros_like(v) for k, v in g.items()}
    want, _, _, _ = adamw_reference(np_params(p), g, zeros, zeros, 0, 2e-2, 0.9, 0.999, 1e-8, 0.1)
    _, q, s = m.generic_adam(x, y, p, s, np.float32(2e-2))
    for k in want:
        np.testing.assert_allclose(np.asarray(q[k]), want[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_sgd_step_is_the_hand_written_step_bitwise(m):
    p = m.init("Model", seed=8)
    x, y = data(9, lengths=(2, 7))
    g = m.gradient(x, y, p)
    l1, q1 = m.generic_sgd(x, y, p, np.float32(0.05))
    l2, q2 = m.by_hand_sgd(x, y, p, np.float32(0.05))
    assert np.asarray(l1).tobytes() == np.asarray(l2).tobytes()
    for k in q1.keys():
        assert np.asarray(q1[k]).tobytes() == np.asarray(q2[k]).tobytes(), k
        want = np.asarray(p[k]) - np.float32(0.05) * np.asarray(g[k])
        np.testing.assert_allclose(np.asarray(q1[k]), want, rtol=1e-6, atol=1e-7, err_msg=k)


def test_a_function_passed_to_the_stdlib_is_the_callers_not_a_stdlib_namesake():
    # l1_loss is also a stdlib function (two arguments): the generic step must call this one.
    src = MODEL + """
fn l1_loss(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> f32[] {
    return mean(abs(forward(x, p) - y))
}
fn step(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> (f32[], Model) {
    return sgd_train_step(l1_loss, (x, y), p, 0.0)
}
fn direct(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> f32[] { return l1_loss(x, y, p) }
"""
    m = rag.compile(src, "shadow.rag")
    p = m.init("Model", seed=1)
    x, y = data(2)
    loss, _ = m.step(x, y, p)
    assert np.asarray(loss).tobytes() == np.asarray(m.direct(x, y, p)).tobytes()


def compile_error(extra):
    with pytest.raises(rag.CompileError) as e:
        rag.compile(MODEL + extra, "bad.rag")
    return str(e.value)


@pytest.mark.parametrize("extra,msg", [
    # a tensor where a function is expected, and a function where a value is
    ("fn f(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> (f32[], Model) {\n"
     "    return sgd_train_step(x, (x, y), p, 0.1)\n}\n",
     "bad.rag:43:12: error: sgd_train_step: argument loss: expected fn, got f32[B, ~N, 3]"),
    ("fn f(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> (f32[], Model) {\n"
     "    return sgd_train_step(loss, loss, p, 0.1)\n}\n",
     "sgd_train_step: argument data: expected D, got a function"),
    # one type parameter bound to two types
    ("fn same[P](a: P, b: P) -> P { return a }\n"
     "fn f(p: Model) -> Model { return same(p, p.layers[0]) }\n",
     "same: argument b: expected P, got Layer (P is Model here)"),
    # Adam state of another params type
    ("fn f(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model, s: Adam[Layer]) -> (f32[], Model, Adam[Model]) {\n"
     "    return adam_train_step(loss, (x, y), p, s, 0.1, 0.0)\n}\n",
     "adam_train_step: argument s: expected Adam[P], got Adam[Layer] (P is Model here)"),
    # spreading what is not a tuple, and into a builtin
    ("fn f(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> f32[] { return loss(*x, y, p) }\n",
     "bad.rag:42:75: error: *: spreads a tuple into arguments, got f32[B, ~N, 3]"),
    ("fn f(x: f32[B, ~N, 3]) -> f32[B, ~N, 3] { return exp(*(x, x)) }\n",
     "*: spreading a tuple into arguments works for functions defined with fn; builtin exp"),
    # wrt counted from the end, out of range
    ("fn f(x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> Model { return grad(loss, wrt=-4)(x, y, p) }\n",
     "loss has no parameter -4 (it has 3)"),
    # a misspelt type is not silently a type parameter
    ("fn g[T](x: T[B, ~N], p: Modle) -> T[B, ~N] { return x }\n",
     "bad.rag:42:25: error: g: parameter 'p': unknown type 'Modle'"),
    ("fn g[P](p: P, s: Adam[Q]) -> P { return p }\n",
     "g: parameter 's': unknown type 'Q' in Adam[Q]"),
])
def test_errors_of_generic_steps_name_the_argument(extra, msg):
    assert msg in compile_error(extra)


def test_a_function_parameter_cannot_come_from_python(m):
    src = MODEL + """
fn apply(f: fn, x: f32[B, ~N, 3], y: f32[B, ~N, 2], p: Model) -> f32[] { return f(x, y, p) }
"""
    mod = rag.compile(src, "apply.rag")
    x, y = data(1)
    with pytest.raises(rag.Error, match=r"a function \(fn\) cannot be passed from Python"):
        mod.apply(0, x, y, mod.init("Model"))


def test_a_function_parameter_is_called_like_any_function():
    src = """
fn double(x: f32[B, ~N, 2]) -> f32[B, ~N, 2] { return x * 2.0 }
fn twice(f: fn, x: f32[B, ~N, 2]) -> f32[B, ~N, 2] { return f(f(x)) }
fn run(x: f32[B, ~N, 2]) -> f32[B, ~N, 2] { return twice(double, x) + twice(exp_of, x) }
fn exp_of(x: f32[B, ~N, 2]) -> f32[B, ~N, 2] { return exp(x) }
"""
    m = rag.compile(src, "twice.rag")
    xs = singles(np.random.default_rng(3), [3, 1], 2)
    got = m.run(rag.ragged(xs))
    for k, x in enumerate(xs):
        want = 4 * x.astype(np.float64) + np.exp(np.exp(x.astype(np.float64)))
        np.testing.assert_allclose(np.asarray(got[k]), want, rtol=1e-5)
