"""compile_seconds counts every compile cost of a first call, and the on-disk cache of compiled
objects serves a second process. Each case runs fresh Python processes, as users start them."""
import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, sys, time
import numpy as np
import rag
m = rag.load(sys.argv[1])
rng = np.random.default_rng(0)
x = rag.ragged([rng.standard_normal((n, 64)).astype(np.float32) for n in (5, 17, 9)])
labels = rag.ragged([(rng.random(n) < 0.5).astype(np.int64) for n in (5, 17, 9)])
p = m.init("Encoder", seed=0)
t0 = time.perf_counter()
loss, q = m.train_step(x, labels, p)
wall = time.perf_counter() - t0
st = m.stats()["train_step"]
print(json.dumps({"wall": wall, "compile_seconds": st["compile_seconds"],
                  "disk_cache_hits": st["disk_cache_hits"],
                  "bits": np.asarray(q["layer.att.wq"]).tobytes().hex() + repr(float(np.asarray(loss)))}))
"""


def child(root, cache):
    env = dict(os.environ, RAG_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", CHILD, str(root / "examples" / "encoder.rag")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_first_call_compile_seconds_is_most_of_the_first_call(root):
    # No disk cache: the row-wise, segmented and line kernels compile inside the first call,
    # after specialisation; they count too. The step itself takes milliseconds.
    r = child(root, "off")
    assert r["disk_cache_hits"] == 0
    assert r["compile_seconds"] <= r["wall"] + 1e-3
    assert r["compile_seconds"] >= 0.8 * r["wall"], r


def test_a_second_process_loads_compiled_objects_from_disk(root, tmp_path):
    first = child(root, tmp_path)
    second = child(root, tmp_path)
    assert first["disk_cache_hits"] == 0
    assert second["disk_cache_hits"] > 0
    assert second["bits"] == first["bits"]
    assert second["compile_seconds"] < first["compile_seconds"]


def test_a_first_call_compiles_only_the_host_kernels_its_plan_uses(root):
    # The row-wise, segmented and line kernels compile one by one on first use: an f32
    # layernorm encoder needs no f64 kernel, no rmsnorm and no max/min line kernel (whole
    # families compiled at once cost a cold first call about 1.2 s of CPU more).
    from test_cli import RAG
    if RAG is None:
        pytest.skip("no rag binary")
    env = dict(os.environ, RAG_CACHE_DIR="off")
    r = subprocess.run([str(RAG), "run", str(root / "examples" / "encoder.rag"), "--fn",
                        "train_step", "--stats"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("stats host kernels compiled:"))
    count, *names = line.split(":", 1)[1].split()
    assert int(count) == len(names) == len(set(names)), line
    assert "rowwise/layernorm.f32" in names and "rowwise/layernorm_grad.f32" in names, line
    assert not [n for n in names if n.endswith(".f64") or "rmsnorm" in n
                or n.startswith(("lines/max", "lines/min"))], line
