"""TREC files in and out of `grtool eval recall`: the format ranx, trec_eval and pytrec_eval read.

- **in** (``--run FILE``): a run of any other retriever (pyserini, FlashRAG, a dense retriever), one line
  ``qid Q0 doc rank score tag`` per retrieved document. Each question's documents are ranked by score (highest
  first; ties by rank) and cut at |gold| + 1 (the paper's protocol for one-shot retrievers) or ``--top-k``; a
  document is named by its grtool doc id or by its title (underscores read as spaces, as Wikipedia ids write
  them). A title several documents share names all of them, as a docid held by several documents does. A
  document the corpus does not hold counts as hallucinated.
- **out** (``--trec-run``, ``--trec-qrels``): the first response of every scored question as a ranked run
  (the order it named its documents; score = documents − rank + 1, as grtool ranks without scores) and the
  gold documents of the same questions as qrels (``qid 0 doc 1``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import IO, TYPE_CHECKING

from grtool.errors import InputError
from grtool.evaluation.verdicts import Score
from grtool.vocab.readers import QuestionIndex, Response
from grtool.userinput import missing_input

if TYPE_CHECKING:
    from grtool.store.partloop import FileWriter

RUN_FIELDS = "qid Q0 doc rank score tag"


def read_run(path: str | Path, questions: QuestionIndex, corpus: str | Path, top_k: int | None = None) -> list[Response]:
    """The responses a TREC run file holds, one per qid in the order the qids first appear."""
    p = Path(path)
    if not p.is_file():
        raise missing_input(p)
    ranked: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    first_line: dict[str, int] = {}
    with open(p, encoding="utf-8", errors="replace") as handle:
        for lineno, line in enumerate(handle, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 6:
                raise InputError(f"{p}, line {lineno}: expected 6 fields '{RUN_FIELDS}', got {len(fields)}")
            qid, _, doc, rank, score, _ = fields
            try:
                entry = (float(score), int(rank), doc)
            except ValueError:
                raise InputError(f"{p}, line {lineno}: rank {rank!r} must be an integer and score {score!r} a number") from None
            if not math.isfinite(entry[0]):  # nan sorts nowhere: the ranking would follow the lines' order
                raise InputError(f"{p}, line {lineno}: score {score!r} is not a finite number")
            first_line.setdefault(qid, lineno)
            ranked[qid].append(entry)
    if not ranked:
        raise InputError(f"{p}: no run line in it ('{RUN_FIELDS}')")
    names = DocumentNames.of(corpus, {doc for docs in ranked.values() for _, _, doc in docs})
    responses = []
    for qid, docs in ranked.items():
        docs.sort(key=lambda e: (-e[0], e[1]))
        question = questions.get(qid)
        depth = top_k or (len(question.gold) + 1 if question is not None else len(docs))
        found: list[str] = []
        unknown = 0
        for _, _, doc in docs[:depth]:
            ids = names.resolve(doc)
            unknown += not ids
            found.extend(d for d in ids if d not in found)
        responses.append(Response(first_line[qid], qid, "", tuple(found), unknown=unknown))
    return responses


class DocumentNames:
    """A run's document names → grtool doc ids, read from the corpus's documents stage for the names the run uses."""

    def __init__(self, ids: set[str], by_title: dict[str, list[str]]):
        self.ids, self.by_title = ids, by_title

    @classmethod
    def of(cls, corpus: str | Path, names: set[str]) -> "DocumentNames":
        from grtool.evaluation.per_question import stage_beside
        from grtool.store.stage import iter_batches

        stage = stage_beside(Path(corpus), "documents")
        if stage is None:
            raise InputError(f"{corpus}: no documents stage here or beside it, to map the run's documents to")
        ids: set[str] = set()
        by_title: dict[str, list[str]] = defaultdict(list)
        for batch in iter_batches(stage, columns=["doc_id", "title"]):
            for doc_id, title in zip(*batch.to_pydict().values()):
                if doc_id in names:
                    ids.add(doc_id)
                for name in {title or "", (title or "").replace(" ", "_")} & names:
                    by_title[name].append(doc_id)
        return cls(ids, dict(by_title))

    def resolve(self, name: str) -> list[str]:
        return [name] if name in self.ids else self.by_title.get(name, [])


def ranked_documents(score: Score) -> list[str]:
    """A scored response's documents in the order it named them (a docid's documents in doc id order)."""
    if score.response.documents is not None:
        return list(dict.fromkeys(score.response.documents))
    return list(dict.fromkeys(d for docs, _ in score.resolved for d in sorted(docs)))


class TrecWriter:
    """Collects the first response of every scored question; :meth:`write` writes the run and the qrels."""

    def __init__(self, tag: str = "grtool"):
        self.tag = "".join("_" if c.isspace() else c for c in tag) or "grtool"  # one field of the line
        self.runs: dict[str, list[str]] = {}
        self.gold: dict[str, tuple[str, ...]] = {}

    def add(self, score: Score) -> None:
        qid = score.question.qid
        if qid not in self.runs:
            self.runs[qid] = ranked_documents(score)
            self.gold[qid] = score.question.gold

    def write(self, run: FileWriter | None, qrels: FileWriter | None) -> None:
        """The run and the qrels written to the files their claims hold (:func:`grtool.store.partloop.claim_file`),
        each whole when it appears, or neither when an id cannot be written."""
        for qid, docs in ((q, [*self.runs[q], *self.gold[q]]) for q in self.runs):  # a TREC line is split at whitespace
            spaced = next((i for i in (qid, *docs) if not str(i) or any(c.isspace() for c in str(i))), None)
            if spaced is not None:
                from grtool.errors import InputError
                from grtool.userinput import shown

                raise InputError(f"--trec-run/--trec-qrels: the id {shown(spaced)} (question {shown(qid)}) holds whitespace or is empty, "
                                 f"which a TREC file cannot hold (its fields are split at whitespace); nothing was written")  # fmt: skip
        for claimed, lines in ((run, self._run_lines), (qrels, self._qrels_lines)):
            if claimed is not None:
                with claimed.open() as out:
                    lines(out)

    def _run_lines(self, out: IO[str]) -> None:
        for qid, docs in self.runs.items():
            for rank, doc in enumerate(docs, 1):
                out.write(f"{qid} Q0 {doc} {rank} {len(docs) - rank + 1} {self.tag}\n")

    def _qrels_lines(self, out: IO[str]) -> None:
        for qid, gold in self.gold.items():
            for doc in dict.fromkeys(gold):
                out.write(f"{qid} 0 {doc} 1\n")
