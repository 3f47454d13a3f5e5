"""Microbenchmarks of issue 14's targets, against memory copies on this machine:
  python3 micro.py [--threads T] [--calls K]     (PYTHONPATH=build/bindings)
- embedding: forward + backward of sum(tok[ids]) (bench/text/embedding.rag) at V = 30522,
  C = 768, 16K tokens, vs copying the gathered rows [16K, 768] plus the table gradient
  [V, 768] (target: within 2x).
- adam: one AdamW step over every param of BERT-Small (bench/text/bert_small.rag `adam_step`)
  vs copying p, g, m and v. GB/s: Adam moves 7 x 4P bytes (reads p, g, m, v; writes p, m, v),
  a copy 2 x the bytes copied.
Copies are numpy copyto into touched buffers, on 1 thread and on T threads (each copying a
slice); the faster is the reference. Every time is the median of K calls after a warm-up.
Prints one JSON line per benchmark."""
import argparse
import json
import os
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--calls", type=int, default=5)
a = ap.parse_args()
os.environ["RAG_NUM_THREADS"] = str(a.threads)
import rag  # noqa: E402


def median_ms(f, calls):
    f()
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        f()
        ts.append(1e3 * (time.perf_counter() - t))
    return float(np.median(ts))


def copy_ms(arrays, calls, threads):
    """Median ms to copy every array once (into preallocated, touched destinations)."""
    src = [x.reshape(-1) for x in arrays]
    dst = [np.ones_like(x) for x in src]

    def part(k):
        for s, d in zip(src, dst):
            lo, hi = len(s) * k // threads, len(s) * (k + 1) // threads
            np.copyto(d[lo:hi], s[lo:hi])

    def run():
        if threads == 1:
            return part(0)
        ts = [threading.Thread(target=part, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return median_ms(run, calls)


def best_copy(arrays):
    return min(copy_ms(arrays, a.calls, 1), copy_ms(arrays, a.calls, a.threads))


# Embedding: 64 samples of 256 tokens = 16384 tokens.
m = rag.load(os.path.join(HERE, "embedding.rag"))
p = m.init("Emb", seed=0)
rng = np.random.default_rng(0)
ids = rag.ragged([rng.integers(30522, size=256).astype(np.int32) for _ in range(64)],
                 ragged_axes="~N")
ms = median_ms(lambda: m.step(ids, p), a.calls)
tok = np.asarray(p["tok"])
ref = best_copy([np.ones((16384, 768), np.float32), np.ones_like(tok)])
print(json.dumps({"bench": "embedding", "V": 30522, "C": 768, "tokens": 16384,
                  "threads": a.threads, "ms": round(ms, 2), "copy_ms": round(ref, 2),
                  "ratio": round(ms / ref, 2)}), flush=True)

# Adam over BERT-Small.
m = rag.load(os.path.join(HERE, "bert_small.rag"))
st = {"p": m.init("Bert", seed=0), "s": m.init("Adam[Bert]")}
g = m.init("Bert", seed=1)
lr = np.float32(1e-3)
P = sum(np.asarray(v).size for v in st["p"].values())


def adam():
    st["p"], st["s"] = m.adam_step(st["p"], g, st["s"], lr)


ms = median_ms(adam, a.calls)
arrs = [np.asarray(v) for v in st["p"].values()]
ref = best_copy(arrs * 4)  # p, g, m, v: four arrays of P floats
print(json.dumps({"bench": "adam", "params": P, "threads": a.threads, "ms": round(ms, 2),
                  "gbps": round(7 * 4 * P / ms / 1e6, 2), "copy_ms": round(ref, 2),
                  "copy_gbps": round(2 * 4 * 4 * P / ref / 1e6, 2), "ratio": round(ms / ref, 2)}),
      flush=True)
