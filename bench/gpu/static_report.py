"""Static report of the GPU tier's kernels (./dev gpu-report): ptxas -v resources and SASS
instruction counts of every kernel tests/gpu/report_kernels.hpp lists, at sm_80 and sm_90, an
occupancy estimate, and a simple bound model of the relpos/attention kernels at N = 8K against
the relative-position paper's H200 figures, with the issue 19 gates stated met or missed.

    python3 bench/gpu/static_report.py PTXDIR CUOBJDUMP COMMIT OUT.md OUT.jsonl

PTXDIR is what build/bench/gpu/rag_gpu_kernels wrote (manifest.tsv and one PTX file per kernel
and arch). ptxas is $RAG_PTXAS, else $CUDA_HOME/bin/ptxas, else /usr/local/cuda/bin/ptxas.
No GPU is used and no GPU number is measured here.
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

PTXAS = os.environ.get("RAG_PTXAS") or os.path.join(
    os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ptxas")

# Counted SASS classes: opcode (before the first '.') -> class.
CLASSES = {"HMMA": "HMMA", "LDSM": "LDSM", "LDGSTS": "LDGSTS", "LDG": "LDG", "STG": "STG",
           "LD": "LD", "ST": "ST", "LDS": "LDS", "STS": "STS", "LDL": "LDL", "STL": "STL",
           "BAR": "BAR", "SHFL": "SHFL", "FFMA": "FFMA"}
COLUMNS = ["HMMA", "LDSM", "LDGSTS", "LDG", "LDG.128", "STG", "LD", "ST", "LDS", "STS", "LDL",
           "STL", "BAR", "SHFL", "FFMA", "total"]

# The paper (REFERENCE.md section 4): H200, fp16, d = 64, H = 12, B N = 16K tokens,
# bidirectional; TFLOP/s forward / backward at N = 8K.
PAPER = {"Shaw": (279, 166), "TXL": (236, 133), "DeBERTa": (159, 101), "T5": (307, 174)}
PROJECTIONS = {"Shaw": 1, "TXL": 2, "DeBERTa": 2, "T5": 0, "attention": 0}
# Floats per relation row of the backward's table partials (D for aq, D for ak, 1 for the bias).
PARTIAL_WIDTH = {"Shaw": 64, "TXL": 129, "DeBERTa": 128, "T5": 1, "attention": 0}
N, B, H, D, J = 8192, 2, 12, 64, 64  # J: the kernels' key tile and strip
# H200 SXM: 132 SMs at 1.98 GHz; dense fp16 tensor peak 989 TFLOP/s, HBM 4.8 TB/s; per SM 64K
# registers, 2048 threads, 32 blocks, 228 KiB shared (1 KiB reserved per block).
SMS, CLOCK, TENSOR_PEAK, HBM = 132, 1.98e9, 989e12, 4.8e12
SCRATCH_BUDGET = 256 * 2 ** 20  # jit/kir_gpu.hpp's kScratchBudget: one launch's scratch in all
SM = {"regs": 65536, "threads": 2048, "blocks": 32, "smem": 228 * 1024,
      "sm_80_smem": 164 * 1024}
BLOCK = 128  # threads per block (jit/kir_nvptx.hpp kKirBlock)

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def ptxas(ptx, arch, cubin):
    out = subprocess.run([PTXAS, "-v", f"-arch={arch}", "-o", cubin, ptx], capture_output=True,
                         text=True, check=True).stderr
    r = {}
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                  out)
    r["stack"], r["spill_stores"], r["spill_loads"] = map(int, m.groups())
    r["registers"] = int(re.search(r"Used (\d+) registers", out).group(1))
    m = re.search(r"(\d+) bytes smem", out)
    r["smem"] = int(m.group(1)) if m else 0
    m = re.search(r"used (\d+) barriers", out)
    r["barriers"] = int(m.group(1)) if m else 0
    return r


def sass(cuobjdump, cubin):
    text = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    return [(int(m.group(1), 16), m.group(3), m.group(4)) for m in INSTR.finditer(text)]


def count(instrs):
    c = dict.fromkeys(COLUMNS, 0)
    for _, op, _ in instrs:
        k = CLASSES.get(op.split(".")[0])
        if k:
            c[k] += 1
        # 16-byte global loads: the kernels' only ones are copy16's staging (also in LDG).
        if k == "LDG" and ".128" in op:
            c["LDG.128"] += 1
        c["total"] += 1
    return c


def loops(instrs):
    """Backward branches as loops (start, end) in address order, outermost first."""
    out = set()
    for addr, op, args in instrs:
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", args)
            if m and int(m.group(1), 16) <= addr:
                out.add((int(m.group(1), 16), addr))
    return sorted(out, key=lambda l: (l[0], -l[1]))


def key_loop(instrs):
    """The key-tile loop: the innermost loop holding every HMMA and, in kernels that stage with
    16-byte loads (LDG.128, or cp.async's LDGSTS), one of them (each iteration stages the tile
    it streams: K and V, or Q and dO in the key pass), when
    that is a loop nested in the grid-stride instance loop (the outermost one); None otherwise
    (no tensor cores). Loops inside it that hold every HMMA without staging are the backward
    passes' halves of a tile pair."""
    hmma = [a for a, op, _ in instrs if op.startswith("HMMA")]
    staging = [a for a, op, _ in instrs
               if op.startswith("LDGSTS") or (op.startswith("LDG") and ".128" in op)]
    ls = loops(instrs)
    if not hmma or not ls:
        return None
    holding = [l for l in ls if l[0] <= min(hmma) and max(hmma) <= l[1]
               and (not staging or any(l[0] <= a <= l[1] for a in staging))]
    if not holding:
        return None
    inner = min(holding, key=lambda l: l[1] - l[0])
    outer = max(ls, key=lambda l: l[1] - l[0])
    if inner == outer:
        return None
    depth = sum(1 for l in ls if l[0] <= inner[0] and inner[1] <= l[1])
    return inner, depth


