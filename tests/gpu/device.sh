#!/usr/bin/env bash
# On a device machine (the device tool's `run`), after `tar xJf gpu-bundle.tar.xz` in the
# repository root (./dev gpu-bundle makes it here): the GPU tests and the CLI against the CPU
# tier (tests/gpu/run.sh), then the quick GPU benchmark; logs and tables go to $OUT when set.
#
#   tests/gpu/device.sh [--full]     (--full: every N of the benchmark, not --quick)
set -uo pipefail
cd "$(dirname "$0")/../.."
export RAG_SOURCE_DIR="$PWD"
export LD_LIBRARY_PATH="$PWD/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT=${OUT:-/tmp/rag-gpu-out}
mkdir -p "$OUT"
QUICK=--quick
[ "${1:-}" = "--full" ] && QUICK=
# run.sh runs the benchmark itself; pass --quick through RAG_GPU_BENCH_ARGS.
RAG_GPU_BENCH_ARGS=$QUICK tests/gpu/run.sh gpu-bundle/build 2>&1 | tee "$OUT/gpu.log"
status=${PIPESTATUS[0]}
cp bench/results/gpu_relpos* "$OUT/" 2>/dev/null || true
echo "device.sh: tests/gpu/run.sh exited $status"
exit "$status"
