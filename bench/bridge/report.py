"""bench/results/bridge.jsonl -> markdown (bench/bridge/run.sh writes both)."""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1])]
meta = {k: v for r in rows if r.get("meta") for k, v in r.items()}
bridge = {}  # batch -> system -> row
for r in rows:
    if r.get("bench") == "bridge":
        bridge.setdefault(r["batch"], {})[r["system"]] = r
ddp = {r["ranks"]: r for r in rows if r.get("bench") == "ddp"}
print("# PyTorch bridge (issue 17)\n")
print("Commit %s, %s; %s (%s cores), torch %s; load average %s at the start, %s at the end "
      "(the machine is shared: other agents' builds and tests ran meanwhile, so absolute "
      "times are noisy). Written by bench/bridge/run.sh.\n"
      % (meta["commit"], meta["date"], meta["cpu"], meta["cores"], meta["torch"],
         meta["loadavg_start"], meta["loadavg_end"]))
first = bridge[min(bridge)]["direct"]
print("## Bridge overhead: the encoder training step\n")
print("Forward and backward of examples/encoder.rag's loss (scaled, as examples/python/ddp.py "
      "trains it), %d threads; %d calls of each path after %d warm-up calls, alternating call "
      "by call (direct, bridge, bridge, direct, ...), so that the shared machine's load hits "
      "both alike. direct: rag tensors and NumPy params, `call_saving` + `Saved.backward`; "
      "rag.torch: torch tensors, `Module` forward + `loss.backward()` into `.grad`. The "
      "target (under 5%%) names the 16-sequence step; the larger batches show what the "
      "bridge's cost is made of. bridge alone: the rag.torch step with rag's work stubbed out "
      "(its results recorded once), median of 201 calls: what the bridge's own code costs "
      "warm in the caches; in the real step it runs after rag's kernels, from colder caches, "
      "and costs more. torch floor: a bare `torch.autograd.Function` over the same parameters "
      "whose backward hands back copies of the same gradients (the copies' time subtracted), "
      "median of 201 calls: torch's own share, which no bridge over these parameters avoids; "
      "after rag: the same, each call made right after an untimed direct rag step (as the "
      "bridge's torch code runs in a real step, with the caches holding rag's data).\n"
      % (first["threads"], first["calls"], first["warmup"]))
print("| sequences | tokens | direct ms (median) | rag.torch ms (median) | bridge cost ms "
      "| overhead (median of per-pair ratios) | by the minima | bridge alone ms "
      "| torch floor ms | after rag ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for batch in sorted(bridge):
    d, b = bridge[batch]["direct"], bridge[batch]["rag.torch"]
    ms = {k: "%.3f" % r["ms_median"] for k, r in bridge[batch].items() if "ms_median" in r}
    print("| %d | %d | %.2f | %.2f | %.2f | %+.1f%% | %+.1f%% | %s | %s | %s |"
          % (batch, d["tokens"], d["ms_median"], b["ms_median"], b["ms_median"] - d["ms_median"],
             100 * (bridge[batch]["ratio"]["median_pair_ratio"] - 1),
             100 * (b["ms_min"] / d["ms_min"] - 1),
             ms.get("bridge alone", "–"), ms.get("torch floor", "–"),
             ms.get("torch floor after rag", "–")))
print()
print("## DDP on gloo: step time, 1 rank vs 2 ranks\n")
print("examples/python/ddp.py's step (DistributedDataParallel over rag.torch, SGD) on the same "
      "16-sequence batches, cost-balanced shards, cores // ranks rag threads per rank; median "
      "of %d steps after %d warm-up steps, timed on rank 0 between barriers.\n"
      % (ddp[1]["steps"], ddp[1]["warmup"]))
print("| ranks | rag threads per rank | ms/step | steps (ms) |\n|---:|---:|---:|---|")
for r in sorted(ddp):
    print("| %d | %d | %.1f | %s |" % (r, ddp[r]["rag_threads_per_rank"], ddp[r]["ms_median"],
                                      ddp[r]["ms"]))
print("\n2 ranks / 1 rank: %.2fx the step time. Both use the machine's %s cores: this measures "
      "the cost of DDP's all-reduce and of splitting the batch, not a speed-up from more "
      "hardware." % (ddp[2]["ms_median"] / ddp[1]["ms_median"], meta["cores"]))
