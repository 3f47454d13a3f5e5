"""Shared by the peer benchmarks: the batch rag_bench dumped, timing, peak RSS, one JSON line.

Every peer runs in its own process (importing danling patches torch), on the CPU, with the
thread count rag used. The models are the examples' programs op for op (examples/*.rag)."""
import argparse
import json
import os
import sys
import time

import numpy as np

import models


def args():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["fwd", "train"],
                    help="measure the loss alone or the training step (default: both)")
    return ap.parse_args()


def load(dump):
    with open(os.path.join(dump, "manifest.json")) as f:
        man = json.load(f)
    arrays = {}
    for t in man["tensors"]:
        dt = {"f32": np.float32, "i64": np.int64}[t["dtype"]]
        a = np.fromfile(os.path.join(dump, t["name"] + ".bin"), dtype=dt)
        arrays[t["name"]] = a.reshape(t["shape"])
    return man, arrays


def setup_torch(threads):
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    return torch


def status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return -1


def reset_hwm():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(step, steps):
    """step() -> loss (float). Returns first call seconds, the median and the least ms of later
    steps, loss0 and the peak RSS growth over the later steps (VmHWM after clear_refs)."""
    t = time.perf_counter()
    loss0 = step()
    first = time.perf_counter() - t
    rss0 = status_kb("VmRSS:")
    reset_hwm()
    ms = []
    for _ in range(steps - 1):
        t = time.perf_counter()
        step()
        ms.append(1e3 * (time.perf_counter() - t))
    hwm = status_kb("VmHWM:")
    return (first, float(np.median(ms)) if ms else 0.0, min(ms) if ms else 0.0, loss0,
            (hwm - rss0) * 1024)


def report(system, man, a, fwd, result=None, error=None):
    out = {"case": man["case"], "system": system, "mode": system, "tier": "cpu",
           "lengths": ",".join(str(n) for n in man["n"]), "threads": a.threads,
           "steps": a.steps, "fwd": fwd}
    if error is not None:
        out["error"] = error
    else:
        first, ms, ms_min, loss0, rss = result
        out.update(ms_step=round(ms, 3), ms_min=round(ms_min, 3), first_call_s=round(first, 4),
                   loss0=loss0,
                   peak_rss_bytes=rss)
    print(json.dumps(out))
    sys.stdout.flush()


def bench(system, man, a, torch, loss_fn, p, lr):
    """The loss alone (no autograd), then the training step (forward, backward, SGD), as rag_bench
    measures them: one JSON line each, or the error that shows the program is not expressible."""

    def fwd():
        with torch.no_grad():
            return float(loss_fn(p))

    def train():
        loss = loss_fn(p)
        loss.backward()
        models.sgd(torch, p, lr)
        return loss.item()

    for is_fwd, step in ((True, fwd), (False, train)):
        if a.only and a.only != ("fwd" if is_fwd else "train"):
            continue
        try:
            result = measure(step, a.steps)
        except Exception as e:  # not expressible: record why
            msg = str(e).splitlines()[0][:160] if str(e) else ""
            report(system, man, a, is_fwd, error=f"{type(e).__name__}: {msg}")
        else:
            report(system, man, a, is_fwd, result)
