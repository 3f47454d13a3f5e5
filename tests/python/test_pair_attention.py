"""attention with a pair bias on singles and triangle attention on pair states (axis=2), against
per-sample float64 NumPy references; gradients for q, k, v and the bias against float64 central
differences; the ending-node form in both bias orientations; bitwise determinism across
RAG_NUM_THREADS; and the CPU plan (a compiled attention step, no reference kernel)."""
import hashlib
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import rag

SRC = """
fn single(q: f64[B, ~N, H, D], k: f64[B, ~M, H, D], v: f64[B, ~M, H, E], b: f64[B, ~N, ~M, H]) -> f64[B, ~N, H, E] {
    return attention(q, k, v, bias=b)
}
fn single_causal(q: f64[B, ~N, H, D], k: f64[B, ~N, H, D], v: f64[B, ~N, H, E], b: f64[B, ~N, ~N, H]) -> f64[B, ~N, H, E] {
    return attention(q, k, v, bias=b, causal=true, scale=0.3)
}
fn tri(q: f64[B, ~N, ~N, H, D], k: f64[B, ~N, ~N, H, D], v: f64[B, ~N, ~N, H, E], b: f64[B, ~N, ~N, H]) -> f64[B, ~N, ~N, H, E] {
    return attention(q, k, v, axis=2, bias=b)
}
fn loss_single(q: f64[B, ~N, H, D], k: f64[B, ~M, H, D], v: f64[B, ~M, H, E], b: f64[B, ~N, ~M, H], w: f64[B, ~N, H, E]) -> f64[] {
    return sum(attention(q, k, v, bias=b) * w)
}
fn loss_tri(q: f64[B, ~N, ~N, H, D], k: f64[B, ~N, ~N, H, D], v: f64[B, ~N, ~N, H, E], b: f64[B, ~N, ~N, H], w: f64[B, ~N, ~N, H, E]) -> f64[] {
    return sum(attention(q, k, v, axis=2, bias=b) * w)
}
"""
SINGLE = [("q", "f64[B, ~N, H, D]"), ("k", "f64[B, ~M, H, D]"), ("v", "f64[B, ~M, H, E]"),
          ("b", "f64[B, ~N, ~M, H]"), ("w", "f64[B, ~N, H, E]")]
TRI = [("q", "f64[B, ~N, ~N, H, D]"), ("k", "f64[B, ~N, ~N, H, D]"),
       ("v", "f64[B, ~N, ~N, H, E]"), ("b", "f64[B, ~N, ~N, H]"), ("w", "f64[B, ~N, ~N, H, E]")]
for _loss, _sig in (("loss_single", SINGLE), ("loss_tri", TRI)):
    _params = ", ".join(f"{n}: {t}" for n, t in _sig)
    for _x, _t in _sig[:4]:
        SRC += (f"fn d{_x}_{_loss}({_params}) -> {_t} {{\n"
                f"    return grad({_loss}, wrt={_x})(q, k, v, b, w)\n}}\n")

# Static heads and widths: H = 2 heads, D = 3 (q, k), E = 2 (v).
SRC = SRC.replace("H, D]", "2, 3]").replace("H, E]", "2, 2]").replace(", H]", ", 2]")

# The ending node written with transposes, in both bias orientations: AlphaFold 3 reads the bias
# at (i, k) of the untransposed pair state; OpenFold / Boltz / Protenix read it from the
# transposed one, f(z_ki).
SRC += """
fn end_af3(z: f64[B, ~N, ~N, 2, 3], zb: f64[B, ~N, ~N, 2]) -> f64[B, ~N, ~N, 2, 3] {
    let t = transpose(z, 1, 2)
    return transpose(attention(t, t, t, axis=2, bias=zb), 1, 2)
}
fn end_of(z: f64[B, ~N, ~N, 2, 3], zb: f64[B, ~N, ~N, 2]) -> f64[B, ~N, ~N, 2, 3] {
    let t = transpose(z, 1, 2)
    return transpose(attention(t, t, t, axis=2, bias=transpose(zb, 1, 2)), 1, 2)
}
"""

EPS = 1e-6


