"""Train a rag program from Python on a stream of ragged batches.

    python3 examples/python/train.py                      # singles -> pairs -> singles block
    python3 examples/python/train.py --program encoder    # encoder layer, token classification
    python3 examples/python/train.py --steps 300 --out loss.png

Calls the compiled `train_step` of examples/single_pair_single.rag (or examples/encoder.rag):
one compilation on the first batch, then cache hits for every later length pattern. Needs tqdm
and matplotlib: pip install -r examples/python/requirements.txt
"""
import argparse
import importlib
import sys
import time

import numpy as np

import _find_rag
import rag

PROGRAMS = {
    "pair": ("examples/single_pair_single.rag", "PairBlock", 384),
    "encoder": ("examples/encoder.rag", "Encoder", 64),
}


def need(module, package):
    try:
        return importlib.import_module(module)
    except ImportError:
        sys.exit(f"train.py needs {package}: pip install -r examples/python/requirements.txt")


def batches(rng, program, width, batch, min_len, max_len):
    """An endless stream of ragged batches with fresh lengths each time."""
    w_label = rng.standard_normal(width)  # encoder labels: a fixed linear rule, learnable
    while True:
        lengths = rng.integers(min_len, max_len + 1, size=batch)
        xs = [rng.standard_normal((n, width)).astype(np.float32) for n in lengths]
        if program == "encoder":
            labels = [(x @ w_label > 0).astype(np.int64) for x in xs]
            yield (rag.ragged(xs, ragged_axes="~N, 64"), rag.ragged(labels, ragged_axes="~N"))
        else:
            yield (rag.ragged(xs, ragged_axes="~N, 384"),)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--program", choices=sorted(PROGRAMS), default="pair")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--min-len", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="train_loss.png", help="where to write the loss plot")
    args = ap.parse_args()
    tqdm = need("tqdm", "tqdm").tqdm
    matplotlib = need("matplotlib", "matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    path, params_name, width = PROGRAMS[args.program]
    m = rag.load(_find_rag.ROOT / path)
    p = m.init(params_name, seed=args.seed)
    stream = batches(np.random.default_rng(args.seed), args.program, width, args.batch, args.min_len, args.max_len)

    losses, t0 = [], time.perf_counter()
    with tqdm(range(args.steps), desc=f"train_step ({args.program})", unit="step") as bar:
        for _ in bar:
            loss, p = m.train_step(*next(stream), p)
            losses.append(float(loss))
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    seconds = time.perf_counter() - t0

    stats = m.stats()["train_step"]
    print(f"{args.steps} steps in {seconds:.1f} s; loss {losses[0]:.4f} -> {np.mean(losses[-10:]):.4f} "
          f"(mean of the last 10); compilations {stats['compilations']}, cache hits {stats['cache_hits']}")

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(losses, lw=0.8, alpha=0.5, label="loss per step")
    k = max(1, args.steps // 20)
    if len(losses) >= k:
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k - 1, len(losses)), smooth, lw=2, label=f"moving mean ({k})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"rag train_step: {path} (batch {args.batch}, lengths {args.min_len}..{args.max_len})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
