"""The one part loop (`grtool.store.partloop`): `chains gold` and `filters apply` run on it as the model stages do.

Each shard record carries its part's wall `seconds` and `rows_per_second`; a finished part is kept (its files and
record untouched) and only a missing part is written again, with the same bytes; a record an older grtool wrote,
without the timing, still reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grtool.records import DamagedRecord
from grtool.store.partloop import Bar, LoopPart, Output, PartLoop
from grtool.store.records import ShardRecord, load_manifest, load_shard_records, read_shard_record
from grtool.store.schemas import TRIPLES
from grtool.store.stage import StageSpec
from grtool.triples.evidence import write_evidence_stage
from chains_helpers import TWO_WIKI


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The tests' own 2Wiki records ingested in parts of 4 questions, its evidence triples, gold chains and their filtering."""
    from conftest import run_cli

    root = tmp_path_factory.mktemp("partloop")
    run_cli("-q", "corpus", "ingest", TWO_WIKI, "--out", root / "corpus", "--rows-per-part", "4")
    assert write_evidence_stage(root / "corpus", root / "triples") > 0
    run_cli("-q", *gold_args(root))
    run_cli("-q", *filter_args(root))
    return root


def gold_args(root: Path) -> list:
    return ["chains", "gold", root / "corpus", "--triples", root / "triples", "--out", root / "chains"]


def filter_args(root: Path) -> list:
    return ["filters", "apply", root / "chains", "--corpus", root / "corpus", "--triples", root / "triples", "--out", root / "filtered"]


def check_timing(record: ShardRecord) -> None:
    seconds, rate = record.seconds, record.rows_per_second
    assert 0 <= seconds < 600
    if seconds == 0:
        assert rate is None
    else:
        assert rate >= 0 and abs(rate * seconds - record.rows) <= 0.01 * seconds


@pytest.mark.parametrize("stage", ["chains", "filtered"])
def test_every_part_records_its_seconds_and_rows_per_second(cli, run: Path, stage: str) -> None:
    records = load_shard_records(run / stage)
    assert len(records) >= 3 and sum(r.rows for r in records.values()) > 0
    listed = load_manifest(run / stage).shards
    for name, record in records.items():
        check_timing(record)
        assert (listed[name].seconds, listed[name].rows_per_second) == (record.seconds, record.rows_per_second)
    status = json.loads(cli("status", run / stage, "--json").stdout)
    assert status["seconds"] == pytest.approx(sum(r.seconds for r in records.values()), abs=1e-3)
    if status["seconds"]:
        assert status["rows_per_second"] == pytest.approx(status["rows"] / status["seconds"], rel=1e-3)
    shown = cli("status", run / stage, env={"COLUMNS": "250"})
    assert "rows/s" in shown.stdout + shown.stderr


@pytest.mark.parametrize("stage, args", [("filtered", filter_args), ("chains", gold_args)])
def test_a_rerun_keeps_finished_parts_and_writes_only_the_missing_one_again(cli, run: Path, stage: str, args) -> None:
    """The finished parts' files and records are not rewritten (a rewritten record would carry new seconds); the
    removed part comes back byte for byte. `filtered` first: the chains it read stay as they were."""
    out = run / stage
    files = {f.relative_to(out): f.read_bytes() for f in [*out.glob("part-*.parquet"), *(out / "_shards").glob("*.json"), *(out / "_rejects").glob("*.jsonl")]}
    removed = [out / "part-00001.parquet", out / "_shards" / "part-00001.json"]
    before = read_shard_record(removed[1])
    for f in removed:
        f.unlink()
    cli("-q", *args(run))
    for name, data in files.items():
        if name != Path("_shards/part-00001.json"):
            assert (out / name).read_bytes() == data, name
    after = read_shard_record(removed[1])
    assert (after.rows, after.sha256, after.counters) == (before.rows, before.sha256, before.counters)
    check_timing(after)


