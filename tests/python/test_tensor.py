"""rag.Tensor from and to NumPy: every dtype, every layout, zero-copy views, errors."""
import gc

import numpy as np
import pytest
import rag

# rag dtype -> the NumPy dtype of converted arrays (bf16 widens to float32).
DTYPES = {
    "f16": np.float16,
    "bf16": np.float32,
    "f32": np.float32,
    "f64": np.float64,
    "i32": np.int32,
    "i64": np.int64,
    "bool": np.bool_,
}
# Raw storage views (`values`): bf16 shows its bits as uint16.
STORAGE = dict(DTYPES, bf16=np.uint16)


def samples_of(dtype, shapes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        if dtype == "bool":
            out.append(rng.random(shape) > 0.5)
        elif dtype in ("i32", "i64"):
            out.append(rng.integers(-1000, 1000, shape).astype(DTYPES[dtype]))
        else:  # values exactly representable in every float type, bf16 included
            out.append((rng.integers(-64, 64, shape) / 4).astype(DTYPES[dtype]))
    return out


def test_dtypes_listed():
    assert set(rag.dtypes) == set(DTYPES)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_round_trip(dtype):
    xs = samples_of(dtype, [(2, 3), (0, 3), (5, 3)])
    t = rag.ragged(xs, dtype=dtype)
    assert t.dtype == dtype
    assert t.schema == f"{dtype}[B, ~N, 3]"
    assert t.batch == len(t) == 3 and t.shape == (3, None, 3)
    assert t.lengths(1) == [2, 0, 5] and t.lengths(2) == [3, 3, 3]
    back = t.to_list()
    for a, b in zip(xs, back):
        assert b.dtype == DTYPES[dtype]
        np.testing.assert_array_equal(a, b)
    pad_value = True if dtype == "bool" else 7
    padded = t.to_padded(pad_value)
    assert padded.shape == (3, 5, 3) and padded.dtype == DTYPES[dtype]
    m = t.mask()
    assert m.dtype == np.bool_ and m.shape == padded.shape
    assert m.sum() == (2 + 0 + 5) * 3
    assert np.all(padded[~m] == pad_value)
    for i, a in enumerate(xs):
        np.testing.assert_array_equal(padded[i, : a.shape[0]], a)
    again = rag.from_padded(padded, t.lengths(1), dtype=dtype)
    assert again.schema == t.schema
    for a, b in zip(xs, again.to_list()):
        np.testing.assert_array_equal(a, b)
    assert t.values.dtype == STORAGE[dtype] and t.values.shape == (7, 3)
    assert np.asarray(t).shape == (7, 3)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_dense_round_trip(dtype):
    a = samples_of(dtype, [(3, 4)])[0]
    t = rag.tensor(a, dtype=dtype)
    assert t.schema == f"{dtype}[3, 4]" and not t.batched
    np.testing.assert_array_equal(t.numpy(), a)
    tb = rag.tensor(a, dtype=dtype, batched=True)
    assert tb.schema == f"{dtype}[B, 4]" and tb.batch == 3
    np.testing.assert_array_equal(tb.numpy(), a)
    np.testing.assert_array_equal(tb.to_padded(), a)


def test_bf16_is_uint16_bits_in_storage():
    xs = [np.array([[1.0, -2.5], [3.0e-3, 1e30]], np.float32)]
    t = rag.ragged(xs, ragged_axes="~N, 2", dtype="bf16")
    bits = t.values
    assert bits.dtype == np.uint16
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(widened, t.to_list()[0])
    # exact values survive, others round to nearest even in 8 bits of mantissa
    assert t.to_list()[0][0, 0] == 1.0 and t.to_list()[0][0, 1] == -2.5
    np.testing.assert_allclose(t.to_list()[0], xs[0], rtol=2**-8)
    # uint16 arrays are taken as bf16 bits: the raw view round-trips without rounding
    again = rag.ragged([bits], ragged_axes=[0])
    assert again.schema == "bf16[B, ~N, 2]"
    np.testing.assert_array_equal(again.values, bits)


def test_f16_exact():
    a = np.array([[65504.0, -0.0, 6.1e-5]], np.float16)
    t = rag.ragged([a])
    assert t.dtype == "f16" and t.values.dtype == np.float16
    np.testing.assert_array_equal(t.to_list()[0], a)


def test_inferred_axes():
    t = rag.ragged([np.zeros((3, 2, 5)), np.zeros((4, 2, 6))])
    assert t.schema == "f64[B, ~N, 2, ~M]"
    assert t.ragged_axes == [1, 3]
    assert t.lengths(1) == [3, 4] and t.lengths(3) == [5, 6] and t.lengths(-1) == [5, 6]
    same = rag.ragged([np.zeros((4, 3)), np.zeros((4, 3))])
    assert same.schema == "f64[B, 4, 3]" and not same.is_ragged


def test_ragged_axes_indices_and_spec():
    xs = [np.arange(9.0).reshape(3, 3), np.arange(16.0).reshape(4, 4)]
    assert rag.ragged(xs, ragged_axes=[0, 1]).schema == "f64[B, ~N, ~M]"
    assert rag.ragged(xs, ragged_axes="~N, ~N").schema == "f64[B, ~N, ~N]"
    assert rag.ragged(xs, ragged_axes="f32[B, ~N, ~N]").schema == "f32[B, ~N, ~N]"
    ys = [np.zeros((3, 8)), np.zeros((3, 8))]
    t = rag.ragged(ys, ragged_axes=[0])  # equal lengths, still ragged
    assert t.schema == "f64[B, ~N, 8]" and t.lengths(1) == [3, 3]
    assert rag.ragged(ys, ragged_axes="~N, 8").schema == "f64[B, ~N, 8]"
    assert rag.ragged(ys, ragged_axes=[-2]).schema == "f64[B, ~N, 8]"
    empty = rag.ragged([], ragged_axes="~N, 384", dtype="f32")
    assert empty.schema == "f32[B, ~N, 384]" and empty.batch == 0


def test_non_leading_ragged_axes_views():
    # [B, 3, ~H, ~W]: stored channel-last, sample views are strided, not copies
    xs = [np.arange(3 * h * w, dtype=np.float32).reshape(3, h, w) for h, w in ((2, 4), (5, 1))]
    t = rag.ragged(xs, ragged_axes="3, ~H, ~W")
    assert t.schema == "f32[B, 3, ~H, ~W]"
    assert t.values.shape == (2 * 4 + 5 * 1, 3)
    for a, b in zip(xs, t.to_list()):
        np.testing.assert_array_equal(a, b)
        assert np.shares_memory(b, t.values)
    padded = t.to_padded(-1)
    assert padded.shape == (2, 3, 5, 4)
    back = rag.from_padded(padded, [[2, 5], [4, 1]], ragged_axes="3, ~H, ~W")
    for a, b in zip(xs, back.to_list()):
        np.testing.assert_array_equal(a, b)


def test_values_are_views_that_keep_the_buffer_alive():
    t = rag.ragged([np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)])
    v = t.values
    w = np.asarray(t)  # buffer protocol: the same packed values
    assert np.shares_memory(v, w)
    assert t.offsets.tolist() == [0, 2, 5]
    assert t.sizes.tolist() == [[2, 4], [3, 4]]
    v[0, 0] = 42.0
    assert t.to_list()[0][0, 0] == 42.0
    s1 = t[1]
    del t
    gc.collect()
    assert v.sum() == 42 + 19  # the write, and 19 ones
    assert s1.shape == (3, 4) and np.all(s1 == 1)


