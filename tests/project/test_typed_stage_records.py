"""The records of stage directories and pipeline runs are read through their declarations (DESIGN §8): a manifest,
a shard record, a stop, a pipeline stage record or a Slurm job record edited in any way the declaration refuses
makes `status`, `validate` and the resume of the same command say so in one line naming the file and the field,
exit 1 or 2: never a traceback, a hang (the subprocess timeout is only a guard) or an answer.

The edits are kinds, not cases: wrong types, missing fields, negative and huge numbers, NaN and 1e999 written as
JSON text, swapped fields, extra nesting, a list for an object, a file name pointing elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

import slurm_fakes
from conftest import EXAMPLES
from inprocess_helpers import grtool_run
from grtool.pipeline.config import load_pipeline
from grtool.store.stage import read_table

GUARD_S = 60  # a hang guard, not a timing assertion
SRC = ("hotpotqa", "hotpot_dev_distractor_v1.example.json")
RAW = "@@raw@@"


def grtool(*args: Any, process: bool = False) -> subprocess.CompletedProcess:
    """In this process (tests/inprocess_helpers.py); ``process``: a child, where a hang is the failure looked for."""
    return grtool_run(args, env={"COLUMNS": "400"}, process=process, timeout=GUARD_S)


def assert_named(proc: subprocess.CompletedProcess, file: Path | str, fields: tuple[str, ...]) -> None:
    """Exit 1 or 2, no traceback, and one line naming ``file`` and one of ``fields``."""
    text = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2), f"exit {proc.returncode}\n{text}"
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if str(file) in line and any(f in line for f in fields)]
    assert lines, f"no line names {file} and {fields}:\n{text}"


# ---- edits: each takes the record's JSON value and returns the text to write


def _at(record: Any, path: str) -> tuple[Any, str]:
    """The object holding the field at the dotted ``path``, and the field's own name."""
    *parents, last = path.split(".")
    for key in parents:
        record = record[key]
    return record, last


def setting(path: str, value: Any) -> Callable[[Any], str]:
    """Set the field at the dotted ``path`` to ``value`` (``RAW + text``: the JSON text itself, e.g. NaN)."""

    def edit(record: Any) -> str:
        target, last = _at(record, path)
        raw = isinstance(value, str) and value.startswith(RAW)
        target[last] = RAW if raw else value
        text = json.dumps(record, indent=2)
        return text.replace(json.dumps(RAW), value[len(RAW) :]) if raw else text

    return edit


def removing(path: str) -> Callable[[Any], str]:
    def edit(record: Any) -> str:
        target, last = _at(record, path)
        del target[last]
        return json.dumps(record)

    return edit


def nesting(path: str) -> Callable[[Any], str]:
    """The field's value wrapped in an object of its own name: ``{"rows": {"rows": 3}}``."""

    def edit(record: Any) -> str:
        target, last = _at(record, path)
        target[last] = {last: target[last]}
        return json.dumps(record)

    return edit


def swapping(a: str, b: str) -> Callable[[Any], str]:
    def edit(record: Any) -> str:
        record[a], record[b] = record[b], record[a]
        return json.dumps(record)

    return edit


def as_list(record: Any) -> str:
    return json.dumps([record])


def emptied(record: Any) -> str:
    return ""


STOP = {"task": "all", "kind": "guard", "guard": "--max-empty-share", "numbers": {"share": 0.5}, "message": "m", "exit_code": 1,
        "when": "2026-01-01T00:00:00+00:00", "command": ["grtool"], "accepted": None}  # fmt: skip