def test_a_shard_record_without_timing_still_reads(cli, run: Path, tmp_path: Path) -> None:
    """Shard records an older grtool wrote have no seconds: they read, validate and show as not timed."""
    import shutil

    old = tmp_path / "chains"
    shutil.copytree(run / "chains", old)
    manifest = json.loads((old / "_manifest.json").read_text())
    for f in (old / "_shards").glob("*.json"):
        record = json.loads(f.read_text())
        del record["seconds"], record["rows_per_second"]
        f.write_text(json.dumps(record))
        for key in ("seconds", "rows_per_second"):
            del manifest["shards"][f.stem][key]
    (old / "_manifest.json").write_text(json.dumps(manifest))
    assert read_shard_record(old / "_shards" / "part-00000.json").seconds is None
    cli("validate", old)
    status = json.loads(cli("status", old, "--json").stdout)
    assert status["seconds"] is None and status["rows_per_second"] is None and status["complete"]
    # a resume over them keeps them as they are
    cli("-q", "chains", "gold", run / "corpus", "--triples", run / "triples", "--out", old)
    assert read_shard_record(old / "_shards" / "part-00000.json").seconds is None


@pytest.mark.parametrize("field, value", [("seconds", -1.0), ("rows_per_second", 1e300), ("seconds", "fast")])
def test_a_timing_out_of_bounds_is_refused_naming_its_field(run: Path, tmp_path: Path, field: str, value) -> None:
    record = json.loads((run / "chains" / "_shards" / "part-00000.json").read_text())
    record[field] = value
    f = tmp_path / "part-00000.json"
    f.write_text(json.dumps(record))
    with pytest.raises(DamagedRecord, match=f"field {field}"):
        read_shard_record(f)


def test_the_loop_writes_only_what_an_output_lacks_and_stops_when_a_part_asks(tmp_path: Path) -> None:
    """Two outputs, three parts: a part one output already has is written only to the other; a part that asks
    to stop is committed and no further part starts; the next run does what is left."""
    outputs = [Output(tmp_path / name, StageSpec("triples", TRIPLES)) for name in ("a", "b")]

    def row(i: int) -> dict:
        return {"doc_id": f"d{i}", "idx": 0, "head": "h", "relation": "r", "tail": "t", "docid": "<h, r, t>"}

    loop = PartLoop(outputs[1:], 3)
    loop.run(lambda part: part.shard.write_rows([row(part.index)]), parts=[1])
    loop.finish(check_empty=False)

    seen: list[tuple[str, int]] = []

    def write(part: LoopPart) -> None:
        seen.append(("part", part.index))
        for shard in part.shards:
            if shard is not None:
                shard.write_rows([row(part.index)])
        if part.index == 1:
            part.stop()

    loop = PartLoop(outputs, 3)
    assert (loop.finished, loop.todo) == ([], [0, 1, 2])
    bar = Bar("toy")
    assert loop.run(write, bar, before_part=lambda i: seen.append(("before", i))) == ["part-00000", "part-00001"]
    assert seen == [("before", 0), ("part", 0), ("before", 1), ("part", 1)] and bar.task is not None
    loop.finish(check_empty=False)
    b_record = (tmp_path / "b" / "_shards" / "part-00001.json").read_bytes()
    loop = PartLoop(outputs, 3)
    assert (loop.finished, loop.todo) == ([0, 1], [2])
    assert loop.run(write) == ["part-00002"]
    manifests = loop.finish()
    assert [m.complete for m in manifests] == [True, True] and [m.rows for m in manifests] == [3, 3]
    assert (tmp_path / "b" / "_shards" / "part-00001.json").read_bytes() == b_record  # written by the first run only


def test_outputs_with_their_own_part_counts_get_a_shard_only_for_their_parts(tmp_path: Path) -> None:
    """One output of one part, another of three: the loop runs three parts, the first output gets a shard in part 0
    only; each output's manifest counts its own parts."""

    def row(i: int) -> dict:
        return {"doc_id": f"d{i}", "idx": 0, "head": "h", "relation": "r", "tail": "t", "docid": "<h, r, t>"}

    outputs = [Output(tmp_path / "one", StageSpec("triples", TRIPLES)), Output(tmp_path / "three", StageSpec("triples", TRIPLES), num_parts=3)]
    loop = PartLoop(outputs, 1, num_shards=1, shard_index=0)
    assert loop.todo == [0, 1, 2]
    given: list[list[bool]] = []

    def write(part: LoopPart) -> None:
        given.append([shard is not None for shard in part.shards])
        for shard in part.shards:
            if shard is not None:
                shard.write_rows([row(part.index)])

    loop.run(write)
    manifests = loop.finish()
    assert given == [[True, True], [False, True], [False, True]]
    assert [(m.num_parts, m.rows, m.complete) for m in manifests] == [(1, 1, True), (3, 3, True)]
    again = PartLoop(outputs, 1, num_shards=1, shard_index=0)
    assert (again.finished, again.todo) == ([0, 1, 2], [])


