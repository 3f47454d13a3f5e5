"""Bridge overhead (issue 17): the encoder's training step (forward and backward of the
examples/encoder.rag loss on a 16-sequence batch, lengths 4..63, 64 features) called through
rag.torch (torch tensors in, torch.autograd backward into parameter .grad) against the same
rag function called directly (rag tensors and NumPy params prepared once, call_saving then
Saved.backward), same inputs, same thread count; warm-up, then the median of --calls.
Prints one JSON line per measurement.

    PYTHONPATH=build/bindings $(./dev bench-python) bench/bridge/bridge.py --calls 11
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples/python"))
import ddp  # noqa: E402  (the encoder with its scaled loss, the batch maker)
import rag  # noqa: E402
import rag.torch  # noqa: E402


def median_ms(fn, calls, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=11)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    rag.set_num_threads(a.threads)
    torch.set_num_threads(a.threads)
    m = ddp.load_module()
    lengths, x, y = ddp.make_batch(1000)
    xs, ys, scale = ddp.step_inputs(lengths, x, y, range(len(lengths)), 1, sum(lengths))
    model = rag.torch.Module(m, "scaled_loss", params="Encoder", seed=0)

    def bridge():
        for p in model.parameters():
            p.grad = None
        model(xs, ys, scale).backward()

    fn = m["scaled_loss"]
    x_rag, y_rag = xs.to_rag(), ys.to_rag()
    params = {k: v.detach().numpy() for k, v in model.params().items()}
    one = np.float32(1.0)

    def direct():
        _, saved = fn.call_saving(x_rag, y_rag, params, scale)
        saved.backward(one)

    # The two compute the same gradients (so they time the same work).
    bridge()
    _, saved = fn.call_saving(x_rag, y_rag, params, scale)
    g = saved.backward(one)[2]
    for k, p in model.params().items():
        np.testing.assert_array_equal(p.grad.numpy(), np.asarray(g[k]))

    base = {"bench": "bridge", "tokens": sum(lengths), "batch": len(lengths),
            "threads": a.threads, "calls": a.calls, "warmup": a.warmup}
    # Interleaved rounds, so load changes on the shared machine hit both alike.
    results = {"direct": [], "rag.torch": []}
    for _ in range(3):
        for name, f in (("direct", direct), ("rag.torch", bridge)):
            results[name].append(median_ms(f, a.calls, a.warmup)[0])
    for name, meds in results.items():
        print(json.dumps(dict(base, system=name, ms_median=statistics.median(meds),
                              round_medians=[round(v, 3) for v in meds])))


if __name__ == "__main__":
    main()
