"""rag on the text benchmark: python3 rag_text.py MODEL PROFILE [--padded] [--calls K]
[--budget S] [--threads T] [--dump FILE.npz]. Prints one JSON line for the loss (fwd) and one
for the training step (forward, backward, clip_norm, AdamW). --padded loads the same program
with padded=True (the dense envelope with masks). --dump writes the batch and the initial
params (dotted names) for the peers, so every system starts from rag's init."""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import data  # noqa: E402
import timing  # noqa: E402
from models import LR, MODELS  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model", choices=sorted(MODELS))
ap.add_argument("profile", choices=["random", "bucketed"])
ap.add_argument("--padded", action="store_true")
ap.add_argument("--calls", type=int, default=5)
ap.add_argument("--budget", type=float, default=60.0)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--only", choices=["fwd", "train"])
ap.add_argument("--dump")
a = ap.parse_args()
os.environ["RAG_NUM_THREADS"] = str(a.threads)
import rag  # noqa: E402

cfg = MODELS[a.model]
m = rag.load(os.path.join(ROOT, cfg["file"]), padded=a.padded)
p = m.init(cfg["ptype"], seed=0)
s = m.init(f"Adam[{cfg['ptype']}]")
n, ids, labels = data.batch(a.profile, cfg["vocab"])
x = rag.ragged(ids, ragged_axes="~N")
y = rag.tensor(labels, batched=True)
if a.dump:
    pad = np.zeros((len(n), int(n.max())), dtype=np.int32)
    for b, t in enumerate(ids):
        pad[b, :len(t)] = t
    np.savez(a.dump, ids=pad, n=n, labels=labels,
             **{"p." + k: np.array(v) for k, v in p.items()})
head = (x, y) if cfg["labels"] else (x,)
lr = np.float32(LR)
state = {"p": p, "s": s}


def fwd():
    return m.loss(*head, p).item()


def train():
    loss, state["p"], state["s"] = m.train_step(*head, state["p"], state["s"], lr)
    return loss.item()


base = dict(model=a.model, profile=a.profile, system="rag-" + ("padded" if a.padded else "ragged"),
            threads=a.threads, **data.occupancy(n))
for is_fwd, step in ((True, fwd), (False, train)):
    if a.only and a.only != ("fwd" if is_fwd else "train"):
        continue
    r = timing.measure(step, a.calls, a.budget, rag.empty_cache)
    fn = "loss" if is_fwd else "train_step"
    st = m.stats()[fn]
    r.update(compilations=st["compilations"], compile_s=round(st["compile_seconds"], 3))
    print(json.dumps(dict(base, fwd=is_fwd, **r)), flush=True)
