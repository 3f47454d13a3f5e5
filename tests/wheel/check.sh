#!/usr/bin/env bash
# The proof that the wheel installs anywhere (./dev wheel-check; not part of ./dev test, which
# never builds the wheel: ./dev wheel takes minutes). Usage: tests/wheel/check.sh WHEEL [BUILD]
#
# 1. The normal build ($BUILD/bindings, linked against Debian's LLVM and OpenBLAS) runs one
#    cold training step of examples/encoder.rag: the reference loss.
# 2. In a private mount namespace, Debian's LLVM, OpenBLAS (and the BLAS/LAPACK alternatives),
#    libedit, libgfortran, libz3 and libxml2 are hidden by bind-mounting empty files and
#    folders over them. Controls: dlopen("libopenblas.so.0") and `import rag` from the normal
#    build must now fail, or the hiding proves nothing.
# 3. There, a fresh venv: pip install WHEEL (numpy from the index), ldd finds every library
#    the extension needs inside the wheel or in glibc/libstdc++, and the same training step,
#    run from a folder outside the repository through rag.example(), gives the reference loss
#    bitwise. Prints the wheel's size and the install, import and first-call times (wall and
#    CPU seconds: on a loaded machine the wall clock of a nice'd process says little).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

fail() { echo "wheel-check: FAIL: $*" >&2; exit 1; }

# The libraries a machine without Debian's packages lacks (rag's own apt dependencies and
# what static LLVM could pull in).
LIBDIR=/usr/lib/x86_64-linux-gnu
HIDDEN_DIRS=(/usr/lib/llvm-16 "$LIBDIR/openblas-pthread" "$LIBDIR/blas" "$LIBDIR/lapack")
HIDDEN_GLOBS=(libLLVM libclang libopenblas libblas liblapack libedit libgfortran libquadmath libz3
  libxml2)

hide_libraries() { # run inside the mount namespace
  local empty_dir=$1 empty_file=$2
  for d in "${HIDDEN_DIRS[@]}"; do [ -d "$d" ] && mount --bind "$empty_dir" "$d"; done
  for g in "${HIDDEN_GLOBS[@]}"; do
    for f in "$LIBDIR/$g"*.so*; do
      [ -e "$f" ] && mount --bind "$empty_file" "$f"
    done
  done
  return 0
}

if [ "${1:-}" = --inside ]; then
  shift
  wheel=$1 build=$2 work=$3
  hide_libraries "$work/empty" "$work/empty.so"
  cd "$work"
  unset PYTHONPATH
  # Controls: with these hidden, the system's OpenBLAS and the normal build cannot load.
  if python3 -c 'import ctypes; ctypes.CDLL("libopenblas.so.0")' 2>/dev/null; then
    fail "libopenblas.so.0 still loads: the hiding did not work"
  fi
  if PYTHONPATH="$build/bindings" python3 -c 'import rag' 2>"$work/control.err"; then
    fail "the normal build imports with the libraries hidden: the hiding proves nothing"
  fi
  echo "control: the normal build cannot import here: $(tail -n 1 "$work/control.err")"

  python3 -m venv "$work/venv"
  start=$(date +%s.%N)
  "$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" ||
    fail "pip install $wheel"
  install_s=$(echo "$(date +%s.%N) - $start" | bc)
  ext=$(echo "$work"/venv/lib/python3*/site-packages/rag/_rag*.so)
  [ -f "$ext" ] || fail "no rag/_rag*.so installed"
  ldd "$ext" >"$work/ldd.txt"
  if grep -q 'not found' "$work/ldd.txt"; then
    cat "$work/ldd.txt"
    fail "the installed extension misses libraries"
  fi
  # Outside the venv only what the manylinux policy lets a wheel assume: glibc, libstdc++,
  # libgcc_s, zlib.
  outside=$(awk '$3 ~ /^\// {print $3}' "$work/ldd.txt" | grep -v "^$work/venv/" |
    grep -vE '/(libc|libm|libmvec|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libz|ld-linux[^/]*)\.so' ||
    true)
  [ -z "$outside" ] || fail "the extension loads libraries from outside the wheel: $outside"
  echo "bundled: $(awk '$3 ~ /rag.libs/ {print $1}' "$work/ldd.txt" | tr '\n' ' ')"

  start=$(date +%s.%N)
  "$work/venv/bin/python" -c 'import rag' || fail "import rag"
  import_process_s=$(echo "$(date +%s.%N) - $start" | bc)
  RAG_CACHE_DIR="$work/cache-wheel" "$work/venv/bin/python" "$HERE/encoder_step.py" \
    >"$work/wheel.json" || fail "the encoder step from the wheel"
  echo "wheel:     $(cat "$work/wheel.json")"
  echo "install_s=$install_s import_process_s=$import_process_s" >"$work/times.txt"
  exit 0
