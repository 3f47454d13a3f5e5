"""einsum of two operands (triangle multiplication, projections, head contractions) against
per-sample float64 NumPy einsum, its gradients against float64 central differences, and its
errors (file:line:col)."""
import numpy as np
import pytest
import rag

SRC = """
fn out(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] {
    return einsum("bikc,bjkc->bijc", a, b)
}
fn inc(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] {
    return einsum("bkic,bkjc->bijc", a, b)
}
fn proj(x: f64[B, ~N, 3], w: f64[3, 5]) -> f64[B, ~N, 5] { return einsum("bnc,cd->bnd", x, w) }
fn projt(x: f64[B, ~N, ~N, 3], w: f64[5, 3]) -> f64[B, ~N, ~N, 5] {
    return einsum("dc,bijc->bijd", w, x)
}
fn scores(q: f64[B, ~N, 2, 3], k: f64[B, ~N, 2, 3]) -> f64[B, 2, ~N, ~N] {
    return einsum("bnhd,bmhd->bhnm", q, k)
}
fn outer(a: f64[B, ~N, 3], b: f64[B, ~N, 3]) -> f64[B, ~N, ~N, 3] {
    return einsum("bic,bjc->bijc", a, b)
}
fn pool(a: f64[B, ~N, 3], z: f64[B, ~N, ~N, 3]) -> f64[B, ~N, 3] {
    return einsum("bic,bijc->bjc", a, z)
}
fn loss_out(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C], w: f64[B, ~N, ~N, C]) -> f64[] {
    return sum(einsum("bikc,bjkc->bijc", a, b) * w)
}
fn loss_inc(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C], w: f64[B, ~N, ~N, C]) -> f64[] {
    return sum(einsum("bkic,bkjc->bijc", a, b) * w)
}
fn da_out(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C], w: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] {
    return grad(loss_out, wrt=a)(a, b, w)
}
fn db_out(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C], w: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] {
    return grad(loss_out, wrt=b)(a, b, w)
}
fn da_inc(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C], w: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] {
    return grad(loss_inc, wrt=a)(a, b, w)
}
fn db_inc(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C], w: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] {
    return grad(loss_inc, wrt=b)(a, b, w)
}
fn loss_pool(a: f64[B, ~N, 3], z: f64[B, ~N, ~N, 3], w: f64[B, ~N, 3]) -> f64[] {
    return sum(einsum("bic,bijc->bjc", a, z) * w)
}
fn da_pool(a: f64[B, ~N, 3], z: f64[B, ~N, ~N, 3], w: f64[B, ~N, 3]) -> f64[B, ~N, 3] {
    return grad(loss_pool, wrt=a)(a, z, w)
}
"""

LENGTHS = [1, 3, 0, 4]
EPS = 1e-6


@pytest.fixture(scope="module", params=["jit", "interpreter"])
def mod(request):
    return rag.compile(SRC, "einsum.rag", tier=request.param)


def pairs(rng, c=2, lengths=LENGTHS):
    return [rng.standard_normal((n, n, c)) for n in lengths]


def close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn,spec", [("out", "ikc,jkc->ijc"), ("inc", "kic,kjc->ijc")])
def test_triangle_multiplication_matches_numpy(mod, fn, spec):
    rng = np.random.default_rng(0)
    a, b = pairs(rng), pairs(rng)
    got = getattr(mod, fn)(a, b).to_list()
    close(got, [np.einsum(spec, x, y) for x, y in zip(a, b)])


def test_projection_head_and_broadcast_einsums_match_numpy(mod):
    rng = np.random.default_rng(1)
    x = [rng.standard_normal((n, 3)) for n in LENGTHS]
    w = rng.standard_normal((3, 5))
    close(mod.proj(x, w).to_list(), [s @ w for s in x])
    z = pairs(rng, 3)
    wt = rng.standard_normal((5, 3))
    close(mod.projt(z, wt).to_list(), [np.einsum("dc,ijc->ijd", wt, s) for s in z])
    q = [rng.standard_normal((n, 2, 3)) for n in LENGTHS]
    k = [rng.standard_normal((n, 2, 3)) for n in LENGTHS]
    close(mod.scores(q, k).to_list(), [np.einsum("nhd,mhd->hnm", s, t) for s, t in zip(q, k)])
    y = [rng.standard_normal((n, 3)) for n in LENGTHS]
    close(mod.outer(x, y).to_list(), [np.einsum("ic,jc->ijc", s, t) for s, t in zip(x, y)])
    close(mod.pool(x, z).to_list(), [np.einsum("ic,ijc->jc", s, t) for s, t in zip(x, z)])


