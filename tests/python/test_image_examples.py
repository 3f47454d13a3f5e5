"""examples/fcn.rag and examples/vit.rag train on synthetic variable-size images (aspect ratios
1:2 to 2:1, sides 32-96 here: CPU scale), from Python and from `rag run --steps`: the loss is
finite and falls, and one compilation serves every size mix."""
import pathlib
import re
import subprocess

import numpy as np
import pytest
import rag

from test_cli import RAG

ROOT = pathlib.Path(__file__).resolve().parents[2]


def synthetic(rng, n, lo=32, hi=96, step=4):
    """n images with sides in [lo, hi] (multiples of `step`), aspect ratios 1:2 to 2:1; the
    class of an image is the sign pattern of its mean colour, so it can be learned."""
    xs, sizes = [], []
    while len(xs) < n:
        h, w = (int(v) * step for v in rng.integers(lo // step, hi // step + 1, 2))
        if not 0.5 <= h / w <= 2:
            continue
        x = rng.standard_normal((3, h, w)).astype(np.float32)
        xs.append(x)
        sizes.append((h, w))
    return xs, sizes


def adam_steps(m, model, args, p, steps, lr):
    s = m.init(f"Adam[{model}]")
    losses = []
    for _ in range(steps):
        loss, p, s = m.train_step(*args, p, s, np.float32(lr))
        losses.append(float(loss))
    return losses


def test_fcn_trains_on_variable_size_images():
    m = rag.load(ROOT / "examples" / "fcn.rag")
    rng = np.random.default_rng(0)
    xs, sizes = synthetic(rng, 6)
    # Per-pixel labels: class = which of the first two channels is larger, and its sign.
    labels = [((x[0] > x[1]).astype(np.int64) * 2 + (x[2] > 0)) for x in xs]
    x = rag.ragged(xs, ragged_axes=[1, 2])
    y = rag.ragged(labels, ragged_axes=[0, 1])
    p = m.init("Fcn", seed=1)
    out = m.logits(x, p)
    assert out.schema == "f32[B, 4, ~H[::4][*4], ~W[::4][*4]]"
    assert [t.shape for t in out.to_list()] == [(4, h, w) for h, w in sizes]
    losses = adam_steps(m, "Fcn", (x, y), p, 6, 1e-2)
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] - 0.02, losses
    # Another size mix reuses the compiled step.
    xs2, _ = synthetic(rng, 3, 32, 64)
    y2 = rag.ragged([np.zeros(x.shape[1:], np.int64) for x in xs2], ragged_axes=[0, 1])
    m.train_step(rag.ragged(xs2, ragged_axes=[1, 2]), y2, p, m.init("Adam[Fcn]"),
                 np.float32(1e-3))
    assert m.stats()["train_step"]["compilations"] == 1


def test_vit_trains_on_variable_size_images():
    m = rag.load(ROOT / "examples" / "vit.rag")
    rng = np.random.default_rng(1)
    xs, sizes = synthetic(rng, 8)
    labels = np.array([int(x.mean() > 0) + 2 * int(x[0].mean() > 0) for x in xs], np.int64)
    x = rag.ragged(xs, ragged_axes=[1, 2])
    p = m.init("Vit", seed=0)
    tok = m.tokens(x, p)
    assert tok.lengths(1) == [(h // 16) * (w // 16) for h, w in sizes]
    losses = adam_steps(m, "Vit", (x, rag.tensor(labels, batched=True)), p, 6, 3e-3)
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses
    assert m.stats()["train_step"]["compilations"] == 1


@pytest.mark.skipif(RAG is None, reason="no rag binary")
@pytest.mark.parametrize("example, lengths, lr", [("fcn.rag", "32,64,48,96", "1e-2"),
                                                   ("vit.rag", "32,64,48,112", "1e-3")])
def test_rag_run_trains_the_image_examples(example, lengths, lr):
    p = subprocess.run([str(RAG), "run", f"examples/{example}", "--fn", "train_step", "--steps",
                        "3", "--lengths", lengths, "--set", f"lr={lr}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    losses = [float(v) for v in re.findall(r"^step \d+ loss ([-0-9.e+]+)$", p.stdout, re.M)]
    assert len(losses) == 3 and all(np.isfinite(losses)), p.stdout
    assert losses[-1] < losses[0], p.stdout
