"""`eval compare` reads what it is given strictly (issue #46, item 6): LABEL=PATH splits at the first `=` (a path
may hold more), every report is decoded through its type (a damaged one is one line naming the field), and runs
over different questions are refused even when both sides scored as many questions (reports name their question
set by digest), unless --allow-different-questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grtool.evaluation.recall import question_set


def _report(path: Path, qids: list[str], recall: float = 0.5, **extra) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"recall": recall, "per_dataset": {"hotpotqa": {"recall": recall}}, "questions_scored": len(qids), "question_set": question_set(qids),
              "responses": len(qids), **extra}  # fmt: skip
    path.write_text(json.dumps(report))
    return path


def test_label_splits_at_the_first_equals_sign(tmp_path, cli):
    a = _report(tmp_path / "sweep" / "lr=1e-5" / "recall.json", ["q1", "q2"], 0.25)
    b = _report(tmp_path / "sweep" / "lr=1e-4" / "recall.json", ["q1", "q2"], 0.75)
    recall = json.loads(cli("eval", "compare", f"lr5={a}", f"lr4={b}", "--json").stdout)["recall"]
    assert recall["all"] == {"lr5": 0.25, "lr4": 0.75}


@pytest.mark.parametrize("damage", [{"recall": "high"}, {"recall": 7}, {"per_dataset": [1]}, {"questions": [{"qid": 1, "status": "scored"}]},
                                    {"questions": [{"qid": "q", "status": "scored", "recall": "x"}]}, {"question_set": {"count": -1, "sha256": "0"}}])  # fmt: skip
def test_a_damaged_report_is_one_line(tmp_path, cli, damage):
    good = _report(tmp_path / "a.json", ["q1", "q2"])
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({**json.loads(good.read_text()), **damage}))
    proc = cli("eval", "compare", f"a={good}", f"b={bad}", check=2)
    assert "Traceback" not in proc.stderr and f"{bad}: not a JSON report of `grtool eval recall --json`" in proc.stderr, proc.stderr


def test_a_report_giving_a_key_twice_is_damaged_not_read_last_wins(tmp_path, cli):
    """Before: ``{"recall": 0.99, "recall": 0.5, ...}`` was compared as 0.5, exit 0."""
    good = _report(tmp_path / "a.json", ["q1", "q2"])
    bad = tmp_path / "b.json"
    bad.write_text(good.read_text().replace("{", '{"recall": 0.99, ', 1))
    err = " ".join(cli("eval", "compare", f"a={good}", f"b={bad}", check=2).stderr.split())
    assert f"{bad}: not a JSON report of `grtool eval recall --json` (report: field recall is given twice" in err, err


def test_as_many_but_other_questions_are_refused_unless_allowed(tmp_path, cli):
    a = _report(tmp_path / "a.json", ["q1", "q2", "q3"])
    b = _report(tmp_path / "b.json", ["q4", "q5", "q6"])
    err = " ".join(cli("eval", "compare", f"a={a}", f"b={b}", check=2).stderr.split())
    assert "runs scored on different questions" in err and "(as many, but other ones)" in err
    proc = cli("eval", "compare", f"a={a}", f"b={b}", "--allow-different-questions")
    assert "runs scored on different questions" in proc.stderr
    cli("eval", "compare", f"a={a}", f"same={_report(tmp_path / 'c.json', ['q3', 'q1', 'q2'])}")  # the same set, in any order
