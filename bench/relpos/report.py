"""Writes bench/results/relpos.md from the JSON lines of rag_bench_relpos and peers.py, in the
layout of the relative-position paper's Tables 11 (throughput) and 12 (peak memory), plus the
speedups of rag's fused kernels over the gather baseline and the best PyTorch peer.

usage: report.py OUT.md HEADER.txt RECORDS.jsonl...
"""
import json
import math
import sys

ORDER = ["PyTorch eager", "PyTorch SDPA", "FlexAttention", "materialising", "gather", "rag fused"]
LABEL = {
    "materialising": "materialising (naive op, f64)",
    "gather": "projections + gather",
    "rag fused": "rag fused",
}
PEERS = ["PyTorch eager", "PyTorch SDPA", "FlexAttention"]


def n_label(n):
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def fmt(x):
    if x is None or not math.isfinite(x):
        return "?"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def cell(rec, key, notes):
    if rec is None:
        return "–"
    note = rec.get("note", "")
    if note.startswith("unsupported"):
        return "–"
    if note.startswith("skipped"):
        notes.setdefault(note, None)
        return "skip" + "¹²³⁴⁵⁶⁷⁸⁹"[list(notes).index(note) % 9]
    if note.startswith("failed"):
        notes.setdefault(note, None)
        return "fail" + "¹²³⁴⁵⁶⁷⁸⁹"[list(notes).index(note) % 9]
    v = rec.get(key)
    s = fmt(v)
    if rec.get("ok") is False:
        s += "†"
    elif rec.get("ok") is None and v is not None:
        s += "*"
    return s


