"""Issue 36 §6: signals that land after the work, messages that fit the command, what a killed run leaves.

Nothing here races a clock: a run is held at a named point (grtool/holds.py, ``GRTOOL_HOLD=POINT:DIR``), the
signal is sent while it waits there, then it is released; the test asserts what the rule says (exit 75 or 130,
the output complete and valid), never how long anything took.

- ``finished``: the command's work is done, its outputs complete. A SIGTERM there exited 0 or, about 4 times in
  10, killed the process (-15): the handler was put back to the default before the interpreter's teardown.
- ``exiting``: the last moment before the process ends (its exit callbacks have run).
- ``locked``: a run holds its output, before writing anything: the stop line of a command without parts does not
  promise that "finished parts are kept".
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from conftest import EXAMPLES, run_cli
from hold_helpers import held

GENERIC = [EXAMPLES / "generic" / "questions_dev.jsonl", EXAMPLES / "generic" / "documents.jsonl"]


def ingest_args(out: Path) -> list[str]:
    return ["corpus", "ingest", *map(str, GENERIC), "--dataset", "generic", "--out", str(out)]


@pytest.mark.parametrize("point", ["finished", "exiting"])
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 75), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_after_the_work_exits_with_its_code_and_the_output_is_complete(tmp_path, point, signum, code):
    out = tmp_path / "corpus"
    proc = held(ingest_args(out), point, signum, tmp_path / "holds")
    assert proc.returncode == code, proc.stderr  # never -15 / -2: the process is not killed by the signal
    said = " ".join(proc.stderr.split())
    assert f"{signal.Signals(signum).name} received after the command's work was done" in said, proc.stderr
    assert "Traceback" not in proc.stderr
    run_cli("validate", out)  # complete, and nothing left behind that validate would name
    assert "temporary file" not in run_cli("validate", out).stderr


def test_a_late_sigterm_after_a_json_summary_keeps_stdout_whole(tmp_path):
    out = tmp_path / "corpus"
    proc = held([*ingest_args(out), "--json"], "finished", signal.SIGTERM, tmp_path / "holds")
    assert proc.returncode == 75, proc.stderr
    assert json.loads(proc.stdout)  # the summary printed before the signal is all there


def test_without_a_hold_the_command_exits_0(tmp_path):
    """The hold points cost nothing when unset, and the exit path (no interpreter teardown) keeps the code."""
    run_cli(*ingest_args(tmp_path / "corpus"))
    run_cli("validate", tmp_path / "corpus")


# ----------------------------------------------------------------------------- messages that fit the command


def test_a_stage_stopped_before_its_first_part_does_not_promise_finished_parts(tmp_path):
    proc = held(ingest_args(tmp_path / "corpus"), "locked", signal.SIGTERM, tmp_path / "holds")
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 75, proc.stderr
    assert "nothing was finished yet; run the same command again" in said and "finished parts are kept" not in said, proc.stderr


def test_a_stopped_export_does_not_promise_finished_parts(tmp_path):
    corpus = tmp_path / "corpus"
    run_cli(*ingest_args(corpus))
    out = tmp_path / "gmr.jsonl"
    proc = held(["export", "gmr", str(corpus), "--out", str(out)], "locked", signal.SIGTERM, tmp_path / "holds")
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 75, proc.stderr
    assert "SIGTERM received" in said and "run the same command again" in said, proc.stderr
    assert "parts" not in said, proc.stderr
    assert not out.exists()


# ----------------------------------------------------------------------------- what a killed run leaves


def test_a_killed_run_s_temporary_files_are_named_by_validate_and_removed_by_the_next_run(tmp_path):
    """A run killed with SIGKILL mid-part leaves `part-*.parquet.<host>-<pid>.tmp` (and records being written);
    validate names them (exit 0: the stage is what its record says) and the next run removes them."""
    out = tmp_path / "corpus"
    run_cli(*ingest_args(out))
    stage = out / "documents"
    left = [stage / "part-00000.parquet.node7-4242.tmp", stage / "_manifest.json.4242.tmp", stage / "_shards" / "part-00000.json.4242.tmp", stage / "_rejects" / "part-00000.jsonl.node7-4242.tmp"]
    for f in left:
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(b"half written")
    report = run_cli("validate", stage)
    said = " ".join(report.stderr.split()) + " ".join(report.stdout.split())
    assert "4 temporary files left by a killed run" in said and "part-00000.parquet.node7-4242.tmp" in said, said
    mine = [stage / "notes.tmp", stage / "_rejects" / "draft.tmp"]  # a user's: neither named nor removed
    for f in mine:
        f.write_bytes(b"mine")
    assert "4 temporary files left by a killed run" in " ".join(run_cli("validate", stage).stderr.split())
    run_cli(*ingest_args(out))  # the same command: resumes (nothing to do) and removes them
    assert not any(f.exists() for f in left) and all(f.read_bytes() == b"mine" for f in mine)
    assert "temporary file" not in run_cli("validate", stage).stderr


def test_a_killed_run_at_a_known_point_leaves_a_stage_the_next_run_completes(tmp_path):
    """SIGKILL (no cleanup at all) while the run holds its output: the next run takes the output and finishes."""
    out = tmp_path / "corpus"
    proc = held(ingest_args(out), "locked", signal.SIGKILL, tmp_path / "holds")
    assert proc.returncode == -signal.SIGKILL
    run_cli(*ingest_args(out))
    run_cli("validate", out)
