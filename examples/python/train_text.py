"""Train a text model of examples/ (BERT, GPT or an encoder-decoder) from Python with AdamW on
synthetic token batches shaped like IMDB reviews, save a checkpoint, and resume from it.

    python3 examples/python/train_text.py --model bert --steps 20 --save bert.safetensors
    python3 examples/python/train_text.py --model bert --steps 5 --load bert.safetensors

Lengths are long-tailed like IMDB reviews in BERT tokens (log-normal, median about 175,
capped at 512: token occupancy about 0.3 of a padded B x 512 batch); ids are drawn so that the
label is learnable (BERT: the share of ids below V/2; GPT and seq2seq: each token predicts the
next by a fixed rule). Only numpy and rag are needed. Every batch has other lengths and the
learning rate is a runtime argument: the step compiles once.
"""
import argparse
import pathlib
import time

import numpy as np

import _find_rag
import rag

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = {  # file, params type, vocabulary
    "bert": ("examples/bert.rag", "Bert", 30522),
    "gpt": ("examples/gpt.rag", "Gpt", 4096),
    "seq2seq": ("examples/seq2seq.rag", "Seq2Seq", 8000),
}


def imdb_lengths(rng, batch, cap=512):
    """Long-tailed review lengths: log-normal, at least 8 tokens, at most `cap`."""
    return np.clip(rng.lognormal(mean=5.15, sigma=0.65, size=batch).astype(int), 8, cap)


def token_batch(rng, lengths, vocab, rule):
    out = []
    for n in lengths:
        ids = np.empty(n, dtype=np.int32)
        ids[0] = rng.integers(vocab)
        for t in range(1, n):  # mostly the rule, sometimes noise
            ids[t] = rule(ids[t - 1]) if rng.random() < 0.8 else rng.integers(vocab)
        out.append(ids)
    return out


def batch_for(model, rng, batch, vocab):
    nxt = lambda v: (v * 7 + 3) % vocab  # noqa: E731: the next-token rule
    if model == "bert":
        lengths = imdb_lengths(rng, batch)
        labels = rng.integers(2, size=batch)
        ids = [np.where(rng.random(n) < (0.7 if y else 0.3), rng.integers(vocab // 2, size=n),
                        rng.integers(vocab // 2, vocab, size=n)).astype(np.int32)
               for n, y in zip(lengths, labels)]
        return (rag.ragged(ids, ragged_axes="~N"), rag.tensor(labels.astype(np.int64), batched=True))
    if model == "gpt":
        return (rag.ragged(token_batch(rng, imdb_lengths(rng, batch), vocab, nxt), ragged_axes="~N"),)
    src = token_batch(rng, imdb_lengths(rng, batch, cap=128), vocab, nxt)
    tgt = [np.concatenate([[1], (s[: max(2, len(s) // 2)] + 1) % vocab]).astype(np.int32) for s in src]
    return (rag.ragged(src, ragged_axes="~N"), rag.ragged(tgt, ragged_axes="~M"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="bert")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="write params and Adam state to FILE and FILE.adam")
    ap.add_argument("--load", help="resume from a checkpoint written with --save")
    args = ap.parse_args()

    path, ptype, vocab = MODELS[args.model]
    m = rag.load(str(ROOT / path))
    if args.load:
        p = m.load_params(ptype, args.load)
        s = m.load_params(f"Adam[{ptype}]", args.load + ".adam")
        print(f"resumed from {args.load} at step {int(np.asarray(s['t']))}")
    else:
        p, s = m.init(ptype, seed=args.seed), m.init(f"Adam[{ptype}]")
    rng = np.random.default_rng(args.seed + int(np.asarray(s["t"])))
    lr = np.float32(args.lr)
    for step in range(args.steps):
        inputs = batch_for(args.model, rng, args.batch, vocab)
        t0 = time.perf_counter()
        loss, p, s = m.train_step(*inputs, p, s, lr)
        ms = 1e3 * (time.perf_counter() - t0)
        print(f"step {int(np.asarray(s['t']))} loss {float(np.asarray(loss)):.6f} ({ms:.0f} ms)")
    st = m.stats()["train_step"]
    print(f"compilations {st['compilations']}, cache hits {st['cache_hits']}")
    if args.save:
        p.save(args.save)
        s.save(args.save + ".adam")
        print(f"saved {args.save} and {args.save}.adam")


if __name__ == "__main__":
    main()
