"""Image ops on the padded tier: images padded to the batch's largest, windows masked to read
zeros (max pooling: -inf) outside each image, derived axes (`~H[::2]`, `~H[::4][*4]`) valid up
to each image's own lengths. Every valid value and every gradient must be the ragged program's."""
import pathlib

import numpy as np
import pytest
import rag

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Odd sides, a 1 x 1 image, sides below the kernel, an empty image, and a wide one.
SIZES = [(8, 12), (5, 7), (1, 1), (2, 3), (0, 4), (12, 20)]

OPS = """
params P {
    w: f32[4, 3, 3, 3] = normal(0.3)
    b: f32[4] = normal(0.3)
}
fn f(x: f32[B, 3, ~H, ~W], p: P) -> f32[B, 4, ~H[::2][1::2][*2], ~W[::2][1::2][*2]] {
    let h = relu(conv2d(x, p.w, bias=p.b, stride=2, padding=1))   # ~H[::2], padding garbage
    let h = avg_pool2d(h, 3, stride=1, padding=1) + max_pool2d(h, 3, stride=1, padding=1)
    return upsample2d(max_pool2d(h, 2), scale=2)                   # ~H[::2][1::2][*2]
}
fn loss(x: f32[B, 3, ~H, ~W], p: P) -> f32[] {
    return mean(f(x, p) * f(x, p)) + mean(mean(conv2d(x, p.w, padding="same"), axis=3))
}
fn gradient(x: f32[B, 3, ~H, ~W], p: P) -> (f32[B, 3, ~H, ~W], P) {
    return (grad(loss, wrt=x)(x, p), grad(loss, wrt=p)(x, p))
}
"""

FCN_GRAD = """
fn gradient(x: f32[B, 3, ~H, ~W], labels: i64[B, ~H[::4][*4], ~W[::4][*4]], p: Fcn) -> Fcn {
    return grad(loss, wrt=p)(x, labels, p)
}
"""


def images(rng, sizes):
    return rag.ragged([rng.standard_normal((3, h, w)).astype(np.float32) for h, w in sizes],
                      ragged_axes=[1, 2])


def same(got, want, tol=2e-6):
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            same(g, w, tol)
    elif isinstance(want, rag.Tensor):
        assert got.schema == want.schema
        gl, wl = got.to_list(), want.to_list()
        assert [g.shape for g in gl] == [w.shape for w in wl]  # each image's own extents
        for g, w in zip(gl, wl):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    elif isinstance(want, (np.ndarray, float)) or np.isscalar(want):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:  # params: relative to each gradient's own size
        for k in want:
            w = np.asarray(want[k], np.float64)
            assert np.linalg.norm(w) > 0, k
            assert np.linalg.norm(np.asarray(got[k], np.float64) - w) <= tol * np.linalg.norm(w), k


@pytest.mark.parametrize("tier", ["jit", "interpreter"])
def test_windows_and_derived_axes_match_the_ragged_program(tier):
    ragged = rag.compile(OPS, "ops.rag", tier=tier)
    padded = rag.compile(OPS, "ops.rag", tier=tier, padded=True)
    rng = np.random.default_rng(0)
    p = ragged.init("P", seed=1)
    x = images(rng, SIZES)
    same(padded.f(x, p), ragged.f(x, p))
    same(padded.loss(x, p), ragged.loss(x, p))
    same(padded.gradient(x, p), ragged.gradient(x, p))


def test_the_fcn_example_matches_the_ragged_program():
    src = (ROOT / "examples" / "fcn.rag").read_text() + FCN_GRAD
    ragged = rag.compile(src, "fcn.rag")
    padded = rag.compile(src, "fcn.rag", padded=True)
    rng = np.random.default_rng(1)
    sizes = [(8, 12), (16, 4), (5, 7), (12, 20)]
    x = images(rng, sizes)
    y = rag.ragged([rng.integers(0, 4, (4 * -(-h // 4), 4 * -(-w // 4))) for h, w in sizes],
                   ragged_axes=[0, 1])
    p = ragged.init("Fcn", seed=0)
    same(padded.logits(x, p), ragged.logits(x, p))
    same(padded.loss(x, y, p), ragged.loss(x, y, p))
    same(padded.gradient(x, y, p), ragged.gradient(x, y, p), 1e-5)


PATCHES = """
params Q {
    w: f32[12, 5] = normal(0.3)
    pos: f32[64, 5] = normal(0.3)
}
fn tokens(x: f32[B, 3, ~H, ~W], q: Q) -> f32[B, ~P, 5] {
    let t = patches(x, 2) @ q.w                       # ~P = (~H[1::2]*~W[1::2])
    return t + q.pos[positions(t)]                    # each image's own patch numbering
}
fn f(x: f32[B, 3, ~H, ~W], q: Q) -> f32[B, 5] {
    let t = tokens(x, q)
    return mean(softmax(t, axis=1) * t, axis=1) + max(t, axis=1)
}
fn loss(x: f32[B, 3, ~H, ~W], q: Q) -> f32[] { return sum(f(x, q) * f(x, q)) }
fn gradient(x: f32[B, 3, ~H, ~W], q: Q) -> (f32[B, 3, ~H, ~W], Q) {
    return (grad(loss, wrt=x)(x, q), grad(loss, wrt=q)(x, q))
}
"""

VIT_GRAD = """
fn gradient(x: f32[B, 3, ~H, ~W], labels: i64[B], p: Vit) -> Vit {
    return grad(loss, wrt=p)(x, labels, p)
}
"""


@pytest.mark.parametrize("tier", ["jit", "interpreter"])
def test_patches_are_each_images_own_row_major_patches(tier):
    # Padded, an image's patches are numbered over the envelope's grid; the padded tier gathers
    # them back into the image's own order, so tokens, positions and every gradient agree.
    # Widths 7 and 2 give 3 and 1 patch columns under an envelope of 10 (odd sides, a 1 x 1
    # image and an empty one have no patch at all).
    ragged = rag.compile(PATCHES, "patches.rag", tier=tier)
    padded = rag.compile(PATCHES, "patches.rag", tier=tier, padded=True)
    x = images(np.random.default_rng(2), SIZES)
    q = ragged.init("Q", seed=3)
    same(padded.tokens(x, q), ragged.tokens(x, q))
    same(padded.f(x, q), ragged.f(x, q))
    same(padded.gradient(x, q), ragged.gradient(x, q), 1e-5)


def test_the_vit_example_matches_the_ragged_program():
    src = (ROOT / "examples" / "vit.rag").read_text() + VIT_GRAD
    ragged = rag.compile(src, "vit.rag")
    padded = rag.compile(src, "vit.rag", padded=True)
    rng = np.random.default_rng(4)
    x = images(rng, [(32, 64), (48, 16), (16, 16), (64, 40), (20, 70)])
    y = rag.tensor(np.array([1, 3, 5, 7, 9]), batched=True)
    p = ragged.init("Vit", seed=0)
    same(padded.logits(x, p), ragged.logits(x, p), 1e-5)
    same(padded.loss(x, y, p), ragged.loss(x, y, p), 1e-5)
    same(padded.gradient(x, y, p), ragged.gradient(x, y, p), 1e-4)
