#!/usr/bin/env bash
# The text benchmark of issue 14 (see bench/README.md): BERT-Tiny and the small GPT on
# IMDB-shaped batches of 64 (random: rho ~0.32; bucketed: rho ~0.98), forward (the loss) and
# training step (forward, backward, clip_norm, AdamW), ms/step and peak RSS growth, for rag
# ragged, rag padded, PyTorch padded (SDPA with masks), torch.nested (jagged), DanLing
# NestedTensor, each in its own process on the same batch and rag's initial params; then the
# embedding and Adam microbenchmarks. Writes bench/results/text.{jsonl,md}.
#   bench/text/run.sh                 (after building bindings; ./dev bench-deps once)
#   MODELS="bert gpt bert_small" PROFILES="random bucketed" PEERS="torch-padded ..." MICRO=1
#   CALLS=5 BUDGET=60 THREADS=2 NAME=text bench/text/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
CALLS=${CALLS:-5}
BUDGET=${BUDGET:-60}
MODELS=${MODELS:-bert gpt}
PROFILES=${PROFILES:-random bucketed}
PEERS=${PEERS:-torch-padded torch-nested danling-nt}
NAME=${NAME:-text}   # results: $OUT/$NAME.{jsonl,md}
BUILD=${RAG_BUILD:-build}
PY=${BENCH_PYTHON:-$(./dev bench-python)}
OUT=${OUT:-bench/results}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
export RAG_NUM_THREADS=$THREADS PYTHONPATH=$BUILD/bindings
DIRTY=$(git status --porcelain -- . ':!bench/results')  # its own results do not count
[ -n "$DIRTY" ] && echo "run.sh: WARNING: the tree is dirty; the results will say so" >&2
JSONL=$OUT/$NAME.jsonl
{ printf '{"meta": true, "commit": "%s", "dirty": %s, "date": "%s", "threads": %s, ' \
    "$(git rev-parse HEAD)" "$([ -n "$DIRTY" ] && echo true || echo false)" "$(date -u +%FT%TZ)" "$THREADS"
  printf '"loadavg_start": "%s", "calls": %s, "budget_s": %s, "cpu": "%s", "torch": "%s"}\n' \
    "$(cut -d' ' -f1-3 /proc/loadavg)" "$CALLS" "$BUDGET" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
    "$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; } >"$JSONL"
cell() { # LABEL COMMAND...: its JSON lines into $JSONL, or one error line with its last message
  local label=$1; shift
  timeout "${CELL_TIMEOUT:-1200}" "$@" >"$TMP/out" 2>"$TMP/err" || true
  if grep -q '^{' "$TMP/out"; then grep '^{' "$TMP/out" | tee -a "$JSONL"; else
    echo "{$label, \"error\": \"$(grep -E 'Error|error' "$TMP/err" | tail -n 1 | tr '"\\' "''" | cut -c1-200)\"}" |
      tee -a "$JSONL"; fi
}
common="--calls $CALLS --budget $BUDGET --threads $THREADS"
for model in $MODELS; do
  for profile in $PROFILES; do
    echo "== $model $profile" >&2
    base="\"model\": \"$model\", \"profile\": \"$profile\""
    dump=$TMP/$model-$profile.npz
    cell "$base, \"system\": \"rag-ragged\"" python3 bench/text/rag_text.py "$model" "$profile" \
      $common --dump "$dump"
    cell "$base, \"system\": \"rag-padded\"" python3 bench/text/rag_text.py "$model" "$profile" \
      $common --padded
    for peer in $PEERS; do
      cell "$base, \"system\": \"$peer\"" "$PY" bench/text/torch_text.py "$peer" "$dump" \
        "$model" "$profile" $common
    done
  done
done
[ "${MICRO:-1}" = 1 ] && cell '"bench": "micro"' python3 bench/text/micro.py --threads "$THREADS" --calls "$CALLS"
printf '{"meta": true, "loadavg_end": "%s"}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$JSONL"
python3 bench/text/report.py "$JSONL" "$OUT/$NAME.md"
