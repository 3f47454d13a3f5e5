#!/usr/bin/env python3
"""Sums the results of every test suite (gtest XML, pytest JUnit XML) in a folder and prints
one final line 'N passed, N failed, N skipped' (which CI reads), after one line per reason for
skipping, so a skipped test is never silently counted as nothing. Exits 1 if anything failed or
no test ran."""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

passed = failed = skipped = 0
reasons = {}  # why tests were skipped -> how many
for f in sorted(Path(sys.argv[1]).glob("*.xml")):
    root = ET.parse(f).getroot()
    for case in root.iter("testcase"):
        skip = case.find("skipped")
        if skip is not None or case.get("result") == "skipped":
            skipped += 1
            # gtest: "file:line\nSKIPPED: reason"; pytest: the reason in the text (a skipped
            # module's message is only "collection skipped"). The last line says why.
            text = "" if skip is None else (skip.text or "").strip() or skip.get("message", "")
            lines = [l.strip() for l in text.splitlines() if l.strip()]
            key = (lines[-1] if lines else "no reason given")[:160]
            reasons[key] = reasons.get(key, 0) + 1
            continue
        bad = case.find("failure") is not None or case.find("error") is not None
        failed += bad
        passed += not bad
for f in sorted(Path(sys.argv[1]).glob("*.failed")):  # suites that crashed before writing XML
    failed += 1
for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
    print(f"skipped {n}: {why}")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed == 0 else 0)
