"""Which questions of a corpus a stage reads: ``--split`` (repeatable), the one selection every stage that reads
questions shares (chains synthesize / gold, filters apply, export sft / kto / gmr, retrieve).

A split named that no question has is a usage error naming the splits the corpus holds: a typo (``--split
valid``) must not select nothing, or everything. The selection is recorded in the stage's manifest parameters
(``split``), so resuming an output with another selection is refused like any other changed option.

:class:`Selection` adds ``--dataset`` and ``--limit``: the questions `retrieve` answers, which `eval recall`
selects again from a retrieve manifest to count the questions left without a response.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from grtool.errors import InputError
from grtool.store.io import InputTable, is_stdio
from grtool.store.stage import iter_batches
from grtool.store.records import resolve_stage


def split_counts(corpus: str | Path) -> Counter[str]:
    """Questions per split of a corpus run directory (or its questions stage)."""
    counts: Counter[str] = Counter()
    for batch in iter_batches(resolve_stage(corpus, "questions"), columns=["split"]):
        counts.update(s if s is not None else "unknown" for s in batch.column(0).to_pylist())
    return counts


SPLIT_RULE = "split names are lower case; validation, val, valid and development are dev; training is train, testing test"
# One split's other names, in grtool's words (ingest normalises records, file names and --split with them)
SPLIT_NAMES = {"validation": "dev", "val": "dev", "valid": "dev", "development": "dev", "training": "train", "testing": "test"}


def canonical_split(name: str) -> str:
    """A split name as grtool writes it: without surrounding blanks, lower case, ``validation`` as ``dev``."""
    name = name.strip().lower()
    return SPLIT_NAMES.get(name, name)


def _as_held(name: str, present: Counter[str]) -> str:
    """``--split Training`` selects the questions ingest wrote as ``train``, said once; a name the corpus holds as
    written (a corpus of an older grtool, which kept records' names) is taken as it is."""
    canonical = canonical_split(name)
    if name in present or canonical not in present:
        return name
    from grtool.log import log

    log.info("--split %r is read as %r (%s)", name, canonical, SPLIT_RULE)
    return canonical


@dataclass(frozen=True)
class SplitSelection:
    """The splits a stage reads (empty: every question)."""

    splits: tuple[str, ...] = ()

    @classmethod
    def of(cls, splits: Iterable[str] | None, corpus: str | Path | None = None) -> "SplitSelection":
        """The selection ``--split`` asks for, checked against the questions of ``corpus`` (not on stdin)."""
        names = tuple(sorted(dict.fromkeys(s.strip() for s in splits or ())))
        if "" in names:
            raise InputError("--split: an empty split name")
        if not names or corpus is None or is_stdio(corpus):
            return cls(names)
        present = split_counts(corpus)  # read once: the names mapped and checked against it
        selection = cls(tuple(sorted(dict.fromkeys(_as_held(s, present) for s in names))))
        selection.check(corpus, present)
        return selection

    def __bool__(self) -> bool:
        return bool(self.splits)

    def check(self, corpus: str | Path, present: Counter[str]) -> None:
        """Every selected split is one ``present`` (:func:`split_counts` of ``corpus``) holds."""
        missing = [s for s in self.splits if s not in present]
        if missing:
            held = ", ".join(f"{s} ({n:,} questions)" for s, n in sorted(present.items())) or "no questions at all"
            raise InputError(f"--split {', '.join(missing)}: no question of {resolve_stage(corpus, 'questions')} has this split; it holds {held}")

    def keeps(self, split: str | None) -> bool:
        return not self.splits or (split or "unknown") in self.splits

    def record(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with the selection added (only when one is made: outputs written before stay resumable)."""
        return {**params, "split": sorted(self.splits)} if self.splits else params

    def qids(self, corpus: str | Path) -> "SelectedQids":
        """The selected questions of ``corpus`` by qid, for stages that read rows of other tables (chains,
        responses) carrying a qid."""
        if not self.splits:
            return SelectedQids(None)
        wanted = pa.array(self.splits, type=pa.string())
        qids: set[str] = set()
        for batch in iter_batches(resolve_stage(corpus, "questions"), columns=["qid", "split"]):
            keep = pc.is_in(pc.fill_null(batch.column(1), "unknown"), value_set=wanted)
            qids.update(batch.column(0).filter(keep).to_pylist())
        return SelectedQids(frozenset(qids))


class SelectedQids:
    """The qids a stage reads (None: all of them)."""

    def __init__(self, qids: frozenset[str] | None):
        self.qids = qids
        self._values = None if qids is None else pa.array(sorted(qids), type=pa.string())

    def __contains__(self, qid: object) -> bool:
        return self.qids is None or qid in self.qids

    def filter(self, batch: pa.RecordBatch | pa.Table) -> tuple[pa.RecordBatch | pa.Table, int]:
        """The rows of ``batch`` (a ``qid`` column) of selected questions, and how many were left out."""
        if self._values is None:
            return batch, 0
        kept = batch.filter(pc.is_in(batch.column("qid"), value_set=self._values))
        return kept, batch.num_rows - kept.num_rows


# ------------------------------------------------------------------------------------------ the questions to answer

QUESTION_COLUMNS = ["qid", "dataset", "split", "question", "gold_doc_ids", "answerable"]


@dataclass
class Selection:
    """The questions to answer: a questions stage filtered by dataset and split, the first ``limit`` of them."""

    table: InputTable
    datasets: tuple[str, ...] = ()
    splits: tuple[str, ...] = ()
    quota: list[int | None] | None = None  # rows per part under --limit (None: every matching row)

    @classmethod
    def of(cls, corpus: str | Path, datasets: tuple[str, ...] = (), splits: tuple[str, ...] = (), limit: int | None = None) -> "Selection":
        table = InputTable.open(corpus, "questions")
        if table.source == "-":
            raise InputError("retrieve reads questions from a corpus run directory or its questions stage, not stdin")
        selection = cls(table, tuple(datasets), SplitSelection.of(splits, corpus).splits)
        counts = [selection._count(i) for i in range(table.num_parts)]
        if sum(counts) == 0:
            what = ", ".join(f"{k} {', '.join(v)}" for k, v in (("dataset", datasets), ("split", splits)) if v) or "any"
            raise InputError(f"{table.source}: no questions selected ({what}); see `grtool corpus stats` for what it holds")
        if limit is not None:
            left, quota = limit, []
            for n in counts:
                quota.append(min(n, left))
                left -= quota[-1]
            selection.quota = quota
        return selection

    def _matching(self, part: int, columns: list[str]):
        keeps = SplitSelection(self.splits).keeps
        for batch in self.table.iter_part(part, columns=columns):
            yield from (r for r in batch if (not self.datasets or r["dataset"] in self.datasets) and keeps(r["split"]))

    def _count(self, part: int) -> int:
        return sum(1 for _ in self._matching(part, ["dataset", "split"]))

    def rows(self, part: int) -> list[dict[str, Any]]:
        wanted = None if self.quota is None else self.quota[part]
        rows = []
        for row in self._matching(part, QUESTION_COLUMNS):
            if wanted is not None and len(rows) >= wanted:
                break
            rows.append(row)
        return rows

    def qids(self) -> set[str]:
        """Every selected question of every part (all shards': the prompt must be the same in each)."""
        return {r["qid"] for part in range(self.table.num_parts) for r in self.rows(part)}

    def planned(self, parts: list[int]) -> int:
        return sum(self.quota[i] if self.quota is not None else self._count(i) for i in parts)  # type: ignore[misc]
