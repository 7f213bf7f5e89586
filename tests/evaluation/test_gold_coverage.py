"""Gold coverage (issue 48): the share of gold documents that hold a docid, on every route that shows it.

A small run of the bundled 2WikiMultihopQA and MuSiQue examples whose triples leave out every gold document of the
MuSiQue dev questions and those of the first 2Wiki dev question; each route's numbers are checked against a count
made here from the questions and the triples stage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli
from run_helpers import write_small_run

from grtool.store.stage import read_table

WIKI, MUSIQUE = "2wikimultihopqa", "musique"


def _of(questions: list[dict], dataset: str, split: str) -> list[dict]:
    return [q for q in questions if q["dataset"] == dataset and q["split"] == split]


def _unreached(questions: list[dict]) -> set[str]:
    """The documents left without triples: every gold one of MuSiQue dev, and the first 2Wiki dev question's."""
    return {d for q in _of(questions, MUSIQUE, "dev") for d in q["gold_doc_ids"]} | set(_of(questions, WIKI, "dev")[0]["gold_doc_ids"])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coverage")
    write_small_run(root / "run", root / "responses.jsonl", without=_unreached)
    run_cli("index", "build", root / "run" / "triples", "--tokenizer", "default", "--out", root / "run" / "index")
    return root / "run"


def _questions(run: Path) -> list[dict]:
    return read_table(run / "questions").to_pylist()


def expected(run: Path, qids: set[str] | None = None) -> dict:
    """The coverage counted here: per (dataset, split) of the scorable questions (answerable, with gold), the
    questions, distinct gold documents, those with a triple, and the qids with none; "all" over every split."""
    held = set(read_table(run / "triples").column("doc_id").to_pylist())
    groups: dict = {}
    for q in _questions(run):
        if not q["answerable"] or not q["gold_doc_ids"] or (qids is not None and q["qid"] not in qids):
            continue
        for key in ((q["dataset"], q["split"]), "all"):
            g = groups.setdefault(key, {"questions": 0, "gold": set(), "none": []})
            g["questions"] += 1
            g["gold"] |= set(q["gold_doc_ids"])
            if not set(q["gold_doc_ids"]) & held:
                g["none"].append(q["qid"])
    return {key: (g["questions"], len(g["gold"]), len(g["gold"] & held), len(g["none"]), sorted(g["none"])) for key, g in groups.items()}


def shown(coverage: dict) -> dict:
    """A route's ``coverage`` object in the form of :func:`expected` (all examples fit: the run is small)."""

    def row(c: dict) -> tuple:
        assert c["unreachable"] == c["gold_documents"] - c["reachable"]
        assert c["share"] == pytest.approx(c["reachable"] / c["gold_documents"])
        return c["questions"], c["gold_documents"], c["reachable"], c["unreachable_questions"]

    got = {(s["dataset"], s["split"]): (*row(s), sorted(s["unreachable_examples"])) for s in coverage["splits"]}
    return {**got, "all": (*row(coverage), sorted(q for s in coverage["splits"] for q in s["unreachable_examples"]))}


def flat(text: str) -> str:
    return " ".join(text.split())


def _warning(want: tuple) -> str:
    questions, gold, reachable, none, _ = want
    return f"{gold - reachable} of {gold} gold documents hold no docid"


def test_the_run_lacks_what_the_test_meant(run):
    """The count made here sees what the run was built to have: a split without coverage, one partly covered."""
    want = expected(run)
    assert want[(MUSIQUE, "dev")][2] == 0 and want[(MUSIQUE, "dev")][3] == want[(MUSIQUE, "dev")][0] > 0
    assert 0 < want[(WIKI, "dev")][2] < want[(WIKI, "dev")][1] and want[(WIKI, "dev")][3] > 0
    assert want[(MUSIQUE, "train")][3] == 0


def test_corpus_stats_counts_coverage_by_triples_or_index(run):
    plain = json.loads(run_cli("corpus", "stats", run, "--json").stdout)
    assert "coverage" not in plain  # without --triples/--index the output is as before
    want = expected(run)
    by_triples = run_cli("corpus", "stats", run, "--triples", run / "triples", "--json")
    stats = json.loads(by_triples.stdout)
    assert shown(stats["coverage"]) == want
    assert stats["coverage"]["source"] == f"triples {run / 'triples'}"
    assert {k: v for k, v in stats.items() if k != "coverage"} == plain
    assert _warning(want["all"]) in flat(by_triples.stderr) and "extract triples" in by_triples.stderr
    by_index = json.loads(run_cli("corpus", "stats", run, "--index", run / "index", "--json").stdout)["coverage"]
    assert shown(by_index) == want and by_index["source"] == f"index {run / 'index'}"
    table = flat(run_cli("corpus", "stats", run, "--triples", run / "triples").stderr)
    questions, gold, reachable, none, _ = want[(MUSIQUE, "dev")]
    assert "gold coverage by triples" in table and f"│ {MUSIQUE} │ dev │ {questions} │ {gold} │ {reachable} │ 0.0% │ {none} │" in table
    both = run_cli("corpus", "stats", run, "--triples", run / "triples", "--index", run / "index", check=2)
    assert "--triples and --index" in both.stderr


def test_index_stats_counts_coverage_of_a_corpus(run):
    assert "coverage" not in json.loads(run_cli("index", "stats", run / "index", "--json").stdout)
    proc = run_cli("index", "stats", run / "index", "--corpus", run, "--json")
    assert shown(json.loads(proc.stdout)["coverage"]) == expected(run)
    assert _warning(expected(run)["all"]) in flat(proc.stderr)
    assert "gold coverage by index" in flat(run_cli("index", "stats", run / "index", "--corpus", run).stderr)


