"""examples/pairformer.rag: AlphaFold 3's block order at full widths (single 384, pair 128),
four blocks, trained with AdamW at small CPU-sized lengths: the loss is finite and falls, one
compilation serves every length vector, the padded baseline agrees on the valid entries, and
`rag run --fn train_step --steps 2` runs."""
import subprocess

import numpy as np
import pytest
import rag

LENGTHS = [(5, 3, 7), (4, 6), (2, 8, 3, 5)]


def batch(rng, lengths):
    s = [rng.standard_normal((n, 384)).astype(np.float32) for n in lengths]
    z = [rng.standard_normal((n, n, 128)).astype(np.float32) for n in lengths]
    ts = [rng.standard_normal((n, 8)).astype(np.float32) for n in lengths]
    tz = [rng.standard_normal((n, n, 8)).astype(np.float32) for n in lengths]
    return s, z, ts, tz


@pytest.fixture(scope="module")
def model(root):
    return rag.load(root / "examples" / "pairformer.rag")


def test_training_lowers_the_loss_and_compiles_once(model):
    rng = np.random.default_rng(0)
    p = model.init("Pairformer", seed=0)
    st = model.init("Adam[Pairformer]")
    data = batch(rng, LENGTHS[0])
    losses = []
    for _ in range(4):
        loss, p, st = model.train_step(*data, p, st, np.float32(3e-4))
        losses.append(float(loss))
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] and all(b < a for a, b in zip(losses, losses[1:])), losses
    for lengths in LENGTHS[1:]:  # other length vectors reuse the compiled step
        loss, p, st = model.train_step(*batch(rng, lengths), p, st, np.float32(1e-3))
        assert np.isfinite(float(loss))
    stats = model.stats()["train_step"]
    assert stats["compilations"] == 1 and stats["cache_hits"] == len(LENGTHS) + 2, stats


def test_padded_baseline_agrees_on_the_loss(root, model):
    rng = np.random.default_rng(1)
    p = model.init("Pairformer", seed=1)
    data = batch(rng, (3, 6, 2))
    padded = rag.load(root / "examples" / "pairformer.rag", padded=True)
    np.testing.assert_allclose(float(padded.loss(*data, p)), float(model.loss(*data, p)),
                               rtol=2e-4)


def test_rag_run_train_step(root):
    out = subprocess.run([str(root / "build" / "dsl" / "rag"), "run",
                          str(root / "examples" / "pairformer.rag"), "--fn", "train_step",
                          "--steps", "2", "--lengths", "4,7,3", "--set", "lr=1e-3"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "ms/step" in out.stdout, out.stdout
