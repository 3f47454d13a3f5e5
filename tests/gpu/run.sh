#!/usr/bin/env bash
# The one script for a machine with an NVIDIA GPU (and the CUDA toolkit): every GPU test
# against the CPU tier's results, the CLI on the device, then bench/gpu when it exists.
#
#   tests/gpu/run.sh [BUILD]      (BUILD: a build folder with rag_gpu_test and dsl/rag;
#                                  default $RAG_BUILD, else build)
#
# The GPU machine may lack LLVM development packages and package registries: build here (the
# binaries link libLLVM-16.so dynamically, so carry a static build, see
# /work/shared/ENGINEERING.md) and copy it over. Exits non-zero if a test fails, and also if
# no device is usable (on a GPU machine every GPU test must run, not skip).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-${RAG_BUILD:-build}}
TEST=$BUILD/tests/rag_gpu_test
RAG=$BUILD/dsl/rag
for f in "$TEST" "$RAG"; do
  [ -x "$f" ] || { echo "run.sh: $f is missing; build first (./dev build)" >&2; exit 2; }
done

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "(no nvidia-smi)"

echo "== rag_gpu_test (PTX through ptxas; the driver; kernels on the device vs the CPU tier)"
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
"$TEST" --gtest_brief=0 2>&1 | tee "$LOG"
if grep -q "SKIPPED: no CUDA device" "$LOG"; then
  echo "run.sh: FAILED: no usable CUDA device, so the execution tests were skipped" >&2
  exit 1
fi

echo "== rag run --device cuda (every function of every example, CPU vs GPU summaries)"
for f in examples/*.rag; do
  for fn in $("$RAG" check "$f" >/dev/null && grep -oE '^fn [A-Za-z_][A-Za-z0-9_]*' "$f" | cut -c4-); do
    cpu=$("$RAG" run "$f" --fn "$fn" --seed 1 2>&1) || { echo "$cpu"; exit 1; }
    gpu=$("$RAG" run "$f" --fn "$fn" --seed 1 --device cuda 2>&1) || { echo "$gpu"; exit 1; }
    echo "-- $f $fn"
    echo "$gpu"
    # Printed statistics agree to the digits shown, up to last-digit rounding; show both.
    [ "$cpu" = "$gpu" ] || { echo "   (cpu)"; echo "$cpu" | sed 's/^/   /'; }
  done
done

if [ -x bench/gpu/run.sh ]; then
  echo "== bench/gpu"
  bench/gpu/run.sh "$BUILD" ${RAG_GPU_BENCH_ARGS:-}
else
  echo "== bench/gpu: not written yet (relative-position attention on the GPU is next)"
fi
