"""Data-parallel training of examples/encoder.rag with torch.distributed (DDP, gloo, CPU).

    python3 examples/python/ddp.py --ranks 2 --steps 5        # needs torch (./dev bench-deps)

Each rank runs rag on its own shard through rag.torch, with its own thread count so ranks do
not oversubscribe the cores. Shards hold different token counts, so averaging each rank's
mean loss would weight tokens unequally; instead every rank scales its mean by
world * local_tokens / global_tokens (a runtime f32[] argument, so it compiles once): DDP's
average of the gradients is then exactly the full batch's gradient. `balanced_shards` splits
a batch by cost (sum N_b for sequences; pass cost=lambda n: n * n for pair models).
"""
import argparse
import os
import pathlib
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _find_rag  # noqa: E402,F401  (makes `import rag` work from a checkout)
import rag  # noqa: E402
import rag.torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The example's loss times a runtime scale (see the module docstring).
SCALED = """
fn scaled_loss(x: f32[B, ~N, 64], labels: i64[B, ~N], p: Encoder, scale: f32[]) -> f32[] {
    return loss(x, labels, p) * scale
}
"""


def load_module():
    return rag.compile((ROOT / "examples/encoder.rag").read_text() + SCALED,
                       str(ROOT / "examples/encoder.rag"))


def balanced_shards(lengths, ranks, cost=lambda n: n):
    """Sample indices per rank, greedily balancing sum(cost(N_b)): longest first, each to the
    rank with the least cost so far (ties to the lowest rank, so every rank agrees)."""
    load, shards = [0] * ranks, [[] for _ in range(ranks)]
    for b in sorted(range(len(lengths)), key=lambda b: (-cost(lengths[b]), b)):
        r = min(range(ranks), key=lambda r: (load[r], r))
        shards[r].append(b)
        load[r] += cost(lengths[b])
    return [sorted(s) for s in shards]


def make_batch(seed, batch=16):
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(4, 64, batch)]
    x = [rng.standard_normal((n, 64)).astype(np.float32) for n in lengths]
    y = [rng.integers(0, 2, n) for n in lengths]
    return lengths, x, y


def ragged(samples, spec=None):
    lengths = [len(s) for s in samples]
    return rag.torch.Ragged(torch.from_numpy(np.concatenate(samples)), lengths, spec)


def step_inputs(lengths, x, y, idx, world, total_tokens):
    tokens = sum(lengths[b] for b in idx)
    scale = world * tokens / total_tokens
    return (ragged([x[b] for b in idx]), ragged([y[b] for b in idx], "~N"), scale)


def train(rank, world, steps, port, out, seed=0):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cores = os.cpu_count() or 1
    rag.set_num_threads(max(1, cores // world))
    torch.set_num_threads(1)
    m = load_module()
    model = torch.nn.parallel.DistributedDataParallel(
        rag.torch.Module(m, "scaled_loss", params="Encoder", seed=seed))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        lengths, x, y = make_batch(1000 + step)
        idx = balanced_shards(lengths, world)[rank]
        xs, ys, scale = step_inputs(lengths, x, y, idx, world, sum(lengths))
        opt.zero_grad()
        loss = model(xs, ys, scale)
        loss.backward()
        opt.step()
        global_loss = loss.detach().clone() / world
        dist.all_reduce(global_loss)
        losses.append(global_loss.item())
    if rank == 0:
        if out:
            torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()}, out)
        print("ddp losses:", " ".join("%.6f" % v for v in losses))
    end_rank()


def end_rank():
    """Leaves the process group and ends this rank's process without Python's finalisation.
    Gloo's worker thread may still be destroying a finished collective's work object, whose
    tensors belong to Python objects; if the interpreter is finalising meanwhile, that thread
    cannot take the GIL and the process aborts ("terminate called without an active
    exception", about one run in ten here; torch's destroy_process_group does not wait for
    it). Everything the rank had to write is written and flushed before this."""
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def single_process_step(seed=0, steps=1):
    """The same steps on the full batch in one process: the reference DDP must reproduce."""
    m = load_module()
    model = rag.torch.Module(m, "scaled_loss", params="Encoder", seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        lengths, x, y = make_batch(1000 + step)
        xs, ys, scale = step_inputs(lengths, x, y, range(len(lengths)), 1, sum(lengths))
        opt.zero_grad()
        model(xs, ys, scale).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--port", type=int, default=29517)
    ap.add_argument("--save", default="", help="rank 0 writes the final parameters here")
    a = ap.parse_args()
    mp.spawn(train, args=(a.ranks, a.steps, a.port, a.save), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
