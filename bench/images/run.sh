#!/usr/bin/env bash
# The image benchmark of issue 16: examples/fcn.rag and examples/vit.rag on B = 8 images
# (near_uniform: sides 96-112; variable: sides 32-224, aspect ratios 1:2 to 2:1), forward (the
# loss) and training step, ms/step and peak RSS growth, for rag ragged, rag padded, PyTorch
# padded (the same math with masks) and PyTorch padded channels_last, and DanLing's
# NestedTensor (the FCN only: it has no patches op), each in its own process on the same batch
# and rag's initial params. Writes bench/results/images.{jsonl,md}.
#   bench/images/run.sh   (after building bindings; ./dev bench-deps once)
#   CALLS=5 BUDGET=60 THREADS=2 bench/images/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
CALLS=${CALLS:-5}
BUDGET=${BUDGET:-60}
BUILD=${RAG_BUILD:-build}
PY=${BENCH_PYTHON:-$(./dev bench-python)}
OUT=${OUT:-bench/results}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
export RAG_NUM_THREADS=$THREADS PYTHONPATH=$BUILD/bindings
DIRTY=$(git status --porcelain -- . ':!bench/results')  # its own results do not count
[ -n "$DIRTY" ] && echo "run.sh: WARNING: the tree is dirty; the results will say so" >&2
JSONL=$OUT/images.jsonl
printf '{"meta": true, "commit": "%s", "dirty": %s, "date": "%s", "threads": %s, "loadavg_start": "%s", "calls": %s, "cpu": "%s"}\n' \
  "$(git rev-parse HEAD)" "$([ -n "$DIRTY" ] && echo true || echo false)" "$(date -u +%FT%TZ)" \
  "$THREADS" "$(cut -d' ' -f1-3 /proc/loadavg)" "$CALLS" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" >"$JSONL"
common="--calls $CALLS --budget $BUDGET --threads $THREADS"
for model in fcn vit; do
  for profile in near_uniform variable; do
    echo "== $model $profile" >&2
    dump=$TMP/$model-$profile.npz
    python3 bench/images/rag_images.py "$model" "$profile" $common --dump "$dump" | tee -a "$JSONL"
    python3 bench/images/rag_images.py "$model" "$profile" $common --padded | tee -a "$JSONL"
    "$PY" bench/images/torch_images.py "$model" "$dump" "$profile" $common | tee -a "$JSONL"
    "$PY" bench/images/torch_images.py "$model" "$dump" "$profile" $common --channels-last |
      tee -a "$JSONL"
    [ "$model" = fcn ] &&
      "$PY" bench/images/torch_images.py "$model" "$dump" "$profile" $common --danling |
      tee -a "$JSONL"
  done
done
printf '{"meta": true, "loadavg_end": "%s"}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$JSONL"
python3 bench/images/report.py "$JSONL" >"$OUT/images.md"
cat "$OUT/images.md"