@pytest.fixture(scope="module", params=["jit", "interpreter"])
def mod(request):
    return rag.compile(SRC, "pair_attention.rag", tier=request.param)


def softmax(s, axis=-1):
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_single(q, k, v, b, scale=None, causal=False):
    """q [N, H, D], k [M, H, D], v [M, H, E], b [N, M, H] -> [N, H, E], float64."""
    N, M = q.shape[0], k.shape[0]
    if N == 0:
        return np.zeros((0, q.shape[1], v.shape[2]))
    if M == 0:
        return np.zeros((N, q.shape[1], v.shape[2]))
    scale = 1 / np.sqrt(q.shape[2]) if scale is None else scale
    s = scale * np.einsum("nhd,mhd->hnm", q, k) + b.transpose(2, 0, 1)
    if causal:
        s = np.where(np.arange(M)[None, :] <= np.arange(N)[:, None], s, -np.inf)
    return np.einsum("hnm,mhe->nhe", softmax(s), v)


def ref_tri(q, k, v, b):
    """Starting node: row r attends q[r, j] over k[r, k] with bias b[j, k]."""
    return np.stack([ref_single(q[r], k[r], v[r], b) for r in range(q.shape[0])]) \
        if q.shape[0] else np.zeros(q.shape[:3] + (v.shape[3],))


def close(got, want, tol=1e-12):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def singles_data(rng, ns, ms, H=2, D=3, E=2):
    q = [rng.standard_normal((n, H, D)) for n in ns]
    k = [rng.standard_normal((m, H, D)) for m in ms]
    v = [rng.standard_normal((m, H, E)) for m in ms]
    b = [rng.standard_normal((n, m, H)) for n, m in zip(ns, ms)]
    return q, k, v, b


def tri_data(rng, ns, H=2, D=3, E=2):
    q = [rng.standard_normal((n, n, H, D)) for n in ns]
    k = [rng.standard_normal((n, n, H, D)) for n in ns]
    v = [rng.standard_normal((n, n, H, E)) for n in ns]
    b = [rng.standard_normal((n, n, H)) for n in ns]
    return q, k, v, b


def test_attention_with_pair_bias_matches_numpy(mod):
    rng = np.random.default_rng(0)
    q, k, v, b = singles_data(rng, [3, 1, 0, 5], [2, 4, 3, 0])
    close(mod.single(q, k, v, b).to_list(), [ref_single(*a) for a in zip(q, k, v, b)])
    q, k, v, b = singles_data(rng, [3, 1, 5], [3, 1, 5])
    close(mod.single_causal(q, k, v, b).to_list(),
          [ref_single(*a, scale=0.3, causal=True) for a in zip(q, k, v, b)])


def test_triangle_attention_matches_numpy(mod):
    rng = np.random.default_rng(1)
    q, k, v, b = tri_data(rng, [3, 1, 0, 4])
    close(mod.tri(q, k, v, b).to_list(), [ref_tri(*a) for a in zip(q, k, v, b)])


def test_ending_node_both_bias_orientations_match_numpy(mod):
    """For each column j, query z_ij attends over keys z_kj; AlphaFold 3's bias is
    bias[i, k] = zb_ik, OpenFold's bias[i, k] = zb_ki."""
    rng = np.random.default_rng(2)
    ns = [3, 1, 4]
    z = [rng.standard_normal((n, n, 2, 3)) for n in ns]
    zb = [rng.standard_normal((n, n, 2)) for n in ns]

    def ending(x, bias):
        out = np.zeros_like(x)
        for j in range(x.shape[0]):
            out[:, j] = ref_single(x[:, j], x[:, j], x[:, j], bias)
        return out

    close(mod.end_af3(z, zb).to_list(), [ending(x, b) for x, b in zip(z, zb)])
    close(mod.end_of(z, zb).to_list(), [ending(x, b.transpose(1, 0, 2)) for x, b in zip(z, zb)])
    # The orientations differ (an asymmetric bias): the test tells them apart.
    assert not np.allclose(mod.end_af3(z, zb).to_list()[2], mod.end_of(z, zb).to_list()[2])


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


