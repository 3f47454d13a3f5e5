"""rag on the image benchmark: python3 rag_images.py MODEL PROFILE [--calls K] [--budget S]
[--threads T] [--dump FILE.npz] [--padded]. MODEL: fcn (examples/fcn.rag) or vit
(examples/vit.rag). Prints one JSON line for the loss (fwd) and one for the training step.
--dump writes the padded batch, the sizes and rag's initial params (dotted names) so the peers
start from the same state. --padded runs rag's padded execution of the same program (the ViT's
patches gathered into each image's own order, as the PyTorch baseline does)."""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "text"))
import image_data as data  # noqa: E402
import timing  # noqa: E402

LR = {"fcn": 1e-2, "vit": 1e-3}
TYPE = {"fcn": "Fcn", "vit": "Vit"}

ap = argparse.ArgumentParser()
ap.add_argument("model", choices=["fcn", "vit"])
ap.add_argument("profile", choices=sorted(data.PROFILES))
ap.add_argument("--calls", type=int, default=5)
ap.add_argument("--budget", type=float, default=60.0)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--dump")
ap.add_argument("--padded", action="store_true")
a = ap.parse_args()
os.environ["RAG_NUM_THREADS"] = str(a.threads)
import rag  # noqa: E402

m = rag.load(os.path.join(ROOT, "examples", a.model + ".rag"), padded=a.padded)
p = m.init(TYPE[a.model], seed=0)
s = m.init(f"Adam[{TYPE[a.model]}]")
hw, xs, pix, cls = data.batch(a.profile)
x = rag.ragged(xs, ragged_axes=[1, 2])
y = rag.ragged(pix, ragged_axes=[0, 1]) if a.model == "fcn" else rag.tensor(cls, batched=True)
if a.dump:
    hm, wm = data.occupancy(hw)["envelope"]
    xp = np.zeros((len(xs), 3, hm, wm), np.float32)
    yp = np.full((len(xs), hm, wm), -100, np.int64)
    for b, (xi, yi) in enumerate(zip(xs, pix)):
        xp[b, :, :xi.shape[1], :xi.shape[2]] = xi
        yp[b, :yi.shape[0], :yi.shape[1]] = yi
    np.savez(a.dump, x=xp, pix=yp, cls=cls, hw=np.array(hw),
             **{"p." + k: np.array(v) for k, v in p.items()})
lr = np.float32(LR[a.model])
state = {"p": p, "s": s}


def fwd():
    return m.loss(x, y, p).item()


def train():
    loss, state["p"], state["s"] = m.train_step(x, y, state["p"], state["s"], lr)
    return loss.item()


base = dict(model=a.model, profile=a.profile, system="rag-padded" if a.padded else "rag-ragged", threads=a.threads,
            **data.occupancy(hw))
for is_fwd, step in ((True, fwd), (False, train)):
    r = timing.measure(step, a.calls, a.budget, rag.empty_cache)
    st = m.stats()["loss" if is_fwd else "train_step"]
    r.update(compilations=st["compilations"], compile_s=round(st["compile_seconds"], 3))
    print(json.dumps(dict(base, fwd=is_fwd, **r)), flush=True)
