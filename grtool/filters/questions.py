"""The lookups the filters need, each built once per run.

- :class:`grtool.docid.lookup.TripleLookup`: docid key → (stored triple, documents), as written or flipped
  (the one triples → documents lookup; eval recall and KTO use it too).
- :class:`QuestionLookup`: qid → dataset, gold documents (as the lookup's 64-bit hashes), normalized answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from grtool.docid.lookup import HASH_SEED
from grtool.vocab.text import normalize_answer
from grtool.store.reading import read_shards_frame
from grtool.store.records import resolve_stage
from grtool.store.stage import shard_paths


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
        frame = read_shards_frame(shards, ["qid", "dataset", "answer", "answer_aliases", "gold_doc_ids", "answerable"])
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