def test_eval_recall_reports_the_coverage_of_the_questions_it_scores(run, tmp_path):
    responses = run.parent / "responses.jsonl"
    proc = run_cli("eval", "recall", responses, "--corpus", run, "--triples", run / "triples", "--json")
    want = expected(run)
    assert shown(json.loads(proc.stdout)["coverage"]) == want
    warning = flat(proc.stderr)
    assert _warning(want["all"]) in warning and f"{want['all'][3]} of {want['all'][0]} questions have no gold document" in warning
    # Only the 2Wiki dev questions answered: the coverage of those.
    wiki_dev = {q["qid"] for q in _of(_questions(run), WIKI, "dev")}
    some = tmp_path / "some.jsonl"
    some.write_text("".join(line + "\n" for line in responses.read_text().splitlines() if json.loads(line)["qid"] in wiki_dev))
    report = json.loads(run_cli("eval", "recall", some, "--corpus", run, "--triples", run / "triples", "--json").stdout)
    assert shown(report["coverage"]) == expected(run, wiki_dev) and set(expected(run, wiki_dev)) == {(WIKI, "dev"), "all"}
    # Questions whose gold documents all hold a docid: full coverage, no warning.
    held = set(read_table(run / "triples").column("doc_id").to_pylist())
    covered = {q["qid"] for q in _questions(run) if q["gold_doc_ids"] and set(q["gold_doc_ids"]) <= held}
    assert covered
    some.write_text("".join(line + "\n" for line in responses.read_text().splitlines() if json.loads(line)["qid"] in covered))
    full = run_cli("eval", "recall", some, "--corpus", run, "--triples", run / "triples", "--json")
    assert json.loads(full.stdout)["coverage"]["share"] == 1.0 and "gold coverage" not in full.stderr


def test_validate_notes_coverage_without_failing(run):
    """Nothing answered the uncovered split: a note, exit 0."""
    proc = run_cli("validate", run / "questions", "--json")
    (report,) = json.loads(proc.stdout)["stages"]
    assert report["problems"] == []
    (note,) = [n for n in report["notes"] if n.startswith("gold coverage")]
    want = expected(run)
    _, gold, reachable, _, _ = want[(MUSIQUE, "dev")]
    assert _warning(want["all"]) in note and f"{MUSIQUE} dev: {gold - reachable} of {gold}" in note
    assert report["checked"]["gold_coverage"] == pytest.approx(want["all"][2] / want["all"][1])


def _coverage_table(html: str) -> dict:
    """The rows of the report's gold coverage table, as :func:`expected` has them (without the qids)."""
    table = re.search(r'<div id="coverage">.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", table):
        dataset, split, questions, gold, reachable, share, none = re.findall(r"<td[^>]*>(.*?)</td>", row)
        rows[(dataset, split) if dataset != "all" else "all"] = (int(questions), int(gold), int(reachable), int(none))
        assert share == f"{int(reachable) / int(gold):.1%}"
    return rows


def test_report_has_a_coverage_table_and_the_recall_reports_coverage(run, tmp_path):
    recall = run_cli("eval", "recall", run.parent / "responses.jsonl", "--corpus", run, "--triples", run / "triples", "--json").stdout
    (run / "reports").mkdir(exist_ok=True)
    (run / "reports" / "recall-all.json").write_text(recall)
    run_cli("report", run, "--out", tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text()
    assert _coverage_table(html) == {key: value[:4] for key, value in expected(run).items()}
    corpus, evaluation = html.split('<section id="corpus">')[1].split("</section>")[0], html.split('<section id="eval">')[1].split("</section>")[0]
    assert _warning(expected(run)["all"]) in corpus and _warning(expected(run)["all"]) in evaluation


@pytest.mark.slow
def test_retrieve_warns_before_generating_and_validate_fails_the_answered_split(run):
    """The embedded model answers the MuSiQue dev questions, none of whose gold documents is in the index."""
    out = run / "retrieve"
    proc = run_cli("retrieve", run, "--index", run / "index", "--dataset", MUSIQUE, "--split", "dev", "--markers", "brackets",
                   "--few-shot", "0", "--max-tokens", "24", "--threads", "2", "--out", out, "--json")  # fmt: skip
    asked = {q["qid"] for q in _of(_questions(run), MUSIQUE, "dev")}
    want = expected(run, asked)
    report = json.loads(proc.stdout)
    assert shown(report["coverage"]) == want and report["coverage"]["share"] == 0.0
    assert report["coverage"]["source"] == f"index {run / 'index'}"
    stderr = flat(proc.stderr)
    assert _warning(want["all"]) in stderr and stderr.index("gold coverage") < stderr.index("retrieve: ")  # before the model runs
    # eval recall of that directory: the questions it was asked, the same numbers from the triples
    scored = json.loads(run_cli("eval", "recall", out, "--corpus", run, "--triples", run / "triples", "--json").stdout)
    assert shown(scored["coverage"]) == want
    # A split a responses stage answered with no gold document reachable fails validation.
    proc = run_cli("validate", run, "--json", check=1)
    questions = next(s for s in json.loads(proc.stdout)["stages"] if s["path"] == str(run / "questions"))
    (problem,) = questions["problems"]
    assert f"none of the {want['all'][1]} gold documents of {MUSIQUE} dev holds a docid" in problem and str(out) in problem