def central(fun, arrs, i):
    g = np.zeros_like(arrs[i])
    for idx in np.ndindex(arrs[i].shape):
        old = arrs[i][idx]
        arrs[i][idx] = old + EPS
        up = fun()
        arrs[i][idx] = old - EPS
        down = fun()
        arrs[i][idx] = old
        g[idx] = (up - down) / (2 * EPS)
    return g


@pytest.mark.parametrize("kind", ["out", "inc"])
def test_triangle_multiplication_gradients_match_central_differences(mod, kind):
    rng = np.random.default_rng(2)
    lengths = [1, 3, 2]
    a, b, w = pairs(rng, 2, lengths), pairs(rng, 2, lengths), pairs(rng, 2, lengths)
    loss = lambda: float(getattr(mod, "loss_" + kind)(a, b, w))  # noqa: E731
    for name, arrs in (("da", a), ("db", b)):
        got = getattr(mod, f"{name}_{kind}")(a, b, w).to_list()
        for i in range(len(lengths)):
            np.testing.assert_allclose(got[i], central(loss, arrs, i), rtol=1e-7, atol=1e-8)


def test_contraction_without_a_free_axis_gradient(mod):
    rng = np.random.default_rng(3)
    lengths = [2, 3]
    a = [rng.standard_normal((n, 3)) for n in lengths]
    z, w = pairs(rng, 3, lengths), [rng.standard_normal((n, 3)) for n in lengths]
    loss = lambda: float(mod.loss_pool(a, z, w))  # noqa: E731
    got = mod.da_pool(a, z, w).to_list()
    for i in range(len(lengths)):
        np.testing.assert_allclose(got[i], central(loss, a, i), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("body,message", [
    ('einsum("bikc,bjkc", a, b)', "the spec must read"),
    ('einsum("bikc,bjkc->bijC", a, b)', "letters must be a-z"),
    ('einsum("bikk,bjkc->bijc", a, b)', "letter 'k' repeats"),
    ('einsum("bik,bjkc->bijc", a, b)', "has 3 letters but its operand"),
    ('einsum("bikc,bjkc->bijz", a, b)', "output letter 'z' is in neither operand"),
    ('einsum("bikc,bjkc->bij", a, b)', "contracts 2 axes"),
    ('einsum("bikc,ajkc->bijc", a, b)', "the batch axis"),
    ('einsum(a, a, b)', "first argument must be a quoted spec"),
    ('einsum("bikc,bjkc->bijc", a)', "takes a spec and two operands"),
    ('a + "x"', "a string is only an argument of a builtin"),
])
def test_unsupported_specs_report_file_line_column(body, message):
    src = ("fn f(a: f64[B, ~N, ~N, C], b: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] {\n"
           f"    return {body}\n}}\n")
    with pytest.raises(rag.Error) as e:
        rag.compile(src, "bad.rag")
    assert message in str(e.value)
    assert "bad.rag:2:" in str(e.value)


def test_triangle_multiplication_plan_has_no_reference_step(root):
    import subprocess
    import tempfile
    exe = root / "build" / "dsl" / "rag"
    with tempfile.NamedTemporaryFile("w", suffix=".rag", delete=False) as f:
        f.write(SRC.replace("f64", "f32"))
    for fn in ("out", "inc", "da_out", "db_inc"):
        plan = subprocess.run([str(exe), "ir", f.name, "--fn", fn, "--plan"], capture_output=True,
                              text=True, timeout=300)
        assert plan.returncode == 0, plan.stderr
        lines = plan.stdout.splitlines()
        # The loss's seed gradient (ones_like) is a listed reference step; nothing else is.
        refs = [ln for ln in lines if ln.startswith("reference") and "ones_like" not in ln]
        assert any(ln.startswith("gemm") for ln in lines) and not refs, plan.stdout
        # One operand's two pair axes are swapped (a row copy); every other transpose is a view.
        if fn in ("out", "inc"):
            assert sum(ln.startswith("permute") for ln in lines) == 1, plan.stdout
