#!/usr/bin/env bash
# Builds the parser fuzzer (libFuzzer + ASan + UBSan, clang++-16) into OUT_DIR and runs it for
# SECONDS seconds (default 60) over the seeds in tests/fuzz/corpus. Exits non-zero on a crash,
# leaving the crashing input in OUT_DIR (crash-*, oom-*, timeout-*).
#   usage: tests/fuzz/run.sh [OUT_DIR] [SECONDS]        OUT_DIR defaults to build-fuzz
# Reproduce a crash: OUT_DIR/parser_fuzz OUT_DIR/crash-<hash>
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/build-fuzz}" && cd "${1:-$ROOT/build-fuzz}" && pwd)
SECONDS_TO_RUN=${2:-60}
CXX=${CXX_FUZZ:-clang++-16}

"$CXX" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$ROOT" \
  "$ROOT/frontend/source.cpp" "$ROOT/frontend/parser.cpp" "$ROOT/frontend/ast_print.cpp" \
  "$ROOT/tests/fuzz/parser_fuzz.cpp" -o "$OUT/parser_fuzz"

# New inputs go to OUT/corpus; the checked-in seeds are only read.
mkdir -p "$OUT/corpus"
"$OUT/parser_fuzz" "$OUT/corpus" "$ROOT/tests/fuzz/corpus" \
  -dict="$ROOT/tests/fuzz/rag.dict" -max_total_time="$SECONDS_TO_RUN" -max_len=8192 \
  -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$OUT/" -print_final_stats=1
