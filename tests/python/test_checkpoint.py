"""Checkpoints (safetensors files), pickling, and argument errors in rag's words."""
import copy
import json
import multiprocessing
import os
import pickle
import struct

import numpy as np
import pytest
import safetensors.numpy as stnp

import rag

MIXED = """
params Mixed {
    a: f32[2, 3] = normal(1.0)
    b: f64[4] = uniform(-1, 1)
    c: i32[2, 2] = ones
    d: i64[] = ones
    e: bf16[3] = normal(1.0)
    f: f16[2, 2] = uniform(-1, 1)
    g: bool[3] = ones
}
params Lin {
    w: f32[4, 2] = normal(0.5)
    b: f32[2] = zeros
}
params Other {
    w: f32[4, 3] = zeros
}
fn apply(x: f32[B, ~N, 4], p: Lin) -> f32[B, ~N, 2] { return x @ p.w + p.b }
"""


@pytest.fixture()
def mod():
    return rag.compile(MIXED, "mixed.rag")


def same(p, q):
    assert list(p.keys()) == list(q.keys())
    for k in p:
        a, b = np.asarray(p[k]), np.asarray(q[k])
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert a.tobytes() == b.tobytes(), k


# ---- files --------------------------------------------------------------------------------

def test_round_trip_every_dtype(mod, tmp_path):
    p = mod.init("Mixed", 7)
    path = tmp_path / "mixed.safetensors"
    p.save(path)
    q = mod.load_params("Mixed", path)
    assert q.name == "Mixed"
    same(p, q)
    # No temporary file is left beside the checkpoint.
    assert os.listdir(tmp_path) == ["mixed.safetensors"]


def test_file_is_a_valid_safetensors_file(mod, tmp_path):
    p = mod.init("Lin", 3)
    path = str(tmp_path / "lin.safetensors")
    p.save(path)
    loaded = stnp.load_file(path)
    assert set(loaded) == {"w", "b"}
    for k in p:
        assert loaded[k].dtype == p[k].dtype and np.array_equal(loaded[k], p[k])
    # The header is JSON padded to 8 bytes and names the params type in its metadata.
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"rag.params": "Lin"}


def test_every_dtype_but_bf16_reads_in_safetensors(mod, tmp_path):
    # NumPy has no bfloat16, so safetensors.numpy refuses BF16 tensors; the rest must match.
    p = mod.init("Mixed", 1)
    path = str(tmp_path / "m.safetensors")
    p.save(path)
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert {k: v["dtype"] for k, v in header.items() if k != "__metadata__"} == {
        "a": "F32", "b": "F64", "c": "I32", "d": "I64", "e": "BF16", "f": "F16", "g": "BOOL"}
    assert header["d"]["shape"] == []
    for k in "abcdfg":
        begin, end = header[k]["data_offsets"]
        arr = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=np.asarray(p[k]).dtype)
        assert np.array_equal(arr.reshape(np.asarray(p[k]).shape), p[k]), k


def test_file_written_by_safetensors_loads(mod, tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    path = str(tmp_path / "theirs.safetensors")
    stnp.save_file({"b": b, "w": w}, path, metadata={"producer": "test"})
    p = mod.load_params("Lin", path)
    assert list(p.keys()) == ["w", "b"]  # the declaration's order, not the file's
    assert np.array_equal(p["w"], w) and np.array_equal(p["b"], b)
    x = rag.ragged([rng.standard_normal((n, 4)).astype(np.float32) for n in (2, 5)])
    y = mod.apply(x, p)
    for i, xi in enumerate(x.to_list()):
        np.testing.assert_allclose(y.to_list()[i], xi @ w + b, rtol=1e-5, atol=1e-6)


def test_save_params_checks_the_type(mod, tmp_path):
    p = mod.init("Lin", 0)
    mod.save_params(p, tmp_path / "ok.safetensors")
    assert mod.load_params("Lin", tmp_path / "ok.safetensors")["w"].shape == (4, 2)
    with pytest.raises(rag.Error, match="expected rag.Params, got dict"):
        mod.save_params(p.to_dict(), tmp_path / "x.safetensors")


def test_saving_over_a_file_replaces_it(mod, tmp_path):
    path = tmp_path / "ck.safetensors"
    mod.init("Lin", 1).save(path)
    mod.init("Lin", 2).save(path)
    same(mod.load_params("Lin", path), mod.init("Lin", 2))
    assert os.listdir(tmp_path) == ["ck.safetensors"]


def test_save_to_a_missing_folder_is_an_error(mod, tmp_path):
    with pytest.raises(rag.Error, match="cannot write checkpoint .*nope/ck.safetensors"):
        mod.init("Lin", 0).save(tmp_path / "nope" / "ck.safetensors")


def test_a_ragged_field_is_not_saved(tmp_path):
    p = rag.Params.__new__(rag.Params)
    x = rag.ragged([np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32)])
    p.__setstate__(("Bag", [("x", x)]))
    with pytest.raises(rag.Error, match=r"cannot save 'x' \(f32\[B, ~N, 3\]\).*ragged"):
        p.save(tmp_path / "bag.safetensors")
    assert not os.listdir(tmp_path)


