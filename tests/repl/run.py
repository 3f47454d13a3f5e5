#!/usr/bin/env python3
"""Scripted `rag repl` sessions: runs `rag repl` with each tests/repl/NAME.in on stdin (a pipe,
so there are no prompts and no echo), compares stdout+stderr with NAME.out and prints one
result line per session.

    python3 tests/repl/run.py [--rag BUILD/dsl/rag] [--junit OUT.xml] [--update] [NAME ...]

--rag      the rag binary (default: $RAG_BUILD/dsl/rag, else build/dsl/rag)
--junit    write a JUnit XML report there: one <testcase> per session, <failure> on mismatch
--update   rewrite the .out files with what rag prints now
NAME       run only these sessions (file stems)

Sessions run from the repository root (so `:load examples/...` works) with HOME set to an
empty temporary folder. Timings vary from run to run, so before comparing, the numbers in
`wall time: 1.234 ms` and `compile_ms=12.345` are replaced by <ms>; a session that exits with
a non-zero status gets a last line `[exit status N]`. Exits 1 if any session fails.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TIMEOUT_S = 300
MASKS = [
    (re.compile(r"wall time: [0-9.]+ ms"), "wall time: <ms> ms"),
    (re.compile(r"compile_ms=[0-9.]+"), "compile_ms=<ms>"),
]


def normalise(text):
    for pattern, repl in MASKS:
        text = pattern.sub(repl, text)
    return text


def run_session(rag, script, home):
    with open(script, "rb") as stdin:
        try:
            p = subprocess.run([str(rag), "repl"], stdin=stdin, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, cwd=ROOT, timeout=TIMEOUT_S,
                               env=dict(os.environ, HOME=home))
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode("utf-8", "replace")
            return normalise(out) + f"[timed out after {TIMEOUT_S} s]\n"
    out = normalise(p.stdout.decode("utf-8", "replace"))
    if p.returncode != 0:
        out += f"[exit status {p.returncode}]\n"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_build = Path(os.environ.get("RAG_BUILD", ROOT / "build"))
    ap.add_argument("--rag", type=Path, default=default_build / "dsl" / "rag")
    ap.add_argument("--junit", type=Path)
    ap.add_argument("--update", action="store_true")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()

    rag = args.rag.resolve()
    scripts = sorted(HERE.glob("*.in"))
    if args.names:
        scripts = [s for s in scripts if s.stem in args.names]
        missing = set(args.names) - {s.stem for s in scripts}
        if missing:
            print(f"repl: no session named {', '.join(sorted(missing))}", file=sys.stderr)
            return 2
    if not rag.is_file():
        print(f"repl: no rag binary at {rag} (build first, or pass --rag)", file=sys.stderr)
        return 2

    suite = ET.Element("testsuite", name="repl")
    failed = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rag-repl-home-") as home:
        for script in scripts:
            expected_path = script.with_suffix(".out")
            t0 = time.monotonic()
            actual = run_session(rag, script, home)
            seconds = time.monotonic() - t0
            case = ET.SubElement(suite, "testcase", classname="repl", name=script.stem,
                                 time=f"{seconds:.3f}")
            if args.update:
                expected_path.write_text(actual, encoding="utf-8")
                print(f"updated  {script.stem} ({seconds:.1f} s)")
                continue
            expected = expected_path.read_text(encoding="utf-8") if expected_path.exists() else None
            if expected == actual:
                print(f"ok       {script.stem} ({seconds:.1f} s)")
                continue
            failed += 1
            if expected is None:
                detail = f"{expected_path.name} is missing; run with --update to create it\n"
            else:
                detail = "".join(difflib.unified_diff(
                    expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                    fromfile=f"{script.stem}.out (expected)", tofile=f"{script.stem} (actual)"))
            print(f"FAILED   {script.stem} ({seconds:.1f} s)")
            sys.stdout.write(detail)
            failure = ET.SubElement(case, "failure", message=f"{script.stem}: transcript differs")
            failure.text = detail
    suite.set("tests", str(len(scripts)))
    suite.set("failures", str(failed))
    suite.set("time", f"{time.monotonic() - started:.3f}")
    if args.junit:
        args.junit.parent.mkdir(parents=True, exist_ok=True)
        root = ET.Element("testsuites")
        root.append(suite)
        ET.ElementTree(root).write(args.junit, encoding="utf-8", xml_declaration=True)
    print(f"repl: {len(scripts) - failed} passed, {failed} failed")
    return 1 if failed or not scripts else 0


if __name__ == "__main__":
    sys.exit(main())
