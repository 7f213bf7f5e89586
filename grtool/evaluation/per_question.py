"""`eval recall --per-question`: every scored question with its responses, their docids and what each did.

Chains and responses hold hash doc ids only; the entries add the documents' titles (from the corpus's
documents stage) and the question's split, read once for the doc ids and qids the entries name.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from grtool.errors import InputError
from grtool.evaluation.verdicts import GOLD, HALLUCINATED, NON_GOLD, Score
from grtool.vocab.readers import Question
from grtool.log import log
from grtool.store.records import is_stage_dir, load_manifest, refuse_unfinished, resolve_stage
from grtool.store.stage import iter_batches


SCORED = "scored"
NO_RESPONSE = "no_response"  # selected and scorable, but the responses hold no row for it


class PerQuestion:
    """Collects the scored responses by question (in the order their questions first appear), then builds the
    report's ``questions`` list. ``corpus``: where titles and splits are read (a run directory or its
    questions stage; the documents stage beside it)."""

    def __init__(self, corpus: str | Path):
        self.corpus = corpus
        self._by_qid: dict[str, tuple[Question, list[dict[str, Any]]]] = {}

    def add(self, score: Score) -> None:
        self._by_qid.setdefault(score.question.qid, (score.question, []))[1].append(_response_detail(score))

    def entries(self, without_response: Collection[Question] = ()) -> list[dict[str, Any]]:
        questions = [q for q, _ in self._by_qid.values()] + list(without_response)
        doc_ids = {d for q in questions for d in q.gold} | {d for _, rows in self._by_qid.values() for r in rows for d in r["retrieved"]}
        titles = lookup_values(self.corpus, "documents", "doc_id", "title", doc_ids)
        splits = lookup_values(self.corpus, "questions", "qid", "split", {q.qid for q in questions})
        out = []
        for question, rows in self._by_qid.values():
            for row in rows:
                row["retrieved"] = [{"doc_id": d, "title": titles.get(d), "verdict": GOLD if d in question.gold else NON_GOLD} for d in row["retrieved"]]
            out.append({
                **_about(question, splits, titles), "status": SCORED, "responses": len(rows),
                "recall": _mean([r["recall"] for r in rows]), "exact": _mean([float(r["exact"]) for r in rows]),
                "docids": sum(len(r["docids"]) for r in rows), "hallucinated": sum(len(r["hallucinated"]) for r in rows), "rows": rows,
            })  # fmt: skip
        for question in without_response:
            out.append({**_about(question, splits, titles), "status": NO_RESPONSE, "responses": 0, "recall": None, "exact": None,
                        "docids": 0, "hallucinated": 0, "rows": []})  # fmt: skip
        return out


def _response_detail(score: Score) -> dict[str, Any]:
    """One response: its recall and exact set, each docid with its verdict, the documents it retrieved (doc ids
    until :meth:`PerQuestion.entries` adds titles) and its hallucinated docids."""
    verdicts = score.verdicts()
    return {
        "line": score.response.line,  # line of the JSON Lines file, or row of the responses directory (1-based)
        "recall": score.recall,
        "exact": score.exact,
        "docids": [{"docid": v.docid, "verdict": v.verdict, "documents": list(v.documents), "flipped": v.flipped} for v in verdicts],
        "retrieved": sorted(score.retrieved),
        "hallucinated": [v.docid for v in verdicts if v.verdict == HALLUCINATED],
        "malformed": score.malformed,
    }


def _about(question: Question, splits: dict[str, str], titles: dict[str, str]) -> dict[str, Any]:
    return {
        "qid": question.qid,
        "dataset": question.dataset,
        "split": splits.get(question.qid),
        "question": question.question,
        "gold": [{"doc_id": d, "title": titles.get(d)} for d in question.gold],
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def lookup_values(corpus: str | Path, table: str, key: str, value: str, wanted: Collection[str]) -> dict[str, str]:
    """``key`` → ``value`` for the wanted keys, streaming one stage of the corpus (a run directory, or a stage of
    it: the ``table`` stage beside it is read). Empty, with a warning, when the corpus has no such stage."""
    if not wanted:
        return {}
    stage = stage_beside(Path(corpus), table)
    if stage is None:
        log.warning("%s: no %s stage here or beside it: the per-question %ss are left out", corpus, table, value)
        return {}
    keys = pa.array(sorted(wanted), pa.string())
    found: dict[str, str] = {}
    for batch in iter_batches(stage, columns=[key, value]):
        hits = batch.filter(pc.is_in(batch.column(key), value_set=keys))
        found.update(zip(hits.column(key).to_pylist(), hits.column(value).to_pylist()))
    return found


def stage_beside(corpus: Path, table: str) -> Path | None:
    """The ``table`` stage of a run directory, or beside a stage of it (the questions stage a manifest names)."""
    for where in (corpus, corpus.parent) if is_stage_dir(corpus) else (corpus,):
        try:
            found = resolve_stage(where, table, finished=False)
        except InputError:
            continue
        refuse_unfinished(found, load_manifest(found))  # found, but a killed or failed run's: said, not passed over
        return found
    return None
