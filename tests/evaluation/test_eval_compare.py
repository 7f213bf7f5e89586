"""`grtool eval compare`: recall reports side by side, as the demo's final table."""

from __future__ import annotations

import json

from conftest import run_cli


def _report(recall: float, per_dataset: dict[str, float], responses: int = 4) -> dict:
    return {
        "responses": responses, "recall": recall, "docids": 10, "hallucinated": 0,
        "per_dataset": {name: {"responses": 2, "recall": r} for name, r in per_dataset.items()},
    }  # fmt: skip


def test_compare_table_and_plot(tmp_path):
    (tmp_path / "base.json").write_text(json.dumps(_report(0.25, {"hotpotqa": 0.5, "musique": 0.0})))
    (tmp_path / "sft.json").write_text(json.dumps(_report(0.75, {"hotpotqa": 1.0, "2wikimultihopqa": 0.5})))
    out, png = tmp_path / "recall.md", tmp_path / "recall.png"
    run_cli("eval", "compare", f"base few-shot={tmp_path / 'base.json'}", tmp_path / "sft.json", "--out", out, "--plot", png)
    lines = out.read_text().splitlines()
    assert "| dataset | base few-shot | sft |" in lines
    assert "| 2wikimultihopqa | - | 0.5000 |" in lines  # a dataset one run did not score
    assert "| **all** | 0.2500 | 0.7500 |" in lines
    assert png.stat().st_size > 1000
    table = json.loads(run_cli("eval", "compare", tmp_path / "base.json", "--json").stdout)
    assert table["recall"]["musique"] == {"base": 0.0}


def test_labels_and_datasets_from_data_are_one_cell_each(tmp_path):
    """A label (or a dataset) holding a newline, a tab, BEL, ESC or ``|`` is escaped in the Markdown table, as in
    every other table (before: written raw, the table broken)."""
    (tmp_path / "r.json").write_text(json.dumps(_report(0.5, {"hot|pot\x1b[31m": 0.5})))
    out = tmp_path / "recall.md"
    run_cli("eval", "compare", f"a\nb\tc\x07|d={tmp_path / 'r.json'}", "--out", out)
    text = out.read_text()
    assert "| dataset | a\\nb\\tc\\x07\\|d |" in text and "| hot\\|pot\\x1b[31m | 0.5000 |" in text, text
    assert all(c not in text for c in "\x07\x1b\t"), text


def test_compare_bad_report_exits_2(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    proc = run_cli("eval", "compare", tmp_path / "x.json", check=2)
    assert "not a JSON report" in proc.stderr


def test_compare_counts_every_metric_and_checks_question_counts(tmp_path):
    base = {**_report(0.25, {"hotpotqa": 0.25}), "questions_scored": 4, "exact_match_share": 0.25, "without_response": 1}
    sft = {**_report(0.5, {"hotpotqa": 0.5}), "questions_scored": 4, "exact_match_share": 0.5, "without_response": None}
    fewer = {**_report(0.9, {"hotpotqa": 0.9}, responses=3), "questions_scored": 3}
    for name, report in (("base", base), ("sft", sft), ("fewer", fewer)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    md = run_cli("eval", "compare", tmp_path / "base.json", tmp_path / "sft.json").stdout.splitlines()
    assert "| exact set | 0.2500 | 0.5000 |" in md and "| questions scored | 4 | 4 |" in md
    assert "| questions without a row | 1 | - |" in md  # JSON Lines responses: nobody recorded which were asked
    assert "| sft | - | - | - | - |" not in md  # reports without a per-question list: no wins and losses, said once
    assert any(line.startswith("Wins and losses need per-question recall of both runs") for line in md)
    proc = run_cli("eval", "compare", tmp_path / "base.json", tmp_path / "fewer.json", check=2)
    assert "different questions: 'base' 4 and 'fewer' 3 questions" in " ".join(proc.stderr.split())
    proc = run_cli("eval", "compare", tmp_path / "base.json", tmp_path / "fewer.json", "--allow-different-questions")
    assert "runs scored on different questions" in proc.stderr and "| **all** | 0.2500 | 0.9000 |" in proc.stdout
    # an older report (no questions_scored) cannot be checked: said, not refused
    (tmp_path / "old.json").write_text(json.dumps(_report(0.5, {"hotpotqa": 0.5})))
    proc = run_cli("eval", "compare", tmp_path / "base.json", tmp_path / "old.json")
    assert "cannot check that 'old' scored the questions 'base' did" in " ".join(proc.stderr.split())


def test_compare_refuses_a_label_given_twice(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps(_report(0.5, {"hotpotqa": 0.5})))
    proc = run_cli("eval", "compare", f"run={tmp_path / 'a.json'}", f"run={tmp_path / 'b.json'}", check=2)
    assert "label 'run' is given twice" in proc.stderr
    # a bare path is labelled by its name: the same file twice is the same label
    proc = run_cli("eval", "compare", tmp_path / "a.json", tmp_path / "a.json", check=2)
    assert "label 'a' is given twice" in proc.stderr
    proc = run_cli("eval", "compare", f"a={tmp_path / 'a.json'}", f"b={tmp_path / 'b.json'}", "--baseline", "c", check=2)
    assert "--baseline 'c': no run has that label" in proc.stderr
