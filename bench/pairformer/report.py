"""bench/results/pairformer.md from pairformer.jsonl: ms/step and peak RSS growth per cell, rag
ragged over rag padded against the issue's target 0.9 / rho_pair, PyTorch padded with masks
beside them, and every system's first-call loss (they must agree within f32 rounding)."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
meta = rows[0]
end = next((r for r in rows if r.get("meta_end")), {})
cells = [r for r in rows if "ms_step" in r or "error" in r]
SYSTEMS = ("rag ragged", "rag padded", "torch padded")
print("# Pairformer benchmark (examples/pairformer.rag, four blocks, B = 8)\n")
print(f"Commit `{meta['commit']}`{' (dirty tree)' if meta['dirty'] else ''}, {meta['date']}, "
      f"{meta['threads']} threads, {meta['cpu']}, load average at start {meta['loadavg_start']}"
      + (f", at the end ({end['date_end']}) {end['loadavg_end']}" if end else "") + ". "
      "The machine is shared with other builds and tests (2 cores): expect noise, and compare "
      "systems within a row more than rows across runs. Median of the timed calls after a "
      "warm-up (bench/text/timing.py); memory is the growth of peak RSS over one more call "
      "after the timed ones, with rag's host block cache and glibc's free heap pages emptied first (`rag.empty_cache()`: "
      "between calls the cache keeps a step's freed blocks resident, up to the process's own "
      "peak), so every system's figure is what one step needs. "
      "PyTorch padded (bench/pairformer/torch_pairformer.py) is the same program on rag's "
      "initial params: dense [B, N_max] tensors, the pair mask on the triangle products' "
      "operands, -inf on padded keys in SDPA, rag's dropout masks (computed once, outside the "
      "step) and the loss over valid entries.\n")
print("| profile | rho_pair | what | ragged ms | padded ms | torch padded ms | padded/ragged time "
      "| target 0.9/rho | torch/ragged time | ragged peak MiB | padded peak MiB "
      "| torch peak MiB | padded/ragged memory |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
by = {(c["profile"], c["what"], c["system"]): c for c in cells if "ms_step" in c}


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "-"


for profile in ("uniform", "variable"):
    for what in ("fwd", "train"):
        r, p, t = (by.get((profile, what, s)) for s in SYSTEMS)
        if not r:
            continue
        ms = [c["ms_step"] if c else None for c in (r, p, t)]
        mib = [c["peak_rss_bytes"] / 2**20 if c else None for c in (r, p, t)]
        cell = lambda v, f: f.format(v) if v is not None else "-"  # noqa: E731
        print(f"| {profile} {r['lengths']} | {r['rho_pair']} | {what} | "
              + " | ".join(cell(v, "{}") for v in ms)
              + f" | {ratio(ms[1], ms[0])} | {0.9 / r['rho_pair']:.2f} | {ratio(ms[2], ms[0])} | "
              + " | ".join(cell(v, "{:.0f}") for v in mib)
              + f" | {ratio(mib[1], mib[0]) if mib[0] and mib[0] > 0 else '-'} |")
print("\nFirst-call loss per system (the warm-up; train's is the loss before its update):\n")
print("| profile | what | " + " | ".join(SYSTEMS) + " |")
print("|---|---|" + "---|" * len(SYSTEMS))
for profile in ("uniform", "variable"):
    for what in ("fwd", "train"):
        got = [by.get((profile, what, s)) for s in SYSTEMS]
        if any(got):
            print(f"| {profile} | {what} | "
                  + " | ".join(f"{c['loss0']:.9g}" if c else "-" for c in got) + " |")
for c in cells:
    if "error" in c:
        print(f"\n{c['system']} {c['profile']} {c['what']}: {c['error']}")
print("\nDanLing NestedTensor is not run: its CPU `scaled_dot_product_attention` pads "
      "(danling/tensors/nn_functions.py, \"Fallback: pad-based SDPA\"; the packed paths are "
      "CUDA-only), so triangle attention and single attention with pair bias would run on the "
      "padded envelope, i.e. PyTorch padded with a per-sample Python loop for the triangle "
      "products (its einsum loops over samples).")
