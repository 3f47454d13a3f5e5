"""Tables and a plot from bench/run.sh's JSON lines:
python report.py peers.jsonl peers.md peers.png"""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
CASES = ["square", "rect", "nonleading", "encoder"]
SYSTEMS = [("rag", "ragged", "jit"), ("rag", "padded", "jit"), ("rag", "ragged", "interp"),
           ("torch-padded", None, None), ("torch-nested", None, None), ("danling-nt", None, None)]
NAMES = {("rag", "ragged", "jit"): "rag ragged (JIT)", ("rag", "padded", "jit"): "rag padded (JIT)",
         ("rag", "ragged", "interp"): "rag ragged (interpreter)",
         ("torch-padded", None, None): "PyTorch padded + masks",
         ("torch-nested", None, None): "torch.nested (jagged)",
         ("danling-nt", None, None): "DanLing NestedTensor"}


def key(r):
    s = r.get("system")
    return (s, r.get("mode"), r.get("tier")) if s == "rag" else (s, None, None)


def find(case, lengths, sysk):
    for r in rows:
        if r["case"] == case and r["lengths"] == lengths and key(r) == sysk:
            return r
    return None


def mib(b):
    return f"{b / 2**20:.1f}" if b is not None and b >= 0 else "-"


out = []
out.append("| program | lengths | rho tokens / pairs | system | ms/step | vs rag ragged | "
           "peak MiB (rag buffers / RSS growth) | first call s (compile s) | loss0 |")
out.append("|---|---|---|---|---:|---:|---:|---:|---:|")
summary = []
profiles = []
for r in rows:
    if (r["case"], r["lengths"]) not in profiles:
        profiles.append((r["case"], r["lengths"]))
for case, lengths in profiles:
    base = find(case, lengths, ("rag", "ragged", "jit"))
    rho = f"{base['rho_tokens']:.2f} / {base['rho_pairs']:.2f}" if base and "rho_tokens" in base else "-"
    for sysk in SYSTEMS:
        r = find(case, lengths, sysk)
        if r is None:
            continue
        if "error" in r:
            out.append(f"| {case} | {lengths} | {rho} | {NAMES[sysk]} | cannot run: {r['error']} | | | | |")
            continue
        ratio = (f"{r['ms_step'] / base['ms_step']:.2f}x" if base and "ms_step" in base
                 and base["ms_step"] > 0 else "-")
        peak = (f"{mib(r.get('peak_bytes'))} / {mib(r.get('peak_rss_bytes'))}")
        first = f"{r['first_call_s']:.2f}"
        if "compile_s" in r:
            first += f" ({r['compile_s']:.2f})"
        out.append(f"| {case} | {lengths} | {rho} | {NAMES[sysk]} | {r['ms_step']:.1f} | {ratio} | "
                   f"{peak} | {first} | {r['loss0']:.6g} |")
    pad = find(case, lengths, ("rag", "padded", "jit"))
    if base and pad and "ms_step" in base and "ms_step" in pad:
        rho_key = "rho_tokens" if case == "encoder" else "rho_pairs"
        line = {"case": case, "lengths": lengths, "rho": base[rho_key],
                "speedup": pad["ms_step"] / base["ms_step"], "target": 0.8 / base[rho_key],
                "mem": pad["peak_bytes"] / max(base["peak_bytes"], 1)}
        for peer in ("torch-padded", "danling-nt", "torch-nested"):
            p = find(case, lengths, (peer, None, None))
            if p and "ms_step" in p:
                line[peer] = p["ms_step"] / base["ms_step"]
        interp = find(case, lengths, ("rag", "ragged", "interp"))
        if interp and "ms_step" in interp:
            line["interp"] = interp["ms_step"] / base["ms_step"]
        summary.append(line)

head = ["| program | lengths | rho | padded / ragged time (target 0.8/rho) | padded / ragged peak "
        "memory | PyTorch padded / rag | DanLing / rag | torch.nested / rag | interpreter / JIT |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
fmt = lambda v: f"{v:.2f}x" if v is not None else "n/a"
for s in summary:
    head.append(f"| {s['case']} | {s['lengths']} | {s['rho']:.2f} | {s['speedup']:.2f}x "
                f"({s['target']:.2f}x) | {s['mem']:.2f}x | {fmt(s.get('torch-padded'))} | "
                f"{fmt(s.get('danling-nt'))} | {fmt(s.get('torch-nested'))} | "
                f"{fmt(s.get('interp'))} |")

with open(sys.argv[2], "w") as f:
    f.write("# Ragged vs padded, rag vs its peers (bench/run.sh)\n\n")
    f.write("Ratios above 1 mean rag's ragged JIT step is faster. rho: valid / padded entries of "
            "the dominant state (pairs for the pair programs, tokens for the encoder).\n\n")
    f.write("\n".join(head) + "\n\n## Every cell\n\n")
    f.write("Peak: rag's own buffer accounting over a step (runtime/memory.hpp) and, for every "
            "system, the growth of the process's peak RSS over the timed steps. loss0: the first "
            "step's loss, the same inputs and params everywhere, so it must agree across systems.\n\n")
    f.write("\n".join(out) + "\n")

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
labels = [f"{c}\n{'var' if i else 'uni'}" for c, l in profiles for i in [len(set(l.split(','))) > 4 and
          max(map(int, l.split(','))) > 2 * min(map(int, l.split(',')))]]
fig, ax = plt.subplots(figsize=(12, 5))
width = 0.8 / len(SYSTEMS)
for k, sysk in enumerate(SYSTEMS):
    xs, ys = [], []
    for j, (case, lengths) in enumerate(profiles):
        r = find(case, lengths, sysk)
        if r and "ms_step" in r:
            xs.append(j + k * width)
            ys.append(r["ms_step"])
    ax.bar(xs, ys, width, label=NAMES[sysk])
ax.set_xticks([j + 0.4 - width / 2 for j in range(len(profiles))])
ax.set_xticklabels(labels)
ax.set_yscale("log")
ax.set_ylabel("ms per training step (log)")
ax.set_title("One training step on the CPU (B = 8), rag vs padded execution and peers")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=110)
