#!/usr/bin/env bash
# The cold first call of the relpos training steps (issue 18: under 1 s in a fresh process):
# `rag run examples/relpos_encoder.rag --fn F` with the disk cache off, RUNS fresh processes
# each, wall and user CPU of the whole process (start, compile, the step, exit). Refuses a
# dirty tree; writes bench/results/relpos_first_call.md naming the commit and the load.
#   bench/relpos/first_call.sh          (after ./dev build)        RUNS=5 bench/relpos/first_call.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${RAG_BUILD:-build}
RUNS=${RUNS:-5}
OUT=${OUT:-bench/results/relpos_first_call.md}
if [ -n "$(git status --porcelain --untracked-files=no -- . ':!bench/results')" ]; then
  echo "first_call.sh: the tree has uncommitted changes; commit them first" >&2
  exit 1
fi
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
{
  echo "# Cold first call of the relpos training steps (issue 18)"
  echo
  echo "Commit $(git rev-parse HEAD), $(date -u +%FT%TZ); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($(nproc) cores); load average $load_start at the start."
  echo "\`RAG_CACHE_DIR=off $BUILD/dsl/rag run examples/relpos_encoder.rag --fn F\`, $RUNS fresh processes each; wall and user CPU seconds of the whole process (start, compile, one step, exit), by /usr/bin/time. Written by bench/relpos/first_call.sh."
  echo
  echo "| function | wall s (median) | wall s (each) | user CPU s (median) |"
  echo "|---|---:|---|---:|"
  for fn in train_step_deberta train_step_txl; do
    walls=() users=()
    for _ in $(seq "$RUNS"); do
      /usr/bin/time -o "$tmp" -f "%e %U" env RAG_CACHE_DIR=off "$BUILD/dsl/rag" run \
        examples/relpos_encoder.rag --fn "$fn" >/dev/null
      read -r w u <"$tmp"
      walls+=("$w") users+=("$u")
    done
    med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
    echo "| $fn | $(med "${walls[@]}") | ${walls[*]} | $(med "${users[@]}") |"
  done
  echo
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
} >"$OUT"
cat "$OUT"
