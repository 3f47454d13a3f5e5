#!/usr/bin/env bash
# Relative-position attention on the GPU next to PyTorch SDPA with a materialised bias and
# FlexAttention with a bias score_mod, on the same machine (tests/gpu/run.sh calls it).
#
#   bench/gpu/run.sh [BUILD] [--quick]     (BUILD: default $RAG_BUILD, else build)
#
# Writes bench/results/gpu_relpos_{rag,peers}.jsonl and the tables bench/results/gpu_relpos.md.
# --quick: N = 128, 1024, 8192 and 2 repetitions (fits a short device session).
# Peers need PyTorch with CUDA (and Triton for FlexAttention) in $RAG_BENCH_PYTHON (default
# python3); without it only rag's rows are written.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${RAG_BUILD:-build}
ARGS=()
for a in "$@"; do
  case "$a" in
    --quick) ARGS=(--lengths 128,1024,8192 --reps 2) ;;
    *) BUILD=$a ;;
  esac
done
BENCH=$BUILD/bench/gpu/rag_bench_gpu
[ -x "$BENCH" ] || { echo "bench/gpu/run.sh: $BENCH is missing; build first" >&2; exit 2; }
OUT=bench/results
mkdir -p "$OUT"
"$BENCH" "${ARGS[@]}" --json "$OUT/gpu_relpos_rag.jsonl"
PY=${RAG_BENCH_PYTHON:-python3}
files=("$OUT/gpu_relpos_rag.jsonl")
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  "$PY" bench/gpu/peers.py "${ARGS[@]}" --json "$OUT/gpu_relpos_peers.jsonl"
  files+=("$OUT/gpu_relpos_peers.jsonl")
else
  echo "bench/gpu/run.sh: no PyTorch with CUDA in $PY: peers skipped" >&2
fi
python3 bench/gpu/report.py "${files[@]}" >"$OUT/gpu_relpos.md"
cat "$OUT/gpu_relpos.md"
