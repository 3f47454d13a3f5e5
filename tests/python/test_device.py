"""device=: where a module's calls run. 'cuda' needs a driver and a device: without them the
load itself is a clear rag.Error; with them the GPU tier's results match the CPU's."""
import numpy as np
import pytest
import rag

from conftest import singles

SRC = """
fn f(x: f32[B, ~N, 4]) -> f32[B, ~N, 4] { return softmax(exp(x) * 2.0 + x, axis=-1) }
fn g(x: f32[B, ~N, 4]) -> f32[B, 4] { return sum(x * x, axis=1) }
"""


def test_the_default_device_is_the_cpu():
    m = rag.compile(SRC)
    assert m.device == "cpu" and m.tier == "jit"
    assert rag.compile(SRC, tier="interpreter").tier == "interpreter"


def test_cuda_runs_on_the_gpu_or_says_why_not(rng):
    try:
        m = rag.compile(SRC, device="cuda")
    except rag.Error as e:  # no driver or no device: say so, and how to proceed
        msg = str(e)
        assert msg.startswith("CUDA unavailable: "), msg
        assert "Run on the CPU" in msg, msg
        return
    assert m.device == "cuda" and m.tier == "gpu"
    cpu = rag.compile(SRC)
    x = rag.ragged(singles(rng, (3, 0, 70), width=4))
    for fn in ("f", "g"):
        got, want = getattr(m, fn)(x), getattr(cpu, fn)(x)
        for a, b in zip(got.to_list(), want.to_list()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    m.tier = "jit"  # back to the CPU
    assert m.device == "cpu"


def test_bad_device_arguments_are_errors():
    with pytest.raises(rag.Error, match="unknown device 'tpu'; use 'cpu' or 'cuda'"):
        rag.compile(SRC, device="tpu")
    with pytest.raises(rag.Error, match="device='cuda' runs compiled code"):
        rag.compile(SRC, tier="interpreter", device="cuda")


def test_cuda_on_the_emulated_device_matches_the_cpu():
    """RAG_GPU_EMULATE=1 (read once per process, hence a child process): device='cuda' runs
    the GPU tier on the emulated device, whose results match the CPU's."""
    import os
    import subprocess
    import sys

    child = f"""
import numpy as np, rag
SRC = {SRC!r}
m, cpu = rag.compile(SRC, device="cuda"), rag.compile(SRC)
assert m.device == "cuda" and m.tier == "gpu"
rng = np.random.default_rng(0)
x = rag.ragged([rng.standard_normal((n, 4)).astype(np.float32) for n in (3, 0, 70)])
for fn in ("f", "g"):
    for a, b in zip(getattr(m, fn)(x).to_list(), getattr(cpu, fn)(x).to_list()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
print("ok")
"""
    env = dict(os.environ, RAG_GPU_EMULATE="1")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
