"""A whole run's records replaced, borrowed from another stage or emptied (DESIGN §8), read by every command that
reads a run: validate names the record, status and report list it as damaged, readers refuse it; and stages of one
pipeline whose outputs collide. The run is the report tests' small run plus an index over its triples."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from report_helpers import build_run

HANG_GUARD = 60  # seconds: a command that reads /dev/zero or a FIFO must refuse at once, never wait


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    run = build_run(tmp_path_factory.mktemp("adv"))
    run_cli("-q", "index", "build", run / "triples", "--tokenizer", "llama3", "--kind", "numpy", "--out", run / "index")
    return run


@pytest.fixture
def run_copy(base_run, tmp_path) -> Path:
    return Path(shutil.copytree(base_run, tmp_path / "run", symlinks=True))


def grtool(*args, input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "grtool", *map(str, args)], capture_output=True, text=True, timeout=HANG_GUARD, input=input)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode in (0, 1, 2, 75, 130), (proc.returncode, proc.stderr[-3000:])
    return proc


def _replace(path: Path, how: str) -> None:
    path.unlink()
    if how == "devzero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


# a record in place of which stands /dev/zero or a folder; discovery (validate), the run listing (status)
# and the page (report) read records bounded and never whole: validate names it, status lists it as damaged, and
# report writes the page with validate's verdict on it (exit 1, as validate)
@pytest.mark.parametrize("record", ["index/index.json", "export/sft.json.grtool.json", "export/dataset_info.json"])
@pytest.mark.parametrize("how", ["devzero", "dir"])
def test_record_replaced_by_device_or_folder(run_copy, record, how):
    _replace(run_copy / record, how)
    proc = grtool("validate", run_copy)
    assert proc.returncode == 1, proc.stderr
    assert Path(record).name in proc.stderr
    assert grtool("status", run_copy).returncode == 0
    assert grtool("report", run_copy, "--out", run_copy.parent / "page.html").returncode == 1
    assert "FAIL" in (run_copy.parent / "page.html").read_text()


# a stage is read only when its manifest and its shard records agree: another stage's manifest copied in
# (same table, so the schema check cannot tell) made export and filters read 9 rows where the manifest said 13
def test_manifest_of_another_stage_is_refused_by_readers(run_copy, tmp_path):
    shutil.copy(run_copy / "chains" / "_manifest.json", run_copy / "filtered" / "_manifest.json")
    for args in (
        ["export", "sft", run_copy / "filtered", "--corpus", run_copy / "corpus", "--out", tmp_path / "x.json"],
        ["filters", "apply", run_copy / "filtered", "--corpus", run_copy / "corpus", "--triples", run_copy / "triples", "--out", tmp_path / "f"],
    ):
        proc = grtool(*args)
        assert proc.returncode == 1, proc.stderr
        assert "_manifest.json records sha256" in proc.stderr and "part-00000" in proc.stderr
    assert not (tmp_path / "x.json").exists()


# a FIFO named as the responses file is named as what it is (it said "no such file")
def test_responses_fifo_named_as_fifo(run_copy, tmp_path):
    fifo = tmp_path / "responses.jsonl"
    os.mkfifo(fifo)
    proc = grtool("eval", "recall", fifo, "--corpus", run_copy / "corpus", "--triples", run_copy / "triples")
    assert proc.returncode == 2
    assert "a FIFO" in proc.stderr.strip().splitlines()[-1]


# the outputs of one `pipeline run` never collide: two stages writing one path (spelt with and without a
# trailing slash) or one stage writing inside another's output were planned as "to run" and met at run time
@pytest.mark.parametrize("second_out", ["{out}/c/", "{out}/c/inner"])
def test_pipeline_stages_with_colliding_outputs_refused(run_copy, tmp_path, second_out):
    toml = tmp_path / "p.toml"
    stage = '[[stages]]\nname = "{name}"\nrun = "chains gold"\nargs = ["{corpus}"]\noptions = {{ triples = "{triples}", out = "{out}" }}\n'
    common = {"corpus": run_copy / "corpus", "triples": run_copy / "triples"}
    toml.write_text(f'out = "{tmp_path / "pout"}"\n' + stage.format(name="a", out="{out}/c", **common) + stage.format(name="b", out=second_out, **common).replace("{{", "{").replace("}}", "}"))
    for args in (["--dry-run"], []):
        proc = grtool("pipeline", "run", toml, *args)
        assert proc.returncode == 2, proc.stderr
        err = " ".join(proc.stderr.split())
        assert "stage 'a' option out" in err and "stage 'b' option out" in err, err
    assert not (tmp_path / "pout").exists()


# validate checks the pipeline's stage records too (status refused the run, validate said "0 problems")
@pytest.mark.parametrize("how", ["empty", "devzero", "dir", "other stage's"])
def test_validate_checks_pipeline_records(run_copy, how):
    record = run_copy / "_pipeline" / "chains.json"
    if how == "empty":
        record.write_bytes(b"")
    elif how == "other stage's":
        shutil.copy(run_copy / "_pipeline" / "filters.json", record)
    else:
        _replace(record, how)
    proc = grtool("validate", run_copy)
    assert proc.returncode == 1, proc.stderr
    assert "chains.json" in proc.stderr
