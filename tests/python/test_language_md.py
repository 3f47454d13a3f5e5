"""LANGUAGE.md section 5, the Python host interface, run verbatim from the repository root."""
import ast
import textwrap

import numpy as np
import rag

from conftest import singles

SNIPPET = textwrap.dedent(
    """
    import rag, numpy as np
    m = rag.load("examples/single_pair_single.rag")
    x = rag.ragged([np.random.randn(n, 384).astype(np.float32) for n in (5, 17, 9)])
    p = m.init("PairBlock", seed=0)
    y, pair = m.block(x, p)          # compiles on first call, reuses on later lengths
    print(pair.lengths(1))           # [5, 17, 9]
    print(m.stats())                 # {"block": {"compilations": 1, "cache_hits": 0, ...}}
    """
)


def test_section5_snippet(root, monkeypatch, capsys):
    monkeypatch.chdir(root)  # the snippet's path is relative to the repository root
    scope = {}
    exec(compile(SNIPPET, "LANGUAGE.md#5", "exec"), scope)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[5, 17, 9]"
    stats = ast.literal_eval(lines[1])
    assert stats["block"]["compilations"] == 1
    assert stats["block"]["cache_hits"] == 0
    assert stats["block"]["compile_seconds"] > 0
    y, pair, x = scope["y"], scope["pair"], scope["x"]
    assert y.schema == "f32[B, ~N, 384]"
    assert pair.schema == "f32[B, ~N, ~N, 128]"
    assert y.lengths(1) == [5, 17, 9]
    assert [a.shape for a in pair.to_list()] == [(5, 5, 128), (17, 17, 128), (9, 9, 128)]
    assert [a.shape for a in x.to_list()] == [(5, 384), (17, 384), (9, 384)]


def test_later_lengths_reuse_the_compiled_code(pair_module, pair_params, rng):
    m = pair_module
    for lengths in [(5, 17, 9), (3, 4), (8,), (6, 6, 6), (2, 11, 1, 7)]:
        y, pair = m.block(rag.ragged(singles(rng, lengths)), pair_params)
        assert pair.lengths(1) == list(lengths)
        assert pair.lengths(2) == list(lengths)
    # (6, 6, 6) happens to have equal lengths and still binds to ~N: no new compilation.
    assert m.stats()["block"]["compilations"] == 1
    assert m.stats()["block"]["cache_hits"] == 4


def test_stats_shape(pair_module, pair_params, rng):
    m = pair_module
    assert m.stats() == {}
    x = rag.ragged(singles(rng, (2, 3)))
    m.block(x, pair_params)
    m.loss(x, pair_params)
    s = m.stats()
    assert set(s) == {"block", "loss"}
    for v in s.values():
        assert set(v) >= {"compilations", "cache_hits", "compile_seconds"}
        assert isinstance(v["compilations"], int) and isinstance(v["compile_seconds"], float)


def layernorm(h, g, b, eps=1e-5):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / np.sqrt(var + eps) * g + b


def block_reference(x, p):
    """The square block of examples/single_pair_single.rag for one sample, in float64."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = x.astype(np.float64)
    a, b = x @ p["wu"], x @ p["wv"]
    pair = a[:, None, :] + b[None, :, :]
    pair = pair + layernorm(pair, p["ln_g"], p["ln_b"]) @ p["wh"]
    y = x + pair.mean(axis=1) @ p["wg"]
    return y, pair


def test_block_matches_numpy_per_sample(pair_module, pair_params, rng):
    xs = singles(rng, (5, 17, 9))
    y, pair = pair_module.block(rag.ragged(xs), pair_params)
    nl_y, nl_pair = pair_module.block_nonleading(rag.ragged(xs), pair_params)
    assert nl_pair.schema == "f32[B, 128, ~N, ~N]"
    for i, x in enumerate(xs):
        ry, rpair = block_reference(x, pair_params)
        np.testing.assert_allclose(y[i], ry, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(pair.to_list()[i], rpair, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(nl_y[i], ry, rtol=1e-4, atol=1e-4)
        # Non-leading layout: channels first in the logical order, stored channel-last.
        np.testing.assert_allclose(nl_pair[i], rpair.transpose(2, 0, 1), rtol=1e-4, atol=1e-4)


def test_rectangular_pairs(pair_module, pair_params, rng):
    xs, zs = singles(rng, (3, 5)), singles(rng, (4, 2))
    y, pair = pair_module.block_rect(rag.ragged(xs), rag.ragged(zs), pair_params)
    assert pair.schema == "f32[B, ~N, ~M, 128]"
    assert pair.lengths(1) == [3, 5] and pair.lengths(2) == [4, 2]
    assert [a.shape for a in pair.to_list()] == [(3, 4, 128), (5, 2, 128)]
