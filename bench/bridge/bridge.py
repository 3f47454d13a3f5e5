"""Bridge overhead (issue 17): the encoder's training step (forward and backward of the
examples/encoder.rag loss on a 16-sequence batch, lengths 4..63, 64 features) called through
rag.torch (torch tensors in, torch.autograd backward into parameter .grad) against the same
rag function called directly (rag tensors and NumPy params prepared once, call_saving then
Saved.backward), same inputs, same thread count, at each batch size of --batches (16 is the
step the target names; larger ones show the bridge's cost is per call, not per token);
warm-up, then --calls calls of each,
alternating one by one (the machine is shared and its load moves within seconds): the
medians of each and the median of the per-pair ratios. Prints JSON lines.

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


def paired_ms(fns, calls, warmup):
    """Per call of each function in turn (the order alternating), so the load of the shared
    machine hits both alike: times[name] lists, and per-pair ratios against the first."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    names = list(fns)
    times = {n: [] for n in names}
    for k in range(calls):
        for n in (names if k % 2 == 0 else names[::-1]):
            t = time.perf_counter()
            fns[n]()
            times[n].append((time.perf_counter() - t) * 1e3)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=41)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="16,64,256")
    a = ap.parse_args()
    rag.set_num_threads(a.threads)
    torch.set_num_threads(a.threads)
    m = ddp.load_module()
    for batch in map(int, a.batches.split(",")):
        measure(m, a, batch)


def measure(m, a, batch):
    lengths, x, y = ddp.make_batch(1000, batch)
    xs, ys, scale = ddp.step_inputs(lengths, x, y, range(len(lengths)), 1, sum(lengths))
    model = rag.torch.Module(m, "scaled_loss", params="Encoder", seed=0)
    # Listed once, as an optimiser holds them: walking the module tree on every step costs
    # ~0.1 ms that is torch's, not the bridge's.
    parameters = list(model.parameters())

    def bridge():
        for p in parameters:
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
    times = paired_ms({"direct": direct, "rag.torch": bridge}, a.calls, a.warmup)
    ratios = [b / d for d, b in zip(times["direct"], times["rag.torch"])]
    for name, ts in times.items():
        print(json.dumps(dict(base, system=name, ms_median=statistics.median(ts),
                              ms_min=min(ts), ms=[round(v, 2) for v in ts])))
    print(json.dumps(dict(base, system="ratio", median_pair_ratio=statistics.median(ratios))))
    stubbed = bridge_alone_ms(m, model, (xs, ys, scale), (x_rag, y_rag, params, scale), one)
    print(json.dumps(dict(base, system="bridge alone", ms_median=stubbed)))
    print(json.dumps(dict(base, system="torch floor", ms_median=torch_floor_ms(model.params(), g))))
    print(json.dumps(dict(base, system="torch floor after rag",
                          ms_median=torch_floor_ms(model.params(), g, direct, a.calls))))


class _Recorded:
    """The rag function with its work done once: call_saving and backward return what the real
    ones returned, so timing a call through the bridge times the bridge alone."""

    def __init__(self, fn, args, one):
        self.signature = fn.signature
        self.result, saved = fn.call_saving(*args)
        self.grads = saved.backward(one)

    def call_saving(self, *args):
        return self.result, self

    def backward(self, cotangent):
        return self.grads


def bridge_alone_ms(m, model, torch_args, rag_args, one, calls=201):
    """Median ms of the training step through rag.torch with rag's work stubbed out: the cost
    the bridge (torch's autograd, the argument and gradient conversions) adds when its code is
    warm in the caches. The paired overhead above is larger: after rag's kernels the same code
    runs from colder caches."""
    stub = _Recorded(m["scaled_loss"], rag_args, one)
    real, model._call = model._call, rag.torch.function({"scaled_loss": stub}, "scaled_loss")
    parameters = list(model.parameters())

    def step():
        for p in parameters:
            p.grad = None
        model(*torch_args).backward()

    try:
        return statistics.median(paired_ms({"stub": step}, calls, 20)["stub"])
    finally:
        model._call = real


class _Bare(torch.autograd.Function):
    """A step's autograd with nothing else: forward takes the parameters and returns a scalar,
    backward returns fresh copies of given gradients (fresh, so torch adopts them as .grad
    without a copy, as it adopts the bridge's)."""

    @staticmethod
    def forward(ctx, grads, *parameters):
        ctx.grads = grads
        return torch.zeros(())

    @staticmethod
    def backward(ctx, _):
        return (None,) + tuple(g.clone() for g in ctx.grads)


def torch_floor_ms(params, g, after=None, calls=201):
    """Median ms of torch's own share of any autograd bridge: a custom Function over the same
    parameters, backward into .grad, minus the time to copy the gradients it hands back. No
    bridge over these parameters can cost less. With `after` (rag's step called directly), each
    timed call runs right after it, untimed, as the bridge's torch code runs in a real step."""
    parameters = [params[k] for k in g.keys()]
    grads = [torch.from_numpy(np.array(g[k])) for k in g.keys()]
    times = {"step": [], "copies": []}

    def timed(name, f):
        if after is not None:
            after()
        t = time.perf_counter()
        f()
        times[name].append((time.perf_counter() - t) * 1e3)

    def step():
        for p in parameters:
            p.grad = None
        _Bare.apply(grads, *parameters).backward()

    for k in range(calls + 20):
        timed("step", step)
        timed("copies", lambda: [t.clone() for t in grads])
    return statistics.median(times["step"][20:]) - statistics.median(times["copies"][20:])


if __name__ == "__main__":
    main()
