"""First-call time of a program built on the standard library against the same model written
with its own layers (issue 21: the library is parsed and checked once per process, so using it
must not slow a program's start).

Each repetition is a fresh process (the library's one-time parse is included) that loads the
program and makes the first call of train_step (lowering, planning and compiling included).
The compiled-object disk cache is off (RAG_CACHE_DIR is a fresh empty directory per process),
so the first call compiles everything. Median of --reps (>= 5) after one warm-up process.

    git show f0c572c:examples/gpt.rag > /tmp/gpt_own_layers.rag
    PYTHONPATH=build/bindings python3 bench/stdlib/startup.py /tmp/gpt_own_layers.rag \
        examples/gpt.rag [--reps 7]
writes bench/results/stdlib_startup.md naming the commit."""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np, rag
t1 = time.perf_counter()
m = rag.load(sys.argv[1])
t2 = time.perf_counter()
ids = rag.ragged([np.arange(n, dtype=np.int32) % 97 for n in (33, 100, 7)])
p, s = m.init("Gpt", seed=0), m.init("Adam[Gpt]")
t3 = time.perf_counter()
loss, p, s = m.train_step(ids, p, s, 1e-3)
t4 = time.perf_counter()
print(json.dumps({"load": t2 - t1, "first_call": t4 - t3, "loss": float(loss)}))
"""


TINY = r"""
import json, time, rag
src = "fn g(x: f32[]) -> f32[] { return x }"
t0 = time.perf_counter(); rag.compile(src); t1 = time.perf_counter()
for _ in range(20): rag.compile(src)
t2 = time.perf_counter()
print(json.dumps({"first": t1 - t0, "later": (t2 - t1) / 20}))
"""


def tiny():
    out = subprocess.run([sys.executable, "-c", TINY], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def one(path):
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, RAG_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env, check=True,
                             capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    progs = (("own layers", a.old), ("stdlib layers", a.new))
    runs = {label: [] for label, _ in progs}
    for _, path in progs:
        one(path)  # warm-up (page cache, Python imports)
    for _ in range(a.reps):  # interleaved, so drift in the machine's load hits both alike
        for label, path in progs:
            runs[label].append(one(path))
    rows = {label: {k: statistics.median(r[k] for r in rs) for k in ("load", "first_call")}
            for label, rs in runs.items()}
    parse = [tiny() for _ in range(a.reps)]
    lines = [f"# Standard library: first-call time (commit {commit})", "",
             f"GPT example (examples/gpt.rag shape), fresh process per run, no disk cache, "
             f"median of {a.reps} after a warm-up; shared noisy 2-core machine.", "",
             "| program | load (ms) | first train_step call (ms) |", "|---|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['load'] * 1e3:.1f} | {r['first_call'] * 1e3:.0f} |")
    first = statistics.median(p["first"] for p in parse) * 1e3
    later = statistics.median(p["later"] for p in parse) * 1e3
    lines += ["", "A one-function program (no layers), fresh process: the first `rag.compile` "
              f"(which parses and checks the library once) {first:.2f} ms, each later one "
              f"{later:.2f} ms (median of {a.reps})."]
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / "results" / "stdlib_startup.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
