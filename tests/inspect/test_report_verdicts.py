"""`report` and `show` give validate's verdict: a stage stopped by a guard, a damaged manifest, an incomplete stage
is marked as such with exit 1 (as `grtool validate` exits), and a directory grtool never wrote is exit 1 with no page.

The run is real and cheap: the 2WikiMultihopQA example ingested without its evidences, a triples stage holding one
triple of a document no question cites (Peter Benchley's), and `chains gold`, whose questions' gold documents then
hold no triple, so its empty-result guard stops it (recorded in its manifest)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_cli

WIDE = {"COLUMNS": "10000"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    from grtool.store.stage import read_table
    from grtool.triples.evidence import write_evidence_stage

    d = tmp_path_factory.mktemp("verdicts") / "run"
    release = json.loads((EXAMPLES / "2wikimultihopqa" / "data_ids_dev.example.json").read_text())
    for question in release:
        question["evidences"] = []
    (d.parent / "dev.json").write_text(json.dumps(release))
    run_cli("-q", "corpus", "ingest", d.parent / "dev.json", "--out", d / "corpus")
    [benchley] = [row["doc_id"] for row in read_table(d / "corpus" / "documents").to_pylist() if row["title"] == "Peter Benchley"]
    triple = {"doc_id": benchley, "idx": 0, "head": "Peter Benchley", "relation": "notable work", "tail": "Jaws"}
    write_evidence_stage(d / "corpus", d / "triples", [{**triple, "docid": "<docid_start>Peter Benchley, notable work, Jaws<docid_end>"}])
    run_cli("-q", "chains", "gold", d / "corpus", "--triples", d / "triples", "--out", d / "chains", check=1)  # the guard stops it
    return d


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _stages_section(page: str) -> str:
    section = re.search(r'<section id="stages">(.*?)</section>', page, re.S)[1]
    return " ".join(re.sub(r"<[^>]+>", " ", section).split())


def _report(run: Path, code: int) -> tuple[str, str]:
    """``grtool report RUN`` with exit ``code``: (its stderr, the stages section of the page it wrote)."""
    proc = run_cli("report", run, "--out", run.parent / "page.html", check=code, env=WIDE)
    return proc.stderr, _stages_section((run.parent / "page.html").read_text())


def test_a_stage_stopped_by_a_guard_fails_report_and_show_as_validate(run: Path, tmp_path: Path) -> None:
    run = _copy(run, tmp_path)
    assert "stopped: guard --allow-empty tripped" in run_cli("validate", run, check=1, env=WIDE).stderr
    # before: the page showed the chains stage like the others, exit 0
    stderr, stages = _report(run, 1)
    assert "FAIL" in stderr and "stopped: guard --allow-empty tripped" in stderr and "1 output(s) FAIL validation" in stderr
    assert "validate: 1 of 4 checked outputs FAIL" in stages and "stopped: guard --allow-empty tripped" in stages, stages
    assert re.search(r"chains chains chains 3 0 .*? FAIL", stages) and stages.count(" ok") == 3, stages
    # before: "0 rows", exit 0
    proc = run_cli("show", run / "chains", check=1, env=WIDE)
    assert "0 rows" in proc.stdout and "stopped: guard --allow-empty tripped" in proc.stderr and "error: " in proc.stderr
    # accepted, it passes everywhere alike
    run_cli("validate", run, "--accept", "--reason", "nothing to chain in this sample", env=WIDE)
    stderr, stages = _report(run, 0)
    assert "FAIL" not in stderr and "validate: all 4 checked outputs ok" in stages
    run_cli("show", run / "chains", env=WIDE)


def test_a_damaged_manifest_fails_report(run: Path, tmp_path: Path) -> None:
    run = _copy(run, tmp_path)
    shutil.rmtree(run / "chains")
    run_cli("report", run, "--out", tmp_path / "clean.html")  # the rest of the run is fine
    (run / "triples" / "_manifest.json").write_text('{"table": "triples", ')
    # before: the damaged stage was left out of the page, exit 0
    stderr, stages = _report(run, 1)
    assert "triples/_manifest.json: manifest is not valid JSON" in stderr and "triples/_manifest.json: manifest is not valid JSON" in stages
    assert "manifest is not valid JSON" in run_cli("show", run / "triples", check=1).stderr  # show cannot read it at all (as before)


def test_an_incomplete_stage_fails_report_and_show(run: Path, tmp_path: Path) -> None:
    run = _copy(run, tmp_path)
    shutil.rmtree(run / "chains")
    for record in (run / "triples" / "_shards").glob("part-*.json"):
        record.unlink()  # a run killed before it committed its part
    stderr, stages = _report(run, 1)
    assert "incomplete: 1 of 1 parts not done" in stderr and "incomplete: 1 of 1 parts not done" in stages
    assert re.search(r"triples triples triples .*? FAIL", stages), stages
    assert "run grtool validate" in run_cli("show", run / "triples", check=1, env=WIDE).stderr  # show refuses its rows (as before)


def test_a_directory_grtool_never_wrote_is_exit_1_with_no_page(run: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "a.txt").write_text("my own notes\n")
    # before: a page of empty sections, exit 0
    proc = run_cli("report", mine, check=1, env=WIDE)
    assert "nothing grtool wrote is here" in proc.stderr and run_cli("validate", mine, check=1).returncode == 1
    assert not (mine / "reports").exists()
    # before: exit 2 from show ("not a stage directory") and status ("no stage directory here"), as for a usage error
    for command in ("show", "status"):
        assert "nothing grtool wrote is here" in run_cli(command, mine, check=1, env=WIDE).stderr
    # a file is no directory of anything (before: status said "nothing grtool wrote is here", exit 1)
    assert "a file, not a stage or run directory" in " ".join(run_cli("status", mine / "notes" / "a.txt", check=2, env=WIDE).stderr.split())
    # a folder of runs is not a stage either, but holds grtool's outputs: show says where to look (exit 2)
    shutil.copytree(run, mine / "runs" / "one")
    err = run_cli("show", mine / "runs", check=2, env=WIDE).stderr  # (status shows each stage below it)
    assert "grtool validate" in err and "lists and checks what grtool wrote below it" in " ".join(err.split()), err
