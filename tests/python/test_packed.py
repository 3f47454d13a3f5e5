"""rag.from_packed and Tensor.packed(): a batch from packed values and lengths, zero copy."""
import numpy as np
import pytest

import rag


def aligned(shape, dtype):
    """A C-contiguous array whose data starts on a 64-byte boundary."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n].view(dtype).reshape(shape)


def test_round_trip_shares_memory():
    rng = np.random.default_rng(0)
    t = rag.ragged([rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 5, 1)])
    values, lengths = t.packed()
    assert values.shape == (8, 3) and [list(l) for l in lengths] == [[2, 5, 1]]
    assert values.ctypes.data == t.values.ctypes.data  # a view, not a copy
    u = rag.from_packed(values, lengths, t.schema)
    assert u.schema == "f32[B, ~N, 3]" and u.lengths(1) == [2, 5, 1]
    assert u.values.ctypes.data == t.values.ctypes.data  # adopted, not copied
    for a, b in zip(t.to_list(), u.to_list()):
        assert np.array_equal(a, b)


def test_element_aligned_arrays_are_adopted_and_others_copied():
    # 16 bytes off a 64-byte boundary (NumPy's usual alignment) is adopted as well.
    for a in (aligned((7, 4), np.float32), aligned((8, 4), np.float32)[1:]):
        a[:] = np.arange(28, dtype=np.float32).reshape(7, 4)
        t = rag.from_packed(a, [3, 4], "~N, 4")
        assert t.values.ctypes.data == a.ctypes.data
        a[0, 0] = 42.0  # shared: visible through the tensor
        assert t.to_list()[0][0, 0] == 42.0
    # One byte off: not element aligned, so copied (and still correct).
    raw = np.zeros(28 * 4 + 65, np.uint8)
    off = (-raw.ctypes.data) % 64 + 1
    c = raw[off:off + 28 * 4].view(np.float32).reshape(7, 4)
    c[:] = np.arange(28, dtype=np.float32).reshape(7, 4)
    t = rag.from_packed(c, [3, 4], "~N, 4")
    assert t.values.ctypes.data != c.ctypes.data
    assert np.array_equal(t.to_list()[1], c[3:])
    a = aligned((7, 4), np.float32)
    a[:] = np.arange(28, dtype=np.float32).reshape(7, 4)
    t = rag.from_packed(a, [3, 4], "~N, 4")
    assert t.values.ctypes.data == a.ctypes.data
    a[0, 0] = 42.0  # shared: visible through the tensor
    assert t.to_list()[0][0, 0] == 42.0
    b = np.arange(28, dtype=np.float64).reshape(7, 4)  # another dtype: converted, one copy
    u = rag.from_packed(b, [3, 4], "~N, 4", dtype="f32")
    assert u.dtype == "f32" and u.values.ctypes.data != b.ctypes.data
    assert np.array_equal(u.to_list()[1], b[3:].astype(np.float32))


def test_two_ragged_axes_and_flat_values():
    # A pair state [B, ~N, ~N, 2]: one row of lengths for the one name ~N.
    n = [2, 3]
    vals = np.arange(sum(k * k for k in n) * 2, dtype=np.float32)
    t = rag.from_packed(vals, n, "f32[B, ~N, ~N, 2]")
    assert t.schema == "f32[B, ~N, ~N, 2]"
    assert t.to_list()[1].shape == (3, 3, 2)
    assert np.array_equal(t.to_list()[1].ravel(), vals[8:])
    # Two names: a list in order or a dict.
    u = rag.from_packed(np.zeros(2 * 3 + 4 * 1, np.float32), {"N": [2, 4], "M": [3, 1]},
                        "~N, ~M")
    assert u.lengths(1) == [2, 4] and u.lengths(2) == [3, 1]
    w = rag.from_packed(np.zeros(10, np.float32), [[2, 4], [3, 1]], "~N, ~M")
    assert w.lengths(2) == [3, 1]


def test_bad_input_is_a_clear_error():
    with pytest.raises(rag.Error, match="hold 20 elements; the lengths .* need 21"):
        rag.from_packed(np.zeros((5, 4), np.float32), [2, 5], "~N, 3")
    with pytest.raises(rag.Error, match=r"shape \[3, 7\]; .* pack as \[7, 3\]"):
        rag.from_packed(np.zeros((3, 7), np.float32), [2, 5], "~N, 3")
    with pytest.raises(rag.Error, match="no ragged axis"):
        rag.from_packed(np.zeros(6, np.float32), [2], "3")
    with pytest.raises(rag.Error, match="give one row of lengths per name"):
        rag.from_packed(np.zeros(6, np.float32), [2, 1], "~N, ~M")
    with pytest.raises(rag.Error, match="negative"):
        rag.from_packed(np.zeros(6, np.float32), [-1, 7], "~N")
    with pytest.raises(rag.Error, match="~N has 2 lengths, ~M has 1"):
        rag.from_packed(np.zeros(6, np.float32), {"N": [2, 1], "M": [3]}, "~N, ~M")


def test_lengths_as_python_ints_numpy_ints_or_arrays_agree():
    vals = np.arange(10, dtype=np.float32).reshape(5, 2)
    want = rag.from_packed(vals, np.array([2, 3]), "~N, 2").to_list()
    for lengths in ([2, 3], (2, 3), [np.int64(2), 3], [np.int32(2), np.int32(3)]):
        got = rag.from_packed(vals, lengths, "~N, 2").to_list()
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), lengths
    with pytest.raises(rag.Error, match="sequence of integers"):
        rag.from_packed(vals, [2, "x"], "~N, 2")
    with pytest.raises(rag.Error, match="sequence of integers"):
        rag.from_packed(vals, [2, 10**30], "~N, 2")
    with pytest.raises(rag.Error, match=r"lengths\[1\] is negative \(-3\)"):
        rag.from_packed(vals, [8, -3], "~N, 2")
