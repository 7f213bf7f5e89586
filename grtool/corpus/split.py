"""`grtool corpus split`: train/dev/test splits by ratio for data that came without them.

A question's split is chosen from a hash of its qid (and ``--seed``) alone, so it never depends on the other
questions: a question keeps its split when more questions are added, and the same corpus always splits the same
way. The output is a new corpus (``OUT/questions`` with the new ``split`` column, ``OUT/documents`` as they were),
part for part like the input, so every later stage reads it as it reads an ingest output.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

from grtool.corpus.datasets import given_split
from grtool.errors import InputError
from grtool.store.questions import split_counts
from grtool.store.records import resolve_stage
from grtool.store.schemas import DOCUMENTS, QUESTIONS
from grtool.store.reading import iter_shard_batches
from grtool.store.partloop import LoopPart, Output, PartLoop
from grtool.store.stage import StageSpec, iter_batches, shard_paths
from grtool.records import Report

DEFAULT_NAMES = ("train", "dev", "test")
UNKNOWN = "unknown"  # ingest's split of a question whose file and record name none
RATIO_TOLERANCE = 1e-6


def parse_ratios(text: str, names: str | None) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """``"0.8,0.1,0.1"`` (and ``"train,dev,test"``) → ratios and split names; a usage error names what is wrong."""
    try:
        ratios = tuple(float(r) for r in text.split(","))
    except ValueError:
        raise InputError(f"--ratios {text!r}: expected numbers separated by commas, e.g. 0.8,0.1,0.1") from None
    if any(not (0.0 <= r <= 1.0) for r in ratios) or abs(sum(ratios) - 1.0) > RATIO_TOLERANCE:
        raise InputError(f"--ratios {text!r}: each between 0 and 1, summing to 1 (they sum to {sum(ratios):g})")
    given = tuple(given_split(n, "--names") for n in names.split(",")) if names is not None else DEFAULT_NAMES[: len(ratios)]
    if len(ratios) < 2 or len(given) != len(ratios):
        raise InputError(f"--ratios {text!r}: give 2 or more ratios, one per split name ({', '.join(given)})" + ("" if names is not None else "; more than 3 need --names"))
    if "" in given or len(set(given)) != len(given) or UNKNOWN in given:
        raise InputError(f"--names {','.join(given)}: split names must be distinct, not empty and not {UNKNOWN!r}")
    return ratios, given


def split_of(qid: str, ratios: tuple[float, ...], names: tuple[str, ...], seed: int) -> str:
    """The split of one question: where a hash of (seed, qid), read as a number in [0, 1), falls among the ratios."""
    digest = hashlib.blake2b(f"{seed}\0{qid}".encode("utf-8"), digest_size=8).digest()
    point = int.from_bytes(digest, "big") / 2**64
    edge = 0.0
    for name, ratio in zip(names, ratios):
        edge += ratio
        if point < edge:
            return name
    return names[-1]


def split_corpus(corpus: str | Path, out: str | Path, *, ratios: tuple[float, ...], names: tuple[str, ...], seed: int = 0, resplit: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Write ``OUT/questions`` (every question with its new split) and ``OUT/documents`` (a copy); returns the
    summary: questions per split. Questions that already have a split are refused unless ``resplit``."""
    questions, documents = resolve_stage(corpus, "questions"), resolve_stage(corpus, "documents")  # finished ones
    held = split_counts(questions)
    named = {s: n for s, n in held.items() if s != UNKNOWN}
    if named and not resplit:
        listed = ", ".join(f"{s} ({n:,} questions)" for s, n in sorted(named.items()))
        raise InputError(f"{questions}: the questions already have splits: {listed}; --resplit replaces them all")
    params = {"ratios": list(ratios), "names": list(names), "seed": seed, **({"resplit": True} if resplit else {})}
    inputs = [str(questions), str(documents)]
    out = Path(out)
    counts: Counter[str] = Counter()
    q_parts, d_parts = shard_paths(questions), shard_paths(documents)
    loop = PartLoop([Output(out / "questions", StageSpec("questions", QUESTIONS, params, inputs)),
                     Output(out / "documents", StageSpec("documents", DOCUMENTS, params, inputs), num_parts=len(d_parts))],
                    len(q_parts), overwrite=overwrite, num_shards=1, shard_index=0)  # fmt: skip

    def split_part(part: LoopPart) -> None:  # questions part i with their new splits, documents part i as it was
        q_shard, d_shard = part.shards
        if q_shard is not None:
            for batch in iter_shard_batches(q_parts[part.index]):
                table = pa.Table.from_batches([batch])
                chosen = [split_of(qid, ratios, names, seed) for qid in table.column("qid").to_pylist()]
                q_shard.count_in(table.num_rows)
                q_shard.write_table(table.set_column(table.schema.get_field_index("split"), "split", pa.array(chosen, pa.string())))
        if d_shard is not None:
            for batch in iter_shard_batches(d_parts[part.index]):
                d_shard.count_in(batch.num_rows)
                d_shard.write_table(pa.Table.from_batches([batch]))

    loop.run(split_part)
    loop.finish()
    for batch in iter_batches(out / "questions", columns=["split"]):
        counts.update(batch.column(0).to_pylist())
    return {"out": str(out), "questions": sum(counts.values()), "by_split": dict(sorted(counts.items())), "replaced": dict(sorted(held.items())) if resplit else {}}


class SplitSummary(Report, kw_only=True):
    """``corpus split --json``."""

    out: str
    questions: int
    by_split: dict[str, int]
    replaced: dict[str, int]