# The backward passes run each tile pair in halves (jit/relpos_programs.cpp: the key pass
# over J / 2 queries at a time, the query pass over J / 2 keys): a loop of this many trips.
HALVES = 2


def per_iteration(body, key, instrs, hmma_needed):
    """Instruction counts of one key-loop iteration: a loop inside it holding HMMAs and other
    such loops is a halves loop (HALVES trips); the innermost loops holding HMMAs (an mma
    statement's loop over its warp's C tiles) run as often as the iteration's tile products
    need (hmma_needed HMMAs a warp), every other inner loop (staging, softmax, projections)
    once: an undercount. Returns (counts, the mma loops' trips)."""
    inner = [l for l in loops(instrs) if key[0] <= l[0] and l[1] <= key[1] and l != key]
    holds = [l for l in inner if any(l[0] <= a <= l[1] and op.startswith("HMMA")
                                     for a, op, _ in body)]
    halves = [l for l in holds
              if any(m != l and l[0] <= m[0] and m[1] <= l[1] for m in holds)]
    leaves = [l for l in holds if l not in halves]

    def outer(a):
        return HALVES ** sum(1 for l in halves if l[0] <= a <= l[1])

    def in_leaf(a):
        return any(l[0] <= a <= l[1] for l in leaves)

    hmma = [a for a, op, _ in body if op.startswith("HMMA")]
    fixed = sum(outer(a) for a in hmma if not in_leaf(a))
    looped = sum(outer(a) for a in hmma if in_leaf(a))
    trips = (hmma_needed - fixed) / looped if looped else 1
    c = dict.fromkeys(COLUMNS, 0.0)
    for a, op, args in body:
        weight = outer(a) * (trips if in_leaf(a) else 1)
        for k, v in count([(a, op, args)]).items():
            c[k] += v * weight
    return c, trips


# Tile products per (strip, key tile) iteration on tensor cores, each 64 x 64 x 64: the
# forward's S = Q K^T and P V; the query pass's S, dP and dQ; the key pass's S, dP, dV and dK;
# and in every pass, per relation table, its projections of the pair's 2 x 64 reachable rows
# (two products: jit/relpos_programs.cpp's project_tile).
PRODUCTS = {"forward": 2, "query_grad": 3, "key_grad": 4}
PROJECTION_PRODUCTS = {"forward": 2, "query_grad": 2, "key_grad": 2}
# Memory instructions: one warp instruction per clock per SM through the load/store unit
# (128 bytes a clock of L1/shared bandwidth: a warp's 32-bit access, conflict-free).
MEMORY = ["LDSM", "LDGSTS", "LDG", "STG", "LD", "ST", "LDS", "STS", "LDL", "STL"]


