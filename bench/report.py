"""Tables and a plot from bench/run.sh's JSON lines:
python report.py peers.jsonl peers.md peers.png [header.md]

Every line is one measurement: a system on a program and a length profile, either the loss
alone ("fwd": true) or the training step (forward, backward, SGD)."""
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
SYSTEMS = [("rag", "ragged", "jit"), ("rag", "padded", "jit"), ("rag", "ragged", "interp"),
           ("torch-padded", None, None), ("torch-nested", None, None), ("danling-nt", None, None)]
NAMES = {("rag", "ragged", "jit"): "rag ragged (JIT)", ("rag", "padded", "jit"): "rag padded (JIT)",
         ("rag", "ragged", "interp"): "rag ragged (interpreter)",
         ("torch-padded", None, None): "PyTorch padded + masks",
         ("torch-nested", None, None): "torch.nested (jagged)",
         ("danling-nt", None, None): "DanLing NestedTensor"}
PHASES = [(False, "training step (forward + backward + SGD)"), (True, "forward (the loss alone)")]


def key(r):
    s = r.get("system")
    return (s, r.get("mode"), r.get("tier")) if s == "rag" else (s, None, None)


def find(case, lengths, sysk, fwd):
    for r in rows:
        if (r["case"] == case and r["lengths"] == lengths and key(r) == sysk
                and bool(r.get("fwd", False)) == fwd):
            return r
    return None


# Ratios use the median of the timed calls (every system: a warm-up call, then the median of
# at least 5), the one protocol all of bench/ follows; the least is shown beside it.
def ms(r):
    return r.get("ms_step")


def ok(r):
    return r is not None and "ms_step" in r and ms(r) > 0


def mib(b):
    return f"{b / 2**20:.1f}" if b is not None and b >= 0 else "-"


def ratio(r, base):
    return ms(r) / ms(base) if ok(r) and ok(base) else None


fmt = lambda v: f"{v:.2f}x" if v is not None else "n/a"  # noqa: E731

profiles = []
for r in rows:
    if (r["case"], r["lengths"]) not in profiles:
        profiles.append((r["case"], r["lengths"]))


def rho_of(case, base):
    # The dominant state: pairs for the pair programs, tokens for the encoder.
    return base.get("rho_tokens" if case == "encoder" else "rho_pairs") if base else None


summary = {}
for fwd, title in PHASES:
    lines = [f"### {title}", "",
             "| program | lengths | rho | rag ms | padded / ragged time (target 0.8/rho) | "
             "padded / ragged peak memory (target 0.8/rho) | PyTorch padded / rag | "
             "DanLing / rag | torch.nested / rag |" + (" interpreter / JIT |" if not fwd else ""),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if not fwd else "")]
    for case, lengths in profiles:
        base = find(case, lengths, ("rag", "ragged", "jit"), fwd)
        if not ok(base):
            continue
        rho = rho_of(case, base)
        pad = find(case, lengths, ("rag", "padded", "jit"), fwd)
        mem = (pad["peak_bytes"] / max(base["peak_bytes"], 1)
               if ok(pad) and "peak_bytes" in pad else None)
        cells = [fmt(ratio(pad, base)) + f" ({0.8 / rho:.2f}x)", fmt(mem) + f" ({0.8 / rho:.2f}x)"]
        for peer in ("torch-padded", "danling-nt", "torch-nested"):
            cells.append(fmt(ratio(find(case, lengths, (peer, None, None), fwd), base)))
        if not fwd:
            cells.append(fmt(ratio(find(case, lengths, ("rag", "ragged", "interp"), fwd), base)))
        lines.append(f"| {case} | {lengths} | {rho:.2f} | {ms(base):.1f} | "
                     + " | ".join(cells) + " |")
    summary[fwd] = lines

out = []
for fwd, title in PHASES:
    out += [f"### {title}", "",
            "| program | lengths | rho tokens / pairs | system | ms median / least | vs rag ragged | "
            "peak MiB (rag buffers / RSS growth) | first call s (compile s) | loss0 |",
            "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for case, lengths in profiles:
        base = find(case, lengths, ("rag", "ragged", "jit"), fwd)
        rho = (f"{base['rho_tokens']:.2f} / {base['rho_pairs']:.2f}"
               if base and "rho_tokens" in base else "-")
        for sysk in SYSTEMS:
            r = find(case, lengths, sysk, fwd)
            if r is None:
                continue
            if "error" in r:
                out.append(f"| {case} | {lengths} | {rho} | {NAMES[sysk]} | cannot run: "
                           f"{r['error']} | | | | |")
                continue
            first = f"{r['first_call_s']:.2f}"
            if "compile_s" in r:
                first += f" ({r['compile_s']:.2f})"
            out.append(f"| {case} | {lengths} | {rho} | {NAMES[sysk]} | {ms(r):.1f} / {r.get('ms_min', ms(r)):.1f} | "
                       f"{fmt(ratio(r, base))} | {mib(r.get('peak_bytes'))} / "
                       f"{mib(r.get('peak_rss_bytes'))} | {first} | {r['loss0']:.6g} |")
    out.append("")

with open(sys.argv[2], "w") as f:
    f.write("# Ragged vs padded, rag vs its peers (bench/run.sh)\n\n")
    if len(sys.argv) > 4:  # run.sh's header: the commit, the machine and its load
        f.write(open(sys.argv[4]).read() + "\n")
    f.write("Ratios above 1 mean rag's ragged JIT is faster (or, for memory, smaller). rho: "
            "valid / padded entries of the dominant state (pairs for the pair programs, tokens "
            "for the encoder). Targets in parentheses (issue 5): padded / ragged at least "
            "0.8 / rho in time and memory. Times: a first (compiling, warm-up) call, then the "
            "median of the timed calls after it, the same protocol for every system.\n\n")
    f.write("\n".join(summary[False] + [""] + summary[True]) + "\n\n## Every cell\n\n")
    f.write("Peak: rag's own buffer accounting over a call (runtime/memory.hpp) and, for every "
            "system, the growth of the process's peak RSS over the timed calls. First call: "
            "compile + run (for rag the first function of the process also builds the "
            "process-wide kernels); compile: rag's specialisation and JIT time of that function. "
            "loss0: the first call's loss, the same inputs and params everywhere, so it must "
            "agree across systems.\n\n")
    f.write("\n".join(out) + "\n")

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)


def label(case, lengths):
    n = [int(v) for v in lengths.split(",")]
    return f"{case}\n{'variable' if max(n) > 2 * min(n) else 'uniform'}"


fig, axes = plt.subplots(2, 1, figsize=(13, 9))
width = 0.8 / len(SYSTEMS)
for ax, (fwd, title) in zip(axes, PHASES):
    for k, sysk in enumerate(SYSTEMS):
        xs, ys = [], []
        for j, (case, lengths) in enumerate(profiles):
            r = find(case, lengths, sysk, fwd)
            if ok(r):
                xs.append(j + k * width)
                ys.append(ms(r))
        if xs:
            ax.bar(xs, ys, width, label=NAMES[sysk])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(profiles))])
    ax.set_xticklabels([label(c, ls) for c, ls in profiles])
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_title(f"{title}, CPU, B = 8")
    ax.legend(fontsize=7, ncol=3)
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=110)