# ---- mismatches name the field ------------------------------------------------------------

def write(path, tensors):
    stnp.save_file(tensors, str(path))
    return path


def test_missing_field(mod, tmp_path):
    path = write(tmp_path / "m.safetensors", {"w": np.zeros((4, 2), np.float32)})
    with pytest.raises(rag.Error, match=r"does not hold Lin params:\n  missing 'b' "
                                        r"\(Lin expects f32\[2\]\)"):
        mod.load_params("Lin", path)


def test_extra_field(mod, tmp_path):
    path = write(tmp_path / "m.safetensors", {"w": np.zeros((4, 2), np.float32),
                                               "b": np.zeros(2, np.float32),
                                               "layers.0.wq": np.zeros(3, np.float32)})
    with pytest.raises(rag.Error, match=r"extra 'layers.0.wq' \(f32\[3\]\), not a field of Lin"):
        mod.load_params("Lin", path)


def test_mis_shaped_field(mod, tmp_path):
    path = write(tmp_path / "m.safetensors", {"w": np.zeros((2, 4), np.float32),
                                               "b": np.zeros(2, np.float32)})
    with pytest.raises(rag.Error, match=r"'w' is f32\[2, 4\] in the file, Lin expects f32\[4, 2\]"):
        mod.load_params("Lin", path)


def test_mis_typed_field(mod, tmp_path):
    path = write(tmp_path / "m.safetensors", {"w": np.zeros((4, 2), np.float64),
                                               "b": np.zeros(2, np.float32)})
    with pytest.raises(rag.Error, match=r"'w' is f64\[4, 2\] in the file, Lin expects f32\[4, 2\]"):
        mod.load_params("Lin", path)


def test_another_types_checkpoint_says_where_it_came_from(mod, tmp_path):
    mod.init("Other", 0).save(tmp_path / "o.safetensors")
    with pytest.raises(rag.Error, match=r"does not hold Lin params \(it was saved from Other\)"):
        mod.load_params("Lin", tmp_path / "o.safetensors")


def test_unknown_type_and_missing_file(mod, tmp_path):
    with pytest.raises(rag.Error, match="no params group named 'Nope'"):
        mod.load_params("Nope", tmp_path / "x.safetensors")
    with pytest.raises(rag.Error, match="cannot read checkpoint .*x.safetensors"):
        mod.load_params("Lin", tmp_path / "x.safetensors")


# ---- hostile and broken files -------------------------------------------------------------

