"""`grtool retrieve --method bm25`: the lexical baseline, on the same corpus and questions as the model.

The engine is bm25s (a maintained library), run with the settings the docs state (:data:`SETTINGS`): English
stopwords, no stemmer, Lucene's BM25 with k1 1.5 and b 0.75. A document is its title, a space and its text.
Every document of the corpus's documents stage is indexed, once per run (a part loop resumed with every part
done builds nothing). Per question the top |gold| + 1 documents are kept (the protocol the ThinkGR paper uses
for one-shot retrievers), or ``--top-k`` N.

The rows are a responses stage like `retrieve`'s (mode ``bm25``): ``doc_ids`` in rank order, ``text`` one line
per document with its score, ``latency_ms`` this question's share of its batch's search time; `eval recall`,
`eval compare`, `show` and `report` read them as any other responses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grtool.errors import InputError
from grtool.extras import require
from grtool.log import activity
from grtool.store.questions import Selection

MODE = "bm25"
ENGINE = "bm25s"
# bm25s's tokenize() and BM25() as grtool calls them; docs/guides/reporting-results.md states them.
SETTINGS: dict[str, Any] = {"stopwords": "en", "stemmer": None, "method": "lucene", "k1": 1.5, "b": 0.75}
BATCH = 1024  # questions searched per call


def document_text(title: str | None, text: str | None) -> str:
    """What BM25 indexes of a document: its title, a space, its text."""
    return f"{title or ''} {text or ''}"


def default_k(gold: list[str] | None) -> int:
    """|gold| + 1: the one-shot retrievers' protocol (a question without gold documents gets 1)."""
    return len(gold or ()) + 1


@dataclass
class Bm25Index:
    """bm25s's index over every document of a corpus, and the doc ids in the order it numbers them."""

    doc_ids: list[str]
    retriever: Any

    @classmethod
    def build(cls, corpus: str | Path) -> "Bm25Index":
        import bm25s

        from grtool.store.records import resolve_stage
        from grtool.store.stage import iter_batches

        doc_ids: list[str] = []
        texts: list[str] = []
        for batch in iter_batches(resolve_stage(corpus, "documents"), columns=["doc_id", "title", "text"]):
            columns = batch.to_pydict()
            doc_ids.extend(columns["doc_id"])
            texts.extend(map(document_text, columns["title"], columns["text"]))
        if not doc_ids:
            raise InputError(f"{corpus}: its documents stage holds no document to index")
        with activity(f"indexing {len(doc_ids):,} documents with BM25"):
            retriever = bm25s.BM25(method=SETTINGS["method"], k1=SETTINGS["k1"], b=SETTINGS["b"])
            retriever.index(tokenize(texts), show_progress=False)
        return cls(doc_ids, retriever)

    def search(self, questions: list[str], ks: list[int]) -> tuple[list[list[tuple[str, float]]], float]:
        """The top ``ks[i]`` (doc id, score) of each question, best first, and the seconds the search took."""
        if not questions:
            return [], 0.0
        start = time.perf_counter()
        k = min(max(ks), len(self.doc_ids))
        found, scores = self.retriever.retrieve(tokenize(questions), k=k, show_progress=False)
        seconds = time.perf_counter() - start
        ranked = [[(self.doc_ids[int(d)], float(s)) for d, s in zip(docs[:want], row[:want])] for docs, row, want in zip(found, scores, ks)]
        return ranked, seconds


def tokenize(texts: list[str]):
    import bm25s

    return bm25s.tokenize(texts, stopwords=SETTINGS["stopwords"], stemmer=SETTINGS["stemmer"], show_progress=False)


def response_row(question: dict[str, Any], ranked: list[tuple[str, float]], latency_ms: float) -> dict[str, Any]:
    """One responses row: the documents in rank order, each with its score in the text."""
    return {
        "qid": question["qid"], "sample": 0, "dataset": question["dataset"],
        "text": "\n".join(f"{rank}. {doc} {score:.4f}" for rank, (doc, score) in enumerate(ranked, 1)),
        "docids": [], "flipped": [], "doc_ids": [doc for doc, _ in ranked], "n_docids": 0, "malformed": 0, "tokens": 0,
        "latency_ms": latency_ms, "finish_reason": "stop", "model": ENGINE, "markers": None, "mode": MODE,
    }  # fmt: skip


def run_bm25(
    corpus: str,
    out: str | Path,
    *,
    datasets: tuple[str, ...] = (),
    splits: tuple[str, ...] = (),
    limit: int | None = None,
    top_k: int | None = None,
    overwrite: bool = False,
    num_shards: int | None = None,
    shard_index: int | None = None,
) -> dict[str, Any]:
    """Answer the selected questions with BM25 over this task's parts; returns the output manifest."""
    require("bm25", "retrieve --method bm25")
    from grtool.store.partloop import Bar, LoopPart, Output, PartLoop
    from grtool.store.records import resolve_stage
    from grtool.store.schemas import RESPONSES
    from grtool.store.stage import StageSpec
    import bm25s

    selection = Selection.of(corpus, datasets, splits, limit)
    documents = resolve_stage(corpus, "documents")
    params = {
        "mode": MODE, "engine": ENGINE, "engine_version": bm25s.__version__, **SETTINGS, "document": "title text",
        "top_k": top_k, "datasets": list(datasets), "splits": list(splits), "limit": limit,
    }  # fmt: skip
    inputs = [str(selection.table.source), str(documents)]
    loop = PartLoop([Output(out, StageSpec("responses", RESPONSES, params, inputs=inputs))], selection.table.num_parts,
                    overwrite=overwrite, num_shards=num_shards, shard_index=shard_index)  # fmt: skip
    index: Bm25Index | None = None

    def before(_: int) -> None:
        nonlocal index
        index = index or Bm25Index.build(corpus)

    def write_part(part: LoopPart) -> None:
        assert index is not None
        questions = selection.rows(part.index)
        part.shard.count_in(len(questions))
        for at in range(0, len(questions), BATCH):
            batch = questions[at : at + BATCH]
            ks = [top_k or default_k(q["gold_doc_ids"]) for q in batch]
            ranked, seconds = index.search([q["question"] or "" for q in batch], ks)
            per_query_ms = 1000 * seconds / len(batch)
            part.shard.write_rows([response_row(q, docs, per_query_ms) for q, docs in zip(batch, ranked)])
            part.shard.count("documents_retrieved", sum(map(len, ranked)))

    loop.run(write_part, Bar("retrieving with BM25"), before_part=before)
    (manifest,) = loop.finish(model=ENGINE)
    return manifest
