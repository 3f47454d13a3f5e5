#!/usr/bin/env bash
# The Pairformer benchmark (issue 15, bench/README.md): the four-block examples/pairformer.rag
# at B = 8, loss (fwd) and training step (train), rag ragged vs rag padded vs PyTorch padded with
# masks (torch_pairformer.py, on rag's initial params), on a near-uniform (pair occupancy ~0.94)
# and a highly variable (~0.32) profile, N_max = 48; each cell in its own process; writes
# bench/results/pairformer.{jsonl,md} naming the commit.
#   bench/pairformer/run.sh   (after building bindings and ./dev bench-deps)   CALLS=5 THREADS=2
# SYSTEMS="ragged padded torch" picks systems; TORCH_BUDGET caps a PyTorch cell's timed seconds
# (it stops after 3 calls once spent: its padded steps are the slowest).
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
CALLS=${CALLS:-5}
BUILD=${RAG_BUILD:-build}
OUT=${OUT:-bench/results}
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS RAG_NUM_THREADS=$THREADS
export PYTHONPATH=$BUILD/bindings
SYSTEMS=${SYSTEMS:-ragged padded torch}
TORCH_PY=$(./dev bench-python)
PARAMS=$(mktemp --suffix=.npz)
trap 'rm -f "$PARAMS"' EXIT
python3 bench/pairformer/cell.py --dump "$PARAMS"
DIRTY=$(git status --porcelain -- . ':!bench/results')
JSONL=$OUT/pairformer.jsonl
printf '{"meta": true, "commit": "%s", "dirty": %s, "date": "%s", "threads": %s, "loadavg_start": "%s", "cpu": "%s"}\n' \
  "$(git rev-parse HEAD)" "$([ -n "$DIRTY" ] && echo true || echo false)" "$(date -u +%FT%TZ)" \
  "$THREADS" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >"$JSONL"
for profile in ${PROFILES:-uniform variable}; do
  for what in ${WHATS:-fwd train}; do
    for system in $SYSTEMS; do
      if [ "$system" = torch ]; then
        "$TORCH_PY" bench/pairformer/torch_pairformer.py "$PARAMS" --profile $profile \
          --what $what --calls "$CALLS" --threads "$THREADS" --budget "${TORCH_BUDGET:-60}"
      else
        python3 bench/pairformer/cell.py --system $system --profile $profile --what $what \
          --calls "$CALLS"
      fi | tee -a "$JSONL"
    done
  done
done
printf '{"meta_end": true, "loadavg_end": "%s", "date_end": "%s"}\n' \
  "$(cut -d' ' -f1-3 /proc/loadavg)" "$(date -u +%FT%TZ)" >>"$JSONL"
python3 bench/pairformer/report.py "$JSONL" >"$OUT/pairformer.md"
cat "$OUT/pairformer.md"
