"""Worked examples built from a corpus's own questions and gold triples (few-shot turns for small models).

K + 1 answerable questions with an answer and at least two gold documents that all have triples are picked by a
stable hash of the qid (the same in every run and shard), so a prompt can always leave out the question it is
asking and still show K. Each example's answer retrieves one gold triple per gold document, in hop order (the
triple naming the answer for the last hop when there is one), then states the answer. `retrieve --few-shot` and
`chains synthesize --few-shot-corpus` use them.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from grtool.docid import MARKERS
from grtool.store.stage import iter_batches
from grtool.store.records import resolve_stage

Triple = tuple[str, str, str]


@dataclass(frozen=True)
class Example:
    qid: str
    question: str
    answer: str
    triples: tuple[Triple, ...]  # one per gold document, hop order


def example_answer(example: Example, markers: str) -> str:
    """A worked answer in plain steps: one retrieved triple per hop, then the answer."""
    m = MARKERS[markers]
    steps = []
    for hop, triple in enumerate(example.triples):
        lead = "First I need a fact about" if hop == 0 else "Next, what the last fact points to:"
        steps.append(f"{lead} {triple[0]}. {m.render(*triple)}")
    steps.append(f"So the answer is {example.answer}.")
    return " ".join(steps)


def _rank(qid: str) -> str:
    return hashlib.blake2b(qid.encode(), digest_size=8).hexdigest()


def pick_examples(corpus: str | Path, triples: str | Path, k: int, *, split: str | Collection[str] | None = None, exclude: Collection[str] = (),
                  spare: int = 1) -> list[Example]:  # fmt: skip
    """K + ``spare`` answerable questions with an answer and at least two gold documents that all have triples;
    only of ``split`` (a name or several) when given, never one of ``exclude`` (qids)."""
    if k <= 0:
        return []
    candidates = _candidate_questions(corpus, limit=(k + spare) * 8, split=split, exclude=frozenset(exclude))
    gold = {d for _, _, _, docs in candidates for d in docs}
    first_triple = _triples_of(triples, gold)
    examples = []
    for qid, question, answer, docs in candidates:
        chosen = [_best_triple(first_triple.get(d, []), answer if i == len(docs) - 1 else None) for i, d in enumerate(docs)]
        if all(chosen):
            examples.append(Example(qid, question, answer, tuple(chosen)))  # type: ignore[arg-type]
        if len(examples) == k + spare:
            break
    return examples


def _candidate_questions(corpus: str | Path, limit: int, split: str | Collection[str] | None = None, exclude: frozenset[str] = frozenset()) -> list[tuple[str, str, str, tuple[str, ...]]]:
    """The ``limit`` eligible questions of lowest qid hash (one streaming pass; nsmallest keeps a bounded heap)."""
    splits = None if split is None else {split} if isinstance(split, str) else set(split)

    def eligible() -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
        columns = ["qid", "question", "answer", "gold_doc_ids", "answerable", "split"]
        for batch in iter_batches(resolve_stage(corpus, "questions"), columns=columns):
            for row in batch.to_pylist():
                if (splits is not None and row["split"] not in splits) or row["qid"] in exclude:
                    continue
                docs = tuple(row["gold_doc_ids"] or ())
                if row["answerable"] is not False and len(docs) >= 2 and (row["answer"] or "").strip():
                    yield row["qid"], row["question"], row["answer"].strip(), docs

    return heapq.nsmallest(limit, eligible(), key=lambda c: _rank(c[0]))


def _triples_of(triples: str | Path, doc_ids: set[str]) -> dict[str, list[Triple]]:
    found: dict[str, list[tuple[int, Triple]]] = {}
    wanted = list(doc_ids)
    for batch in iter_batches(resolve_stage(triples, "triples"), columns=["doc_id", "idx", "head", "relation", "tail"]):
        batch = batch.filter(pc.is_in(batch["doc_id"], value_set=pa.array(wanted, pa.string())))
        for row in batch.to_pylist():
            found.setdefault(row["doc_id"], []).append((row["idx"], (row["head"], row["relation"], row["tail"])))
    return {d: [t for _, t in sorted(rows)] for d, rows in found.items()}


def _best_triple(triples: list[Triple], answer: str | None) -> Triple | None:
    """The triple that names the answer (last hop), else the document's first triple."""
    if answer:
        for t in triples:
            if answer.lower() in (t[2].lower(), t[0].lower()):
                return t
    return triples[0] if triples else None