def test_a_report_is_claimed_before_the_stage_runs_and_a_second_run_writing_it_is_refused_at_once(cli, run: Path, tmp_path: Path) -> None:
    """A report, plot or JSON file is claimed like every output (`claim_file`): before, it took no lock, so two runs
    writing one --report both did all their work, and the last to finish replaced the other's file."""
    import os
    import subprocess
    import sys
    import time

    report, holds = tmp_path / "filters.md", tmp_path / "holds"
    holds.mkdir()
    args = ["filters", "apply", run / "chains", "--corpus", run / "corpus", "--triples", run / "triples", "--report", report]
    first = subprocess.Popen([sys.executable, "-m", "grtool", *map(str, args), "--out", str(tmp_path / "first")], stderr=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, env={**os.environ, "GRTOOL_HOLD": f"locked:{holds}"})  # fmt: skip
    try:
        while not (holds / "locked.reached").exists():  # a state, not a time: it holds the report, nothing else yet
            assert first.poll() is None, first.stderr.read().decode()[-3000:]
            time.sleep(0.01)
        assert not (tmp_path / "first").exists()
        second = cli(*args, "--out", tmp_path / "second", check=75)
        assert f"{report}: is being written by another run: pid {first.pid}" in second.stderr
        assert not (tmp_path / "second").exists() and not report.exists()  # refused before any work
    finally:
        (holds / "locked.release").write_text("")
        _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err.decode()[-3000:]
    assert report.read_text().startswith("#") and json.loads((tmp_path / ".filters.md.grtool-file.json").read_text())["format"] == "grtool-file"
    assert not list(tmp_path.glob(".*.grtool.lock"))  # the claim let go of its lock


def _report_args(run: Path, out: Path, report: Path) -> list:
    return ["filters", "apply", run / "chains", "--corpus", run / "corpus", "--triples", run / "triples", "--out", out, "--report", report]


@pytest.mark.parametrize("planted", ["a link to a file", "a link to nothing", "a directory"])
def test_what_is_planted_at_a_report_s_lock_is_refused_and_never_written_through(cli, run: Path, tmp_path: Path, planted: str) -> None:
    """The lock file was opened following links: a link planted at `.r.md.grtool.lock` had its target replaced with
    the holder's line (another user's file, in a shared folder); a directory there gave a traceback."""
    precious, lock = tmp_path / "precious.txt", tmp_path / ".r.md.grtool.lock"
    precious.write_text("precious\n")
    if planted == "a directory":
        lock.mkdir()
    else:
        lock.symlink_to(precious if planted == "a link to a file" else tmp_path / "made-by-the-lock")
    err = cli(*_report_args(run, tmp_path / "f", tmp_path / "r.md"), check=2).stderr
    what = "a directory" if planted == "a directory" else "a symbolic link"
    assert f"{lock}: is {what} where grtool keeps the lock of the output beside it: remove it" in err
    assert precious.read_text() == "precious\n" and not (tmp_path / "made-by-the-lock").exists()
    assert not (tmp_path / "f").exists() and not (tmp_path / "r.md").exists()