@pytest.mark.parametrize("kind", ["single", "tri"])
def test_gradients_for_q_k_v_and_bias_match_central_differences(mod, kind):
    rng = np.random.default_rng(3)
    if kind == "single":
        ins = list(singles_data(rng, [2, 3, 1], [3, 1, 2]))
        w = [rng.standard_normal((n, 2, 2)) for n in (2, 3, 1)]
    else:
        ins = list(tri_data(rng, [2, 3, 1]))
        w = [rng.standard_normal((n, n, 2, 2)) for n in (2, 3, 1)]
    loss = lambda: float(getattr(mod, "loss_" + kind)(*ins, w))  # noqa: E731
    for a, x in enumerate("qkvb"):
        got = getattr(mod, f"d{x}_loss_{kind}")(*ins, w).to_list()
        for i in range(3):
            np.testing.assert_allclose(got[i], central(loss, ins[a], i), rtol=1e-6, atol=1e-8,
                                       err_msg=f"d{x} sample {i}")


def test_mismatched_lengths_name_the_sample(mod):
    rng = np.random.default_rng(4)
    q, k, v, b = singles_data(rng, [3, 2], [2, 4])
    b[1] = rng.standard_normal((2, 3, 2))
    with pytest.raises(rag.Error, match="sample 1"):
        mod.single(q, k, v, b)


@pytest.mark.parametrize("body,message", [
    ("attention(q, q, q, axis=2)", "needs bias="),
    ("attention(q, q, q, axis=3, bias=b)", "axis must be 1"),
    ("attention(q, q, q, bias=b)", "with axis=1 q must be"),
    ("attention(q, q, q, axis=2, bias=q)", "bias must be"),
])
def test_bad_calls_report_file_line_column(body, message):
    src = ("fn f(q: f32[B, ~N, ~N, 2, 3], b: f32[B, ~N, ~N, 2]) -> f32[B, ~N, ~N, 2, 3] {\n"
           f"    return {body}\n}}\n")
    with pytest.raises(rag.Error) as e:
        rag.compile(src, "bad.rag")
    assert message in str(e.value) and "bad.rag:2:" in str(e.value), str(e.value)


