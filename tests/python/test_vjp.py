"""Reverse mode from the host: Function.vjp and Function.call_saving / Saved.backward.

Gradients are checked against float64 central differences of <f(x), cotangent> directly, and
the two-call form against the one-call form bitwise.
"""
import numpy as np
import pytest

import rag

SRC = """
params P {
    w: T[4, 3] = normal(0.5)
    b: T[3] = uniform(-0.5, 0.5)
}
params S {
    m: T[3] = ones
    t: i64[] = zeros
}
fn f(x: T[B, ~N, 4], p: P) -> T[B, ~N, 3] {
    return tanh(x @ p.w + p.b)
}
fn g(x: T[B, ~N, 4], labels: i64[B, ~N], p: P, s: S) -> (T[], T[B, ~N, 3], i64[B, ~N]) {
    let y = f(x, p) * s.m
    return (sum(y * y), y, labels)
}
"""

LENGTHS = (2, 5, 1)


def module(dtype):
    return rag.compile(SRC.replace("T[", dtype + "["))


def ragged(rng, width, dtype):
    return rag.ragged([rng.standard_normal((n, width)).astype(dtype) for n in LENGTHS])


def inner(m, x, p, ct):
    """<f(x, p), ct> in float64."""
    y = m.f(x, p)
    return sum(float(np.sum(a * b)) for a, b in zip(y.to_list(), ct.to_list()))


def perturbed_tensor(x, k, h):
    vals = [a.copy() for a in x.to_list()]
    flat = np.concatenate([v.ravel() for v in vals])
    flat[k] += h
    out, pos = [], 0
    for v in vals:
        out.append(flat[pos:pos + v.size].reshape(v.shape))
        pos += v.size
    return rag.ragged(out)


def test_vjp_matches_float64_finite_differences():
    rng = np.random.default_rng(0)
    m = module("f64")
    p = m.init("P", 1)
    x = ragged(rng, 4, np.float64)
    ct = ragged(rng, 3, np.float64)
    gx, gp = m.f.vjp(x, p, ct)
    h = 1e-6
    got_x = np.concatenate([a.ravel() for a in gx.to_list()])
    for k in range(0, got_x.size, 3):
        fd = (inner(m, perturbed_tensor(x, k, h), p, ct) -
              inner(m, perturbed_tensor(x, k, -h), p, ct)) / (2 * h)
        assert got_x[k] == pytest.approx(fd, rel=1e-6, abs=1e-8), k
    for name in ("w", "b"):
        got = np.asarray(gp[name])
        base = np.asarray(p[name]).copy()
        for idx in np.ndindex(base.shape):
            plus, minus = p.copy(), p.copy()
            a, b = base.copy(), base.copy()
            a[idx] += h
            b[idx] -= h
            plus[name], minus[name] = a, b
            fd = (inner(m, x, plus, ct) - inner(m, x, minus, ct)) / (2 * h)
            assert got[idx] == pytest.approx(fd, rel=1e-6, abs=1e-8), (name, idx)


def test_call_saving_then_backward_equals_vjp_bitwise():
    rng = np.random.default_rng(1)
    m = module("f32")
    p = m.init("P", 2)
    x = ragged(rng, 4, np.float32)
    ct = ragged(rng, 3, np.float32)
    y, saved = m.f.call_saving(x, p)
    assert np.array_equal(y.values, m.f(x, p).values)
    gx, gp = saved.backward(ct)
    gx2, gp2 = m.f.vjp(x, p, cotangents=ct)
    assert np.array_equal(gx.values, gx2.values)
    for name in ("w", "b"):
        assert np.array_equal(np.asarray(gp[name]), np.asarray(gp2[name]))
    # The saved state is reusable: a second backward with another cotangent is linear in it.
    g3x, _ = saved.backward(rag.ragged([2 * a for a in ct.to_list()]))
    np.testing.assert_allclose(g3x.values, 2 * gx.values, rtol=1e-6, atol=1e-7)