MANIFEST_EDITS: dict[str, tuple[Callable[[Any], str], tuple[str, ...]]] = {
    "num_parts 10**12 (the issue's)": (setting("num_parts", 10**12), ("num_parts",)),
    "created not a time": (setting("created", "9999-99-99T99:99:99"), ("created",)),
    "num_parts a string": (setting("num_parts", "2"), ("num_parts",)),
    "num_parts true": (setting("num_parts", True), ("num_parts",)),
    "num_parts negative": (setting("num_parts", -1), ("num_parts",)),
    "num_parts NaN": (setting("num_parts", RAW + "NaN"), ("num_parts",)),
    "num_parts 1e999": (setting("num_parts", RAW + "1e999"), ("num_parts",)),
    "num_parts a float": (setting("num_parts", 2.5), ("num_parts",)),
    "num_parts missing": (removing("num_parts"), ("num_parts",)),
    "num_parts nested": (nesting("num_parts"), ("num_parts",)),
    "num_parts fewer than the parts recorded": (setting("num_parts", 1), ("num_parts", "shards")),
    "num_parts more than the complete stage lists": (setting("num_parts", 5), ("complete",)),
    "rows negative": (setting("rows", -5), ("rows",)),
    "rows 10**12": (setting("rows", 10**12), ("rows",)),
    "rows Infinity": (setting("rows", RAW + "Infinity"), ("rows",)),
    "table unknown": (setting("table", "documentz"), ("table",)),
    "table missing": (removing("table"), ("table",)),
    "table a list": (setting("table", ["documents"]), ("table",)),
    "table and num_parts swapped": (swapping("table", "num_parts"), ("table", "num_parts")),
    "shards [1, 2] (the issue's)": (setting("shards", [1, 2]), ("shards",)),
    "shards entry file pointing elsewhere": (setting("shards.part-00000.file", "../x"), ("shards.part-00000.file",)),
    "shards entry file of another part": (setting("shards.part-00000.file", "part-00001.parquet"), ("file",)),
    "shards entry sha256 not a digest": (setting("shards.part-00000.sha256", "zz"), ("shards.part-00000.sha256",)),
    "shards entry rows NaN": (setting("shards.part-00000.rows", RAW + "NaN"), ("rows",)),
    "shards key not a part": (lambda m: json.dumps({**m, "shards": {"../part": m["shards"]["part-00000"]}}), ("shards",)),
    "counters.in negative": (setting("counters.in", -3), ("counters.in",)),
    "counters.rejected a fraction": (setting("counters.rejected", {"x": 1.5}), ("counters.rejected",)),
    "counters nested": (nesting("counters"), ("counters",)),
    "stops a list": (setting("stops", []), ("stops",)),
    "stop kind unknown": (setting("stops", {"all": {**STOP, "kind": "oops"}}), ("stops.all.kind",)),
    "stop exit_code 10**12": (setting("stops", {"all": {**STOP, "exit_code": 10**12}}), ("stops.all.exit_code",)),
    "stop under another task": (setting("stops", {"3/4": STOP}), ("stops.3/4",)),
    "inputs a string": (setting("inputs", "abc"), ("inputs",)),
    "params a list": (setting("params", []), ("params",)),
    "schema an object": (setting("schema", {}), ("schema",)),
    "complete a string": (setting("complete", "yes"), ("complete",)),
    "the whole manifest a list": (as_list, ("object", "array")),
    "empty file": (emptied, ("JSON", "manifest")),
}

SHARD_EDITS: dict[str, tuple[Callable[[Any], str], tuple[str, ...]]] = {
    "rows a string": (setting("rows", "3"), ("rows",)),
    "finished not a time": (setting("finished", "yesterday"), ("finished",)),
    "rows negative": (setting("rows", -1), ("rows",)),
    "rows 10**20": (setting("rows", 10**20), ("rows",)),
    "rows nested": (nesting("rows"), ("rows",)),
    "bytes NaN": (setting("bytes", RAW + "NaN"), ("bytes",)),
    "bytes 1e999": (setting("bytes", RAW + "1e999"), ("bytes",)),
    "bytes -0.5": (setting("bytes", -0.5), ("bytes",)),
    "sha256 short": (setting("sha256", "abc"), ("sha256",)),
    "sha256 missing": (removing("sha256"), ("sha256",)),
    "file pointing elsewhere": (setting("file", "../x"), ("file",)),
    "file an absolute path": (setting("file", "/etc/passwd"), ("file",)),
    "file of another part": (setting("file", "part-00000.parquet"), ("file",)),
    "part of another part": (setting("part", "part-00000"), ("part",)),
    "rejects_file elsewhere": (setting("rejects_file", "/etc/passwd"), ("rejects_file",)),
    "seconds negative": (setting("seconds", -1.5), ("seconds",)),
    "rows_per_second NaN": (setting("rows_per_second", RAW + "NaN"), ("rows_per_second",)),
    "counters a list": (setting("counters", []), ("counters",)),
    "counters.in negative": (setting("counters.in", -1), ("counters.in",)),
    "counters.extra a string": (setting("counters.extra", {"a": "b"}), ("counters.extra",)),
    "rows and sha256 swapped": (swapping("rows", "sha256"), ("rows", "sha256")),
    "the whole record a list": (as_list, ("object", "array")),
    "empty file": (emptied, ("JSON", "shard record")),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, Path]:
    """A small real run directory (two documents parts, one questions part) and its source, made once."""
    root = tmp_path_factory.mktemp("typed")
    src = root / SRC[1]
    shutil.copyfile(EXAMPLES / SRC[0] / SRC[1], src)
    proc = grtool("-q", "corpus", "ingest", src, "--out", root / "out", "--rows-per-part", "10")
    assert proc.returncode == 0, proc.stderr
    assert (root / "out" / "documents" / "part-00001.parquet").is_file()
    return root / "out", src


