"""DLPack: rag tensors to NumPy and NumPy arrays to rag, through the capsule protocol."""
import ctypes
import gc

import numpy as np
import pytest
import rag
from dlpack_abi import DLTensor, Versioned, capsule_name, new_capsule

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
    with pytest.raises(BufferError, match=r"CPU memory or on CUDA device 0; .* \(7, 0\)"):
        t.__dlpack__(dl_device=(7, 0))
    with pytest.raises(BufferError, match="copy=False forbids uploading"):
        t.__dlpack__(dl_device=(2, 0), copy=False)
    try:  # uploaded where there is a device, else the protocol's BufferError says why not
        on_device = rag.from_dlpack(t.__dlpack__(dl_device=(2, 0)))
        assert on_device.device == "cuda" and t.device == "cpu"
        np.testing.assert_array_equal(on_device.values, t.values)
    except BufferError as e:
        assert str(e).startswith("__dlpack__: CUDA unavailable: "), str(e)
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


# ---- DLPack 1.x: versioned capsules ---------------------------------------------------------


class Spy:
    """A producer that forwards to `inner` and records what the consumer asked for and got."""

    def __init__(self, inner):
        self.inner, self.asked, self.got = inner, None, None

    def __dlpack__(self, **kw):
        self.asked = kw.get("max_version")
        cap = self.inner.__dlpack__(**kw)
        self.got = capsule_name(cap)
        return cap

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


class LegacyProducer:
    """A pre-1.0 producer: __dlpack__ takes no max_version."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, stream=None):
        return self.inner.__dlpack__()


def test_export_kind_follows_max_version():
    t = rag.ragged([np.ones((2, 3), np.float32), np.ones((1, 3), np.float32)])
    assert capsule_name(t.__dlpack__()) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    assert t.__dlpack_device__() == (1, 0)


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_both_capsule_kinds_import_without_a_copy(max_version):
    t = rag.ragged([np.arange(6.0).reshape(2, 3), np.arange(3.0).reshape(1, 3)])
    cap = t.__dlpack__(max_version=max_version)
    back = rag.from_dlpack(cap)
    assert back.values.ctypes.data == t.values.ctypes.data
    np.testing.assert_array_equal(back.numpy(), t.values)
    assert capsule_name(cap).startswith("used_")
    with pytest.raises(rag.Error, match="consumed"):
        rag.from_dlpack(cap)
    packed = rag.from_packed(t.__dlpack__(max_version=max_version), [2, 1], "~N, 3")
    assert packed.values.ctypes.data == t.values.ctypes.data
    assert packed.to_list()[1].tolist() == [[0.0, 1.0, 2.0]]
    del t, back, packed
    gc.collect()
    unused = rag.tensor(np.ones(3)).__dlpack__(max_version=max_version)
    del unused  # an unconsumed capsule of either kind frees its tensor itself
    gc.collect()


def test_numpy_round_trip_through_versioned_capsules():
    t = rag.ragged([np.arange(8, dtype=np.float32).reshape(2, 4), np.ones((3, 4), np.float32)])
    spy = Spy(t)
    a = np.from_dlpack(spy)
    versioned = tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 1)
    # NumPy >= 2.1 asks for DLPack 1.x; older NumPy gets (and reads) the legacy capsule.
    assert spy.got == ("dltensor_versioned" if versioned else "dltensor")
    assert a.ctypes.data == t.values.ctypes.data
    src = aligned((5, 4), np.float32)
    src[:] = np.arange(20).reshape(5, 4)
    spy = Spy(src)
    r = rag.from_dlpack(spy, batched=True)
    assert spy.asked == (1, 0) and spy.got == ("dltensor_versioned" if versioned else "dltensor")
    assert r.values.ctypes.data == src.ctypes.data  # adopted
    np.testing.assert_array_equal(r.values, src)


def test_read_only_tensors_are_copied():
    a = aligned((4, 4), np.float32)
    a[:] = np.arange(16).reshape(4, 4)
    a.flags.writeable = False
    spy = Spy(a)
    t = rag.from_dlpack(spy)  # NumPy exports a read-only array only as a versioned capsule
    assert spy.got == "dltensor_versioned"
    assert t.values.ctypes.data != a.ctypes.data  # the read-only flag forbids adopting it
    np.testing.assert_array_equal(t.numpy(), a)
    t.values[0, 0] = -1  # rag's copy is writable; the producer's memory is untouched
    assert a[0, 0] == 0
    p = rag.from_packed(Spy(a), [1, 3], "~N, 4")
    assert p.values.ctypes.data != a.ctypes.data
    w = aligned((4, 4), np.float32)  # the same array writable: adopted
    assert rag.from_dlpack(Spy(w)).values.ctypes.data == w.ctypes.data


def test_legacy_producers_get_the_legacy_call():
    a = aligned((3, 2), np.float64)
    a[:] = 7
    t = rag.from_dlpack(LegacyProducer(a))
    assert t.values.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(t.numpy(), a)


def handmade_capsule(array, major, flags):
    """A "dltensor_versioned" capsule built field by field (no deleter: `array` stays alive)."""
    shape = (ctypes.c_int64 * array.ndim)(*array.shape)
    dl = DLTensor(array.ctypes.data, 1, 0, array.ndim, 2, 32, 1, shape, None, 0)
    m = Versioned(major, 0, None, None, flags, dl)
    return new_capsule(m), (m, shape)


def test_versioned_fields_are_read_by_their_abi():
    a = aligned((2, 3), np.float32)
    a[:] = np.arange(6).reshape(2, 3)
    cap, keep = handmade_capsule(a, 1, 0)
    assert rag.from_dlpack(cap).values.ctypes.data == a.ctypes.data
    cap, keep = handmade_capsule(a, 1, 1)  # DLPACK_FLAG_BITMASK_READ_ONLY
    t = rag.from_dlpack(cap)
    assert t.values.ctypes.data != a.ctypes.data
    np.testing.assert_array_equal(t.numpy(), a)
    cap, keep = handmade_capsule(a, 2, 0)
    with pytest.raises(rag.Error, match=r"DLPack 2\.0 tensor; rag reads DLPack 1\.x"):
        rag.from_dlpack(cap)
    assert capsule_name(cap) == "dltensor_versioned"  # refused before taking it over
