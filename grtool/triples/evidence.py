"""A dataset's own gold triples: 2WikiMultihopQA's ``evidences``, kept by ingest in each question's ``meta``.

They make a triples stage without a model (`grtool triples evidence`: a CPU user's docids, benchmarks, the
train-retrieve consistency test) and tell `chains gold` which of a gold document's triples the question's hops use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from grtool.docid import SPECIAL, Markers, triple_problem
from grtool.records import Report

Parts = tuple[str, str, str]
_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)$")


def _evidence_items(meta: Any) -> list | None:
    """The ``evidences`` list of a question's ``meta`` (JSON text) as given; None when it has none (or holds the
    Hugging Face copies' parallel lists, which are not read as triples: docs/data-formats.md)."""
    try:
        found = orjson.loads(meta).get("evidences") if isinstance(meta, str) and meta else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return found if isinstance(found, list) else None


def _well_formed(evidence: Any) -> bool:
    return isinstance(evidence, list) and len(evidence) == 3 and all(isinstance(p, str) and p.strip() for p in evidence)


def question_evidences(meta: Any) -> list[Parts]:
    """The ``evidences`` triples in a question's ``meta`` (JSON text), in the dataset's order; [] when none."""
    return [tuple(e) for e in _evidence_items(meta) or () if _well_formed(e)]  # type: ignore[misc]


@dataclass
class EvidenceRows:
    """The triples rows of every question's evidences, and the accounting: ``read`` = rows + ``merged`` + rejects."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)  # (record, reason, detail)
    read: int = 0
    merged: int = 0  # a triple two questions give for one document is one row
    questions: int = 0
    questions_without_evidences: int = 0


def evidence_rows(questions: Iterable[dict[str, Any]], documents: Iterable[dict[str, Any]], markers: Markers = SPECIAL) -> EvidenceRows:
    """Every question's evidence triples, each on the gold document titled like its head (the first such gold
    document; else the gold document whose title is the head and a parenthesised disambiguation). Rejected, with the reason: an evidence that is not three non-empty strings (``bad_evidence``), a part
    that cannot live inside a docid (:func:`grtool.docid.triple_problem`), a head that names no gold document of
    the question (``head_not_gold_title``)."""
    by_title: dict[str, list[str]] = {}
    by_base: dict[str, list[str]] = {}  # 2Wiki's subjects drop the titles' disambiguation: "Star Wars" for "Star Wars (film)"
    for d in documents:
        by_title.setdefault(d["title"], []).append(d["doc_id"])
        by_base.setdefault(_DISAMBIGUATION.sub("", d["title"]), []).append(d["doc_id"])
    out = EvidenceRows()
    idx: dict[str, int] = {}
    seen: set[tuple[str, Parts]] = set()
    for q in questions:
        out.questions += 1
        items = _evidence_items(q.get("meta"))
        if not items:
            out.questions_without_evidences += 1
            continue
        gold = set(q.get("gold_doc_ids") or ())
        for position, evidence in enumerate(items):
            out.read += 1
            record = {"qid": q.get("qid"), "evidence": position, "triple": evidence}
            if not _well_formed(evidence):
                out.rejects.append((record, "bad_evidence", "expected [subject, relation, object], three non-empty strings"))
                continue
            head, relation, tail = evidence
            problem = triple_problem((head, relation, tail), (markers.start, markers.end))
            if problem is not None:
                out.rejects.append((record, problem.reason, problem.detail))
                continue
            holder = next((d for d in (*by_title.get(head, ()), *by_base.get(head, ())) if d in gold), None)
            if holder is None:
                out.rejects.append((record, "head_not_gold_title", f"{head!r} is not the title of a gold document of the question"))
                continue
            if (holder, (head, relation, tail)) in seen:
                out.merged += 1
                continue
            seen.add((holder, (head, relation, tail)))
            idx[holder] = idx.get(holder, -1) + 1
            out.rows.append({"doc_id": holder, "idx": idx[holder], "head": head, "relation": relation, "tail": tail,
                             "docid": markers.render(head, relation, tail)})  # fmt: skip
    return out


def evidence_triples(questions: Iterable[dict[str, Any]], documents: Iterable[dict[str, Any]], markers: Markers = SPECIAL) -> list[dict[str, Any]]:
    """Rows of the triples table from every question's evidences (:func:`evidence_rows`, without its accounting)."""
    return evidence_rows(questions, documents, markers).rows


def write_evidence_stage(corpus: str | Path, out: str | Path, extra: Iterable[dict[str, Any]] = (), *, markers: Markers = SPECIAL, overwrite: bool = False) -> int:
    """A triples stage at ``out`` of :func:`evidence_rows` over an ingest or merge output (one part, its rejects with
    their reasons), followed by the triples rows ``extra`` (a benchmark adds the extracted triples of the distractor
    paragraphs, which have no evidences); returns its row count."""
    from grtool.errors import DataProblem
    from grtool.store import empty
    from grtool.store.schemas import TRIPLES
    from grtool.store.partloop import LoopPart, Output, PartLoop
    from grtool.store.stage import StageSpec, read_table
    from grtool.store.records import resolve_stage

    questions, documents = resolve_stage(corpus, "questions"), resolve_stage(corpus, "documents")
    found = evidence_rows(read_table(questions).to_pylist(), read_table(documents, ["doc_id", "title"]).to_pylist(), markers)
    if not found.read and not extra and not empty.allowed():
        raise DataProblem(
            f"{questions}: none of its {found.questions:,} questions has evidences ([subject, relation, object] "
            "lists, as 2WikiMultihopQA's release ships them): nothing to make triples of; triples extract "
            "makes them with a model (--allow-empty accepts an empty stage)"
        )
    rows = found.rows + list(extra)
    params = {"source": "evidences", **({"docid_markers": [markers.start, markers.end]} if markers != SPECIAL else {})}
    loop = PartLoop([Output(out, StageSpec("triples", TRIPLES, params, inputs=[str(questions), str(documents)]))], 1, overwrite=overwrite, num_shards=1, shard_index=0)

    def write(part: LoopPart) -> None:
        shard = part.shard
        shard.count_in(found.read + len(rows) - len(found.rows))  # the evidences read and the extra rows
        shard.count_merged(found.merged)
        for record, reason, detail in found.rejects:
            shard.reject(record, reason, source=str(questions), detail=detail)
        shard.count("questions", found.questions)
        shard.count("questions_without_evidences", found.questions_without_evidences)
        shard.write_rows(rows)

    loop.run(write)
    (manifest,) = loop.finish()
    return manifest.rows


class EvidenceReport(Report, kw_only=True):
    """``triples evidence --json``: the triples written and the stage's counters."""

    triples: int
    counters: dict[str, Any]
