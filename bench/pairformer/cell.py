"""One cell of the Pairformer benchmark in this process: rag ragged or rag padded, the loss
(forward) or the training step (forward, backward, clip_norm, AdamW) of
examples/pairformer.rag on one length profile; prints one JSON line (bench/text/timing.py).
--dump FILE.npz instead writes rag's initial params for the PyTorch peer and exits."""
import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "text"))
sys.path.insert(0, str(ROOT / "bench" / "pairformer"))
import rag  # noqa: E402
from data import PROFILES, batch, rho_pair  # noqa: E402
from timing import measure  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", choices=["ragged", "padded"], default="ragged")
    ap.add_argument("--profile", choices=sorted(PROFILES), default="uniform")
    ap.add_argument("--what", choices=["fwd", "train"], default="fwd")
    ap.add_argument("--dump")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--budget", type=float, default=120)
    a = ap.parse_args()
    lengths = PROFILES[a.profile]
    m = rag.load(ROOT / "examples" / "pairformer.rag", padded=a.system == "padded")
    p = m.init("Pairformer", seed=0)
    if a.dump:
        np.savez(a.dump, **{k: np.array(v) for k, v in p.items()})
        return
    s, z, ts, tz = batch(lengths)
    st = m.init("Adam[Pairformer]")
    lr = np.float32(1e-4)
    if a.what == "fwd":
        step = lambda: m.loss(s, z, ts, tz, p)  # noqa: E731
    else:  # the same params every call, so each call does the same work
        step = lambda: m.train_step(s, z, ts, tz, p, st, lr)[0]  # noqa: E731
    r = measure(step, a.calls, a.budget, rag.empty_cache)
    r.update(system="rag " + a.system, profile=a.profile, what=a.what, lengths=lengths,
             rho_pair=rho_pair(lengths),
             compile_s=round(sum(v.get("compile_seconds", 0) for v in m.stats().values()), 2))
    print(json.dumps(r))


if __name__ == "__main__":
    main()
