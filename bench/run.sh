#!/usr/bin/env bash
# The ragged-vs-padded benchmark and its peers, one command (see bench/README.md):
#   ./dev bench            (builds, then runs this with the bench venv's Python)
#   bench/run.sh [STEPS]   (RAG_BENCH=path/to/rag_bench BENCH_PYTHON=venv/bin/python)
# STEPS (default 6): calls per cell, the first a warm-up (it compiles), the median of the rest.
# For each program (single-pair-single square, rectangular, non-leading; the encoder layer) and
# each length profile (near-uniform, highly variable), the loss alone and one training step
# (forward, backward, SGD) of: rag ragged and rag padded on the JIT, rag ragged on the
# interpreter (training step only), PyTorch padded with masks, torch.nested (jagged), DanLing
# NestedTensor; every system in its own process, on
# the same dumped inputs, with THREADS threads, each process at most CELL_TIMEOUT seconds
# (default 600). Writes bench/results/peers.{jsonl,md,png}, headed by the commit it ran at.
set -euo pipefail
cd "$(dirname "$0")/.."
# Results describe a commit: a tree with changes to tracked files is refused (as in
# bench/relpos/run.sh), unless BENCH_ALLOW_DIRTY=1 (smoke runs), which the header then says.
dirty=$(git status --porcelain --untracked-files=no -- . ':!bench/results')  # results do not count
if [ -n "$dirty" ] && [ "${BENCH_ALLOW_DIRTY:-0}" != 1 ]; then
  echo "run.sh: the tree has uncommitted changes; commit them first (results name the commit)" >&2
  exit 1
fi
commit=$(git rev-parse --short HEAD)
load=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)
STEPS=${1:-6}
THREADS=${THREADS:-2}
BUILD=${RAG_BUILD:-build}
RAG_BENCH=${RAG_BENCH:-$BUILD/bench/rag_bench}
PY=${BENCH_PYTHON:-$(./dev bench-python)}
OUT=bench/results
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
export RAG_NUM_THREADS=$THREADS

# B = 8 everywhere. Pair programs (C = 384, Cp = 128): N_max = 32. Encoder (C = 64, 4 heads):
# N_max = 128. Small enough for a few minutes on 2 cores.
declare -A LENGTHS=(
  [pair:uniform]=30,31,32,30,32,31,32,30
  [pair:variable]=4,6,8,10,12,16,20,32
  [encoder:uniform]=120,124,128,122,126,128,125,121
  [encoder:variable]=8,16,24,32,48,64,96,128
)
JSONL=$OUT/peers.jsonl
: >"$JSONL"
cell() { # WANT LABEL COMMAND...: the command's JSON lines into $JSONL. WANT: the "fwd" values it
  # measures ("true false": the loss, then the training step); each it did not print becomes an
  # error line with the command's last message.
  local want=$1 label=$2; shift 2
  timeout "${CELL_TIMEOUT:-600}" "$@" >"$TMP/out" 2>"$TMP/err" || true
  grep '^{' "$TMP/out" | tee -a "$JSONL" || true
  local msg; msg=$(tail -n 1 "$TMP/err" | tr '"\\' "''" | cut -c1-200)
  for fwd in $want; do
    grep -q "\"fwd\": $fwd" "$TMP/out" ||
      echo "{$label, \"fwd\": $fwd, \"error\": \"${msg:-no output}\"}" | tee -a "$JSONL"
  done
}
for profile in uniform variable; do
  for case in square rect nonleading encoder; do
    kind=pair; [ "$case" = encoder ] && kind=encoder
    lengths=${LENGTHS[$kind:$profile]}
    dump=$TMP/$case-$profile
    base="\"case\": \"$case\", \"lengths\": \"$lengths\""
    echo "== $case $profile ($lengths)" >&2
    cell "true false" "$base, \"system\": \"rag\", \"mode\": \"ragged\", \"tier\": \"jit\"" \
      "$RAG_BENCH" "$case" "$lengths" --steps "$STEPS" --threads "$THREADS" --dump "$dump"
    cell "true false" "$base, \"system\": \"rag\", \"mode\": \"padded\", \"tier\": \"jit\"" \
      "$RAG_BENCH" "$case" "$lengths" --padded --steps "$STEPS" --threads "$THREADS"
    cell false "$base, \"system\": \"rag\", \"mode\": \"ragged\", \"tier\": \"interp\"" \
      "$RAG_BENCH" "$case" "$lengths" --tier interp --steps "$STEPS" --threads "$THREADS" --only train
    for peer in torch_padded torch_nested danling_nt; do
      cell "true false" "$base, \"system\": \"${peer//_/-}\"" \
        "$PY" "bench/peers/$peer.py" "$dump" --steps "$STEPS" --threads "$THREADS"
    done
  done
done
cat >"$TMP/header.md" <<EOF
Produced by \`bench/run.sh $STEPS\` in $(( $(date +%s) - start )) s on $(date -u +%Y-%m-%d), $(nproc) cores
($(lscpu | sed -n 's/^Model name: *//p' | head -1)), $THREADS threads per system, git $commit${dirty:+ + uncommitted changes (BENCH_ALLOW_DIRTY=1: not a result)};
load average at the start: $load; at the end: $(cut -d' ' -f1-3 /proc/loadavg). Peers: $("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo "torch not installed").
EOF
"$PY" bench/report.py "$JSONL" "$OUT/peers.md" "$OUT/peers.png" "$TMP/header.md"
