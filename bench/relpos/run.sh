#!/usr/bin/env bash
# The relative-position attention benchmark, one command: rag_bench_relpos (rag's fused
# kernels, the gather baseline, the materialising reference) and peers.py (PyTorch eager, SDPA,
# FlexAttention) on the same inputs, then bench/results/relpos.md (+ relpos.jsonl, the raw cells).
# usage: bench/relpos/run.sh [--quick]      (--quick: N <= 1024)
# RELPOS_BENCH_ARGS (e.g. "--tokens 256 --heads 2 --dim 16" for a smoke run) is passed to both.
# Environment: RAG_BUILD (default build), BENCH_PYTHON (default: ./dev bench-python; peers are
# skipped, and the table says so, when there is no bench venv).
#
# Budget (74-77 min on 2 cores at 1d3692b and bd0643a, most of it the PyTorch peers): every system runs N = 128 ... 8192 at B * N = 16K tokens until
# its next forward + backward would pass 20 s (rag fused: 45 s; the time doubles with N at a
# fixed token count), then its cells read "skip". The materialising op is float64 loops and runs at N = 128 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${RAG_BUILD:-build}
LENGTHS=128,256,512,1024,2048,4096,8192
[ "${1:-}" = --quick ] && LENGTHS=128,256,512,1024
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bench="$BUILD/bench/relpos/rag_bench_relpos"
# Results describe a commit: a tree with changes to tracked files is refused (issue 18), unless
# RELPOS_ALLOW_DIRTY=1 (smoke runs), which the header then says.
dirty=$(git status --porcelain --untracked-files=no -- . ':!bench/results')  # results do not count
if [ -n "$dirty" ] && [ "${RELPOS_ALLOW_DIRTY:-0}" != 1 ]; then
  echo "run.sh: the tree has uncommitted changes; commit them first (results name the commit)" >&2
  exit 1
fi
[ -x "$bench" ] || { echo "run.sh: no $bench; run ./dev build" >&2; exit 1; }
start=$(date +%s)
commit=$(git rev-parse --short HEAD)  # the commit measured, not the one at the end
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
EXTRA=(${RELPOS_BENCH_ARGS:-})
# rag's fused kernels get a longer cap, so that every map reaches N = 8192 (TXL's identity map
# does the most work there); the baselines and peers stop at 20 s.
# The machine's measured peak first (FMA and SGEMM, warm-up then the median of 5).
"$BUILD/bench/rag_bench_peak" --json "$tmp/peak.jsonl"
"$bench" --lengths "$LENGTHS" --systems 'rag fused' --cap-s 45 --check-max-n 2048 \
  "${EXTRA[@]}" --json "$tmp/rag.jsonl"
"$bench" --lengths "$LENGTHS" --systems 'gather,materialising' --cap-s 20 \
  --max-n materialising=128 --check-max-n 2048 "${EXTRA[@]}" --json "$tmp/baselines.jsonl"

PY=${BENCH_PYTHON:-$(./dev bench-python 2>/dev/null || true)}
peers_note="PyTorch peers: not run (no bench venv; ./dev bench-deps)."
if [ -n "$PY" ] && "$PY" -c 'import torch' 2>/dev/null; then
  "$PY" bench/relpos/peers.py --lengths "$LENGTHS" --cap-s 20 --max-gib 12 --check-max-n 2048 \
    --max-n FlexAttention=2048 "${EXTRA[@]}" --json "$tmp/peers.jsonl"
  peers_note="PyTorch peers: torch $("$PY" -c 'import torch; print(torch.__version__)'), $("$PY" -c 'import torch; print(torch.get_num_threads())') threads."
fi
elapsed=$(( $(date +%s) - start ))

cat >"$tmp/header.md" <<EOF
# Relative-position attention on the CPU (issue 6)

Produced by \`${RELPOS_BENCH_ARGS:+RELPOS_BENCH_ARGS=\"$RELPOS_BENCH_ARGS\" }bench/relpos/run.sh${1:+ $1}\` in ${elapsed} s on $(date -u +%Y-%m-%d), $(nproc) cores
($(lscpu | sed -n 's/^Model name: *//p' | head -1)), git $commit${dirty:+ + uncommitted changes (RELPOS_ALLOW_DIRTY=1: not a result)}.
Load average at the start: $load_start; at the end: $(cut -d' ' -f1-3 /proc/loadavg) (other jobs on the machine make times noisy).
$peers_note

One attention layer, bidirectional, B * N = 16384 tokens, H = 12 heads, d = 64, **float32**
(the CPU has no fast f16/bf16 GEMM here; the paper's Tables 11/12 are H200 fp16), the models'
maps: Shaw clip(256) (aq), Transformer-XL identity L = N (aq = p_r, ak = u, bias = v.p_r),
DeBERTa log_buckets(256, 512) (aq + ak, tau = 1/sqrt(3d)), T5 t5_buckets(32, 128) (bias, tau = 1).
Every system gets the same input values (rag's counter-based generator, in both binaries).

- Throughput: useful FLOPs over time, REFERENCE.md section 4: forward 4BHN^2d + 2BHNRd per
  relation projection (Shaw, TXL one; DeBERTa two; T5 none), backward twice that. Time: every
  system at every N makes a first call (warm-up, untimed; it measures the peak memory), then
  the median of 5 timed calls. Backward is timed
  with the forward's saved state given (rag: O and the log-sum-exp; PyTorch: its autograd graph).
- Peak memory: resident bytes (VmHWM after resetting it, minus VmRSS before) above the inputs,
  and for backward above the inputs plus the forward's saved state. The same measure for every
  system, so allocator and library buffers count too.
- Correctness, on sample 0 of each batch for N <= 2048, against a float64 reference that gathers
  the relation vector of every (i, j), REFERENCE.md section 3 for f32 (relative l2 <= 1e-5 for
  the output and for every gradient): † marks a failure, * a cell not checked (N > 2048).
- Systems: **rag fused** (jit/relpos.hpp); **projections + gather** (bench/relpos/gather_baseline.cpp:
  every query projected onto every relation row with one OpenBLAS GEMM per head, then one
  lookup per score into a materialised N x N score matrix per head, f32); **materialising**
  (the reference op relpos_attention in float64 loops, run at N = 128 only); **PyTorch eager**
  (the bias built as the HF / NeMo attention modules build it), **PyTorch SDPA** (that bias as
  attn_mask: the math path, since the bias needs a gradient), **FlexAttention** (torch.compile
  for the CPU, score_mod reading the bias table; forward only: the CPU has no flex backward).
- skip: the system's next forward + backward would exceed 20 s (45 s for rag fused; its time doubles with N at fixed tokens) or
  its N x N state would exceed 12 GiB; – : not supported.
EOF
mkdir -p bench/results
cat "$tmp"/*.jsonl >bench/results/relpos.jsonl  # peak.jsonl's lines carry "measure"
python3 bench/relpos/report.py bench/results/relpos.md "$tmp/header.md" "$tmp"/*.jsonl
echo "wrote bench/results/relpos.md (${elapsed} s)"