def test_a_run_refused_after_its_report_was_claimed_leaves_no_folder_it_made_for_it(cli, tmp_path: Path) -> None:
    """The claim's lock needs the report's folder; a run that then writes no report removes the folders it made."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cli("eval", "compare", f"a={bad}", f"b={bad}", "--out", tmp_path / "new" / "deeper" / "r.md", check=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]


def test_a_dry_run_claims_no_summary_file(cli, tmp_path: Path, write_pipeline, examples) -> None:
    config = write_pipeline([{"name": "ingest", "run": "corpus ingest", "args": [examples / "generic" / "questions_dev.jsonl", examples / "generic" / "documents.jsonl"],
                              "options": {"dataset": "generic", "out": "{out}/corpus"}}])  # fmt: skip
    cli("pipeline", "run", config, "--dry-run", "--json", tmp_path / "a" / "b" / "summary.json")
    assert not (tmp_path / "a").exists()


def test_a_run_stopped_while_it_holds_its_report_s_lock_leaves_no_lock_file(run: Path, tmp_path: Path) -> None:
    import signal

    from hold_helpers import held

    proc = held(_report_args(run, tmp_path / "f", tmp_path / "r.md"), "locked", signal.SIGTERM, tmp_path / "holds")
    assert proc.returncode == 75, proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["holds"]


def test_a_report_changed_since_grtool_wrote_it_is_the_user_s_and_never_replaced(cli, run: Path, tmp_path: Path) -> None:
    """The record of a report names its bytes: before, any file beside a record passed for grtool's, so a report
    edited by hand, or a user's file put where a stopped first write had left only its record, was replaced."""
    import signal

    from hold_helpers import held

    report = tmp_path / "r.md"
    args = _report_args(run, tmp_path / "f", report)
    assert held(args, "recorded", signal.SIGKILL, tmp_path / "holds").returncode == -signal.SIGKILL
    assert not report.exists() and (tmp_path / ".r.md.grtool-file.json").is_file()  # a first write stopped: its record only
    report.write_text("my own notes\n")
    err = cli(*args, "--overwrite", check=2).stderr
    assert f"--report {report}: was changed since grtool wrote it" in err and report.read_text() == "my own notes\n"
    report.unlink()
    cli(*args, "--overwrite")  # written whole, its record naming its bytes
    written = report.read_bytes()
    assert held([*args, "--overwrite"], "recorded", signal.SIGKILL, tmp_path / "holds2").returncode == -signal.SIGKILL
    assert report.read_bytes() == written  # the new record is in, the old report stays: it is still grtool's
    cli(*args, "--overwrite")
    report.write_text(report.read_text() + "\nmy comment\n")  # edited by hand
    assert "was changed since grtool wrote it" in cli(*args, "--overwrite", check=2).stderr
    assert report.read_text().endswith("my comment\n")


def test_what_stands_where_a_report_s_record_goes_is_named_before_any_work(cli, run: Path, tmp_path: Path) -> None:
    """A directory there failed the run after its work, with a traceback; a damaged record beside a report was
    called missing ("no .r.md.grtool-file.json beside it")."""
    report, record = tmp_path / "r.md", tmp_path / ".r.md.grtool-file.json"
    record.mkdir()
    err = cli(*_report_args(run, tmp_path / "f", report), check=2).stderr
    assert f"{record} is a directory where grtool keeps the file's record" in err and not (tmp_path / "f").exists()
    record.rmdir()
    report.write_text("mine\n")
    record.write_text("{not json")
    err = cli(*_report_args(run, tmp_path / "f", report), check=2).stderr
    assert f"{record}, where grtool keeps the file's record, is damaged or not a record grtool wrote" in err and report.read_text() == "mine\n"
    report.unlink()  # no report, and a user's notes where its record goes: refused, the notes kept (before: replaced)
    record.write_text("my notes\n")
    assert "is damaged or not a record grtool wrote" in cli(*_report_args(run, tmp_path / "f", report), check=2).stderr
    assert record.read_text() == "my notes\n" and not report.exists()


def test_one_process_never_holds_two_claims_of_one_file(tmp_path: Path) -> None:
    """The lock lets its holder in again (a pipeline's stages in turn), and both claims would write the same
    temporary file: a second claim of the same file while the first is held is refused."""
    from grtool.errors import InputError
    from grtool.store.partloop import claim_file

    with claim_file(tmp_path / "r.md", "--report") as first:
        with pytest.raises(InputError, match="this run writes it already"):
            with claim_file(tmp_path / "link" / ".." / "r.md", "--plot"):
                pass
        first.write(b"# report\n")
    with claim_file(tmp_path / "r.md", "--report") as again:  # let go with its block
        again.write(b"# again\n")
    assert (tmp_path / "r.md").read_bytes() == b"# again\n"


def test_validate_judges_a_report_by_the_bytes_its_record_names(cli, run: Path, tmp_path: Path) -> None:
    """Before: `validate r.md` failed every report grtool wrote ("a file grtool cannot validate")."""
    report = tmp_path / "r.md"
    cli(*_report_args(run, tmp_path / "f", report))
    assert "ok" in cli("validate", report).stderr
    report.write_text(report.read_text() + "my note\n")
    err = cli("validate", report, check=1).stderr
    assert "changed since grtool wrote it" in err
    report.unlink()
    assert "missing, but .r.md.grtool-file.json records it" in cli("validate", report, check=1).stderr
