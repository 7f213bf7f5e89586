"""A small real run directory for the `grtool report` tests, without a model.

The tests' own 2Wiki file (tests/data: invented films and directors in the release layout) is ingested and its evidence triples written as the triples stage; then a pipeline runs corpus
stats, triples collisions, `chains gold`, the filters (``--max-docids 2``: the chains of questions with three or
more hops are rejected, so the page has reasons to show), the SFT export, recall of two response files (every
gold chain, and every chain cut after its first docid) and their comparison with a plot.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import TEST_DATA, run_cli

from grtool.store.records import load_manifest
from grtool.store.stage import read_table

SECTION_IDS = ("stages", "funnel", "filters", "corpus", "collisions", "overlap", "eval", "commands")

PIPELINE = """
out = "{out}"

[[stages]]
name = "stats"
run = "corpus stats"
args = ["{{out}}/corpus"]
options = {{ json = true, plot = "{{out}}/reports/stats.png" }}
stdout = "{{out}}/reports/stats.json"

[[stages]]
name = "collisions"
run = "triples collisions"
args = ["{{out}}/triples"]
options = {{ corpus = "{{out}}/corpus", json = true }}
stdout = "{{out}}/reports/collisions.json"

[[stages]]
name = "chains"
run = "chains gold"
args = ["{{out}}/corpus"]
options = {{ triples = "{{out}}/triples", out = "{{out}}/chains" }}

[[stages]]
name = "filters"
run = "filters apply"
args = ["{{out}}/chains"]
options = {{ corpus = "{{out}}/corpus", triples = "{{out}}/triples", out = "{{out}}/filtered", max_docids = 2 }}

[[stages]]
name = "export-sft"
run = "export sft"
args = ["{{out}}/filtered"]
options = {{ corpus = "{{out}}/corpus", out = "{{out}}/export/sft.json" }}

[[stages]]
name = "recall-gold"
run = "eval recall"
args = ["{responses}/gold.jsonl"]
options = {{ corpus = "{{out}}/corpus", triples = "{{out}}/triples", json = true }}
stdout = "{{out}}/reports/recall-gold.json"

[[stages]]
name = "recall-first"
run = "eval recall"
args = ["{responses}/first.jsonl"]
options = {{ corpus = "{{out}}/corpus", triples = "{{out}}/triples", json = true }}
stdout = "{{out}}/reports/recall-first.json"

[[stages]]
name = "recall-table"
run = "eval compare"
args = ["gold={{out}}/reports/recall-gold.json", "first docid={{out}}/reports/recall-first.json"]
options = {{ out = "{{out}}/reports/recall.md", plot = "{{out}}/reports/recall.png" }}
"""


def build_run(root: Path) -> Path:
    """The run directory ``root/run`` (responses files beside it, in ``root/responses``)."""
    from grtool.triples.evidence import write_evidence_stage

    out, responses = root / "run", root / "responses"
    run_cli("-q", "corpus", "ingest", TEST_DATA / "2wikimultihopqa" / "data_ids_dev.tests.json", "--out", out / "corpus")
    write_evidence_stage(out / "corpus", out / "triples")
    # the responses: each question's gold chain as a model might write it, and the same cut after its first docid
    responses.mkdir()
    run_cli("-q", "chains", "gold", out / "corpus", "--triples", out / "triples", "--out", root / "gold-chains")
    chains = read_table(root / "gold-chains").to_pylist()
    end = "<docid_end>"
    (responses / "gold.jsonl").write_text("".join(json.dumps({"qid": c["qid"], "response": c["text"]}) + "\n" for c in chains))
    first = [{"qid": c["qid"], "response": c["text"][: c["text"].index(end) + len(end)]} for c in chains]
    (responses / "first.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first))
    toml = root / "run.toml"
    toml.write_text(PIPELINE.format(out=out, responses=responses))
    run_cli("-q", "pipeline", "run", toml)
    return out


def expected_numbers(run: Path) -> dict:
    """The numbers the page must show, read from the run's own records."""
    chains, filtered = load_manifest(run / "chains"), load_manifest(run / "filtered")
    extra = filtered.counters.extra
    return {
        "questions": load_manifest(run / "corpus" / "questions").rows,
        "chained": chains.counters.extra["questions_chained"],
        "kept": extra["kept"],
        "exported": json.loads((run / "export" / "sft.json.grtool.json").read_text())["rows"],
        "reasons": {k.split("/", 1)[1]: v for k, v in extra.items() if k.startswith("reason/")},
        "recall": {name: json.loads((run / "reports" / f"recall-{name}.json").read_text())["recall"] for name in ("gold", "first")},
        "commands": [json.loads(f.read_text())["command"] for f in sorted((run / "_pipeline").glob("*.json"))],
    }
