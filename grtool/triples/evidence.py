"""A dataset's own gold triples: 2WikiMultihopQA's ``evidences``, kept by ingest in each question's ``meta``.

They serve as a triples stage where a model's extraction is not the point (benchmarks, the train-retrieve
consistency test) and tell `chains gold` which of a gold document's triples the question's hops use.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from grtool.docid import SPECIAL, Markers

Parts = tuple[str, str, str]


def question_evidences(meta: Any) -> list[Parts]:
    """The ``evidences`` triples in a question's ``meta`` (JSON text), in the dataset's order; [] when none."""
    try:
        found = orjson.loads(meta).get("evidences") if isinstance(meta, str) and meta else None
    except (orjson.JSONDecodeError, AttributeError):
        return []
    if not isinstance(found, list):
        return []
    return [tuple(e) for e in found if isinstance(e, list) and len(e) == 3 and all(isinstance(p, str) and p.strip() for p in e)]  # type: ignore[misc]


def evidence_triples(questions: Iterable[dict[str, Any]], documents: Iterable[dict[str, Any]], markers: Markers = SPECIAL) -> list[dict[str, Any]]:
    """Rows of the triples table: every question's evidence triples, each on the gold document titled like its
    head (the first such gold document; an evidence whose head names no gold document is left out). A triple
    two questions share is stored once per document."""
    by_title: dict[str, list[str]] = {}
    for d in documents:
        by_title.setdefault(d["title"], []).append(d["doc_id"])
    rows: list[dict[str, Any]] = []
    idx: dict[str, int] = {}
    seen: set[tuple[str, Parts]] = set()
    for q in questions:
        gold = set(q.get("gold_doc_ids") or ())
        for head, relation, tail in question_evidences(q.get("meta")):
            holder = next((d for d in by_title.get(head, ()) if d in gold), None)
            if holder is None or (holder, (head, relation, tail)) in seen:
                continue
            seen.add((holder, (head, relation, tail)))
            idx[holder] = idx.get(holder, -1) + 1
            rows.append({"doc_id": holder, "idx": idx[holder], "head": head, "relation": relation, "tail": tail,
                         "docid": markers.render(head, relation, tail)})  # fmt: skip
    return rows


def write_evidence_stage(corpus: str | Path, out: str | Path, extra: Iterable[dict[str, Any]] = ()) -> int:
    """A triples stage at ``out`` of :func:`evidence_triples` over an ingest or merge output (one part), followed by
    the triples rows ``extra`` (a benchmark adds the extracted triples of the distractor paragraphs, which have no
    evidences); returns its row count."""
    from grtool.store.schemas import TRIPLES
    from grtool.store.stage import StageSpec, StageWriter, read_table
    from grtool.store.records import resolve_stage

    questions, documents = resolve_stage(corpus, "questions"), resolve_stage(corpus, "documents")
    rows = evidence_triples(read_table(questions).to_pylist(), read_table(documents, ["doc_id", "title"]).to_pylist()) + list(extra)
    stage = StageWriter(out, StageSpec("triples", TRIPLES, {"source": "evidences"}, inputs=[str(questions), str(documents)]), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    stage.finish()
    return len(rows)
