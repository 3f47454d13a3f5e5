"""bench/results/pairformer.md from pairformer.jsonl: ms/step and peak RSS growth per cell, and
ragged over padded against the issue's target 0.9 / rho_pair."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
meta, cells = rows[0], rows[1:]
print("# Pairformer benchmark (examples/pairformer.rag, four blocks, B = 8)\n")
print(f"Commit `{meta['commit']}`{' (dirty tree)' if meta['dirty'] else ''}, {meta['date']}, "
      f"{meta['threads']} threads, {meta['cpu']}, load average at start {meta['loadavg_start']}. "
      "The machine is shared with other builds and tests: expect noise. Median of the timed "
      "calls after a warm-up (bench/text/timing.py); memory is the growth of peak RSS over the "
      "timed calls. PyTorch padded and DanLing were not run (no bench venv with torch on this "
      "machine).\n")
print("| profile | rho_pair | what | ragged ms | padded ms | padded/ragged time | target 0.9/rho "
      "| ragged peak MiB | padded peak MiB | padded/ragged memory |")
print("|---|---|---|---|---|---|---|---|---|---|")
by = {(c["profile"], c["what"], c["system"]): c for c in cells if "ms_step" in c}
for profile in ("uniform", "variable"):
    for what in ("fwd", "train"):
        r, p = by.get((profile, what, "rag ragged")), by.get((profile, what, "rag padded"))
        if not r or not p:
            continue
        rho = r["rho_pair"]
        mr, mp = r["peak_rss_bytes"] / 2**20, p["peak_rss_bytes"] / 2**20
        print(f"| {profile} {r['lengths']} | {rho} | {what} | {r['ms_step']} | {p['ms_step']} | "
              f"{p['ms_step'] / r['ms_step']:.2f} | {0.9 / rho:.2f} | {mr:.0f} | {mp:.0f} | "
              f"{(mp / mr if mr > 0 else float('nan')):.2f} |")