def hmma_per_warp(pas, mp):
    """HMMAs (m16n8k16: 4096 FLOPs) a warp issues per key-loop iteration: the pass's tile
    products of 64 x 64 x 64 shared by the block's warps."""
    products = PRODUCTS.get(pas, 0) + PROJECTION_PRODUCTS.get(pas, 0) * PROJECTIONS.get(mp, 0)
    return products * 64 ** 3 * 2 // 4096 // (BLOCK // 32)


def occupancy(r, arch):
    per_warp = -(-r["registers"] * 32 // 256) * 256
    warps = BLOCK // 32
    by_regs = SM["regs"] // (per_warp * warps)
    smem_sm = SM["sm_80_smem"] if arch == "sm_80" else SM["smem"]
    by_smem = smem_sm // (r["smem"] + 1024)
    blocks = min(by_regs, by_smem, SM["threads"] // BLOCK, SM["blocks"])
    return blocks, blocks * warps / (SM["threads"] // 32)


def backward_parts(mp):
    """The parts (runs of whole strips) jit/relpos_setup.cpp's relpos_split_backward gives each
    backward pass on a device at N = 8K: halved while parts x H < 1024 and the table partials
    stay within max(whole samples', 1 GiB); every map with tables taken as unbounded (U = 2N -
    1 rows, the paper's accounting), which makes its partials widest."""
    U, width = 2 * N - 1, PARTIAL_WIDTH[mp]
    def of(strips):  # parts and their bytes
        rows = strips * J
        parts = B * -(-N // rows)
        return parts, 4 * parts * H * min(rows + N - 1, U) * width
    strips = N // J
    budget = max(of(strips)[1], 1024 * 2 ** 20)
    while strips > 1 and of(strips)[0] * H < 1024 and of(-(-strips // 2))[1] <= budget:
        strips = -(-strips // 2)
    return of(strips)[0]


def relpos_model(row, key_loop, blocks_per_sm):
    """A bound on one relpos pass at N = 8K (B = 2, H = 12, d = 64) on the H200, from the
    key-loop's SASS counts (see the report's assumptions)."""
    tiles = N // J
    grid = B * tiles * H if row["pass"] == "forward" else backward_parts(row["map"]) * H
    iterations = B * H * tiles * tiles  # (strip, key tile) pairs, every pass
    warps = BLOCK // 32
    # The blocks a launch uses (jit/kir_gpu.cpp's kir_gpu_blocks): at most 8 per SM and no more
    # scratch than SCRATCH_BUDGET in all; they loop over the grid's instances.
    launched = min(grid, 8 * SMS, SCRATCH_BUDGET // max(row["scratch"], 1))
    resident = min(launched, SMS * blocks_per_sm)
    sms = min(SMS, resident)
    issue_rate = sms * min(4, warps * max(1, resident // sms)) * CLOCK  # warp-instr / s
    dynamic = key_loop["per_iteration"]
    hmma = hmma_per_warp(row["pass"], row["map"])
    per_warp = dynamic["total"]
    t_issue = iterations * warps * per_warp / issue_rate
    t_tensor = iterations * warps * hmma * 4096 / (TENSOR_PEAK * sms / SMS)
    lsu = sum(dynamic[k] for k in MEMORY)
    t_lsu = iterations * warps * lsu / (sms * CLOCK)
    flops = 4 * B * H * N * N * D + 2 * B * H * N * (2 * N - 1) * D * PROJECTIONS[row["map"]]
    return {"grid": grid, "launched": launched, "sms": sms, "t_issue": max(t_issue, t_lsu), "t_tensor": t_tensor,
            "paper_flops": flops, "per_warp": per_warp, "trips": key_loop["mma_trips"]}


def main(ptxdir, cuobjdump, commit, out_md, out_jsonl):
    with open(os.path.join(ptxdir, "manifest.tsv")) as f:
        manifest = [line.rstrip("\n").split("\t") for line in f if line.strip()]

    def one(line):
        kid, family, mp, pas, dtype, arch, entry, file, dynamic_smem, scratch = line
        with tempfile.TemporaryDirectory() as tmp:
            cubin = os.path.join(tmp, "k.cubin")
            r = {"id": kid, "family": family, "map": mp, "pass": pas, "dtype": dtype,
                 "arch": arch, "entry": entry, "commit": commit}
            r.update(ptxas(os.path.join(ptxdir, file), arch, cubin))
            r["smem"] += int(dynamic_smem)  # dynamic shared memory: the launch asks for it
            r["scratch"] = int(scratch)  # per block at N = 8K
            instrs = sass(cuobjdump, cubin)
        r["sass"] = count(instrs)
        kl = key_loop(instrs)
        if kl:
            (lo, hi), depth = kl
            body = [i for i in instrs if lo <= i[0] <= hi]
            dynamic, trips = per_iteration(body, (lo, hi), instrs, hmma_per_warp(pas, mp))
            r["key_loop"] = {"depth": depth, "bytes": hi - lo + 16, "sass": count(body),
                             "per_iteration": dynamic, "mma_trips": trips}
        r["blocks_per_sm"], r["occupancy"] = occupancy(r, arch)
        print(kid, arch, file=sys.stderr)
        return r

    # ptxas and cuobjdump run as subprocesses: a few at once.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        rows = list(pool.map(one, manifest))
    banks = read_banks(os.path.join(ptxdir, "banks.tsv"))
    for r in rows:
        if r["id"] in banks:
            r["banks"] = worst_banks(banks[r["id"]])
    with open(out_jsonl, "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    with open(out_md, "w") as f:
        f.write(render(rows, commit))


# Warp-wide shared-memory accesses by kind (jit/kir_banks.hpp): staging stores, tensor-core
# fragment loads of A and B (ldmatrix, or element by element), the accumulator C's loads and
# stores, other loads in threads loops.
BANK_KINDS = ["store", "ldmatrix A", "ldmatrix B", "mma A", "mma B", "mma C", "load"]
FRAGMENT_KINDS = {"A": ("ldmatrix A", "mma A"), "B": ("ldmatrix B", "mma B")}


def read_banks(path):
    """banks.tsv (rag_gpu_kernels): kernel id -> [(array, kind, degree)]."""
    out = {}
    with open(path) as f:
        for line in f:
            kid, array, kind, degree = line.rstrip("\n").split("\t")
            out.setdefault(kid, []).append((array, kind, int(degree)))
    return out


def worst_banks(accesses):
    """Per kind: accesses, the worst degree, and how many were not derived (degree 0)."""
    out = {}
    for kind in BANK_KINDS:
        d = [deg for _, k, deg in accesses if k == kind]
        if d:
            out[kind] = {"accesses": len(d), "worst": max(d),
                         "not_derived": sum(1 for x in d if x == 0)}
    return out


def bank_section(rows):
    o = []
    w = o.append
    w("## Shared-memory bank conflicts (derived from the addressing)\n")
    w("Per warp-wide shared-memory access of each program under the NVPTX lowering, the "
      "passes it takes: the most distinct 4-byte words any of the 32 banks is asked for (one "
      "word for several lanes is a broadcast; 1 = conflict-free). jit/kir_banks.cpp evaluates "
      "each address for lanes 0-31 of warp 0: in a distributed `threads` loop lane L runs "
      "iteration lo + L, other loop indices their first value, with the report's parameters "
      "(N = 8K, the instance's strip or part the whole sample); tensor-core fragments as the "
      "lowering loads them (kir::fragment_load): an ldmatrix where the operand is a half-typed "
      "shared tile with contiguous, 16-byte aligned 8-element rows, each of its 8 x 8 matrices "
      "one pass of 8 lanes' 16-byte rows (the cell gives the worst matrix); otherwise one load "
      "per element in the PTX ISA's m16n8k16 layout (lane 4g + t: A rows g, g + 8 by columns "
      "2t, 2t + 1, + 8; B rows 2t, 2t + 1, + 8 of column g; C rows g, g + 8 by columns 2t, "
      "2t + 1). Half tiles are padded by 16 bytes per row (kir::BufferDecl::row). The same at "
      "sm_80 and sm_90. Each cell: accesses of that kind in the program, worst degree.\n")
    w("| kernel | staging stores | ldmatrix A | ldmatrix B | element loads A | "
      "element loads B | accumulator C | other loads |")
    w("|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = r.get("banks")
        if r["arch"] != "sm_90" or not b:
            continue
        cell = (lambda k: f"{b[k]['accesses']}: {b[k]['worst']}-way"
                + (f" ({b[k]['not_derived']} not derived)" if b[k]["not_derived"] else "")
                if k in b else "-")
        w(f"| {r['id']} | " + " | ".join(cell(k) for k in BANK_KINDS) + " |")
    return "\n".join(o) + "\n"


def fmt_counts(c):
    return " | ".join(str(c[k]) for k in COLUMNS)


def render(rows, commit):
    o = []
    w = o.append
    w("# Static report of the GPU tier's kernels\n")
    w(f"Commit `{commit}`, made by `./dev gpu-report` (bench/gpu/static_report.py) from the PTX "
      "of `build/bench/gpu/rag_gpu_kernels` (every kernel of tests/gpu/report_kernels.hpp: the "
      "relpos passes for the four maps by their relation terms, plain attention, GEMM and "
      "normalisation, d = 64, bidirectional, tensor cores for f16/bf16 as the GPU tier runs "
      "them). Resources from `ptxas -v` (CUDA 13.0), SASS from `cuobjdump -sass` (PyPI "
      "nvidia-cuda-cuobjdump, bench/gpu/requirements-report.txt). **No GPU number has been "
      "measured: every figure below is static or modelled.** `rag_gpu_test "
      "--gtest_filter=GpuStatic.*` checks the register and spill figures of a few kernels "
      "against ptxas at HEAD.\n")
    gates = gate_lines(rows)
    w("## Issue 19 gates\n")
    for g in gates:
        w(f"- {g}")
    w("")
    w("## Resources and SASS counts (whole kernel)\n")
    w("Registers per thread, spill stores/loads and stack frame (local memory) in bytes per "
      "thread, shared memory per block (static, or dynamic past 48 KiB), blocks per SM and occupancy (resident warps / "
      "64) from registers and shared memory at 128 threads per block. SASS columns: static "
      "instruction counts (each instruction once, loops not multiplied). LD/ST are generic "
      "(the per-block scratch arrays in global memory are addressed generically). LDG.128: "
      "the 16-byte global loads among LDG (copy16's staging).\n")
    w("| kernel | arch | regs | spill st/ld | stack | smem | blocks/SM | occ | "
      + " | ".join(COLUMNS) + " |")
    w("|---|---|---|---|---|---|---|---|" + "---|" * len(COLUMNS))
    for r in rows:
        w(f"| {r['id']} | {r['arch']} | {r['registers']} | {r['spill_stores']}/"
          f"{r['spill_loads']} | {r['stack']} | {r['smem']} | {r['blocks_per_sm']} | "
          f"{r['occupancy']:.2f} | {fmt_counts(r['sass'])} |")
    w("")
    w("## Key-tile loop (static counts per iteration)\n")
    w("The key-tile loop is found in the SASS as the innermost loop (backward branch) holding "
      "every HMMA of the kernel and, where the kernel stages with 16-byte loads (LDG.128, or "
      "LDGSTS: cp.async, with which the tensor-core passes load tile t + 1 while tile t is "
      "computed), one of them "
      "(each iteration stages the tile it streams), when that is nested inside the grid-stride "
      "instance loop; kernels without tensor cores (f32, GEMM-free passes) have none "
      "identified. Counts are the instructions between the loop's head and its back branch, "
      "inner loops (the backward passes' two halves of a tile pair, the k steps of an mma, "
      "strided staging loops) counted once, so they are lower bounds on one iteration's "
      "dynamic count; the model below weights them.\n")
    w("| kernel | arch | depth | " + " | ".join(COLUMNS)
      + " | LDSM/HMMA | global ld/st but LDG.128 |")
    w("|---|---|---|" + "---|" * len(COLUMNS) + "---|---|")
    for r in rows:
        k = r.get("key_loop")
        if not k:
            continue
        c = k["sass"]
        ratio = c["LDSM"] / c["HMMA"] if c["HMMA"] else 0
        glob = c["LDG"] - c["LDG.128"] + c["STG"] + c["LD"] + c["ST"]
        w(f"| {r['id']} | {r['arch']} | {k['depth']} | {fmt_counts(c)} | {ratio:.2f} | {glob} |")
    w("")
    w(bank_section(rows))
    w(model_section(rows))
    return "\n".join(o) + "\n"


def model_rows(rows):
    out = {}
    for r in rows:
        if r["arch"] != "sm_90" or r["dtype"] != "f16" or r["family"] not in ("relpos",
                                                                              "attention"):
            continue
        if r["pass"] not in ("forward", "query_grad", "key_grad") or "key_loop" not in r:
            continue
        m = relpos_model(r, r["key_loop"], r["blocks_per_sm"])
        out[(r["map"], r["pass"])] = m
    return out


def model_section(rows):
    o = []
    w = o.append
    w("## Modelled bound at N = 8K against the paper (H200, fp16)\n")
    w("Assumptions (a bound, optimistic on purpose, so a missed gate is missed for certain):")
    w(f"- Workload as the paper's: B = {B}, N = {N}, H = {H}, d = {D}; the kernels' key tile and "
      f"strip J = {J}, so every pass runs B H (N/J)^2 = {B * H * (N // J) ** 2} (strip, key "
      "tile) iterations; the forward launches B (N/J) H blocks, each backward pass parts x H "
      "blocks (jit/relpos_setup.cpp's relpos_split_backward: runs of whole strips, halved "
      "while there are fewer than 1024 blocks and the table partials stay within 1 GiB, "
      "every map with tables taken as unbounded, U = 2N - 1 rows). A launch runs at most 8 "
      "blocks per SM and no more blocks than 256 MiB of their scratch arrays allow "
      "(jit/kir_gpu.cpp: each block loops over the grid's instances); the table shows the grid "
      "and, in parentheses, the blocks launched.")
    w(f"- H200: {SMS} SMs at {CLOCK / 1e9:.2f} GHz, dense fp16 tensor peak "
      f"{TENSOR_PEAK / 1e12:.0f} TFLOP/s, 128 threads (4 warps) per block; blocks per SM from "
      "ptxas's registers and shared memory; an SM issues at most one warp instruction per "
      "scheduler (4) per clock and a warp at most one per clock, with no stalls (memory "
      "latency, barriers, dependent HMMA) at all.")
    w("- Instructions per iteration per warp: the key loop's SASS, with the halves loops (an "
      "inner loop holding other loops with HMMAs: the backward passes' halves of a tile pair, "
      "a projection's two 64-row halves) run twice, the innermost "
      "loops that hold HMMAs (an mma's loop over the warp's 16 x 8 C tiles) run as often as "
      "the tile products need (64 x 64 x 64 each: 2 in the forward, 3 in the query pass, 4 in "
      "the key pass, plus in each 2 per relation table projected (the pair's 128 reachable "
      "rows, never saturated when the tables are unbounded), 32 HMMA per warp each), every other inner loop (staging, softmax, "
      "projections) counted once: an undercount. All four warps execute it; time = max(issue time, tensor "
      "time of the HMMAs at peak on the SMs in use, load/store-unit time at one memory warp "
      "instruction per clock per SM, i.e. 128 B/clock: every access an L1 hit without bank "
      "conflicts). DRAM/L2 bandwidth, latency and the barriers' waits are not charged.")
    w("- TFLOP/s credited with the paper's accounting (REFERENCE.md): forward 4BHN^2 d + "
      "2BHN(2N-1)d per relation projection (Shaw 1, TXL 2, DeBERTa 2, T5 0), backward twice "
      "that; the backward's time is the query pass plus the key pass (the table reduction "
      "is not charged).")
    w("")
    model = model_rows(rows)
    w("| map | fwd bound TFLOP/s | paper fwd | % | bwd bound TFLOP/s | paper bwd | % | fwd "
      "grid (launched) / SMs | bwd grid (launched dQ, dK) / SMs | warp instr. per iteration "
      "fwd / dQ / dK |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    for mp in ["Shaw", "TXL", "DeBERTa", "T5", "attention"]:
        f, q, k = (model.get((mp, p)) for p in ("forward", "query_grad", "key_grad"))
        if not (f and q and k):
            w(f"| {mp} | no key loop identified | | | | | | | | |")
            continue
        tf = max(f["t_issue"], f["t_tensor"])
        tb = max(q["t_issue"], q["t_tensor"]) + max(k["t_issue"], k["t_tensor"])
        fw, bw = f["paper_flops"] / tf / 1e12, 2 * f["paper_flops"] / tb / 1e12
        pf, pb = PAPER.get(mp, (None, None))
        pct = (lambda a, p: f"{100 * a / p:.1f}%" if p else "-")
        w(f"| {mp} | {fw:.1f} | {pf or '-'} | {pct(fw, pf)} | {bw:.1f} | {pb or '-'} | "
          f"{pct(bw, pb)} | {f['grid']} ({f['launched']}) / {f['sms']} | {q['grid']} "
          f"({q['launched']}, {k['launched']}) / {min(q['sms'], k['sms'])} | "
          f"{f['per_warp']:.0f} / {q['per_warp']:.0f} / {k['per_warp']:.0f} |")
    return "\n".join(o) + "\n"


def gate_lines(rows):
    rel = [r for r in rows if r["family"] in ("relpos", "attention") and r["pass"] != "reduce"]
    spills = [r for r in rel if r["spill_stores"] or r["spill_loads"] or r["stack"]]
    g = []
    g.append(("MET" if not spills else "MISSED") + ": zero spills and no local memory in every "
             f"relpos and attention kernel, sm_80 and sm_90 ({len(spills)} of {len(rel)} "
             "kernel/arch pairs spill or use a stack frame"
             + (f", up to {max(r['spill_stores'] for r in spills)} B of spill stores per thread"
                if spills else "") + ").")
    keyed = [r for r in rel if "key_loop" in r]
    tc = [r for r in rel if r["dtype"] in ("f16", "bf16")]
    ldsm = [r for r in keyed if 2 * r["key_loop"]["sass"]["LDSM"] >= r["key_loop"]["sass"]["HMMA"]]
    g.append(("MET" if keyed and len(ldsm) == len(tc) else "MISSED")
             + ": at least one LDSM per two HMMA in the key loop "
             f"({len(ldsm)} of {len(tc)} tensor-core kernel/arch pairs; key loop identified in "
             f"{len(keyed)}).")
    def other_global(r):
        c = r["key_loop"]["sass"]
        return c["LDG"] - c["LDG.128"] + c["STG"] + c["LD"] + c["ST"]
    clean = [r for r in keyed if not other_global(r)]
    g.append(("MET" if keyed and len(clean) == len(tc) else "MISSED")
             + ": no global loads or stores in the key loop but the staged K/V/table tiles "
             f"({len(clean)} of {len(tc)} tensor-core kernel/arch pairs have none but the "
             "16-byte staging loads, LDG.128 or LDGSTS; relation-table and projection reads, dS stored "
             "by offset and scalar staging count against it).")
    banked = [r for r in tc if r["arch"] == "sm_90" and r.get("banks")]
    gated = ("store",) + FRAGMENT_KINDS["A"] + FRAGMENT_KINDS["B"]
    worst = {k: max((r["banks"][k]["worst"] for r in banked if k in r["banks"]), default=0)
             for k in gated}
    worst["A"] = max(worst[k] for k in FRAGMENT_KINDS["A"])
    worst["B"] = max(worst[k] for k in FRAGMENT_KINDS["B"])
    clean_banks = [r for r in banked
                   if all(r["banks"][k]["worst"] == 1 for k in gated if k in r["banks"])]
    g.append(("MET" if banked and len(clean_banks) == len(banked) else "MISSED")
             + ": 1-way bank conflicts on staging and fragment loads "
             f"({len(clean_banks)} of {len(banked)} tensor-core kernels conflict-free; worst "
             f"{worst['store']}-way on staging stores, {worst['A']}-way on A and "
             f"{worst['B']}-way on B fragment loads; derived from the addressing, see "
             "the bank-conflict section).")
    model = model_rows(rows)
    ok_f = ok_b = 0
    for mp, (pf, pb) in PAPER.items():
        f, q, k = (model.get((mp, p)) for p in ("forward", "query_grad", "key_grad"))
        if f and q and k:
            tf = max(f["t_issue"], f["t_tensor"])
            tb = max(q["t_issue"], q["t_tensor"]) + max(k["t_issue"], k["t_tensor"])
            ok_f += f["paper_flops"] / tf / 1e12 >= 0.5 * pf
            ok_b += 2 * f["paper_flops"] / tb / 1e12 >= 0.4 * pb
    g.append(("MET" if ok_f == 4 else "MISSED") + f": modelled forward bound >= 50% of the "
             f"paper for every map ({ok_f} of 4 maps).")
    g.append(("MET" if ok_b == 4 else "MISSED") + f": modelled backward bound >= 40% of the "
             f"paper for every map ({ok_b} of 4 maps).")
    g.append("Emulator race detector: every relpos program the GPU tests run through the "
             "emulator passes with it on (tests/gpu/emulator_test.cpp, GpuEmulator.*).")
    return g


if __name__ == "__main__":
    main(*sys.argv[1:])
