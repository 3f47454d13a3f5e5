"""One cell of the Pairformer benchmark in this process: rag ragged or rag padded, the loss
(forward) or the training step (forward, backward, clip_norm, AdamW) of
examples/pairformer.rag on one length profile; prints one JSON line (bench/text/timing.py)."""
import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "text"))
import rag  # noqa: E402
from timing import measure  # noqa: E402

PROFILES = {  # B = 8; pair occupancy rho = sum N_b^2 / (B N_max^2)
    "uniform": [46, 48, 45, 47, 48, 44, 46, 48],
    "variable": [8, 12, 16, 20, 24, 28, 36, 48],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", choices=["ragged", "padded"], required=True)
    ap.add_argument("--profile", choices=sorted(PROFILES), required=True)
    ap.add_argument("--what", choices=["fwd", "train"], required=True)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--budget", type=float, default=120)
    a = ap.parse_args()
    lengths = PROFILES[a.profile]
    m = rag.load(ROOT / "examples" / "pairformer.rag", padded=a.system == "padded")
    rng = np.random.default_rng(0)
    s = [rng.standard_normal((n, 384)).astype(np.float32) for n in lengths]
    z = [rng.standard_normal((n, n, 128)).astype(np.float32) for n in lengths]
    ts = [rng.standard_normal((n, 8)).astype(np.float32) for n in lengths]
    tz = [rng.standard_normal((n, n, 8)).astype(np.float32) for n in lengths]
    p = m.init("Pairformer", seed=0)
    st = m.init("Adam[Pairformer]")
    lr = np.float32(1e-4)
    if a.what == "fwd":
        step = lambda: m.loss(s, z, ts, tz, p)  # noqa: E731
    else:  # the same params every call, so each call does the same work
        step = lambda: m.train_step(s, z, ts, tz, p, st, lr)[0]  # noqa: E731
    r = measure(step, a.calls, a.budget)
    nmax = max(lengths)
    r.update(system="rag " + a.system, profile=a.profile, what=a.what, lengths=lengths,
             rho_pair=round(sum(n * n for n in lengths) / (len(lengths) * nmax * nmax), 3),
             compile_s=round(sum(v.get("compile_seconds", 0) for v in m.stats().values()), 2))
    print(json.dumps(r))


if __name__ == "__main__":
    main()
