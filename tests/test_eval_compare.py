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


def test_compare_bad_report_exits_2(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    proc = run_cli("eval", "compare", tmp_path / "x.json", check=2)
    assert "not a JSON report" in proc.stderr
