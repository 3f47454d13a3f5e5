"""Where every plan step runs, visible in m.stats()['fn']['steps'] and `rag run --stats`:
compiled kernels, device kernels, and by op name reference kernels and host fallbacks. Also:
f64 relative-position attention is computed in f64 (the tile programs are f32), not rounded."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import rag

ROOT = pathlib.Path(__file__).resolve().parents[2]

RELPOS = """
fn att(q: f64[B, ~N, 2, 8], k: f64[B, ~N, 2, 8], v: f64[B, ~N, 2, 8], t: f64[9, 2, 8]) -> f64[B, ~N, 2, 8] {
    return relpos_attention(q, k, v, map=clip(4), aq=t)
}
fn loss(q: f64[B, ~N, 2, 8], k: f64[B, ~N, 2, 8], v: f64[B, ~N, 2, 8], t: f64[9, 2, 8]) -> f64[] {
    let o = att(q, k, v, t)
    return sum(o * o)
}
fn dq(q: f64[B, ~N, 2, 8], k: f64[B, ~N, 2, 8], v: f64[B, ~N, 2, 8], t: f64[9, 2, 8]) -> f64[B, ~N, 2, 8] {
    return grad(loss, wrt=q)(q, k, v, t)
}
fn att32(q: f32[B, ~N, 2, 8], k: f32[B, ~N, 2, 8], v: f32[B, ~N, 2, 8], t: f32[9, 2, 8]) -> f32[B, ~N, 2, 8] {
    return relpos_attention(q, k, v, map=clip(4), aq=t)
}
"""


def packed(t):
    return np.concatenate([np.asarray(x).ravel() for x in t.to_list()])


def relpos_inputs(dtype):
    rng = np.random.default_rng(0)
    qkv = [rag.ragged([rng.standard_normal((n, 2, 8)).astype(dtype) for n in (3, 7, 5)])
           for _ in range(3)]
    return qkv + [rng.standard_normal((9, 2, 8)).astype(dtype)]


def test_f64_relpos_attention_is_computed_in_f64():
    m = rag.compile(RELPOS, "relpos64.rag")
    args = relpos_inputs(np.float64)
    got = {fn: packed(m[fn](*args)) for fn in ("att", "dq")}
    steps = m.stats()["att"]["steps"]
    # The f32 tile programs would be rel l2 ~1e-7 off; the f64 reference kernel is exact.
    assert steps["reference"] == {"relpos_attention": 1}, steps
    m.tier = "interpreter"
    for fn, g in got.items():
        want = packed(m[fn](*args))
        assert np.linalg.norm(g - want) <= 1e-13 * np.linalg.norm(want), fn
    m.tier = "jit"
    m.att32(*relpos_inputs(np.float32))
    assert m.stats()["att32"]["steps"] == {"compiled": 1, "reference": {}, "device": 0,
                                          "host": {}}


def test_steps_of_the_latest_call_are_counted_by_placement():
    m = rag.load(ROOT / "examples" / "encoder.rag")
    p = m.init("Encoder", seed=0)
    rng = np.random.default_rng(1)
    x = rag.ragged([rng.standard_normal((n, 64)).astype(np.float32) for n in (3, 5)])
    labels = rag.ragged([rng.integers(0, 2, n).astype(np.int64) for n in (3, 5)])
    m.loss(x, labels, p)
    steps = m.stats()["loss"]["steps"]
    assert steps["compiled"] >= 10 and steps["device"] == 0 and steps["host"] == {}, steps
    plan = cli("ir", ROOT / "examples" / "encoder.rag", "--fn", "loss", "--plan")
    want = {}
    for line in plan.splitlines():
        if line.startswith("reference "):
            op = line.split(" = ")[1]
            want[op] = want.get(op, 0) + 1
    assert steps["reference"] == want, (steps, plan)


def cli(*args):
    exe = ROOT / os.environ.get("RAG_BUILD", "build") / "dsl" / "rag"
    out = subprocess.run([str(exe)] + [str(a) for a in args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_rag_run_stats_prints_where_steps_ran():
    out = cli("run", ROOT / "examples" / "encoder.rag", "--fn", "loss", "--stats")
    line = [s for s in out.splitlines() if s.startswith("steps loss: ")]
    assert line and " device=0 " in line[0] and line[0].endswith("host=0"), out


EMULATED = """
import numpy as np, rag
src = '''
fn f(x: f32[B, ~N, 4], w: f32[4, 4]) -> f32[B, ~N, 4] { return tanh(x @ w) * 2.0 }
fn g(x: f64[B, ~N, 4], w: f64[4, 4]) -> f64[B, ~N, 4] { return x @ w }
'''
m = rag.compile(src, device="cuda")
rng = np.random.default_rng(0)
x = [rng.standard_normal((n, 4)) for n in (3, 5)]
w = rng.standard_normal((4, 4))
m.f(rag.ragged([a.astype(np.float32) for a in x]), w.astype(np.float32))
m.g(rag.ragged(x), w)
s = m.stats()
print(s["f"]["steps"], s["g"]["steps"], sep="\\n")
"""


def test_gpu_tier_reports_device_steps_and_host_fallbacks():
    # The emulated device runs the device kernels on the host: placement, not speed, is tested.
    env = dict(os.environ, RAG_GPU_EMULATE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(pathlib.Path(rag.__file__).parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", EMULATED], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    f, g = [eval(s) for s in out.stdout.strip().splitlines()[-2:]]
    assert f == {"compiled": 0, "reference": {}, "device": 2, "host": {}}, f
    # The f64 GEMM has no device kernel: it runs on the host and says so.
    assert g == {"compiled": 0, "reference": {}, "device": 0, "host": {"matmul_f64": 1}}, g


COMPARE = """
fn sel(a: f32[B, ~N, 8], b: f32[B, ~N, 8]) -> f32[B, ~N, 8] {
    return where(a < b, a, b * 2.0) + where(a != b, 1.0 - a, a)
}
fn lc(a: f32[B, ~N, 8], b: f32[B, ~N, 8]) -> f32[] { return sum(where(a <= b, a * a, b)) }
fn dlc(a: f32[B, ~N, 8], b: f32[B, ~N, 8]) -> f32[B, ~N, 8] { return grad(lc, wrt=a)(a, b) }
fn all(a: f64[B, ~N, 8], b: f64[B, ~N, 8]) -> (bool[B, ~N, 8], bool[B, ~N, 8], bool[B, ~N, 8],
                                                bool[B, ~N, 8], bool[B, ~N, 8], bool[B, ~N, 8]) {
    return (a < b, a <= b, a > b, a >= b, a == b, a != b)
}
"""


def test_comparisons_and_where_run_compiled_and_equal_the_reference():
    m = rag.compile(COMPARE, "compare.rag")
    rng = np.random.default_rng(0)

    def ints(dtype):  # small integers: many ties; NaN in the first sample
        xs = [rng.integers(-2, 3, (n, 8)).astype(dtype) for n in (3, 0, 70)]
        xs[0][0, :3] = np.nan
        return rag.ragged(xs)

    cases = {"sel": [ints(np.float32) for _ in range(2)],
             "dlc": [ints(np.float32) for _ in range(2)],
             "all": [ints(np.float64) for _ in range(2)]}
    got = {fn: m[fn](*args) for fn, args in cases.items()}
    for fn in cases:
        steps = m.stats()[fn]["steps"]
        assert not any(op in steps["reference"] for op in ("lt", "le", "gt", "ge", "eq", "ne",
                                                           "where")), (fn, steps)
    m.tier = "interpreter"
    for fn, args in cases.items():
        want = m[fn](*args)
        pairs = zip(got[fn], want) if isinstance(want, tuple) else [(got[fn], want)]
        for g, w in pairs:
            assert g.schema == w.schema
            for x, y in zip(g.to_list(), w.to_list()):
                np.testing.assert_array_equal(x, y)
