"""Two runs writing one output at once: the second waits for nothing and loses nothing (issue 17, item 1).

A second whole run of a stage into a directory another run is writing fails fast (exit 75: try again later)
naming the live run; array tasks with distinct shard indices still write one directory together.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grtool.corpus.synthetic import write_hotpot_array
from grtool.errors import GrtoolError
from grtool.store.schemas import DOCUMENTS
from grtool.store.stage import StageSpec, StageWriter, read_table
from grtool.store.locks import run_lock


@pytest.fixture(scope="module")
def big_input(tmp_path_factory) -> Path:
    return write_hotpot_array(tmp_path_factory.mktemp("big") / "hotpot_train_v1.1.json", 20_000)


def _command(inputs: list[Path], out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grtool", "-q", "corpus", "ingest", *map(str, inputs), "--out", str(out), *extra]


@pytest.fixture(scope="module")
def reference(big_input, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "out"
    subprocess.run(_command([big_input], out), check=True, capture_output=True)
    return out


def _same_rows(a: Path, b: Path) -> None:
    for table in ("documents", "questions"):
        ta, tb = read_table(a / table), read_table(b / table)
        assert ta.num_rows > 0 and ta.equals(tb), table


def _start_second_while_first_reads(first_cmd: list[str], second_cmd: list[str], out: Path):
    """Start one run, start the second once the first is reading its inputs, wait for both."""
    first = subprocess.Popen(first_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "_ingest_work").exists():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = subprocess.run(second_cmd, capture_output=True, text=True)
    first_was_running = first.poll() is None
    _, first_err = first.communicate(timeout=300)
    return first, first_err, second, first_was_running


def test_two_identical_ingests_at_once_lose_no_rows(big_input, reference, tmp_path, cli):
    out = tmp_path / "out"
    cmd = _command([big_input], out)
    first, first_err, second, first_was_running = _start_second_while_first_reads(cmd, cmd, out)
    assert first.returncode == 0, first_err
    if first_was_running:  # the second run started while the first was live: refused, naming it
        assert second.returncode == 75, second.stderr
        msg = " ".join(second.stderr.split())
        assert f"pid {first.pid}" in msg and "corpus ingest" in msg and "started" in msg, msg
    else:
        assert second.returncode in (0, 75), second.stderr
    _same_rows(reference, out)
    cli("validate", out)


def test_a_concurrent_run_with_other_parameters_does_not_mix(big_input, reference, tmp_path, cli):
    out = tmp_path / "out"
    first, first_err, second, first_was_running = _start_second_while_first_reads(_command([big_input], out), _command([big_input], out, "--split", "dev"), out)
    assert first.returncode == 0, first_err
    # A live run: try again later (75); a finished run with other parameters: a usage error (2).
    assert second.returncode in ((75,) if first_was_running else (2, 75)), second.stderr
    _same_rows(reference, out)
    for table in ("documents", "questions"):
        assert json.loads((out / table / "_manifest.json").read_bytes())["params"]["split"] is None
    cli("validate", out)


# ------------------------------------------------------------------ the lock itself, for every stage


SPEC = StageSpec("documents", DOCUMENTS, params={"p": 1}, command=["grtool", "test", "stage"])


def _hold(path: str, shards, ready, release) -> None:
    """Child process: open a stage writer as a whole run or an array task and keep it open."""
    writer = StageWriter(path, SPEC, num_parts=4, shards=shards)
    ready.set()
    release.wait(60)
    writer.finish()


@pytest.fixture
def holder(tmp_path):
    ctx = mp.get_context("spawn")
    started = []

    def start(shards):
        ready, release = ctx.Event(), ctx.Event()
        p = ctx.Process(target=_hold, args=(str(tmp_path / "docs"), shards, ready, release))
        p.start()
        assert ready.wait(60)
        started.append((p, release))
        return p

    yield start
    for p, release in started:
        release.set()
        p.join(30)


def test_a_second_whole_run_fails_fast_naming_the_live_one(tmp_path, holder):
    p = holder(None)
    with pytest.raises(GrtoolError) as e:
        StageWriter(tmp_path / "docs", SPEC, num_parts=4)
    assert e.value.exit_code == 75  # try again later
    msg = str(e.value)
    assert f"pid {p.pid}" in msg and "grtool test stage" in msg and "started" in msg and "host" in msg


def test_array_tasks_with_distinct_indices_run_together(tmp_path, holder):
    holder((2, 0))
    other = StageWriter(tmp_path / "docs", SPEC, num_parts=4, shards=(2, 1))
    with other.shard(1) as sh:
        sh.count_in(0)
    other.finish()
    with pytest.raises(GrtoolError, match=r"task 0 of 2"):  # the same index twice: a duplicate task
        StageWriter(tmp_path / "docs", SPEC, num_parts=4, shards=(2, 0))
    with pytest.raises(GrtoolError, match=r"array task 0 of 2.*pid"):  # a whole run while a task writes
        StageWriter(tmp_path / "docs", SPEC, num_parts=4)


def test_an_array_task_waits_for_nothing_while_a_whole_run_writes(tmp_path, holder):
    p = holder(None)
    with pytest.raises(GrtoolError, match=rf"pid {p.pid}"):
        StageWriter(tmp_path / "docs", SPEC, num_parts=4, shards=(2, 1))


def test_the_lock_is_released_when_the_run_ends(tmp_path):
    first = StageWriter(tmp_path / "docs", SPEC, num_parts=4)
    with first.shard(0) as sh:
        sh.count_in(0)
    first.finish()
    assert not (tmp_path / "docs" / "_run.lock").exists()  # no lock file left behind
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    release.set()
    p = ctx.Process(target=_hold, args=(str(tmp_path / "docs"), None, ready, release))
    p.start()
    p.join(60)
    assert p.exitcode == 0  # a later run got the directory


def test_run_lock_of_a_run_directory(tmp_path):
    with run_lock(tmp_path / "run", command=["grtool", "corpus", "ingest"]):
        with run_lock(tmp_path / "run"):  # the same process again (a pipeline): re-entrant
            pass
        assert (tmp_path / "run" / "_run.lock").exists()