def test_scalar_result_vjp_equals_the_languages_grad():
    rng = np.random.default_rng(2)
    m = rag.compile(SRC.replace("T[", "f32[") + """
fn loss(x: f32[B, ~N, 4], p: P) -> f32[] {
    let y = f(x, p)
    return sum(y * y)
}
fn dloss(x: f32[B, ~N, 4], p: P) -> P {
    return grad(loss, p)(x, p)
}
""")
    p = m.init("P", 3)
    x = ragged(rng, 4, np.float32)
    _, gp = m.loss.vjp(x, p, 1.0)
    want = m.dloss(x, p)
    for name in ("w", "b"):
        np.testing.assert_allclose(np.asarray(gp[name]), np.asarray(want[name]), rtol=1e-5,
                                   atol=1e-6)


def test_tuple_results_integer_arguments_and_record_integer_fields():
    rng = np.random.default_rng(3)
    m = module("f32")
    p, s = m.init("P", 4), m.init("S", 0)
    x = ragged(rng, 4, np.float32)
    labels = rag.ragged([np.zeros(n, np.int64) for n in LENGTHS])
    ct_y = ragged(rng, 3, np.float32)
    # Only the second element gets a cotangent: the gradient is f's vjp scaled by s.m = 1.
    gx, glabels, gp, gs = m.g.vjp(x, labels, p, s, (None, ct_y, None))
    assert glabels is None
    fx, fp = m.f.vjp(x, p, ct_y)
    np.testing.assert_allclose(gx.values, fx.values, rtol=1e-6, atol=1e-7)
    assert list(gs.keys()) == ["m", "t"] and int(np.asarray(gs["t"])) == 0
    # d/dm of sum_k <y_k, ct_k> with y = f * m: sum over rows of f * ct.
    fy = m.f(x, p)
    want = sum((a * b).sum(axis=0) for a, b in zip(fy.to_list(), ct_y.to_list()))
    np.testing.assert_allclose(np.asarray(gs["m"]), want, rtol=1e-5)
    # The scalar element alone: d sum(y^2) / dx = vjp of f with cotangent 2 y.
    gx1, _, _, _ = m.g.vjp(x, labels, p, s, (1.0, None, None))
    gx2, _ = m.f.vjp(x, p, rag.ragged([2 * a for a in fy.to_list()]))
    np.testing.assert_allclose(gx1.values, gx2.values, rtol=1e-5, atol=1e-6)


def test_the_interpreter_gives_the_same_gradients():
    rng = np.random.default_rng(4)
    m = module("f32")
    p = m.init("P", 5)
    x, ct = ragged(rng, 4, np.float32), ragged(rng, 3, np.float32)
    gx, gp = m.f.vjp(x, p, ct)
    m.tier = "interpreter"
    ix, ip = m.f.vjp(x, p, ct)
    np.testing.assert_allclose(gx.values, ix.values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gp["w"]), np.asarray(ip["w"]), rtol=1e-5, atol=1e-6)


def test_bad_cotangents_are_clear_errors():
    rng = np.random.default_rng(5)
    m = module("f32")
    p, s = m.init("P", 6), m.init("S", 0)
    x = ragged(rng, 4, np.float32)
    labels = rag.ragged([np.zeros(n, np.int64) for n in LENGTHS])
    wrong = rag.ragged([np.zeros((n + 1, 3), np.float32) for n in LENGTHS])
    with pytest.raises(rag.Error, match="cotangent of output 0 .* must match the output"):
        m.f.vjp(x, p, wrong)
    with pytest.raises(rag.Error, match="one cotangent per result element"):
        m.g.vjp(x, labels, p, s, (1.0, None))
    with pytest.raises(rag.Error, match="give one cotangent per element"):
        m.g.vjp(x, labels, p, s, 1.0)
    with pytest.raises(TypeError, match=r"takes 3 arguments \(the 2 of f, then the cotangents\)"):
        m.f.vjp()
    # The module survives and still computes.
    gx, _ = m.f.vjp(x, p, rag.ragged([np.ones((n, 3), np.float32) for n in LENGTHS]))
    assert gx.schema == "f32[B, ~N, 4]"
