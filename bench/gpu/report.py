"""Tables of bench/gpu's JSON lines (rag_bench_gpu and peers.py), in the layout of REFERENCE.md
section 4: per mechanism and N, forward and backward TFLOP/s and peak memory of every system,
with rag's ratio to each peer side by side.

    python3 bench/gpu/report.py FILE.jsonl... > bench/results/gpu_relpos.md
"""
import json
import sys

PUBLISHED = {  # REFERENCE.md section 4: the relative-position paper, H200, fp16, N = 8K
    "Shaw": "279 / 166", "TXL": "236 / 133", "DeBERTa": "159 / 101", "T5": "307 / 174"}


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def main(paths):
    cells = {}
    systems = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                cells[(r["system"], r["mechanism"], r["N"])] = r
                if r["system"] not in systems:
                    systems.append(r["system"])
    peers = [s for s in systems if s != "rag"]
    mechs = sorted({m for _, m, _ in cells}, key=["Shaw", "TXL", "DeBERTa", "T5"].index)
    print("# Relative-position attention on the GPU (bench/gpu/run.sh)\n")
    print("fp16, B * N = 16K tokens, H = 12, d = 64, bidirectional. TFLOP/s of useful FLOPs "
          "(forward 4BHN^2d + 2BHNRd per relation projection, backward twice that); peak MiB "
          "above the inputs. `x` = rag / peer (TFLOP/s: higher is better for rag; memory: lower "
          "is better for rag). `err` = the cell failed (see the JSON).\n")
    for m in mechs:
        print(f"## {m} (published H200 at 8K, fwd / bwd TFLOP/s: {PUBLISHED.get(m, '?')})\n")
        head = ["N"]
        for what in ("fwd", "bwd"):
            head += [f"rag {what}"] + [f"{p} {what}" for p in peers] + [f"x {p}" for p in peers]
        head += ["rag MiB"] + [f"{p} MiB" for p in peers]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for N in sorted({n for s, mm, n in cells if mm == m}):
            rag = cells.get(("rag", m, N), {})
            row = [str(N)]

            def val(r, key):
                return None if "error" in r else r.get(key)
            for what in ("fwd_tflops", "bwd_tflops"):
                mine = val(rag, what)
                row.append("err" if "error" in rag else fmt(mine))
                for p in peers:
                    r = cells.get((p, m, N), {})
                    row.append("err" if "error" in r else fmt(val(r, what)))
                for p in peers:
                    theirs = val(cells.get((p, m, N), {}), what)
                    row.append(fmt(mine / theirs, 2) + "x" if mine and theirs else "-")
            row.append(fmt(val(rag, "peak_mib"), 0))
            for p in peers:
                r = cells.get((p, m, N), {})
                row.append("err" if "error" in r else fmt(val(r, "peak_mib"), 0))
            print("| " + " | ".join(row) + " |")
        print()
    checks = [(s, m, n, r.get("rel_l2_vs_cpu", r.get("rel_l2_vs_f64")))
              for (s, m, n), r in sorted(cells.items()) if "rel_l2_vs_cpu" in r or
              "rel_l2_vs_f64" in r]
    if checks:
        print("## Checks (relative l2: rag vs its CPU tier, peers vs float64)\n")
        for s, m, n, e in checks:
            print(f"- {s} {m} N={n}: {e:.2e}")
        print()
    errors = [(k, r["error"]) for k, r in sorted(cells.items()) if "error" in r]
    if errors:
        print("## Errors\n")
        for (s, m, n), e in errors:
            print(f"- {s} {m} N={n}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
