"""`grtool triples evidence` (#48): docids without a model, from 2WikiMultihopQA's evidences, as a triples stage whose
accounting holds (evidences read = rows + merged + rejected, each reject with its reason)."""

from __future__ import annotations

import json

from grtool.corpus.doc_hash import doc_id
from grtool.store.stage import read_table


def test_evidence_triples_stage_from_2wiki_release_files(examples, tmp_path, cli):
    files = [examples / "2wikimultihopqa" / n for n in ("dev.example.json", "train.example.json")]
    cli("corpus", "ingest", *files, "--out", tmp_path / "corpus")
    proc = cli("triples", "evidence", tmp_path / "corpus", "--out", tmp_path / "run", "--json")
    counters = json.loads(proc.stdout)["counters"]
    records = [r for f in files for r in json.loads(f.read_text())]
    assert counters["in"] == sum(len(r["evidences"]) for r in records)
    assert counters["in"] == counters["out"] + counters["merged"] + sum(counters["rejected"].values())
    rows = read_table(tmp_path / "run" / "triples").to_pylist()
    assert len(rows) == counters["out"] > 0
    titles = {doc_id(t, " ".join(s)): t for r in records for t, s in r["context"]}
    for row in rows:  # each triple sits on the document titled like its subject (or that title with its disambiguation)
        assert titles[row["doc_id"]] in (row["head"],) or titles[row["doc_id"]].startswith(row["head"] + " (")
        assert row["docid"] == f"<docid_start>{row['head']}, {row['relation']}, {row['tail']}<docid_end>"
    rejects = [json.loads(x) for x in (tmp_path / "run" / "triples" / "_rejects" / "part-00000.jsonl").read_text().splitlines()]
    assert len(rejects) == sum(counters["rejected"].values())
    assert all(r["reason"] == "head_not_gold_title" and r["record"]["triple"][0] in r["detail"] for r in rejects)
    cli("validate", tmp_path / "run")


def test_a_corpus_without_evidences_is_an_error_naming_the_way_out(examples, tmp_path, cli):
    cli("corpus", "ingest", examples / "inline" / "qa.jsonl", "--split", "dev", "--out", tmp_path / "corpus")
    proc = cli("triples", "evidence", tmp_path / "corpus", "--out", tmp_path / "run", check=1)
    assert "none of its 12 questions has evidences" in proc.stderr and "triples extract" in proc.stderr
