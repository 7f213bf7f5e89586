"""`grtool export gmr`: training pairs for generative multi-hop retrieval (GMR/GRLS style).

Retrieval pairs, per question with gold documents, in hop order: step k's input is the question followed
by the k gold documents already retrieved, its target is gold document k+1; the last step's target is
``DONE``. A question with n gold documents gives n + 1 pairs::

    <QUESTION> q </QUESTION>                                        → d1
    <QUESTION> q </QUESTION> <EVIDENCE> d1 </EVIDENCE>              → d2
    <QUESTION> q </QUESTION> <EVIDENCE> d1 </EVIDENCE> <EVIDENCE> d2 </EVIDENCE> → DONE

A document is written as ``title: text``, the same string as target and as evidence. Memorization pairs
(``--memorization``) split each corpus document's words at 70%: the first part → the rest.

Memory: questions are read in chunks; for each chunk one pass over the documents keeps only that chunk's
gold documents, so memory is bounded by the chunk, not by the corpus.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from grtool.export.formats import export_outputs, row_writers
from grtool.store.empty import check_rows
from grtool.store.partloop import LoopPart, one_part
from grtool.store.questions import SplitSelection
from grtool.vocab.gmr import memorization_pair, render_document, retrieval_pairs
from grtool.vocab.provenance import input_fingerprint, questions_record, write_sidecar
from grtool.store.stage import iter_batches
from grtool.store.records import resolve_stage
from grtool.records import Report


@dataclass
class GmrResult:
    questions: int = 0
    retrieval_pairs: int = 0
    no_gold: int = 0  # unanswerable or without gold documents
    missing_gold_document: int = 0  # a gold doc id absent from the documents table: question skipped
    missing_examples: list[str] = field(default_factory=list)
    memorization_pairs: int = 0
    too_short: int = 0  # documents of fewer than two words: no memorization pair
    outside_split: int = 0  # questions outside --split
    qids: set[str] = field(default_factory=set)  # the questions with retrieval pairs written

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "qids"}


def _documents_by_id(documents: Path, wanted: set[str]) -> dict[str, str]:
    """One pass over the documents table keeping only ``wanted`` (rendered)."""
    found: dict[str, str] = {}
    value_set = pa.array(sorted(wanted), type=pa.string())
    for batch in iter_batches(documents, columns=["doc_id", "title", "text"]):
        mask = pc.is_in(batch.column("doc_id"), value_set=value_set)
        if not pc.any(mask).as_py():
            continue
        for row in batch.filter(mask).to_pylist():
            found[row["doc_id"]] = render_document(row["title"], row["text"])
    return found


def export_gmr(corpus: str | Path, out: str | Path, *, memorization: bool = False, chunk_questions: int = 50_000, splits: tuple[str, ...] = ()) -> GmrResult:
    """Write the pairs of the corpus run directory ``corpus`` to ``out`` (JSON Lines; ``-``: standard output)."""
    outputs = export_outputs([out], "gmr", inputs=[(corpus, "questions"), (corpus, "documents")])  # claimed before anything is read
    result = GmrResult()

    def part(p: LoopPart) -> None:
        [writer] = row_writers(p, json_array=False)
        for pair in iter_gmr(corpus, result, memorization=memorization, chunk_questions=chunk_questions, splits=splits):
            writer.write(pair)
        skips = {"no gold documents": result.no_gold, "a gold document missing": result.missing_gold_document}
        check_rows(str(out), result.questions, writer.rows, skips, unit="questions", inputs=[str(corpus)])  # before the file is committed
        writer.close()
        inputs = [input_fingerprint(corpus, "questions"), input_fingerprint(corpus, "documents")]
        p.shards[0].record = functools.partial(
            write_sidecar, out, kind="gmr", fmt="gmr", rows=writer.rows, json_array=False, inputs=inputs, questions=questions_record(result.qids, splits=sorted(splits) or None)
        )

    one_part(outputs, part)
    return result


def iter_gmr(corpus: str | Path, result: GmrResult, *, memorization: bool = False, chunk_questions: int = 50_000,
             splits: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:  # fmt: skip
    selection = SplitSelection.of(splits, corpus)
    questions = resolve_stage(corpus, "questions")
    documents = resolve_stage(corpus, "documents")
    chunk: list[dict[str, Any]] = []

    def flush() -> Iterator[dict[str, Any]]:
        docs = _documents_by_id(documents, {d for q in chunk for d in q["gold_doc_ids"]})
        for q in chunk:
            missing = [d for d in q["gold_doc_ids"] if d not in docs]
            if missing:
                result.missing_gold_document += 1
                if len(result.missing_examples) < 5:
                    result.missing_examples.append(f"{q['qid']}: {missing[0]}")
                continue
            pairs = retrieval_pairs(q["qid"], q["question"], [(d, docs[d]) for d in q["gold_doc_ids"]])
            result.questions += 1
            result.qids.add(q["qid"])
            result.retrieval_pairs += len(pairs)
            yield from pairs
        chunk.clear()

    for batch in iter_batches(questions, columns=["qid", "question", "gold_doc_ids", "answerable", "split"]):
        for q in batch.to_pylist():
            if not selection.keeps(q["split"]):
                result.outside_split += 1
                continue
            if not q["gold_doc_ids"] or q["answerable"] is False:
                result.no_gold += 1
                continue
            chunk.append(q)
            if len(chunk) >= chunk_questions:
                yield from flush()
    if chunk:
        yield from flush()

    if memorization:
        for batch in iter_batches(documents, columns=["doc_id", "title", "text"]):
            for row in batch.to_pylist():
                pair = memorization_pair(row["doc_id"], render_document(row["title"], row["text"]))
                if pair is None:
                    result.too_short += 1
                    continue
                result.memorization_pairs += 1
                yield pair


class GmrReport(Report, kw_only=True):
    """``export gmr --json``: :meth:`GmrResult.as_dict`."""

    questions: int
    retrieval_pairs: int
    no_gold: int
    missing_gold_document: int
    missing_examples: list[str]
    memorization_pairs: int
    too_short: int
    outside_split: int
