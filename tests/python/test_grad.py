"""Gradients derived by the frontend against central differences computed from Python."""
import numpy as np
import pytest
import rag

SRC = """
params Lin {
    w: f64[3, 2] = normal(0.5)
    b: f64[2] = uniform(-0.5, 0.5)
}
fn f(x: f64[B, ~N, 3], p: Lin) -> f64[] {
    let h = tanh(x @ p.w + p.b)
    return sum(h * h) + mean(sum(h, axis=1)) + mean(softmax(h, axis=1) * h)
}
fn df(x: f64[B, ~N, 3], p: Lin) -> Lin { return grad(f, wrt=p)(x, p) }
fn dx(x: f64[B, ~N, 3], p: Lin) -> f64[B, ~N, 3] { return grad(f, wrt=x)(x, p) }
fn vg(x: f64[B, ~N, 3], p: Lin) -> (f64[], Lin) { return value_and_grad(f, wrt=p)(x, p) }
"""

EPS = 1e-6


@pytest.fixture(scope="module")
def mod():
    return rag.compile(SRC, "grad.rag")


@pytest.fixture()
def data(mod):
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((n, 3)) for n in (2, 5, 1, 3)]
    return xs, mod.init("Lin", seed=2).to_dict()


def central(fun, arr):
    """d fun / d arr by central differences, perturbing `arr` in place."""
    g = np.zeros_like(arr)
    for idx in np.ndindex(arr.shape):
        old = arr[idx]
        arr[idx] = old + EPS
        up = fun()
        arr[idx] = old - EPS
        down = fun()
        arr[idx] = old
        g[idx] = (up - down) / (2 * EPS)
    return g


def test_grad_wrt_params(mod, data):
    xs, p = data
    x = rag.ragged(xs)
    loss = lambda: float(mod.f(x, p))  # noqa: E731
    g = mod.df(x, p)
    assert isinstance(g, rag.Params) and g.name == "Lin"
    for name in ("w", "b"):
        np.testing.assert_allclose(g[name], central(loss, p[name]), rtol=1e-6, atol=1e-8)


def test_grad_wrt_ragged_input(mod, data):
    xs, p = data
    g = mod.dx(rag.ragged(xs), p)
    assert g.schema == "f64[B, ~N, 3]" and g.lengths(1) == [2, 5, 1, 3]
    for i, gi in enumerate(g.to_list()):
        loss = lambda: float(mod.f(rag.ragged(xs), p))  # noqa: E731
        np.testing.assert_allclose(gi, central(loss, xs[i]), rtol=1e-6, atol=1e-8)


def test_value_and_grad(mod, data):
    xs, p = data
    x = rag.ragged(xs)
    value, g = mod.vg(x, p)
    assert float(value) == pytest.approx(float(mod.f(x, p)), rel=1e-12)
    g2 = mod.df(x, p)
    for name in g:
        np.testing.assert_allclose(g[name], g2[name], rtol=1e-12)


def test_train_step_lowers_the_loss(pair_module, pair_params, rng):
    from conftest import singles

    x = rag.ragged(singles(rng, (3, 4, 2)))
    p = pair_params
    losses = []
    for _ in range(3):
        loss, p = pair_module.train_step(x, p)
        losses.append(float(loss))
    assert losses[2] < losses[1] < losses[0]
    assert pair_module.stats()["train_step"]["compilations"] == 1
