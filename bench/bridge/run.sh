#!/usr/bin/env bash
# The PyTorch bridge benchmark of issue 17 (see bench/bridge/bridge.py and ddp_time.py): the
# encoder training step through rag.torch against the rag function called directly, and the
# DDP step on 1 and 2 gloo ranks. Refuses a dirty tree (its own results aside); records the
# commit and the load average at the start and the end. Writes bench/results/bridge.{jsonl,md}.
#   bench/bridge/run.sh                  (after ./dev build; ./dev bench-deps once)
#   CALLS=41 STEPS=11 THREADS=2 bench/bridge/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
CALLS=${CALLS:-41}
STEPS=${STEPS:-11}
THREADS=${THREADS:-2}
BUILD=${RAG_BUILD:-build}
PY=${BENCH_PYTHON:-$(./dev bench-python)}
OUT=${OUT:-bench/results}
if [ -n "$(git status --porcelain -- . ':!bench/results')" ]; then
  echo "bench/bridge/run.sh: the tree is dirty; commit first (results name their commit)" >&2
  exit 1
fi
export PYTHONPATH=$BUILD/bindings OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
JSONL=$OUT/bridge.jsonl
{ printf '{"meta": true, "commit": "%s", "date": "%s", "loadavg_start": "%s", "cpu": "%s", ' \
    "$(git rev-parse HEAD)" "$(date -u +%FT%TZ)" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  printf '"cores": %s, "torch": "%s"}\n' "$(nproc)" \
    "$("$PY" -c 'import torch; print(torch.__version__)')"; } >"$JSONL"
"$PY" bench/bridge/bridge.py --calls "$CALLS" --threads "$THREADS" | tee -a "$JSONL"
for r in 1 2; do
  "$PY" bench/bridge/ddp_time.py --ranks "$r" --steps "$STEPS" | grep '^{' | tee -a "$JSONL"
done
printf '{"meta": true, "loadavg_end": "%s"}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$JSONL"
"$PY" bench/bridge/report.py "$JSONL" >"$OUT/bridge.md"
cat "$OUT/bridge.md"
