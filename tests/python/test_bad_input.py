"""Bad input to the Python API gets a clear rag.Error (or the Python error its protocol asks
for) and loses nothing: never a crash, NumPy's or pybind11's text, or a silent reinterpretation.
The cases that used to crash run in a subprocess, so a crash fails the test instead of pytest.
"""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rag

SRC = """
params P {
    w: f32[4, 3] = normal(0.5)
}
fn f(x: f32[B, ~N, 4], p: P) -> f32[B, ~N, 3] {
    return tanh(x @ p.w)
}
"""


@pytest.fixture(scope="module")
def m():
    return rag.compile(SRC)


@pytest.fixture(scope="module")
def x():
    return rag.ragged([np.ones((n, 4), np.float32) for n in (2, 3)])


def run_python(code):
    """Runs code in a fresh interpreter with this test's rag; returns (rc, stdout + stderr)."""
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(rag.__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


# Every method and property of an uninitialised instance, a call given one, and the protocols
# that reach it: each must be rag.Error("... is not initialised ..."). The script prints what
# did not, and exits 0; a crash is a signal's return code.
UNINITIALISED = """
import pickle
import numpy as np
import rag

SRC = '''%s'''
m = rag.compile(SRC)
x = rag.ragged([np.ones((n, 4), np.float32) for n in (2, 3)])
p = m.init("P")
ARGS = {"lengths": (1,), "astype": ("f32",), "__getitem__": (0,), "__setitem__": ("w", 0),
        "get": ("w",), "__contains__": ("w",), "__getattr__": ("w",), "save": ("/nonexistent",),
        "__call__": (x, p), "vjp": (x, p, x), "call_saving": (x, p), "ir": (),
        "backward": (x,), "call": ("f", x, p), "init": ("P",), "load_params": ("P", "/x"),
        "save_params": (p, "/x"), "Module.ir": ("f",), "to": ("cpu",)}
SKIP = {"__init__", "__new__", "__setstate__", "__doc__", "__module__", "__hash__"}
bad = []

def expect_error(what, f):
    try:
        f()
    except rag.Error as e:
        if "is not initialised" not in str(e):
            bad.append("%%s: %%s" %% (what, e))
    except BaseException as e:
        bad.append("%%s: %%s: %%s" %% (what, type(e).__name__, e))
    else:
        bad.append(what + ": no error")

for cls in (rag.Tensor, rag.Params, rag.Module, rag.Function, rag.Saved):
    obj = cls.__new__(cls)
    for name, attr in vars(cls).items():
        if name in SKIP or name.startswith("_pybind11"):
            continue
        if isinstance(attr, property):
            expect_error(cls.__name__ + "." + name, lambda: getattr(obj, name))
        elif callable(attr):
            args = ARGS.get(cls.__name__ + "." + name, ARGS.get(name, ()))
            expect_error(cls.__name__ + "." + name, lambda: getattr(obj, name)(*args))

t = pickle.loads(b"\\x80\\x02crag\\nTensor\\n)\\x81.")  # NEWOBJ without BUILD: no state
expect_error("unpickled values", lambda: t.values)
expect_error("f(t)", lambda: m.f(t, p))
expect_error("f(x, params)", lambda: m.f(x, rag.Params.__new__(rag.Params)))
expect_error("vjp(t)", lambda: m.f.vjp(t, p, x))
expect_error("np.from_dlpack", lambda: np.from_dlpack(t))
expect_error("pickle.dumps", lambda: pickle.dumps(t))
expect_error("rag.tensor", lambda: rag.tensor(t))
expect_error("params field", lambda: m.f(x, {"w": t}))
try:
    memoryview(t)
    bad.append("memoryview: no error")
except BufferError as e:  # the buffer protocol's own error, from the rag.Error
    if "is not initialised" not in str(e.__cause__ or e.__context__):
        bad.append("memoryview: %%r" %% (e.__cause__ or e.__context__))
print("\\n".join(bad) if bad else "all refused")
""" % SRC


def test_uninitialised_instances_are_errors_not_crashes():
    rc, out = run_python(UNINITIALISED)
    assert rc == 0, out
    assert out.strip() == "all refused", out


def test_classes_say_how_to_make_an_instance():
    with pytest.raises(rag.Error, match=r"rag.Tensor cannot be made directly; .*rag.ragged"):
        rag.Tensor()
    with pytest.raises(rag.Error, match=r"rag.Params cannot be made directly; .*m.init"):
        rag.Params()
    with pytest.raises(rag.Error, match=r"rag.Module cannot be made directly; .*rag.load"):
        rag.Module("x.rag")
    for cls in (rag.Function, rag.Saved):
        with pytest.raises(rag.Error, match="cannot be made directly"):
            cls()


def test_a_state_that_is_not_one_is_a_rag_error(x):
    t = rag.Tensor.__new__(rag.Tensor)
    with pytest.raises(rag.Error, match="rag.Tensor state: expected the tuple .* got int"):
        t.__setstate__(5)
    with pytest.raises(rag.Error, match="rag.Tensor state: an axis is not"):
        t.__setstate__((1, "f32", True, [5], 1, [], b""))
    with pytest.raises(rag.Error, match="rag.Tensor state: not a state this rag writes"):
        t.__setstate__((1, "f32", True, [(0, 2**70, "N")], 1, [], b""))
    with pytest.raises(rag.ArgumentError, match=r"rag.Tensor.__setstate__\(.*\): cannot take"):
        t.__setstate__()
    with pytest.raises(rag.Error, match="rag.Params state"):
        rag.Params.__new__(rag.Params).__setstate__(("P", [5]))
    # After all that the instance is still uninitialised, and a good state initialises it.
    with pytest.raises(rag.Error, match="not initialised"):
        t.batch
    t.__setstate__(x.__getstate__())
    assert t.lengths(1) == [2, 3]


def test_a_seed_outside_its_range_says_the_range(m):
    for seed in (-1, 2**64, 2**70):
        with pytest.raises(rag.Error, match=re.escape("seed must be an integer in [0, 2**64), "
                                                      "got %d" % seed)):
            m.init("P", seed=seed)
    top = m.init("P", seed=2**64 - 1)
    np.testing.assert_array_equal(m.init("P", seed=np.uint64(2**64 - 1))["w"], top["w"])
    np.testing.assert_array_equal(m.init("P", seed=np.int32(3))["w"], m.init("P", 3)["w"])
    with pytest.raises(rag.ArgumentError, match=r"seed: int = 0\): cannot take \(str, seed=float"):
        m.init("P", seed=1.5)


def test_a_params_field_of_the_wrong_kind_names_the_field(m, x):
    with pytest.raises(rag.Error) as e:
        m.f(x, {"w": "abc"})
    message = str(e.value)
    assert message.startswith("f: argument p.w: expected numbers for f32, got str"), message
    assert "f32[4, 3]" in message
    assert "Cannot cast" not in message and "dtype(" not in message
    with pytest.raises(rag.Error, match=r"p.w: expected f32, got ndarray of NumPy dtype "
                                        r"complex128, which does not convert without loss"):
        m.f(x, {"w": np.zeros((4, 3), np.complex128)})
    p = m.init("P")
    with pytest.raises(rag.Error, match="P.w: expected numbers for f32, got str"):
        p["w"] = "abc"


def test_from_packed_names_a_dtype_mismatch():
    values = np.zeros((5, 4), np.float32)
    with pytest.raises(rag.Error, match="from_packed: values: expected i32, got ndarray of NumPy "
                                        "dtype float32, which does not convert without loss"):
        rag.from_packed(values, [2, 3], "i32[B, ~N, 4]")


def test_lengths_must_be_integers():
    values = np.zeros((5, 4), np.float32)
    for lengths in ([2.5, 2.5], np.array([2.0, 3.0]), [2, 3.0]):
        with pytest.raises(rag.Error, match="from_packed: lengths must be a sequence of integers, "
                                            "got NumPy dtype float64"):
            rag.from_packed(values, lengths, "f32[B, ~N, 4]")
    with pytest.raises(rag.Error, match="from_padded: lengths must be a sequence of integers"):
        rag.from_padded(np.zeros((2, 3), np.float32), [2.5, 1])
    # Integers of any width and layout are read as they are: a strided view too.
    t = rag.from_packed(values, np.array([2, 9, 3, 9], np.int32)[::2], "f32[B, ~N, 4]")
    assert t.lengths(1) == [2, 3]
    assert rag.from_packed(np.zeros((0, 4), np.float32), [], "f32[B, ~N, 4]").batch == 0


def test_vjp_counts_describe_vjps_own_signature(m, x):
    p = m.init("P")
    sig = re.escape("f.vjp(x, p, cotangents) takes 3 arguments (the 2 of f, then the cotangents)")
    with pytest.raises(TypeError, match=sig + " but 2 were given"):
        m.f.vjp(x, p)
    with pytest.raises(TypeError, match=sig + " but 4 were given"):
        m.f.vjp(x, p, x, x)
    with pytest.raises(TypeError, match=sig + " but 0 were given"):
        m.f.vjp()
    with pytest.raises(TypeError, match=re.escape("f.vjp() missing argument 'p'")):
        m.f.vjp(x, cotangents=x)
    with pytest.raises(TypeError, match=re.escape("f.call_saving() missing argument 'p'")):
        m.f.call_saving(x)
    gx, _ = m.f.vjp(x, p, rag.ragged([np.ones((n, 3), np.float32) for n in (2, 3)]))
    assert gx.schema == "f32[B, ~N, 4]"


def test_a_sample_index_out_of_range_is_reported_as_given(x):
    for i in (-3, 2, 2**80, -(2**80)):
        with pytest.raises(IndexError, match=r"^sample index %d out of range for a batch of 2$"
                                             % i):
            x[i]
    assert x[-2].shape == (2, 4) and x[np.int64(1)].shape == (3, 4)


def test_example_takes_only_a_shipped_name():
    for name in ("../__init__.py", "/etc/passwd", "examples/encoder.rag", "", ".", "examples"):
        with pytest.raises(rag.Error, match="no example '%s' " % re.escape(name)):
            rag.example(name)
    assert os.path.basename(rag.example("encoder.rag")) == "encoder.rag"


def test_thread_counts():
    try:
        with pytest.raises(rag.Error, match="n must be 0 .every core. or a positive count, "
                                            "got -1"):
            rag.set_num_threads(-1)
        rag.set_num_threads(10**6)  # more threads than any call can use: the most it can
        assert rag.num_threads() == 64
        rag.set_num_threads(10**30)
        assert rag.num_threads() == 64
        rag.set_num_threads(3)
        assert rag.num_threads() == 3
    finally:
        rag.set_num_threads(0)
    assert rag.num_threads() >= 1
