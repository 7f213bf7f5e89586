"""bench/quality.py checks its arguments as the CLI does (issue #46, item 7): an unknown row, a --work that is a
file or not empty, numbers out of range and too few questions for both splits are one line, exit 2, before
anything runs (they were an empty table with exit 0, or tracebacks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from paths_helpers import BENCH

QUALITY = BENCH / "quality.py"


def _quality(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(QUALITY), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "dev.json").write_text(json.dumps([{"_id": f"q{i}", "question": f"Who made thing {i}?"} for i in range(3)]))
    return folder


@pytest.mark.parametrize("args, words", [
    (("--rows", "sft,bogus"), "unknown row 'bogus'"),
    (("--steps", "0"), "--steps 0: accepted is a whole number from 1"),
    (("--gmr-questions", "-1"), "--gmr-questions -1"),
])  # fmt: skip
def test_bad_arguments_are_one_line_exit_2(data, args, words):
    proc = _quality("--data", data, *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and words in proc.stderr, proc.stderr


def test_work_that_is_a_file_or_not_empty(data, tmp_path):
    work = tmp_path / "work.txt"
    work.write_text("mine")
    proc = _quality("--data", data, "--work", work)
    assert proc.returncode == 2 and "not a folder" in proc.stderr and work.read_text() == "mine", proc.stderr
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("mine")
    proc = _quality("--data", data, "--work", full)
    assert proc.returncode == 2 and "not empty" in proc.stderr


def test_too_few_questions_for_both_splits(data):
    proc = _quality("--data", data, "--questions", "1", "--rows", "bm25")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "both splits need one at least" in proc.stderr, proc.stderr
