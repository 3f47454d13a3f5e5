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


def test_cuda_dlpack_on_the_emulated_device():
    """CUDA DLPack both ways (the emulated device's memory is host memory, so ctypes can stand
    in for a CUDA library): a device result exports its device memory, shared (a write through
    the capsule is what rag reads next) or copied; an import of device memory is adopted
    without an upload, or copied on the device where it is misaligned; rag hands a producer
    its stream (-1, none, on the emulated device, whose work is synchronous)."""
    import os
    import subprocess
    import sys

    child = r"""
import ctypes, numpy as np, pytest, rag
from dlpack_abi import DLTensor, Managed, Versioned, new_capsule, opened

SRC = '''
fn f(x: f32[B, ~N, 4]) -> f32[B, ~N, 4] { return x * 2.0 }
'''
m = rag.compile(SRC, device="cuda")
rng = np.random.default_rng(0)
lengths = [3, 0, 5]
x = rag.ragged([rng.standard_normal((n, 4)).astype(np.float32) for n in lengths])
want = 2 * np.concatenate(x.to_list())

def uploaded(arg):
    out = m.f(arg)
    return m.stats()["f"]["uploaded_bytes"], out

# Export: a device result is CUDA memory, shared with the consumer.
y = m.f(x)
assert y.device == "cuda" and y.__dlpack_device__() == (2, 0)
cap = y.__dlpack__(stream=1)
dl = opened(cap, Managed).dl_tensor
assert (dl.device_type, dl.device_id, dl.ndim, dl.shape[0], dl.shape[1]) == (2, 0, 2, 8, 4)
first = lambda t: t.to("cpu").values[0, 0]  # a host copy; `values` would take t to the host
assert first(y) == want[0, 0]
ctypes.c_float.from_address(dl.data).value = 99.0  # the consumer writes its memory
assert first(y) == 99.0 and y.device == "cuda"  # rag reads it again
ctypes.c_float.from_address(dl.data).value = float(want[0, 0])
del cap

copied = y.__dlpack__(copy=True, max_version=(1, 0))
v = opened(copied, Versioned)
assert v.flags & 2 and v.dl_tensor.device_type == 2 and v.dl_tensor.data != dl.data  # IS_COPIED
for bad in (0, -2):
    with pytest.raises(BufferError, match="not a CUDA stream"):
        y.__dlpack__(stream=bad)

# Import: a CUDA producer's memory is adopted, shared, and read in place by a device call.
class Producer:
    def __init__(self, inner):
        self.inner, self.stream = inner, "not asked"
    def __dlpack__(self, stream=None, **kw):
        self.stream = stream
        return self.inner.__dlpack__(stream=stream, **kw)
    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

p = Producer(y)
z = rag.from_packed(p, lengths, "~N, 4")
assert p.stream == -1 and z.device == "cuda" and list(z.lengths(1)) == lengths
up_x, _ = uploaded(x)
up_y, _ = uploaded(y)
up_z, out = uploaded(z)
assert up_z == up_y and up_x - up_y == 8 * 4 * 4, (up_x, up_y, up_z)
np.testing.assert_array_equal(np.concatenate(out.to_list()), 2 * want)

w = rag.from_dlpack(copied)  # the copy: its own memory
ctypes.c_float.from_address(v.dl_tensor.data).value = -1.0
assert w.device == "cuda" and first(w) == -1.0 and first(y) == want[0, 0]

# A DLTensor made here: device memory of the emulated device is host memory.
def capsule(a, offset=0, strides=None, device=(2, 0)):
    shape = (ctypes.c_int64 * a.ndim)(*a.shape)
    st = None if strides is None else (ctypes.c_int64 * a.ndim)(*strides)
    mt = Managed(DLTensor(a.ctypes.data, device[0], device[1], a.ndim, 2, 32, 1, shape, st,
                          offset), None, None)
    keep.append((a, shape, st, mt))
    return new_capsule(mt)

keep = []
raw = np.zeros(33, np.float32)
raw[1:] = np.arange(32, dtype=np.float32)
odd = rag.from_dlpack(capsule(raw[:32].reshape(8, 4), offset=4))  # 4 bytes past 16-alignment
assert odd.device == "cuda"
raw[1] = 7.0  # copied on the device: the producer's later writes are not seen
np.testing.assert_array_equal(odd.numpy().ravel(), np.arange(32, dtype=np.float32))
aligned = np.arange(32, dtype=np.float32).reshape(8, 4)
shared = rag.from_dlpack(capsule(aligned))
assert shared.device == "cuda" and first(shared) == 0.0
aligned[0, 0] = 5.0  # adopted: the producer's later writes are what rag reads
assert first(shared) == 5.0
with pytest.raises(rag.Error, match="strided CUDA tensor"):
    rag.from_dlpack(capsule(aligned, strides=(1, 8)))
with pytest.raises(rag.Error, match="on CUDA device 1; rag runs on device 0"):
    rag.from_dlpack(capsule(aligned, device=(2, 1)))

host = y.__dlpack__(dl_device=(1, 0))  # asked for on the CPU: the host bytes, from now on
assert opened(host, Managed).dl_tensor.device_type == 1 and y.device == "cpu"
print("ok")
"""
    here = os.path.dirname(os.path.abspath(__file__))  # dlpack_abi
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, RAG_GPU_EMULATE="1", PYTHONPATH=path)
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_views_keep_device_values_on_the_device():
    """A view step (reshape) between device steps is a host step of metadata only: it shares
    its input's values, residency included, so nothing is downloaded (its buffer() would)."""
    import os
    import subprocess
    import sys

    child = """
import numpy as np, rag
SRC = '''
fn f(x: f32[B, ~N, 4, 2]) -> f32[B, ~N, 8] {
    return reshape(x * 2.0, 8) + 1.0
}
'''
m, cpu = rag.compile(SRC, device="cuda"), rag.compile(SRC)
rng = np.random.default_rng(0)
x = rag.ragged([rng.standard_normal((n, 4, 2)).astype(np.float32) for n in (3, 0, 5)])
y = m.f(x)
st = m.stats()["f"]
assert st["steps"]["host"] == {"reshape_f32": 1} and st["steps"]["device"] == 2, st
assert st["downloaded_bytes"] == 0, st
assert y.device == "cuda"
np.testing.assert_allclose(y.to("cpu").values, cpu.f(x).values, rtol=1e-6)
print("ok")
"""
    env = dict(os.environ, RAG_GPU_EMULATE="1")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_transposes_of_static_axes_run_on_the_device():
    """A weight's transpose and a swap of a batch's static axes run as the transpose program
    (jit/layout_programs.hpp): device steps, nothing downloaded, the CPU's values."""
    import os
    import subprocess
    import sys

    child = """
import numpy as np, rag
SRC = '''
fn f(x: f32[B, ~N, 4, 2], w: f32[3, 5]) -> (f32[B, ~N, 2, 4], f32[5, 3]) {
    return (transpose(x * 2.0, a=2, b=3), transpose(w * 2.0, a=0, b=1))
}
'''
m, cpu = rag.compile(SRC, device="cuda"), rag.compile(SRC)
rng = np.random.default_rng(0)
x = rag.ragged([rng.standard_normal((n, 4, 2)).astype(np.float32) for n in (3, 0, 5)])
w = rng.standard_normal((3, 5)).astype(np.float32)
y, wt = m.f(x, w)
st = m.stats()["f"]
assert st["steps"]["host"] == {} and st["steps"]["reference"] == {}, st
assert st["downloaded_bytes"] == 0, st
want_y, want_wt = cpu.f(x, w)
np.testing.assert_array_equal(y.to("cpu").values, want_y.values)
np.testing.assert_array_equal(wt, want_wt)  # unbatched results come back as arrays
print("ok")
"""
    env = dict(os.environ, RAG_GPU_EMULATE="1")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_bias_gradients_are_summed_on_the_device():
    """sum_to onto a bias (the rows of a device-resident gradient) runs as row_sums +
    column_sums on the device, not as a host step, with the CPU's values."""
    import os
    import subprocess
    import sys

    child = """
import numpy as np, rag
SRC = '''
params Lin { w: f32[4, 3], b: f32[3] }
fn loss(x: f32[B, ~N, 4], p: Lin) -> f32[] {
    let y = x @ p.w + p.b
    return mean(y * y)
}
fn grads(x: f32[B, ~N, 4], p: Lin) -> Lin {
    return grad(loss, wrt=p)(x, p)
}
'''
m, cpu = rag.compile(SRC, device="cuda"), rag.compile(SRC)
rng = np.random.default_rng(0)
x = rag.ragged([rng.standard_normal((n, 4)).astype(np.float32) for n in (70, 0, 129)])
p = m.init("Lin", seed=1)
g = m.grads(x, p)
steps = m.stats()["grads"]["steps"]
assert "sum_to" not in steps["reference"] and not any(
    k.startswith("sum_to") for k in steps["host"]), steps
want = cpu.grads(x, p)
for k in ("w", "b"):
    np.testing.assert_allclose(g[k], want[k], rtol=1e-5, atol=1e-6)
print("ok")
"""
    env = dict(os.environ, RAG_GPU_EMULATE="1")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_zeros_like_is_made_on_the_device():
    """zeros_like is a memset on the device: nothing uploaded but x and its segment table."""
    import os
    import subprocess
    import sys

    child = """
import numpy as np, rag
SRC = '''
fn f(x: f32[B, ~N, 4]) -> f32[B, ~N, 4] { return zeros_like(x) + x }
fn g(x: f32[B, ~N, 4]) -> f32[B, ~N, 4] { return x + x }
'''
m = rag.compile(SRC, device="cuda")
x = rag.ragged([np.full((n, 4), 2.0, np.float32) for n in (3, 0, 50)])
y = m.f(x)
m.g(x)
st, plain = m.stats()["f"], m.stats()["g"]
assert st["steps"]["reference"] == {} and st["steps"]["host"] == {}, st
assert st["uploaded_bytes"] == plain["uploaded_bytes"], (st, plain)
np.testing.assert_array_equal(y.to("cpu").values, x.values)
print("ok")
"""
    env = dict(os.environ, RAG_GPU_EMULATE="1")
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
