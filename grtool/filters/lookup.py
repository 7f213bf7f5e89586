"""The two lookups the filters need, each built once per run.

- :class:`TripleIndex`: docid → (stored triple, documents), for the triple as written and for its flip
  ``tail, relation, head``, both compared by their key (:func:`grtool.docid.normalize`: spacing forgiven,
  case kept, the rule recall and KTO use too). Strings are never kept: every key is a 64-bit polars hash, and the index is
  three sorted numpy arrays, so a batch of chains is resolved with one ``searchsorted``. Cost: two entries
  (forward and flipped) of 3 × 8 bytes per triple, **≈ 48 MB per million triples** (about 64 MB at the peak
  of the build, which streams the triples stage).
- :class:`QuestionLookup`: qid → dataset, gold documents (as the same 64-bit hashes), normalized answers.

A false hit needs two different strings with equal 64-bit hashes; for 10^8 triples that is about one chance
in 10^11 per docid looked up.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from grtool.docid import Markers, normalize_expr
from grtool.errors import InputError
from grtool.filters.text import normalize_answer
from grtool.store.stage import resolve_stage, shard_paths

HASH_SEED = 0x6772746F6F6C  # any fixed seed: hashes are only compared within one process


@dataclass
class Resolved:
    """Per looked-up docid: the stored triple (its key's hash, 0 when unknown) and the documents holding it."""

    triple: list[int]
    docs: list[tuple[int, ...]]


def docid_hashes(docids: pa.Array | pl.Series, markers: Markers) -> np.ndarray:
    """64-bit hashes of the keys of whole docid strings (markers included); a string not wrapped in
    ``markers`` gets the hash of null, under which no triple is stored."""
    series = docids if isinstance(docids, pl.Series) else pl.from_arrow(docids)
    s = pl.col("d").cast(pl.String)
    inner = s.str.slice(len(markers.start), s.str.len_chars() - len(markers.start) - len(markers.end))
    wrapped = s.str.starts_with(markers.start) & s.str.ends_with(markers.end) & (s.str.len_chars() >= len(markers.start) + len(markers.end))
    frame = pl.DataFrame({"d": series}).select(pl.when(wrapped).then(normalize_expr(inner)).hash(HASH_SEED))
    return frame.to_series().to_numpy()


class TripleIndex:
    def __init__(self, keys: np.ndarray, triples: np.ndarray, docs: np.ndarray, count: int):
        self.keys = keys  # sorted hashes of docid strings, forward and flipped
        self.triples = triples  # the stored (forward) docid's hash, per key
        self.docs = docs  # the document's hash, per key
        self.count = count  # triple rows read

    @classmethod
    def build(cls, triples: str | Path) -> "TripleIndex":
        stage = resolve_stage(triples, "triples")
        shards = shard_paths(stage)
        if not shards:
            empty = np.zeros(0, np.uint64)
            return cls(empty, empty, empty, 0)
        missing = {"doc_id", "head", "relation", "tail"} - set(pl.read_parquet_schema(shards[0]))
        if missing:
            raise InputError(f"{shards[0]}: not a triples table (missing columns {sorted(missing)})")
        # Both readings' keys are made from the parts (grtool.docid.triple_key / flip_key), not read from the
        # stored docid column: the triples stage may have used other markers.
        frame = (
            pl.scan_parquet([str(s) for s in shards])
            .filter(pl.all_horizontal(pl.col("head", "relation", "tail", "doc_id").is_not_null()))
            .select(normalize_expr(pl.col("head", "relation", "tail")), pl.col("doc_id"))
            .select(
                forward=pl.concat_str([pl.col("head"), pl.col("relation"), pl.col("tail")], separator=",").hash(HASH_SEED),
                flipped=pl.concat_str([pl.col("tail"), pl.col("relation"), pl.col("head")], separator=",").hash(HASH_SEED),
                doc=pl.col("doc_id").hash(HASH_SEED),
            )
            .collect(engine="streaming")
        )
        count = frame.height
        forward, flip, doc = (frame.get_column(c).to_numpy() for c in ("forward", "flipped", "doc"))
        del frame
        keys = np.concatenate((forward, flip))
        triple = np.concatenate((forward, forward))
        docs = np.concatenate((doc, doc))
        order = np.lexsort((docs, triple, keys))
        keys, triple, docs = keys[order], triple[order], docs[order]
        # One entry per (key, triple, document): a symmetric triple's flip is itself, and a triple may repeat.
        keep = np.ones(len(keys), bool)
        keep[1:] = (keys[1:] != keys[:-1]) | (triple[1:] != triple[:-1]) | (docs[1:] != docs[:-1])
        return cls(keys[keep], triple[keep], docs[keep], count)

    def resolve(self, docid_hashes: np.ndarray) -> Resolved:
        """Stored triple and documents of each docid hash; an unknown docid gets triple 0 and no documents.

        When a flipped reading and a forward reading of different triples share one string, the forward
        triple wins (its own spelling is the more likely meaning).
        """
        # Sorted needles walk the (large) key array in order: far fewer cache misses than random probes.
        order = np.argsort(docid_hashes, kind="stable")
        needles = docid_hashes[order]
        lo, hi = np.empty_like(order), np.empty_like(order)
        lo[order] = np.searchsorted(self.keys, needles, "left")
        hi[order] = np.searchsorted(self.keys, needles, "right")
        n = hi - lo
        first = np.minimum(lo, max(len(self.keys) - 1, 0))
        triple = np.where(n > 0, self.triples[first] if len(self.keys) else 0, 0)
        single = self.docs[first].tolist() if len(self.keys) else [0] * len(lo)
        docs: list[tuple[int, ...]] = []
        triples = triple.tolist()
        for i, count in enumerate(n.tolist()):
            if count == 0:
                docs.append(())
            elif count == 1:
                docs.append((single[i],))
            else:  # a collision (several documents) or several triples under one string
                span = slice(lo[i], hi[i])
                t, d = self.triples[span], self.docs[span]
                forward = t == docid_hashes[i]
                pick = t[forward][0] if forward.any() else t[0]
                triples[i] = int(pick)
                docs.append(tuple(d[t == pick].tolist()))
        return Resolved(triples, docs)


@dataclass(frozen=True, slots=True)
class QuestionInfo:
    dataset: str
    gold: frozenset[int]  # document hashes
    answers: tuple[str, ...]  # normalized answer and aliases, non-empty ones
    answerable: bool


class QuestionLookup(dict):
    """qid → :class:`QuestionInfo` for every question of a corpus run directory."""

    @classmethod
    def build(cls, corpus: str | Path) -> "QuestionLookup":
        stage = resolve_stage(corpus, "questions")
        shards = shard_paths(stage)
        lookup = cls()
        if not shards:
            return lookup
        frame = pl.read_parquet([str(s) for s in shards], columns=["qid", "dataset", "answer", "answer_aliases", "gold_doc_ids", "answerable"])
        gold = frame.select(pl.col("gold_doc_ids").list.eval(pl.element().hash(HASH_SEED))).to_series().to_list()
        for qid, dataset, answer, aliases, gold_hashes, answerable in zip(
            frame.get_column("qid").to_list(),
            frame.get_column("dataset").to_list(),
            frame.get_column("answer").to_list(),
            frame.get_column("answer_aliases").to_list(),
            gold,
            frame.get_column("answerable").to_list(),
        ):
            answers = tuple(dict.fromkeys(a for a in map(normalize_answer, [answer or "", *(aliases or [])]) if a))
            lookup[qid] = QuestionInfo(dataset or "unknown", frozenset(gold_hashes or ()), answers, answerable is not False)
        return lookup