@pytest.fixture
def run_dir(template, tmp_path) -> Path:
    shutil.copytree(template[0], tmp_path / "out")
    return tmp_path / "out"


def _resume(template, out: Path, process: bool = False) -> subprocess.CompletedProcess:
    return grtool("-q", "corpus", "ingest", template[1], "--out", out, "--rows-per-part", "10", process=process)


def _edit(path: Path, edit: Callable[[Any], str]) -> None:
    path.write_text(edit(json.loads(path.read_text())))


def _damaged_copies(template, root: Path, edits: dict, record: str) -> dict[str, Path]:
    """One copy of the run directory per edit, under ``root``, with ``record`` (relative to it) edited."""
    copies = {}
    for i, (case, (edit, _)) in enumerate(sorted(edits.items())):
        out = root / f"case-{i:02d}"
        shutil.copytree(template[0], out)
        _edit(out / record, edit)
        copies[case] = out / record
    return copies


@pytest.mark.parametrize("edits, record", [(MANIFEST_EDITS, "documents/_manifest.json"), (SHARD_EDITS, "documents/_shards/part-00001.json")],
                         ids=["manifest", "shard record"])  # fmt: skip
def test_validate_lists_every_damaged_record(template, tmp_path, edits, record):
    """One validate over every damaged copy at once: each is one line naming its file and field, exit 1."""
    copies = _damaged_copies(template, tmp_path, edits, record)
    proc = grtool("validate", tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    for case, path in copies.items():
        assert_named(proc, path, edits[case][1])


@pytest.mark.parametrize("case", sorted(MANIFEST_EDITS))
def test_a_damaged_manifest_stops_status_and_resume(template, run_dir, case):
    edit, fields = MANIFEST_EDITS[case]
    manifest = run_dir / "documents" / "_manifest.json"
    _edit(manifest, edit)
    for proc in (grtool("status", run_dir, "--json"), _resume(template, run_dir)):
        assert_named(proc, manifest, fields)


@pytest.mark.parametrize("case", sorted(SHARD_EDITS))
def test_a_damaged_shard_record_stops_status_and_resume(template, run_dir, case):
    edit, fields = SHARD_EDITS[case]
    record = run_dir / "documents" / "_shards" / "part-00001.json"
    _edit(record, edit)
    for proc in (grtool("status", run_dir / "documents"), _resume(template, run_dir)):
        assert_named(proc, record, fields)


def test_shard_records_that_are_not_parts_of_the_stage(template, run_dir):
    shards = run_dir / "documents" / "_shards"
    stray = shards / "part-x.json"
    shutil.copyfile(shards / "part-00001.json", stray)
    for proc in (grtool("status", run_dir / "documents"), grtool("validate", run_dir), _resume(template, run_dir)):
        assert_named(proc, stray, ("part-NNNNN",))
    stray.unlink()
    past = shards / "part-00007.json"  # a record of a part the manifest does not plan (num_parts is 2)
    record = json.loads((shards / "part-00001.json").read_text())
    past.write_text(json.dumps({**record, "part": "part-00007", "file": "part-00007.parquet"}))
    for proc in (grtool("status", run_dir / "documents"), grtool("validate", run_dir), _resume(template, run_dir)):
        assert_named(proc, run_dir / "documents" / "_manifest.json", ("num_parts",))


def test_a_fifo_for_a_record_does_not_hang(template, run_dir):
    record = run_dir / "documents" / "_shards" / "part-00000.json"
    record.unlink()
    os.mkfifo(record)
    for proc in (grtool("status", run_dir / "documents", process=True), grtool("validate", run_dir, process=True), _resume(template, run_dir, process=True)):
        assert_named(proc, record, ("FIFO",))


@pytest.mark.parametrize("field", ["bytes", "rows"])
def test_a_record_that_disagrees_with_its_file_is_redone_by_resume(template, run_dir, field):
    """A record the declaration accepts but the file contradicts: validate names it; the files decide, so status
    shows the part pending and the resume redoes it."""
    docs = run_dir / "documents"
    before = read_table(docs).to_pylist()
    _edit(docs / "_shards" / "part-00001.json", setting(field, 10**12))
    assert_named(grtool("validate", run_dir), "part-00001", (field, "bytes", "rows"))
    status = json.loads(grtool("status", docs, "--json").stdout)
    if field == "bytes":  # status weighs each part's file, not its Parquet footer (it starts without pyarrow):
        assert status["parts_pending"] == ["part-00001"] and not status["complete"]  # validate and resume read those
    again = _resume(template, run_dir)
    assert again.returncode == 0 and "already complete" not in again.stderr, again.stderr
    assert sorted(read_table(docs).to_pylist(), key=str) == sorted(before, key=str)
    assert grtool("validate", run_dir).returncode == 0


# ---- the typed value is what readers get (issue #45)


def test_a_manifest_and_its_shard_records_read_as_their_declarations(template):
    """load_manifest gives the Manifest (its shard entries ShardRecords, its stops StopRecords), the shard records
    read back as ShardRecords equal to the manifest's copies, and every field the writer put in the file is a
    declared one: nothing written is dropped by the reader."""
    import msgspec

    from grtool.store.records import Counters, Manifest, ShardRecord, StopRecord, load_manifest, load_shard_records, read_shard_record

    for table in ("documents", "questions"):
        stage = template[0] / table
        manifest = load_manifest(stage)
        assert isinstance(manifest, Manifest) and manifest.table == table and isinstance(manifest.counters, Counters)
        assert manifest.shards and all(isinstance(entry, ShardRecord) for entry in manifest.shards.values())
        assert all(isinstance(stop, StopRecord) for stop in (manifest.stops or {}).values())
        written = json.loads((stage / "_manifest.json").read_text())
        assert set(written) <= {f.encode_name for f in msgspec.structs.fields(Manifest)}
        assert written["counters"]["in"] == manifest.counters.in_ and written["rows"] == manifest.rows
        records = load_shard_records(stage)
        assert set(records) == set(manifest.shards)
        for name, record in records.items():
            assert isinstance(record, ShardRecord) and record == read_shard_record(stage / "_shards" / f"{name}.json")
            assert (record.file, record.rows, record.sha256) == (manifest.shards[name].file, manifest.shards[name].rows, manifest.shards[name].sha256)
    detected = load_manifest(template[0] / "documents").detected  # what ingest read each input as, typed too
    assert detected and detected[0].dataset == "hotpotqa" and detected[0].path.endswith(SRC[1])


def test_a_manifest_field_no_reader_declares_is_never_written(tmp_path):
    """A writer that adds a field the Manifest does not declare stops at the write, naming the field (the readers
    would drop it)."""
    from grtool.records import DamagedRecord
    from grtool.store.records import Manifest, write_record

    with pytest.raises(DamagedRecord, match="field sampler is not declared by Manifest"):
        write_record(tmp_path / "_manifest.json", {"table": "documents", "num_parts": 1, "sampler": "top-k"}, Manifest, "manifest")
    assert not (tmp_path / "_manifest.json").exists()
    assert write_record(tmp_path / "_manifest.json", {"table": "documents", "num_parts": 1, "model": "m"}, Manifest, "manifest").model == "m"


# ---- §2: the issue's case (a part removed by hand, then the same command)


@pytest.mark.parametrize("command", ["ingest", "merge"])
def test_the_issue_rm_part_resume(examples, tmp_path, command):
    """`rm OUT/documents/part-00002.parquet OUT/documents/_shards/part-00002.json`, then the same command: the
    part is redone (never 'already complete, nothing to do' with rows missing)."""
    src = examples / "hotpotqa" / "hotpot_train_v1.1.example.json"
    ingest = ("-q", "corpus", "ingest", src, "--out", tmp_path / "ing", "--rows-per-part", "4")
    assert grtool(*ingest).returncode == 0
    args = ingest if command == "ingest" else ("-q", "corpus", "merge", tmp_path / "ing", "--out", tmp_path / "out", "--rows-per-part", "4")
    out = tmp_path / ("ing" if command == "ingest" else "out")
    if command == "merge":
        assert grtool(*args).returncode == 0
    docs = out / "documents"
    rows = read_table(docs).num_rows
    (docs / "part-00002.parquet").unlink()
    (docs / "_shards" / "part-00002.json").unlink()
    again = grtool(*args)
    assert again.returncode == 0 and "already complete" not in again.stderr, again.stderr
    assert read_table(docs).num_rows == rows
    assert grtool("validate", out).returncode == 0


# ---- the pipeline's own records


@pytest.fixture(scope="module")
def pipeline_template(tmp_path_factory) -> Path:
    """A pipeline file of one ingest stage, run once: its run directory holds ``_pipeline/ingest.json``."""
    root = tmp_path_factory.mktemp("pipe")
    shutil.copyfile(EXAMPLES / SRC[0] / SRC[1], root / SRC[1])
    (root / "pipe.toml").write_text(
        textwrap.dedent(f"""
        out = "run"

        [[stages]]
        name = "ingest"
        run = "corpus ingest"
        args = ["{root / SRC[1]}"]
        options = {{ out = "{{out}}/corpus", rows_per_part = 10 }}
        """)
    )
    proc = grtool_in(root, "-q", "pipeline", "run", "pipe.toml")
    assert proc.returncode == 0, proc.stderr
    assert (root / "run" / "_pipeline" / "ingest.json").is_file()
    return root


@pytest.fixture
def pipeline_dir(pipeline_template, tmp_path) -> Path:
    shutil.copytree(pipeline_template, tmp_path / "p")
    return tmp_path / "p"


def grtool_in(cwd: Path, *args: Any) -> subprocess.CompletedProcess:
    return grtool_run(args, env={"COLUMNS": "400"}, cwd=cwd, timeout=GUARD_S)


STAGE_RECORD_EDITS: dict[str, tuple[Callable[[Any], str], tuple[str, ...]]] = {
    "seconds NaN": (setting("seconds", RAW + "NaN"), ("seconds",)),
    "seconds 1e999": (setting("seconds", RAW + "1e999"), ("seconds",)),
    "seconds negative": (setting("seconds", -1), ("seconds",)),
    "seconds a string": (setting("seconds", "fast"), ("seconds",)),
    "finished a number": (setting("finished", 5), ("finished",)),
    "finished not a time": (setting("finished", "yesterday"), ("finished",)),
    "command a list": (setting("command", ["grtool"]), ("command",)),
    "command missing": (removing("command"), ("command",)),
    "outputs a string": (setting("outputs", "run/corpus"), ("outputs",)),
    "stage another name": (setting("stage", "other"), ("stage",)),
    "inputs a list": (setting("inputs", [1, 2]), ("inputs",)),
    "the whole record a list": (as_list, ("object", "array")),
}


@pytest.mark.parametrize("case", sorted(STAGE_RECORD_EDITS))
def test_a_damaged_pipeline_stage_record_is_one_line(pipeline_dir, case):
    edit, fields = STAGE_RECORD_EDITS[case]
    record = pipeline_dir / "run" / "_pipeline" / "ingest.json"
    _edit(record, edit)
    for args in (("pipeline", "status", "run"), ("pipeline", "run", "pipe.toml")):
        assert_named(grtool_in(pipeline_dir, *args), record.relative_to(pipeline_dir), fields)


def _slurm_record(pipeline_dir: Path) -> dict[str, Any]:
    stage = load_pipeline(pipeline_dir / "pipe.toml").stages[0]
    return {"stage": stage.to_dict(), "out": str((pipeline_dir / "run").absolute()), "overwrite": False, "tasks": 1,
            "submitted": "2026-01-01T00:00:00+00:00", "jobs": {"run": "123"}}  # fmt: skip


SLURM_EDITS: dict[str, tuple[Callable[[Any], str], tuple[str, ...]]] = {
    "tasks negative": (setting("tasks", -1), ("tasks",)),
    "tasks 10**12": (setting("tasks", 10**12), ("tasks",)),
    "tasks a string": (setting("tasks", "4"), ("tasks",)),
    "tasks NaN": (setting("tasks", RAW + "NaN"), ("tasks",)),
    "jobs a list": (setting("jobs", ["123"]), ("jobs",)),
    "jobs.run a shell line": (setting("jobs.run", "123; rm -rf ~"), ("jobs.run",)),
    "jobs.finalize without run": (setting("jobs", {"finalize": "124"}), ("jobs",)),
    "stage.options an object": (setting("stage.options", {"out": "x"}), ("stage.options",)),
    "stage missing": (removing("stage"), ("stage",)),
    "stage.name another stage": (setting("stage.name", "other"), ("stage.name",)),
    "submitted not a time": (setting("submitted", "yesterday"), ("submitted",)),
    "out a number": (setting("out", 5), ("out",)),
    "overwrite a string": (setting("overwrite", "yes"), ("overwrite",)),
    "the whole record a list": (as_list, ("object", "array")),
}


@pytest.fixture
def controller_down(tmp_path, monkeypatch) -> Path:
    """The stand-in Slurm (tests/slurm_fakes.py) first on PATH, its `scontrol` answering as Slurm's own does when
    slurmctld cannot be reached (the real one says so after waiting out its message timeout, 18 s here); returns
    the folder its calls are recorded in."""
    folder = tmp_path / "slurm"
    for name, value in {**slurm_fakes.install(folder), "FAKE_CONTROLLER_DOWN": "1"}.items():
        monkeypatch.setenv(name, value)
    return folder


def test_a_valid_slurm_job_record_reads(pipeline_dir, controller_down):
    record = pipeline_dir / "run" / "_pipeline" / "slurm" / "ingest.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps(_slurm_record(pipeline_dir)))
    proc = grtool_in(pipeline_dir, "status", "run")
    assert proc.returncode == 0 and "123" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert grtool_in(pipeline_dir, "pipeline", "finalize", record).returncode == 0


def test_status_with_the_slurm_controller_down_asks_once_and_says_so(pipeline_dir, controller_down):
    """Each scontrol call waits out Slurm's timeout when the controller is down: `status` asked twice per job and
    once more for the jobcomp file, and showed "unknown" a minute later."""
    record = pipeline_dir / "run" / "_pipeline" / "slurm" / "ingest.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({**_slurm_record(pipeline_dir), "jobs": {"run": "123", "finalize": "124"}}))
    proc = grtool_in(pipeline_dir, "status", "run")
    assert proc.returncode == 0, proc.stderr
    shown = " ".join((proc.stdout + proc.stderr).split())
    assert "Unable to contact slurm controller" in shown, shown
    assert [call["argv"] for call in slurm_fakes.records(controller_down, "scontrol")] == [["show", "job", "-o", "123"]]
    report = json.loads(grtool_in(pipeline_dir, "status", "run", "--json").stdout)
    assert "Unable to contact slurm controller" in report["slurm_jobs"][0]["summary"]


@pytest.mark.parametrize("case", sorted(SLURM_EDITS))
def test_a_damaged_slurm_job_record_is_one_line(pipeline_dir, case):
    edit, fields = SLURM_EDITS[case]
    record = pipeline_dir / "run" / "_pipeline" / "slurm" / "ingest.json"
    record.parent.mkdir(parents=True)
    record.write_text(edit(_slurm_record(pipeline_dir)))
    for args in (("status", "run"), ("pipeline", "finalize", record)):
        assert_named(grtool_in(pipeline_dir, *args), record.relative_to(pipeline_dir), fields)
