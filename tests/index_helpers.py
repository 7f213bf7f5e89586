"""Triples stages for the index tests: the bundled triples file and stages written from rows."""

from __future__ import annotations

import json
from pathlib import Path

from paths_helpers import EXAMPLES, TEST_DATA
from grtool.store.schemas import TRIPLES
from grtool.store.stage import StageSpec, StageWriter
import hashlib
from collections import defaultdict


BUNDLED = TEST_DATA / "index_triples.jsonl"


def write_triples_stage(path: Path, rows: list[dict]) -> Path:
    stage = StageWriter(path, StageSpec("triples", TRIPLES, params={"test": True}), num_parts=2)
    half = len(rows) // 2
    for part, chunk in enumerate((rows[:half], rows[half:])):
        with stage.shard(part) as sh:
            sh.count_in(len(chunk))
            sh.write_rows(chunk)
    stage.finish()
    return path


def two_wiki_rows() -> list[dict]:
    """Evidence triples of the 2Wiki records (the examples' and the tests' own), each in the documents of its head and (when the tail is
    a supporting title too) its tail: bridge triples land in two documents (collisions)."""
    records = []
    for f in [*sorted((EXAMPLES / "2wikimultihopqa").glob("d*.json")), TEST_DATA / "2wikimultihopqa" / "data_ids_dev.tests.json"]:
        records += json.loads(f.read_text())
    docs: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for rec in records:
        titles = {t for t, _ in rec["supporting_facts"]}
        for head, rel, tail in rec["evidences"]:
            for title in {head, tail} & titles or {head}:
                if (head, rel, tail) not in docs[title]:
                    docs[title].append((head, rel, tail))
    rows = []
    for title, triples in sorted(docs.items()):
        doc_id = hashlib.sha1(title.encode()).hexdigest()[:16]
        for i, (h, r, t) in enumerate(triples):
            rows.append({"doc_id": doc_id, "idx": i, "head": h, "relation": r, "tail": t, "docid": f"<docid_start>{h}, {r}, {t}<docid_end>"})
    return rows