def raw_file(path, header, data=b"", size=None, pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    n = len(text) if size is None else size
    path.write_bytes(struct.pack("<Q", n) + text + data)
    return path


LIN_OK = {"w": {"dtype": "F32", "shape": [4, 2], "data_offsets": [0, 32]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [32, 40]}}


def test_valid_hand_written_file_loads(mod, tmp_path):
    data = np.arange(8, dtype=np.float32).tobytes() + np.array([1, 2], np.float32).tobytes()
    p = mod.load_params("Lin", raw_file(tmp_path / "ok.safetensors", LIN_OK, data))
    assert np.array_equal(p["w"], np.arange(8, dtype=np.float32).reshape(4, 2))


@pytest.mark.parametrize("case, message", [
    ("empty", r"not a safetensors file: 0 bytes"),
    ("short", r"not a safetensors file: 5 bytes"),
    ("huge header", r"header size 18446744073709551615 is over the"),
    ("header past the end", r"truncated safetensors file: header of 4096 bytes"),
    ("not json", r"header JSON at byte 0"),
    ("not an object", r"header is not an object"),
    ("truncated data", r"truncated safetensors file: tensor 'b' ends at byte 40"),
    ("trailing bytes", r"4 bytes after the last tensor"),
    ("overlap", r"tensor 'b': data_offsets \[28, 36\] overlap"),
    ("gap", r"tensor 'b': data_offsets \[36, 44\] leave a gap"),
    ("bad dtype", r"tensor 'w': dtype 'U8' is not one rag reads"),
    ("shape mismatch", r"tensor 'w': shape and dtype F32 need 28 bytes but data_offsets "
                       r"\[0, 32\] hold 32"),
    ("duplicate", r"the name 'w' appears twice"),
    ("negative", r"negative numbers"),
    ("backwards", r"data_offsets end before they begin"),
    ("giant shape", r"tensor 'w': the shape is too large"),
    ("deep", r"nested too deeply"),
    ("missing key", r"needs dtype, shape and data_offsets"),
    ("metadata not strings", r"__metadata__ value of 'n' is not a string"),
    ("bad escape", r"bad escape"),
])
def test_broken_files_are_clear_errors(mod, tmp_path, case, message):
    data = bytes(40)
    path = tmp_path / "bad.safetensors"

    def entry(**kw):
        h = json.loads(json.dumps(LIN_OK))
        h["w"].update(kw)
        return h
    if case == "empty":
        path.write_bytes(b"")
    elif case == "short":
        path.write_bytes(b"\x01\x02\x03\x04\x05")
    elif case == "huge header":
        raw_file(path, LIN_OK, data, size=2**64 - 1)
    elif case == "header past the end":
        raw_file(path, LIN_OK, data, size=4096)
    elif case == "not json":
        raw_file(path, b"hello world", data)
    elif case == "not an object":
        raw_file(path, [1, 2], data)
    elif case == "truncated data":
        raw_file(path, LIN_OK, data[:36])
    elif case == "trailing bytes":
        raw_file(path, LIN_OK, data + bytes(4))
    elif case == "overlap":
        h = json.loads(json.dumps(LIN_OK))
        h["b"]["data_offsets"] = [28, 36]
        raw_file(path, h, data)
    elif case == "gap":
        h = json.loads(json.dumps(LIN_OK))
        h["b"]["data_offsets"] = [36, 44]
        raw_file(path, h, data + bytes(4))
    elif case == "bad dtype":
        raw_file(path, entry(dtype="U8"), data)
    elif case == "shape mismatch":
        raw_file(path, entry(shape=[7]), data)
    elif case == "duplicate":
        raw_file(path, b'{"w": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, '
                       b'"w": {"dtype": "F32", "shape": [], "data_offsets": [4, 8]}}', bytes(8))
    elif case == "negative":
        raw_file(path, json.dumps(entry(shape=[-4, 2])).encode(), data)
    elif case == "backwards":
        raw_file(path, entry(data_offsets=[32, 0]), data)
    elif case == "giant shape":
        raw_file(path, entry(shape=[2**40, 2**40, 2**40]), data)
    elif case == "deep":
        raw_file(path, b"[" * 100000 + b"]" * 100000, data)
    elif case == "missing key":
        h = json.loads(json.dumps(LIN_OK))
        del h["w"]["shape"]
        raw_file(path, h, data)
    elif case == "metadata not strings":
        h = json.loads(json.dumps(LIN_OK))
        h["__metadata__"] = {"n": 3}
        raw_file(path, h, data)
    elif case == "bad escape":
        raw_file(path, b'{"\\q": 1}', data)
    with pytest.raises(rag.Error, match=message) as e:
        mod.load_params("Lin", path)
    assert str(path) in str(e.value)


# ---- pickling -----------------------------------------------------------------------------

def ragged_tensors():
    rng = np.random.default_rng(5)
    out = []
    for dtype in ("f16", "bf16", "f32", "f64", "i32", "i64", "bool"):
        samples = [rng.standard_normal((n, 3)) * 4 for n in (2, 0, 5)]
        out.append(rag.ragged(samples, dtype=dtype))
    # Pairs (a repeated ragged name), two different ragged axes, and an empty batch.
    out.append(rag.ragged([rng.standard_normal((n, n, 2)).astype(np.float32) for n in (3, 1)],
                          ragged_axes="~N, ~N, 2"))
    out.append(rag.ragged([rng.standard_normal((n, m)).astype(np.float32)
                           for n, m in ((2, 3), (4, 1), (0, 2))], ragged_axes="~N, ~M"))
    out.append(rag.ragged([], ragged_axes="~N, 4", dtype="f64"))
    out.append(rag.tensor(rng.standard_normal((3, 4)).astype(np.float32)))
    out.append(rag.tensor(np.float64(2.5)))
    out.append(rag.tensor(rng.standard_normal((3, 4)), batched=True))
    return out


def assert_same_tensor(a, b):
    assert a.schema == b.schema and a.batched == b.batched and a.batch == b.batch
    for axis in range(1, a.ndim if a.batched else 0):
        assert a.lengths(axis) == b.lengths(axis)
    assert np.asarray(a.values).tobytes() == np.asarray(b.values).tobytes()


@pytest.mark.parametrize("t", ragged_tensors(), ids=lambda t: t.schema)
def test_tensor_pickles_bitwise(t):
    for proto in (2, pickle.HIGHEST_PROTOCOL):
        assert_same_tensor(t, pickle.loads(pickle.dumps(t, protocol=proto)))
    assert_same_tensor(t, copy.deepcopy(t))


def test_params_pickle(mod):
    p = mod.init("Mixed", 3)
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, rag.Params) and q.name == "Mixed"
    same(p, q)
    same(p, copy.deepcopy(p))