def test_sample_indexing_and_iteration():
    xs = [np.full((n, 2), n, np.int32) for n in (1, 2, 3)]
    t = rag.ragged(xs)
    assert [int(a[0, 0]) for a in t] == [1, 2, 3]
    np.testing.assert_array_equal(t[-1], xs[-1])
    with pytest.raises(IndexError):
        t[3]


def test_scalar_and_item():
    s = rag.tensor(np.float32(2.5))
    assert s.schema == "f32[]" and s.item() == 2.5
    assert rag.tensor(np.int64(3)).item() == 3
    assert rag.tensor(True).item() is True


def test_astype():
    t = rag.ragged([np.array([1.5, 2.5]), np.array([3.5])]).astype("f32")
    assert t.schema == "f32[B, ~N]"
    np.testing.assert_array_equal(t.to_list()[1], np.array([3.5], np.float32))


def test_errors_are_rag_errors():
    with pytest.raises(rag.Error, match="sample 1"):
        rag.ragged([np.zeros((3, 3)), np.zeros((4, 5))], ragged_axes="~N, ~N")
    with pytest.raises(rag.Error, match="rank"):
        rag.ragged([np.zeros((3, 3)), np.zeros(4)])
    with pytest.raises(rag.Error, match="static extent"):
        rag.ragged([np.zeros((3, 3)), np.zeros((4, 5))], ragged_axes=[0])
    with pytest.raises(rag.Error, match="dtype"):
        rag.ragged([np.zeros(3, np.uint8)])
    with pytest.raises(rag.Error, match="unknown dtype"):
        rag.ragged([np.zeros(3)], dtype="f128")
    with pytest.raises(rag.Error, match="ragged"):
        rag.ragged([np.zeros(3), np.zeros(4)]).numpy()
    with pytest.raises(rag.Error, match="batch axis"):
        rag.ragged([np.zeros(3), np.zeros(4)]).lengths(0)
    with pytest.raises(rag.Error, match="beyond the padded extent"):
        rag.from_padded(np.zeros((2, 3)), [1, 4])
