"""dropout(x, p, seed, shared_axis=a): one mask shared along a pair axis (row- and column-wise
dropout of AlphaFold 3's triangle updates), against a NumPy reimplementation of the documented
counter-based mask, with its gradient checked by float64 central differences."""
import numpy as np
import pytest
import rag

SRC = """
fn rows(z: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] { return dropout(z, 0.25, 7, shared_axis=1) }
fn cols(z: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] { return dropout(z, 0.25, 7, shared_axis=2) }
fn plain(z: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] { return dropout(z, 0.25, 7) }
fn loss(z: f64[B, ~N, ~N, C], w: f64[B, ~N, ~N, C]) -> f64[] {
    return sum(dropout(z, 0.5, 3, shared_axis=1) * w)
}
fn dz(z: f64[B, ~N, ~N, C], w: f64[B, ~N, ~N, C]) -> f64[B, ~N, ~N, C] {
    return grad(loss, wrt=z)(z, w)
}
"""
M64 = (1 << 64) - 1
LENGTHS = [3, 0, 5, 2]


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def uniform(seed, k):
    return (splitmix64((seed * 0x9E3779B97F4A7C15 + k) & M64) >> 11) * 2.0 ** -53


def reference(zs, p, seed, shared):
    """Without shared: k is the packed index (each sample's [N, N, C] block row-major, one
    after another); with shared: k is (sample, j0, j1, c) in 20-bit digits, j_shared = 0."""
    out, begin = [], 0
    for i, z in enumerate(zs):
        y = np.zeros_like(z)
        for idx in np.ndindex(z.shape):
            if shared is None:
                k = begin + int(np.ravel_multi_index(idx, z.shape))
            else:
                k = i
                for a, j in enumerate(idx):
                    k = ((k << 20) + (0 if a == shared - 1 else j)) & M64
            y[idx] = z[idx] / (1 - p) if uniform(seed, k) >= p else 0.0
        out.append(y)
        begin += z.size
    return out


@pytest.fixture(scope="module", params=["jit", "interpreter"])
def mod(request):
    return rag.compile(SRC, "dropout.rag", tier=request.param)


def test_masks_match_the_documented_counters(mod):
    rng = np.random.default_rng(0)
    zs = [rng.standard_normal((n, n, 4)) for n in LENGTHS]
    for fn, shared in (("rows", 1), ("cols", 2), ("plain", None)):
        got = getattr(mod, fn)(zs).to_list()
        for g, w in zip(got, reference(zs, 0.25, 7, shared)):
            np.testing.assert_array_equal(g, w)


def test_row_mask_is_shared_along_its_axis(mod):
    zs = [np.ones((n, n, 4)) for n in LENGTHS]
    rows, cols = mod.rows(zs).to_list(), mod.cols(zs).to_list()
    for r, c in zip(rows, cols):
        if r.shape[0] > 1:
            assert (r == r[:1]).all() and (c == c[:, :1]).all()
            assert 0 < (r == 0).sum() < r.size  # some dropped, some kept


def test_gradient_matches_central_differences(mod):
    rng = np.random.default_rng(1)
    zs = [rng.standard_normal((n, n, 2)) for n in (2, 3)]
    ws = [rng.standard_normal((n, n, 2)) for n in (2, 3)]
    got = mod.dz(zs, ws).to_list()
    eps = 1e-6
    for i, z in enumerate(zs):
        g = np.zeros_like(z)
        for idx in np.ndindex(z.shape):
            old = z[idx]
            z[idx] = old + eps
            up = float(mod.loss(zs, ws))
            z[idx] = old - eps
            down = float(mod.loss(zs, ws))
            z[idx] = old
            g[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(got[i], g, rtol=1e-7, atol=1e-9)


def test_padded_run_drops_the_same_valid_entries(mod):
    rng = np.random.default_rng(2)
    zs = [rng.standard_normal((n, n, 4)) for n in LENGTHS]
    padded = rag.compile(SRC, "dropout.rag", padded=True)
    for fn in ("rows", "cols"):
        for g, w in zip(getattr(padded, fn)(zs).to_list(), getattr(mod, fn)(zs).to_list()):
            np.testing.assert_array_equal(g, w)


def test_bad_shared_axis_is_an_error():
    src = "fn f(z: f32[B, ~N, ~N, 4]) -> f32[B, ~N, ~N, 4] { return dropout(z, 0.1, 1, shared_axis=0) }\n"
    with pytest.raises(rag.Error, match="dropout"):
        rag.compile(src, "bad.rag")