def test_unpickled_values_work_in_calls(mod):
    p = mod.init("Lin", 1)
    x = rag.ragged([np.ones((n, 4), np.float32) for n in (3, 1)])
    want = mod.apply(x, p).to_list()
    got = mod.apply(pickle.loads(pickle.dumps(x)), pickle.loads(pickle.dumps(p))).to_list()
    for a, b in zip(want, got):
        assert a.tobytes() == b.tobytes()


def test_values_cross_processes(mod):
    # A spawned process unpickles the arguments and pickles its result back.
    x = ragged_tensors()[7]
    p = mod.init("Mixed", 2)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        x2, p2 = pool.apply(copy.deepcopy, ((x, p),))
    assert_same_tensor(x, x2)
    same(p, p2)


def test_a_broken_pickle_state_is_an_error():
    t = rag.ragged([np.zeros((2, 3), np.float32), np.zeros((1, 3), np.float32)])
    state = t.__reduce_ex__(2)[2]
    bad = list(state)
    bad[6] = bad[6][:-4]  # 4 bytes short
    u = rag.Tensor.__new__(rag.Tensor)
    with pytest.raises(rag.Error, match="bytes"):
        u.__setstate__(tuple(bad))
    bad = list(state)
    bad[5] = [2**40, 3, 1, 3]  # extents claiming far more values than the bytes hold
    with pytest.raises(rag.Error, match="more values than its bytes hold"):
        rag.Tensor.__new__(rag.Tensor).__setstate__(tuple(bad))


# ---- argument errors ----------------------------------------------------------------------

def no_pybind_text(e):
    text = str(e.value)
    assert "incompatible function arguments" not in text
    assert "Invoked with" not in text
    assert "pybind" not in text.lower()


def test_wrong_argument_types_are_rag_errors(mod):
    with pytest.raises(rag.ArgumentError, match=r"rag.Module.init\(name: str, seed: int = 0\): "
                                                r"cannot take \(int\)") as e:
        mod.init(5)
    no_pybind_text(e)
    assert isinstance(e.value, rag.Error) and isinstance(e.value, TypeError)
    with pytest.raises(rag.ArgumentError, match=r"cannot take \(str, seed=str\)") as e:
        mod.init("Lin", seed="zero")
    no_pybind_text(e)
    x = rag.ragged([np.zeros((2, 3), np.float32)])
    with pytest.raises(rag.ArgumentError, match=r"rag.Tensor.lengths\(axis: int\)") as e:
        x.lengths("one")
    no_pybind_text(e)
    with pytest.raises(rag.ArgumentError, match=r"rag.Module.tier: assign a str, not a int"):
        mod.tier = 5
    with pytest.raises(rag.ArgumentError, match=r"rag.Module.load_params\(type: str"):
        mod.load_params(3, "x.safetensors")
    with pytest.raises(rag.Error, match=r"rag.Params.save: expected a file path .* got int"):
        mod.init("Lin").save(5)
    with pytest.raises(rag.Error, match=r"rag.load: expected a file path"):
        rag.load(None)
    with pytest.raises(rag.Error, match=r"ragged_axes: expected per-sample axis numbers"):
        rag.ragged([np.zeros((2, 3))], ragged_axes=["a"])


def test_wrong_arguments_still_work_after_wrapping(mod):
    # The wrappers keep names, docs and normal behaviour.
    assert mod.init.__name__ == "init" and "Deterministic" in mod.init.__doc__
    assert mod.init("Lin", seed=1)["w"].shape == (4, 2)
    with pytest.raises(KeyError):
        mod.init("Lin")["nope"]


def test_out_of_memory_is_a_rag_error():
    # A field no machine can hold is refused at check time, at the field.
    with pytest.raises(rag.CompileError, match=r"1:18: error: params field Huge.w is too large"):
        rag.compile("params Huge { w: f32[1000000000, 1000000000] = zeros }")

