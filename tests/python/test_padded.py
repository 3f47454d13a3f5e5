"""Padded execution from Python: rag.load/compile(..., padded=True) and Module.padded run the same
program on the dense envelope with masks; every valid result must be the ragged one."""
import numpy as np
import pytest
import rag

from conftest import singles

LENGTHS = [(5, 5, 5), (3, 0, 7, 1), (1, 12, 2)]  # near-uniform, a zero-length sample, variable


def assert_same(got, want, rtol):
    """Results of one call, padded vs ragged: tensors per sample, params mappings per field."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w, rtol)
    elif isinstance(want, rag.Tensor):
        assert got.schema == want.schema
        gl, wl = got.to_list(), want.to_list()
        assert [g.shape for g in gl] == [w.shape for w in wl]  # true extents, not the envelope
        for g, w in zip(gl, wl):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
    elif isinstance(want, np.ndarray) or np.isscalar(want):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    else:  # a params mapping: gradients, compared relative to their own size
        assert list(got) == list(want)
        for k in want:
            w = np.asarray(want[k], np.float64)
            assert np.linalg.norm(w) > 0, k  # a zero gradient would pass anything
            err = np.linalg.norm(np.asarray(got[k], np.float64) - w) / np.linalg.norm(w)
            assert err <= rtol, (k, err)


# Gradients compared directly: a parameter after one SGD step hides a wrong gradient below
# lr * |g|, under the tolerance.
GRADS = """
fn gradient_rect(x: f32[B, ~N, 384], z: f32[B, ~M, 384], p: PairBlock) -> PairBlock {
    return grad(loss_rect, wrt=p)(x, z, p)
}
"""
ENCODER_GRAD = """
fn gradient(x: f32[B, ~N, 64], labels: i64[B, ~N], p: Encoder) -> Encoder {
    return grad(loss, wrt=p)(x, labels, p)
}
"""


def with_grads(path, extra, **kw):
    return rag.compile(path.read_text() + extra, str(path), **kw)


@pytest.mark.parametrize("tier", ["jit", "interpreter"])
@pytest.mark.parametrize("fn", ["block", "loss", "gradient", "block_rect", "gradient_rect"])
def test_pair_example_padded_matches_ragged(example_path, pair_params, rng, tier, fn):
    ragged = with_grads(example_path, GRADS, tier=tier)
    padded = with_grads(example_path, GRADS, tier=tier, padded=True)
    assert padded.padded and not ragged.padded
    for lengths in LENGTHS:
        x = rag.ragged(singles(rng, lengths))
        args = [x, rag.ragged(singles(rng, lengths[::-1]))] if fn.endswith("rect") else [x]
        assert_same(padded[fn](*args, pair_params), ragged[fn](*args, pair_params), 1e-4)
    # The envelope changes with the lengths; the compiled padded function does not.
    assert padded.stats()[fn]["compilations"] == 1


def test_encoder_loss_padded_matches_ragged(root, rng):
    ragged = with_grads(root / "examples" / "encoder.rag", ENCODER_GRAD)
    padded = with_grads(root / "examples" / "encoder.rag", ENCODER_GRAD, padded=True)
    p = ragged.init("Encoder", seed=1)
    for lengths in LENGTHS:
        x = rag.ragged(singles(rng, lengths, width=64))
        labels = rag.ragged([rng.integers(0, 2, n).astype(np.int64) for n in lengths])
        assert_same(padded.gradient(x, labels, p), ragged.gradient(x, labels, p), 1e-4)


def test_padded_property_switches_a_module(example_path, pair_params, rng):
    m = rag.load(example_path)
    x = rag.ragged(singles(rng, (2, 6)))
    want = m.block(x, pair_params)
    m.padded = True
    assert m.padded
    assert_same(m.block(x, pair_params), want, 1e-4)
    m.padded = False
    assert_same(m.block(x, pair_params), want, 0)
    # One specialisation per mode: ragged, then padded.
    assert m.stats()["block"]["compilations"] == 2


def test_compile_padded(rng):
    src = """
fn row_mean(x: f64[B, ~N, 3]) -> f64[B, 3] { return mean(x, axis=1) }
"""
    m = rag.compile(src, "p.rag", padded=True)
    xs = [rng.standard_normal((n, 3)) for n in (4, 0, 2)]
    got = m.row_mean(rag.ragged(xs)).numpy()
    np.testing.assert_allclose(got, [x.mean(0) if len(x) else np.zeros(3) for x in xs],
                               rtol=1e-12)


CAUSAL = """
params A {
    wb: f32[2, 2] = normal(0.5)
}
fn self_causal(q: f32[B, ~N, 2, 4], k: f32[B, ~N, 2, 4]) -> f32[B, ~N, 2, 4] {
    return attention(q, k, k, causal=true)
}
fn cross_causal(q: f32[B, ~N, 2, 4], k: f32[B, ~M, 2, 4]) -> f32[B, ~N, 2, 4] {
    return attention(q, k, k, causal=true)
}
fn biased_causal(q: f32[B, ~N, 2, 4], k: f32[B, ~N, 2, 4], a: A) -> f32[B, ~N, 2, 4] {
    let b = sum(q[:, :, new, :, :] * k[:, new, :, :, :], axis=4) @ a.wb   # [B, ~N, ~N, 2]
    return attention(q, k, k, bias=b, causal=true)
}
fn loss(q: f32[B, ~N, 2, 4], k: f32[B, ~N, 2, 4], a: A) -> f32[] {
    return sum(self_causal(q, k) * biased_causal(q, k, a))
}
fn gradient(q: f32[B, ~N, 2, 4], k: f32[B, ~N, 2, 4], a: A) -> A {
    return grad(loss, wrt=a)(q, k, a)
}
fn gradient_q(q: f32[B, ~N, 2, 4], k: f32[B, ~N, 2, 4], a: A) -> f32[B, ~N, 2, 4] {
    return grad(loss, wrt=q)(q, k, a)
}
"""


@pytest.mark.parametrize("tier", ["jit", "interpreter"])
def test_causal_attention_padded_matches_ragged(rng, tier):
    """Key j is visible to query i iff j <= i, counted from each sample's start: the padded
    scores lose the later keys and the padded ones (the GPT's attention)."""
    ragged = rag.compile(CAUSAL, "c.rag", tier=tier)
    padded = rag.compile(CAUSAL, "c.rag", tier=tier, padded=True)
    a = ragged.init("A", seed=3)

    def heads(lengths):
        return rag.ragged([rng.standard_normal((n, 2, 4)).astype(np.float32) for n in lengths])

    for lengths in LENGTHS:
        q, k = heads(lengths), heads(lengths)
        for fn, args in (("self_causal", (q, k)), ("biased_causal", (q, k, a)),
                         ("loss", (q, k, a)), ("gradient", (q, k, a)), ("gradient_q", (q, k, a))):
            assert_same(getattr(padded, fn)(*args), getattr(ragged, fn)(*args), 1e-5)
        m = heads([n + 2 for n in lengths])  # more keys than queries: top-left aligned
        assert_same(padded.cross_causal(q, m), ragged.cross_causal(q, m), 1e-5)
