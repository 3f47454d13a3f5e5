"""Renders bench/results/images.jsonl as a markdown table: ms/step (median) and peak RSS growth
per model, profile, pass and system, with rag ragged's speedup over each padded peer."""
import json
import sys

rows, meta = [], {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("meta"):
        meta.update(r)
    else:
        rows.append(r)
print(f"# Image benchmark (issue 16)\n\ncommit {meta.get('commit')}"
      f"{' (dirty tree)' if meta.get('dirty') else ''}, {meta.get('date')}, {meta.get('cpu')}, "
      f"{meta.get('threads')} threads, median of {meta.get('calls')} timed calls after a warm-up of at least 0.5 s; "
      f"load average {meta.get('loadavg_start')} -> {meta.get('loadavg_end')} (a shared, noisy "
      f"machine). B = 8. Peak RSS growth: over one more call after the timed "
      f"ones, with rag's host block cache and glibc's free heap pages emptied first (`rag.empty_cache()`, `malloc_trim`), so every "
      f"system's figure is what one step needs.\n")
print("| model | profile | rho_image | pass | system | ms/step | peak RSS growth MiB "
      "| rag ragged speedup |")
print("|---|---|---|---|---|---|---|---|")
key = lambda r: (r["model"], r["profile"], r["fwd"])  # noqa: E731
rag = {key(r): r["ms_step"] for r in rows if r["system"] == "rag-ragged"}
for r in rows:
    sp = rag.get(key(r))
    speed = "" if r["system"] == "rag-ragged" or not sp else f"{r['ms_step'] / sp:.2f}x"
    print(f"| {r['model']} | {r['profile']} | {r['rho_image']} | {'fwd' if r['fwd'] else 'train'} "
          f"| {r['system']} | {r['ms_step']} | {r['peak_rss_bytes'] / 2**20:.1f} | {speed} |")

print("\n## Targets (issue 16): rag ragged over rag padded at least 0.9 / rho_image\n")
for r in rows:
    sp = rag.get(key(r))
    if r["system"] == "rag-padded" and sp:
        got, want = r["ms_step"] / sp, 0.9 / r["rho_image"]
        print(f"- {r['model']} {r['profile']} {'fwd' if r['fwd'] else 'train'}: {got:.2f}x vs "
              f"{want:.2f}x: {'holds' if got >= want else 'misses'}")
