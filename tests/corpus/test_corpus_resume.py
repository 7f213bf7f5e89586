"""A SIGKILLed ingest, run again with the same command, gives exactly the rows of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grtool.corpus.synthetic import write_hotpot_array, write_wiki_dump
from grtool.store.stage import read_table


ROWS_PER_PART = "400"  # several parts from small inputs


@pytest.fixture(scope="module")
def big_inputs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("big")
    write_wiki_dump(root / "wiki", 2_000, docs_per_file=500, compress=False)
    write_hotpot_array(root / "hotpot_train_v1.1.json", 300)
    return [root / "wiki", root / "hotpot_train_v1.1.json"]


def _args(inputs: list[Path], out: Path) -> list[str]:
    return ["-q", "corpus", "ingest", *map(str, inputs), "--out", str(out), "--rows-per-part", ROWS_PER_PART]


def _kill_at(point: str, args: list[str], holds: Path) -> None:
    """Run ``grtool ARGS`` in a process of its own, held at the named point (grtool/holds.py), and SIGKILL it there:
    a state, never a race with the clock."""
    holds.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "grtool", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "GRTOOL_HOLD": f"{point}:{holds}"})  # fmt: skip
    try:
        while not (holds / f"{point}.reached").is_file():
            assert proc.poll() is None, f"the run ended before it reached {point}: {proc.stderr.read()[-2000:]!r}"
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()


@pytest.fixture(scope="module")
def reference(big_inputs, tmp_path_factory) -> Path:
    from conftest import run_cli

    out = tmp_path_factory.mktemp("ref") / "out"
    run_cli(*_args(big_inputs, out))
    return out


def _same_rows(a: Path, b: Path) -> None:
    for table in ("documents", "questions"):
        ta, tb = read_table(a / table), read_table(b / table)
        assert ta.num_rows > 0 and ta.equals(tb), table


def test_reference_has_several_parts(reference):
    manifest = json.loads((reference / "documents" / "_manifest.json").read_bytes())
    assert manifest["num_parts"] >= 3 and manifest["complete"]
    assert manifest["counters"]["merged"] > 0  # the array's paragraphs repeat across questions


def test_killed_while_writing_shards_resumes_to_the_same_rows(big_inputs, reference, tmp_path, cli):
    out = tmp_path / "out"
    _kill_at("committed", _args(big_inputs, out), tmp_path / "holds")  # the first part committed, the next not begun
    manifest = json.loads((out / "documents" / "_manifest.json").read_bytes())
    done = list((out / "documents" / "_shards").glob("part-*.json"))
    assert len(done) == 1 < manifest["num_parts"]  # really killed mid-way
    assert not list(out.glob("questions/part-*.parquet"))
    cli(*_args(big_inputs, out))
    _same_rows(reference, out)
    assert not (out / "_ingest_work").exists()
    cli("validate", out)


def test_killed_while_reading_inputs_resumes_to_the_same_rows(big_inputs, reference, tmp_path, cli):
    out = tmp_path / "out"
    _kill_at("spilled", _args(big_inputs, out), tmp_path / "holds")  # every row in the buckets, no plan yet
    buckets = out / "_ingest_work" / "documents"
    assert buckets.is_dir() and any(buckets.iterdir())
    assert not (out / "_ingest_work" / "plan.json").exists()
    assert not list(out.rglob("part-*.parquet"))  # nothing visible from a run that never finished reading
    cli(*_args(big_inputs, out))
    _same_rows(reference, out)
    cli("validate", out)