def cli(root, *args):
    out = subprocess.run([str(root / "build" / "dsl" / "rag")] + [str(a) for a in args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cpu_plan_runs_compiled_attention_steps(root):
    with tempfile.NamedTemporaryFile("w", suffix=".rag", delete=False) as f:
        f.write(SRC.replace("f64", "f32"))
    for fn in ("tri", "single", "dq_loss_tri", "db_loss_single"):
        plan = cli(root, "ir", f.name, "--fn", fn, "--plan")
        refs = [ln for ln in plan.splitlines()
                if ln.startswith("reference") and "ones_like" not in ln]  # the loss's seed
        assert "attention %" in plan and not refs, plan
    plan = cli(root, "ir", f.name, "--fn", "db_loss_tri", "--plan")
    # One pass computes the bias gradient (its siblings are not asked for).
    assert plan.count("= biased_attention_grad") == 1, plan


def test_compiled_step_is_counted_and_no_reference_runs():
    m = rag.compile(SRC.replace("f64", "f32"), "pair_attention32.rag")
    rng = np.random.default_rng(5)
    q, k, v, b = (list(map(np.float32, x)) for x in tri_data(rng, [3, 5]))
    m.tri(q, k, v, b)
    q, k, v, b = (list(map(np.float32, x)) for x in tri_data(rng, [4, 2, 6]))
    m.tri(q, k, v, b)
    st = m.stats()["tri"]
    assert st["compilations"] == 1 and st["cache_hits"] == 1, st
    assert not st.get("reference_steps"), st


CHILD = """
import hashlib, sys, numpy as np, rag
src = open(sys.argv[1]).read()
m = rag.compile(src, "det.rag")
rng = np.random.default_rng(9)
ns = [23, 31, 17, 9]
H, D, E = 2, 3, 2
q = [rng.standard_normal((n, n, H, D)).astype(np.float32) for n in ns]
k = [rng.standard_normal((n, n, H, D)).astype(np.float32) for n in ns]
v = [rng.standard_normal((n, n, H, E)).astype(np.float32) for n in ns]
b = [rng.standard_normal((n, n, H)).astype(np.float32) for n in ns]
w = [rng.standard_normal((n, n, H, E)).astype(np.float32) for n in ns]
h = hashlib.sha256()
for fn in ("dq_loss_tri", "dk_loss_tri", "dv_loss_tri", "db_loss_tri", "tri"):
    args = (q, k, v, b, w) if fn != "tri" else (q, k, v, b)
    for s in getattr(m, fn)(*args).to_list():
        h.update(np.ascontiguousarray(s).tobytes())
print(h.hexdigest())
"""


def test_gradients_are_bitwise_the_same_across_thread_counts():
    with tempfile.NamedTemporaryFile("w", suffix=".rag", delete=False) as f:
        f.write(SRC.replace("f64", "f32"))
    digests = set()
    for threads in ("1", "2", "3"):
        env = dict(os.environ, RAG_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", CHILD, f.name], capture_output=True,
                             text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests


@pytest.mark.parametrize("scratch", ["0", "64"])
def test_gradients_are_bitwise_the_same_across_thread_counts_whole_or_in_key_tiles(scratch):
    # RAG_ATTENTION_SCRATCH=64: every row block runs in key tiles (16 keys: ns up to 31).
    with tempfile.NamedTemporaryFile("w", suffix=".rag", delete=False) as f:
        f.write(SRC.replace("f64", "f32"))
    digests = set()
    for threads in ("1", "2", "3"):
        env = dict(os.environ, RAG_NUM_THREADS=threads)
        if scratch != "0":
            env["RAG_ATTENTION_SCRATCH"] = scratch
        out = subprocess.run([sys.executable, "-c", CHILD, f.name], capture_output=True,
                             text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1, digests


# ---- key tiles with an online softmax (rows whose N x M scores pass RAG_ATTENTION_SCRATCH) ----

@pytest.fixture
def tiled(monkeypatch):
    """The JIT module with a 64-element scores budget: a row block of N queries over M keys
    with N * M > 64 runs in tiles of 16 keys (so M > 16 takes several), the rest whole."""
    monkeypatch.setenv("RAG_ATTENTION_SCRATCH", "64")
    return rag.compile(SRC, "pair_attention_tiled.rag", tier="jit")


def test_key_tiles_match_numpy(tiled):
    rng = np.random.default_rng(11)
    q, k, v, b = singles_data(rng, [5, 33, 1, 0, 4], [40, 17, 37, 3, 0])
    close(tiled.single(q, k, v, b).to_list(), [ref_single(*a) for a in zip(q, k, v, b)])
    q, k, v, b = singles_data(rng, [40, 20, 3], [40, 20, 3])
    close(tiled.single_causal(q, k, v, b).to_list(),
          [ref_single(*a, scale=0.3, causal=True) for a in zip(q, k, v, b)])
    q, k, v, b = tri_data(rng, [20, 35, 2])
    close(tiled.tri(q, k, v, b).to_list(), [ref_tri(*a) for a in zip(q, k, v, b)])


@pytest.mark.parametrize("kind", ["single", "tri"])
def test_key_tile_gradients_match_central_differences(tiled, kind):
    rng = np.random.default_rng(12)
    if kind == "single":
        ins = list(singles_data(rng, [2, 3], [40, 35]))
        w = [rng.standard_normal((n, 2, 2)) for n in (2, 3)]
    else:
        ins = list(tri_data(rng, [17, 5]))
        w = [rng.standard_normal((n, n, 2, 2)) for n in (17, 5)]
    loss = lambda: float(getattr(tiled, "loss_" + kind)(*ins, w))  # noqa: E731
    for a, x in enumerate("qkvb"):
        got = getattr(tiled, f"d{x}_loss_{kind}")(*ins, w).to_list()
        # Sample 0 runs in tiles (N x M > 64, M > 16): central differences over every element.
        np.testing.assert_allclose(got[0], central(loss, ins[a], 0), rtol=1e-6, atol=1e-8,
                                   err_msg=f"d{x}")
