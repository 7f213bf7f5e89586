"""Seconds each test file took in a whole-suite run (tests/durations.json), so `make test` starts the longest
files first (tests/conftest.py orders them; xdist's loadfile hands files out in that order).

pytest-xdist otherwise orders files by their number of tests, which starts the many quick files first and leaves
the few files that train or start vLLM to the end, where one worker runs them while the other idles. A file
missing from the record (a new one) counts as a median file; the record only orders work, so a stale one costs
time, never a result.

Refresh it after a change that moves time between files:
    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/junit.xml
    .venv/bin/python tests/durations_helpers.py /tmp/junit.xml > tests/durations.json
"""

from __future__ import annotations

import json
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from paths_helpers import TESTS

RECORD = TESTS / "durations.json"


def file_seconds() -> dict[str, float]:
    """Recorded seconds by test file (``chains/test_chains.py``); empty when the record is absent or unreadable."""
    try:
        record = json.loads(RECORD.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in record.items() if isinstance(v, (int, float))} if isinstance(record, dict) else {}


def longest_first(paths: list[str], seconds: dict[str, float]) -> list[str]:
    """``paths`` (test files relative to tests/) ordered by recorded seconds, longest first; unrecorded files count
    as the median recorded file; ties keep their given order."""
    default = statistics.median(seconds.values()) if seconds else 0.0
    return sorted(paths, key=lambda p: -seconds.get(p, default))


def from_junit(junit: Path) -> dict[str, float]:
    """Seconds per test file from pytest's JUnit XML (test case ``classname`` is the dotted module path)."""
    per_file: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        parts = (case.get("classname") or "").split(".")[1:]  # tests.<folder>.<module>[.<Class>]
        name = next((f for n in range(len(parts), 0, -1) if (TESTS / (f := "/".join(parts[:n]) + ".py")).is_file()), None)
        if name is not None:
            per_file[name] += float(case.get("time") or 0)
    return {name: round(per_file[name], 1) for name in sorted(per_file)}


if __name__ == "__main__":
    print(json.dumps(from_junit(Path(sys.argv[1])), indent=0, sort_keys=True))
