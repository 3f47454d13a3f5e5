"""DLPack: rag tensors to NumPy and NumPy arrays to rag, through the capsule protocol."""
import gc

import numpy as np
import pytest
import rag

NUMPY_DTYPES = {
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
    "i32": np.int32,
    "i64": np.int64,
    "bool": np.bool_,
}


def aligned(shape, dtype, align=64):
    """A C-contiguous array whose data starts on an `align`-byte boundary."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + n].view(dtype).reshape(shape)


def test_device():
    t = rag.ragged([np.zeros((2, 3)), np.zeros((1, 3))])
    assert t.__dlpack_device__() == (1, 0)


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_rag_to_numpy_is_a_view_of_the_packed_values(dtype):
    xs = [np.arange(n * 3).reshape(n, 3).astype(NUMPY_DTYPES[dtype]) for n in (2, 4)]
    t = rag.ragged(xs)
    a = np.from_dlpack(t)
    assert a.dtype == NUMPY_DTYPES[dtype] and a.shape == (6, 3)
    np.testing.assert_array_equal(a, np.concatenate(xs))
    assert np.shares_memory(a, t.values)
    del t
    gc.collect()
    np.testing.assert_array_equal(a, np.concatenate(xs))  # the capsule keeps the buffer alive


def test_dense_tensors_export_their_logical_array():
    w = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(np.from_dlpack(rag.tensor(w)), w)
    np.testing.assert_array_equal(np.from_dlpack(rag.tensor(w, batched=True)), w)


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_numpy_to_rag_round_trip(dtype):
    a = (np.arange(24) % 5).reshape(2, 3, 4).astype(NUMPY_DTYPES[dtype])
    t = rag.from_dlpack(a)
    assert t.schema == f"{dtype}[2, 3, 4]"
    np.testing.assert_array_equal(t.numpy(), a)
    tb = rag.from_dlpack(a, batched=True)
    assert tb.schema == f"{dtype}[B, 3, 4]" and tb.batch == 2
    np.testing.assert_array_equal(np.from_dlpack(tb), a)


def test_aligned_arrays_are_adopted_without_a_copy():
    a = aligned((4, 8), np.float32)
    a[:] = np.arange(32).reshape(4, 8)
    t = rag.from_dlpack(a)
    assert np.shares_memory(np.from_dlpack(t), a)
    a[0, 0] = 99
    assert t.numpy()[0, 0] == 99
    del a
    gc.collect()
    assert t.numpy()[0, 0] == 99  # rag owns a reference through the DLPack deleter


def test_strided_and_unaligned_arrays_are_copied():
    base = np.arange(60.0).reshape(6, 10)
    for a in (base[::2, 1::3], base.T, base[1:, 1:], aligned((5, 3), np.float64)[:, ::-1]):
        t = rag.from_dlpack(a)
        np.testing.assert_array_equal(t.numpy(), a)
        assert t.numpy().flags.c_contiguous


def test_capsules():
    t = rag.ragged([np.ones((2, 2)), np.ones((3, 2))])
    cap = t.__dlpack__()
    back = rag.from_dlpack(cap)
    np.testing.assert_array_equal(back.numpy(), t.values)
    with pytest.raises(rag.Error, match="consumed"):
        rag.from_dlpack(cap)
    unused = t.__dlpack__()
    del unused  # an unconsumed capsule calls the deleter itself
    gc.collect()
    copied = rag.from_dlpack(rag.tensor(np.ones(3)).__dlpack__(copy=True))
    np.testing.assert_array_equal(copied.numpy(), np.ones(3))
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(rag.Error, match="__dlpack__"):
        rag.from_dlpack([1, 2, 3])


def test_bf16_exports_as_bfloat16():
    t = rag.ragged([np.array([1.0, 2.0]), np.array([3.0])], dtype="bf16")
    back = rag.from_dlpack(t.__dlpack__())  # DLPack bfloat16 (code 4): rag reads it back
    assert back.dtype == "bf16"
    np.testing.assert_array_equal(back.numpy(), [1.0, 2.0, 3.0])
    with pytest.raises((BufferError, RuntimeError, TypeError)):
        np.from_dlpack(t)  # NumPy has no bfloat16
    # NumPy side: bf16 travels as its uint16 bits (the buffer protocol, `values`)
    bits = np.asarray(t)
    assert bits.dtype == np.uint16 and np.shares_memory(bits, t.values)
    again = rag.from_dlpack(bits)
    assert again.dtype == "bf16"
    np.testing.assert_array_equal(again.numpy(), [1.0, 2.0, 3.0])