fi

[ $# -ge 1 ] || { echo "usage: tests/wheel/check.sh WHEEL [BUILD]" >&2; exit 2; }
wheel=$(realpath "$1")
build=$(realpath "${2:-$HERE/../../build}")
[ -f "$wheel" ] || fail "no wheel $wheel"
[ -d "$build/bindings/rag" ] || fail "no normal build at $build (./dev build)"
work=$(mktemp -d /tmp/rag-wheel-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/empty"
: >"$work/empty.so"
# The same thread count on both sides: the loss is compared bitwise.
export RAG_NUM_THREADS=2

# Every example program ships in the wheel (bindings/rag/examples/meson.build lists them).
python3 - "$wheel" "$HERE/../../examples" <<'EOF' || fail "examples missing from the wheel"
import pathlib, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
missing = [p.name for p in sorted(pathlib.Path(sys.argv[2]).glob("*.rag"))
           if f"rag/examples/{p.name}" not in names]
if missing:
    sys.exit(f"not in the wheel: {missing} (add them to bindings/rag/examples/meson.build)")
EOF

(cd "$work" && RAG_CACHE_DIR="$work/cache-ref" PYTHONPATH="$build/bindings" \
  python3 "$HERE/encoder_step.py" >"$work/ref.json") || fail "the encoder step from $build"
echo "reference: $(cat "$work/ref.json")"

# root may unshare the mount namespace directly; anyone else through a user namespace.
userns=(); [ "$(id -u)" -eq 0 ] || userns=(-r)
unshare "${userns[@]}" -m --propagation private bash "$0" --inside "$wheel" "$build" "$work"

python3 - "$work" "$wheel" <<'EOF'
import json, os, sys
work, wheel = sys.argv[1], sys.argv[2]
ref = json.load(open(f"{work}/ref.json"))
got = json.load(open(f"{work}/wheel.json"))
times = dict(kv.split("=") for kv in open(f"{work}/times.txt").read().split())
if got["loss_bits"] != ref["loss_bits"] or got["loss2_bits"] != ref["loss2_bits"]:
    sys.exit(f"wheel-check: FAIL: losses differ: wheel {got['loss']} ({got['loss_bits']}, "
             f"{got['loss2_bits']}), normal build {ref['loss']} ({ref['loss_bits']}, {ref['loss2_bits']})")
print(f"wheel-check: OK: {os.path.basename(wheel)} {os.path.getsize(wheel) / 2**20:.1f} MiB; "
      f"loss {got['loss']} bitwise equal to the normal build's (two steps); "
      f"pip install {float(times['install_s']):.1f} s; "
      f"a whole python -c 'import rag' {float(times['import_process_s']):.2f} s")
print("wall s (CPU s)    wheel            normal build")
for key, label in (("import", "import rag"), ("first_call", "first train_step"),
                   ("warm_call", "warm train_step")):
    cell = lambda d: f"{d[key + '_s']:.3f} ({d[key + '_cpu_s']:.3f})"
    print(f"{label:17} {cell(got):16} {cell(ref)}")
EOF
