"""Lookups export, evaluation, retrieve and train share: questions by qid, documents by docid, responses by line.

Both hold no Python object per entry, so a few million triples or a few hundred thousand questions cost tens
of megabytes instead of the gigabytes a ``dict`` of strings would (measured in ``bench/export.py``): questions
are a static marisa trie (``marisa_trie.BytesTrie``) built by streaming the stage, docids the hashed
:class:`grtool.docid.lookup.TripleLookup` the filters use, memory-mapped from files built once per triples stage.
"""

from __future__ import annotations

import gzip
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import marisa_trie
import orjson

from grtool.corpus.datasets import BadRecord, gold_incomplete, record_id
from grtool.corpus.readers import long_integers_kept
from grtool.records import repeated_key_in
from grtool.docid.lookup import TripleLookup, hash_keys, release_build_memory
from grtool.docid.lookup_files import open_lookup
from grtool.errors import InputError
from grtool.store.stage import iter_batches
from grtool.store.records import resolve_stage
from grtool.userinput import missing_input


@dataclass(frozen=True)
class Question:
    qid: str
    dataset: str
    question: str
    gold: tuple[str, ...]  # gold doc ids, hop order where the dataset gives it
    answerable: bool
    gold_complete: bool = True  # False: a gold title was missing from the context (meta.gold_titles_missing)


class QuestionIndex:
    """qid → :class:`Question`, from the ``questions`` stage of a corpus run directory."""

    def __init__(self, trie: marisa_trie.BytesTrie, size: int):
        self._trie = trie
        self.size = size

    @classmethod
    def build(cls, corpus: str | Path) -> "QuestionIndex":
        stage = resolve_stage(corpus, "questions")
        size = 0

        def entries() -> Iterator[tuple[str, bytes]]:
            nonlocal size
            columns = ["qid", "dataset", "question", "gold_doc_ids", "answerable", "meta"]
            for batch in iter_batches(stage, columns=columns):
                for row in batch.to_pylist():
                    size += 1
                    value = [row["dataset"], row["question"], row["gold_doc_ids"] or [], row["answerable"] is not False, not gold_incomplete(row["meta"])]
                    yield row["qid"], orjson.dumps(value)

        trie = marisa_trie.BytesTrie(entries())
        release_build_memory()
        return cls(trie, size)

    def get(self, qid: str) -> Question | None:
        values = self._trie.get(qid)
        if not values:
            return None
        dataset, question, gold, answerable, complete = orjson.loads(values[0])
        return Question(qid, dataset, question, tuple(gold), answerable, complete)


class DocidIndex:
    """Docid key → every document holding that triple, from a ``triples`` stage directory
    (:class:`grtool.docid.lookup.TripleLookup`, the lookup the filters use).

    A triple found in several documents (a collision) retrieves all of them. A docid written tail-first
    (``tail, relation, head``) is found too, as the filters' docid-exists rule accepts it: chains that pass
    the filters teach the model to flip triples, so a flipped docid is a retrieval, not a hallucination.
    """

    def __init__(self, lookup: TripleLookup):
        self.lookup = lookup
        self.triples = lookup.count

    @classmethod
    def build(cls, triples: str | Path) -> "DocidIndex":
        return cls(open_lookup(triples))

    def resolve_many(self, keys: Sequence[str]) -> list[tuple[frozenset[str], bool]]:
        """(documents, flipped) per key (:func:`grtool.docid.normalize` d): as written first, then tail-first;
        no documents when the key names no stored triple. One call per batch of keys."""
        if not keys:
            return []
        resolved = self.lookup.resolve(hash_keys(keys), rows=True)
        return [(self.lookup.doc_ids_of(d), f) for d, f in zip(resolved.docs, resolved.flipped)]

    def resolve(self, key: str) -> tuple[frozenset[str], bool]:
        return self.resolve_many([key])[0]

    def documents(self, key: str) -> frozenset[str]:
        """Documents holding exactly this triple key, as written (empty when none)."""
        docs, flipped = self.resolve(key)
        return frozenset() if flipped else docs


@dataclass(frozen=True)
class Response:
    line: int  # line of a JSON Lines file, or row of a responses stage (1-based)
    qid: str
    text: str
    documents: tuple[str, ...] | None = None  # GMR and BM25 responses name their documents; docid responses are parsed
    markers: str | None = None  # the docid syntax `retrieve` decoded with (special | brackets); None: read both
    unknown: int = 0  # documents named that the corpus does not hold (a TREC run's): hallucinated


def iter_responses(path: str | Path) -> Iterator[Response]:
    """Stream responses: ``{"qid": …, "response": …}`` lines from a JSONL file (plain or .gz) or ``-`` (stdin),
    or the rows of a `grtool retrieve` output directory.

    Blank lines are skipped; anything else that is not such an object stops the run with the file and line.
    """
    if str(path) != "-" and Path(path).is_dir():
        yield from _stage_responses(Path(path))
        return
    name = "<stdin>" if str(path) == "-" else str(path)
    if str(path) == "-":
        handle = sys.stdin.buffer
    else:
        p = Path(path)
        if not p.is_file():
            raise missing_input(p)  # a FIFO or a device named as what it is, not "no such file"
        handle = gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")
    try:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            line = line.rstrip(b"\r\n")
            try:
                row = long_integers_kept(line, orjson.loads(line))  # an id past 64 bits kept digit for digit
            except orjson.JSONDecodeError as e:
                raise InputError(f"{name}, line {lineno}, character {e.pos + 1}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise InputError(f"{name}, line {lineno}: expected a JSON object with 'qid' and 'response'")
            repeated = repeated_key_in(line, row)
            if repeated is not None:
                raise InputError(f"{name}, line {lineno}: key {repeated!r} is given twice; which of its values is meant is unknown")
            # `grtool retrieve --out -` writes its rows, whose response is "text"
            text = row.get("response", row.get("text"))
            try:
                qid = record_id(row, "qid")  # as ingest reads an id: 7.0 is "7", a long integer its digits
            except BadRecord as e:
                raise InputError(f"{name}, line {lineno}: {e.reason}{f' ({e.detail})' if e.detail else ''}") from None
            if not isinstance(text, str):
                raise InputError(f"{name}, line {lineno}: 'response' must be a string, got {type(text).__name__}")
            yield Response(lineno, qid, text, _named_documents(row), _markers(row))
    finally:
        if handle is not sys.stdin.buffer:
            handle.close()


def _stage_responses(path: Path) -> Iterator[Response]:
    row_no = 0
    for batch in iter_batches(resolve_stage(path, "responses"), columns=["qid", "text", "doc_ids", "mode", "markers"]):
        for row in batch.to_pylist():
            row_no += 1
            yield Response(row_no, row["qid"], row["text"] or "", _named_documents(row), _markers(row))


DOCUMENT_MODES = ("gmr", "bm25")  # rows that name their documents (in rank order) instead of docids


def _named_documents(row: dict) -> tuple[str, ...] | None:
    return tuple(row.get("doc_ids") or ()) if row.get("mode") in DOCUMENT_MODES else None


def _markers(row: dict) -> str | None:
    """The syntax a `retrieve` row was decoded with; other sources say nothing, and both syntaxes are read."""
    markers = row.get("markers")
    return markers if markers in ("special", "brackets") else None
