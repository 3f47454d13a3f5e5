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


def test_to_moves_a_tensor_or_says_why_not(rng):
    x = rag.ragged(singles(rng, (3, 2), width=4))
    assert x.device == "cpu"
    assert x.to("cpu").device == "cpu"
    with pytest.raises(rag.Error, match="to: unknown device 'tpu'; use 'cpu' or 'cuda'"):
        x.to("tpu")
    try:
        t = x.to("cuda")
    except rag.Error as e:  # no driver or no device
        assert str(e).startswith("CUDA unavailable: "), str(e)
        return
    assert t.device == "cuda" and x.device == "cpu"


def test_results_stay_on_the_emulated_device_between_calls():
    """A GPU call's results stay in device memory: parameters passed back into the next step are
    not uploaded again (stats' uploaded_bytes drops by w's 48 bytes), and the steps match the
    CPU's. to('cuda') / to('cpu') move a tensor; a writable view takes it to the host."""
    import os
    import subprocess
    import sys

    child = """
import numpy as np, rag
SRC = '''
params Lin { w: f32[4, 3] }
fn loss(x: f32[B, ~N, 4], y: f32[B, ~N, 3], p: Lin) -> f32[] {
    let d = x @ p.w - y
    return mean(d * d)
}
fn train_step(x: f32[B, ~N, 4], y: f32[B, ~N, 3], p: Lin) -> (f32[], Lin) {
    return sgd_train_step(loss, (x, y), p, 0.1)
}
'''
m, cpu = rag.compile(SRC, device="cuda"), rag.compile(SRC)
rng = np.random.default_rng(0)
x = rag.ragged([rng.standard_normal((n, 4)).astype(np.float32) for n in (5, 0, 9)])
y = rag.ragged([rng.standard_normal((n, 3)).astype(np.float32) for n in (5, 0, 9)])
p0 = m.init("Lin", seed=1)
l1, p1 = m.train_step(x, y, p0)
up1 = m.stats()["train_step"]["uploaded_bytes"]
l2, p2 = m.train_step(x, y, p1)
up2 = m.stats()["train_step"]["uploaded_bytes"]
assert up1 - up2 == 4 * 3 * 4, (up1, up2)
c1, q1 = cpu.train_step(x, y, p0)
c2, q2 = cpu.train_step(x, y, q1)
for got, want in ((l1, c1), (l2, c2)):
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-5)
np.testing.assert_allclose(p2["w"], q2["w"], rtol=1e-5, atol=1e-6)
t = x.to("cuda")
assert t.device == "cuda" and x.device == "cpu"
c = t.to("cpu")
assert c.device == "cpu" and t.device == "cuda"
np.testing.assert_array_equal(c.values, x.values)
v = t.values
assert t.device == "cpu"
print("ok")
"""
    env = dict(os.environ, RAG_GPU_EMULATE="1")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
