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


@pytest.fixture(scope="module")
def big_inputs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("big")
    write_wiki_dump(root / "wiki", 200_000, docs_per_file=50_000, compress=False)
    write_hotpot_array(root / "hotpot_train_v1.1.json", 10_000)
    return [root / "wiki", root / "hotpot_train_v1.1.json"]


def _command(inputs: list[Path], out: Path) -> list[str]:
    return [sys.executable, "-m", "grtool", "-q", "corpus", "ingest", *map(str, inputs), "--out", str(out)]


def _kill_when(cmd: list[str], ready, timeout: float = 300) -> None:
    """Start the command and SIGKILL it as soon as ``ready()`` is true."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            assert proc.poll() is None, "the run ended before it could be killed mid-way"
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def reference(big_inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "out"
    subprocess.run(_command(big_inputs, out), check=True, capture_output=True)
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
    first_shard = out / "documents" / "_shards" / "part-00000.json"
    _kill_when(_command(big_inputs, out), first_shard.exists)
    manifest = json.loads((out / "documents" / "_manifest.json").read_bytes())
    done = list((out / "documents" / "_shards").glob("part-*.json"))
    assert 1 <= len(done) < manifest["num_parts"]  # really killed mid-way
    assert not list(out.glob("questions/part-*.parquet"))
    proc = subprocess.run(_command(big_inputs, out), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    _same_rows(reference, out)
    assert not (out / "_ingest_work").exists()
    cli("validate", out)


def test_killed_while_reading_inputs_resumes_to_the_same_rows(big_inputs, reference, tmp_path, cli):
    out = tmp_path / "out"
    buckets = out / "_ingest_work" / "documents"
    _kill_when(_command(big_inputs, out), lambda: buckets.is_dir() and any(buckets.iterdir()))
    assert not (out / "_ingest_work" / "plan.json").exists()
    assert not list(out.rglob("part-*.parquet"))  # nothing visible from a run that never finished reading
    proc = subprocess.run(_command(big_inputs, out), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    _same_rows(reference, out)
    cli("validate", out)
