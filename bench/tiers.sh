#!/usr/bin/env bash
# Interpreter vs CPU JIT on the example training steps, same inputs, same machine, one run.
# usage: bench/tiers.sh [LENGTHS] [STEPS]      (default 32,96,64,8,128,40,16,80 and 6)
set -euo pipefail
cd "$(dirname "$0")/.."
RAG=${RAG:-build/dsl/rag}
LENGTHS=${1:-32,96,64,8,128,40,16,80}
STEPS=${2:-6}
printf '%-44s %12s %12s %8s\n' "program (lengths $LENGTHS)" "interp ms" "jit ms" "ratio"
for case in single_pair_single.rag:train_step single_pair_single.rag:train_step_rect \
            single_pair_single.rag:train_step_nonleading encoder.rag:train_step; do
  file=${case%%:*}; fn=${case##*:}
  ms() { "$RAG" run "examples/$file" --fn "$fn" --lengths "$LENGTHS" --steps "$STEPS" --tier "$1" \
           | sed -n 's/ ms\/step.*//p'; }
  i=$(ms interp); j=$(ms jit)
  printf '%-44s %12s %12s %7.2fx\n' "$file $fn" "$i" "$j" "$(echo "$i / $j" | bc -l)"
done
