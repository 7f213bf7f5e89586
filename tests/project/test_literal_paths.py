"""Paths are literal everywhere (#45 §3): a run directory named ``r*`` or ``exp[1]`` is that directory, never a
glob pattern. polars reads a path holding ``*``, ``?`` or ``[…]`` as a pattern unless told not to, so before
every shard read went through :func:`grtool.store.reading.scan_shards`, ``corpus stats exp[1]`` answered with
the shards of its sibling ``exp1`` (exit 0) and ``r*`` read ``r1``'s shards with its own.

Four sibling runs of different content (one dataset, two together, a third, the second alone) are each asked by every
command that reads shards; each answer must be that directory's own, counted here with pyarrow file by file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from run_helpers import write_small_run

from conftest import EXAMPLES, REPO

# As a glob, r* names r1 as well (whose questions it also holds: read twice, a key check finds duplicates) and
# exp[1] names exp1 alone.
RUNS = {
    "r1": (EXAMPLES / "2wikimultihopqa",),
    "r*": (EXAMPLES / "2wikimultihopqa", EXAMPLES / "musique"),
    "exp[1]": (EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json",),
    "exp1": (EXAMPLES / "musique",),
}


@pytest.fixture(scope="module")
def siblings(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("literal")
    (root / "answers").mkdir()
    for n, (name, sources) in enumerate(RUNS.items()):
        write_small_run(root / name, root / "answers" / f"{n}.jsonl", sources=sources)
    return root


def _questions(run: Path) -> list[dict]:
    """The questions of ``run`` read file by file with pyarrow (its own shards, by their literal names)."""
    files = sorted((run / "questions").glob("part-*.parquet"))
    assert files, run
    return [row for f in files for row in pq.read_table(f, columns=["qid", "dataset"]).to_pylist()]


@pytest.mark.parametrize("name", list(RUNS))
def test_each_command_reads_the_directory_it_was_given(siblings, cli, name):
    run, responses = siblings / name, siblings / "answers" / f"{list(RUNS).index(name)}.jsonl"
    questions = _questions(run)
    qids, datasets = {q["qid"] for q in questions}, {q["dataset"] for q in questions}
    assert len(qids) == len(questions)
    assert all({q["qid"] for q in _questions(siblings / n)} != qids for n in RUNS if n != name)  # each run its own content

    stats = json.loads(cli("corpus", "stats", run, "--json").stdout)
    assert sum(g["questions"] for g in stats["groups"]) == len(qids) and {g["dataset"] for g in stats["groups"]} == datasets, stats

    shown = [json.loads(line) for line in cli("show", run / "chains", "--corpus", run, "--triples", run / "triples", "--json", "--limit", "0").stdout.splitlines()]
    assert {r["key"]["qid"] for r in shown} == qids and all(r["question"]["qid"] == r["key"]["qid"] for r in shown), shown
    assert {d["verdict"] for r in shown for d in r["docids"]} == {"gold"}, shown  # each chain's docids found in its own run's triples

    report = json.loads(cli("validate", run, "--json").stdout)
    assert report["ok"] and {s["path"]: s["checked"]["rows"] for s in report["stages"]}[f"{run}/questions"] == len(qids), report

    status = json.loads(cli("status", run, "--json").stdout)
    assert {s["path"]: s["rows"] for s in status["stages"]}[f"{run}/questions"] == len(qids), status

    recall = json.loads(cli("eval", "recall", responses, "--corpus", run, "--triples", run / "triples", "--json").stdout)
    scored = recall["responses"] + recall["no_gold"]  # an unanswerable MuSiQue question has no gold to score
    assert scored == len(qids) and recall["unknown_qid"] == 0 and recall["recall"] == 1.0, recall
    assert set(recall["per_dataset"]) == datasets, recall

    page = siblings / "answers" / f"report-{list(RUNS).index(name)}.html"
    cli("report", run, "--out", page)
    text = " ".join(re.sub(r"<[^>]+>", " ", page.read_text()).split())
    assert re.search(r"questions in the corpus (\d+)", text)[1] == str(len(qids)), text
    assert re.search(r"questions with a chain (\d+)", text)[1] == str(len(qids)), text


def test_polars_reads_shards_only_through_the_literal_helpers():
    """Every polars read of files is in grtool/store/reading.py, with glob=False: a new call elsewhere would read
    a user's path as a pattern again."""
    calls = re.compile(r"\bpl\.(scan|read)_(parquet|ndjson|csv|ipc|delta|json)\b|\bpolars\.(scan|read)_")
    found = [f"{p.relative_to(REPO)}:{n}" for p in sorted((REPO / "grtool").rglob("*.py")) for n, line in enumerate(p.read_text().splitlines(), 1)
             if calls.search(line) and p.name != "reading.py"]  # fmt: skip
    assert found == [], found
    reading = (REPO / "grtool" / "store" / "reading.py").read_text()
    assert all("glob=False" in line for line in reading.splitlines() if calls.search(line) and "return" in line), reading