def table(records, key, title, unit):
    mechs = list(dict.fromkeys(r["mechanism"] for r in records))
    lengths = sorted({r["N"] for r in records})
    by = {(r["mechanism"], r["system"], r["pass"], r["N"]): r for r in records}
    systems = [s for s in ORDER if any(r["system"] == s for r in records)]
    notes = {}
    head = ["", "System"] + [f"F {n_label(n)}" for n in lengths] + [f"B {n_label(n)}" for n in lengths]
    lines = [f"### {title} ({unit})", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for m in mechs:
        for i, s in enumerate(systems):
            row = [m if i == 0 else "", LABEL.get(s, s)]
            for p in ("F", "B"):
                row += [cell(by.get((m, s, p, n)), key, notes) for n in lengths]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for k, note in enumerate(notes):
        lines.append(f"{'¹²³⁴⁵⁶⁷⁸⁹'[k % 9]} {note}  ")
    lines.append("")
    return lines


def speedups(records):
    by = {(r["mechanism"], r["system"], r["pass"], r["N"]): r for r in records}
    mechs = list(dict.fromkeys(r["mechanism"] for r in records))
    lengths = sorted({r["N"] for r in records})
    head = ["", "vs"] + [f"F {n_label(n)}" for n in lengths] + [f"B {n_label(n)}" for n in lengths]
    lines = ["### rag fused: speedup (time ratio) over the gather baseline and the fastest PyTorch peer",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def ms(m, s, p, n):
        r = by.get((m, s, p, n))
        return r["ms"] if r and r.get("ms") else None

    for m in mechs:
        for i, vs in enumerate(["gather", "best peer"]):
            row = [m if i == 0 else "", vs]
            for p in ("F", "B"):
                for n in lengths:
                    ours = ms(m, "rag fused", p, n)
                    if vs == "gather":
                        other, who = ms(m, "gather", p, n), ""
                    else:
                        cands = [(ms(m, s, p, n), s) for s in PEERS if ms(m, s, p, n)]
                        other, who = min(cands) if cands else (None, "")
                    row.append(f"{other / ours:.2f}x" if ours and other else "–")
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def executed(records, peaks):
    """rag fused's executed FLOP/s (counted from its tile schedule, jit/relpos_programs.hpp's
    relpos_executed_flops) next to the credited ones, and as a fraction of the measured peaks
    (rag_bench_peak: the two-thread FMA rate and the SGEMM rate)."""
    fused = [r for r in records if r["system"] == "rag fused" and r.get("exec_gflops")]
    if not fused:
        return []
    fma = max((p["gflops"] for p in peaks if p["measure"] == "fma"), default=None)
    sgemm = max((p["gflops"] for p in peaks if p["measure"].startswith("sgemm")), default=None)
    lines = ["### rag fused: executed against credited FLOP/s, and against this machine's peak", ""]
    for p in peaks:
        lines.append(f"- measured {p['measure']}: {p['gflops']:.1f} GFLOP/s with {p['threads']} threads"
                     + (f" ({p['isa']})" if "isa" in p else "")
                     + (f" ({p['size']}^3, OpenBLAS {p['core']})" if "core" in p else ""))
    if not peaks:
        lines.append("- no peak measured (bench/peak: rag_bench_peak)")
    lines += ["", "Each cell: executed GFLOP/s / credited GFLOP/s; executed as a % of the SGEMM rate "
              "and of the FMA peak. Targets (issue 20): executed >= 60% of SGEMM forward, >= 50% "
              "backward at N >= 1K.", ""]
    lengths = sorted({r["N"] for r in fused})
    head = ["", "pass"] + [n_label(n) for n in lengths]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(r["mechanism"], r["pass"], r["N"]): r for r in fused}
    for m in dict.fromkeys(r["mechanism"] for r in fused):
        for i, p in enumerate(("F", "B")):
            row = [m if i == 0 else "", p]
            for n in lengths:
                r = by.get((m, p, n))
                if not r:
                    row.append("–")
                    continue
                e = r["exec_gflops"]
                c = f"{fmt(e)} / {fmt(r.get('gflops'))}"
                if sgemm:
                    c += f"; {100 * e / sgemm:.0f}% sgemm"
                if fma:
                    c += f", {100 * e / fma:.0f}% fma"
                row.append(c)
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def targets(records, peaks):
    """Issue 20's targets cell by cell: rag fused at least 3x the best peer, and executed FLOP/s
    at least 60% (forward) / 50% (backward) of the measured SGEMM rate at N >= 1K. A missed speed
    cell says what 3x would take: rag's executed FLOPs per credited FLOP times three times the
    best peer's credited rate, as a % of SGEMM, so a cell needing ~100% or more cannot be met
    without executing fewer FLOPs."""
    by = {(r["mechanism"], r["system"], r["pass"], r["N"]): r for r in records}
    sgemm = max((p["gflops"] for p in peaks if p["measure"].startswith("sgemm")), default=None)
    fused = [r for r in records if r["system"] == "rag fused" and r.get("ms")]
    if not fused:
        return []
    lengths = sorted({r["N"] for r in fused})
    head = ["", "pass", "target"] + [n_label(n) for n in lengths]
    lines = ["### Targets (issue 20), cell by cell", "",
             "speed: rag fused's time ratio over the best PyTorch peer (target >= 3x); where missed, "
             "the executed GFLOP/s 3x would take and its % of the measured SGEMM rate. "
             "efficiency: executed FLOP/s as a % of SGEMM at N >= 1K (target 60% forward, 50% "
             "backward). met / MISSED.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    met = missed = 0
    for m in dict.fromkeys(r["mechanism"] for r in fused):
        for p in ("F", "B"):
            speed, eff = [], []
            for n in lengths:
                r = by.get((m, "rag fused", p, n))
                peers = [by.get((m, s, p, n)) for s in PEERS]
                peers = [q for q in peers if q and q.get("ms")]
                if not r or not r.get("ms") or not peers:
                    speed.append("–")
                else:
                    best = min(peers, key=lambda q: q["ms"])
                    x = best["ms"] / r["ms"]
                    if x >= 3:
                        met += 1
                        speed.append(f"met {x:.2f}x")
                    else:
                        missed += 1
                        c = f"MISSED {x:.2f}x"
                        if r.get("exec_gflops") and r.get("gflops") and best.get("gflops"):
                            need = 3 * best["gflops"] * r["exec_gflops"] / r["gflops"]
                            c += f": needs {fmt(need)}"
                            if sgemm:
                                c += f" ({100 * need / sgemm:.0f}% sgemm)"
                        speed.append(c)
                goal = 60 if p == "F" else 50
                if n < 1024 or not r or not r.get("exec_gflops") or not sgemm:
                    eff.append("–")
                else:
                    pct = 100 * r["exec_gflops"] / sgemm
                    ok = pct >= goal
                    met, missed = met + ok, missed + (not ok)
                    shown = f"{pct:.0f}" if ok or round(pct) < goal else f"{pct:.1f}"
                    eff.append(f"{'met' if ok else 'MISSED'} {shown}%")
            lines.append("| " + " | ".join([m if p == "F" else "", p, "speed"] + speed) + " |")
            lines.append("| " + " | ".join(["", p, "efficiency"] + eff) + " |")
    lines += ["", f"{met} cells met, {missed} missed.", ""]
    return lines


def main():
    out, header = sys.argv[1], sys.argv[2]
    records, peaks = [], []
    for path in sys.argv[3:]:
        try:
            with open(path) as f:
                for line in f:
                    if line.strip():
                        rec = json.loads(line)
                        (peaks if "measure" in rec else records).append(rec)
        except FileNotFoundError:
            pass
    lines = open(header).read().rstrip().splitlines() + [""]
    lines += table(records, "gflops", "Throughput (Table 11 layout)", "useful GFLOP/s, higher is better")
    lines += table(records, "mib", "Peak memory beyond the inputs (Table 12 layout)", "MiB, lower is better")
    lines += speedups(records)
    lines += executed(records, peaks)
    lines += targets(records, peaks)
    lines += ["### Time per call (ms)", ""]
    lines += table(records, "ms", "Time", "ms per call")[2:]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
