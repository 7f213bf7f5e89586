"""The report's funnel counts a question once per step, however many stage directories of one kind hold it, and
shows the rows each stage merged (folded into an identical row)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_cli
from run_helpers import write_small_run

from grtool.store.records import load_manifest
from grtool.store.stage import read_table


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run with two chains stages over the same questions (hand-written chains and `chains gold`), each
    filtered: most questions are in both."""
    root = tmp_path_factory.mktemp("funnel")
    run = root / "run"
    write_small_run(run, root / "responses.jsonl")
    run_cli("-q", "chains", "gold", run, "--triples", run / "triples", "--out", run / "gold")
    for chains in ("chains", "gold"):
        run_cli("-q", "filters", "apply", run / chains, "--corpus", run, "--triples", run / "triples", "--out", run / f"filtered-{chains}",
                "--max-docids", "2")  # fmt: skip
    run_cli("-q", "report", run)
    return run


def funnel_text(run: Path) -> str:
    page = (run / "reports" / "report.html").read_text()
    section = re.search(r'<section id="funnel">(.*?)</section>', page, re.S).group(1)
    return " ".join(re.sub(r"<[^>]+>", " ", section).split())


def qids(stage: Path, kept_only: bool = False) -> set[str]:
    return {r["qid"] for r in read_table(stage, ["qid", "selected"]).to_pylist() if r["selected"] or not kept_only}


def test_a_question_in_several_chains_stages_is_counted_once(run):
    chained = qids(run / "chains") | qids(run / "gold")
    kept = qids(run / "filtered-chains", kept_only=True) | qids(run / "filtered-gold", kept_only=True)
    each = [len(qids(run / "chains")), len(qids(run / "gold"))], [len(qids(run / f"filtered-{c}", kept_only=True)) for c in ("chains", "gold")]
    assert sum(each[0]) > len(chained) and sum(each[1]) > len(kept)  # both stages hold some of the same questions
    text = funnel_text(run)
    assert f"chained questions with a chain {len(chained)} " in text, text
    assert f"kept questions with a chain that passed the filters {len(kept)} " in text, text


def test_merged_rows_are_shown(run):
    merged = load_manifest(run / "documents").counters.merged
    assert merged > 0  # the two example datasets share documents
    text = funnel_text(run)
    assert f"merged documents rows folded into an identical one (documents) {merged} rows, not questions" in text, text
