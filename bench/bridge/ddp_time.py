"""DDP step time (issue 17): examples/python/ddp.py's training step (rag.torch under
DistributedDataParallel, gloo, SGD) on R ranks of this machine, each rank given
cores // R rag threads, on the same 16-sequence batches; rank 0 reports the median step time
(barrier before each step, so it is the slowest rank's) after a warm-up. One JSON line.

    PYTHONPATH=build/bindings $(./dev bench-python) bench/bridge/ddp_time.py --ranks 2
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples/python"))
import ddp  # noqa: E402
import rag  # noqa: E402
import rag.torch  # noqa: E402


def run(rank, world, steps, warmup, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    threads = max(1, (os.cpu_count() or 1) // world)
    rag.set_num_threads(threads)
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(
        rag.torch.Module(ddp.load_module(), "scaled_loss", params="Encoder", seed=0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    times = []
    for step in range(warmup + steps):
        lengths, x, y = ddp.make_batch(1000 + step)
        idx = ddp.balanced_shards(lengths, world)[rank]
        xs, ys, scale = ddp.step_inputs(lengths, x, y, idx, world, sum(lengths))
        dist.barrier()
        t = time.perf_counter()
        opt.zero_grad()
        model(xs, ys, scale).backward()
        opt.step()
        dist.barrier()
        times.append((time.perf_counter() - t) * 1e3)
    if rank == 0:
        print(json.dumps({"bench": "ddp", "ranks": world, "rag_threads_per_rank": threads,
                          "steps": steps, "warmup": warmup,
                          "ms_median": statistics.median(times[warmup:]),
                          "ms": [round(v, 2) for v in times[warmup:]]}), flush=True)
    ddp.end_rank()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=11)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=29541)
    a = ap.parse_args()
    mp.spawn(run, args=(a.ranks, a.steps, a.warmup, a.port), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
