"""`grtool corpus merge`: the union of ingested corpora.

Documents are deduplicated by ``doc_id`` (the first occurrence's title and text are kept, ``datasets``
becomes the union), questions are concatenated in input order and a qid seen twice is rejected. This is
how MoreHopQA's documents join the 2WikiMultihopQA corpus. Same two phases, bounded memory and resume as
ingest (the work directory is ``OUT/_merge_work``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from grtool.corpus.ingest import rows_per_part_param, run_two_phase
from grtool.corpus.dedup_spill import MAX_BUCKETS, Spill, SpillPlan
from grtool.errors import InputError
from grtool.log import progress
from grtool.store.io import is_stdio, stdin_rows
from grtool.store.schemas import DOCUMENTS, QUESTIONS
from grtool.store.layout import MANIFEST
from grtool.store.stage import StageSpec, iter_batches, shard_paths
from grtool.store.records import load_manifest, resolve_stage
import msgspec
from grtool.records import Report

WORK_DIR = "_merge_work"
ROWS_PER_BUCKET = 50_000
STDIN_ROWS_ESTIMATE = 5_000_000  # rows assumed for `-` (unknown in advance; more buckets cost little)


def _stages(inputs: list[str | Path]) -> tuple[list[Path], list[Path]]:
    docs, questions = [], []
    for i in inputs:
        if is_stdio(i):
            continue
        docs.append(resolve_stage(i, "documents"))
        p = Path(i)
        if (p / "questions" / MANIFEST).exists() or ((p / MANIFEST).exists() and load_manifest(p).table == "questions"):
            questions.append(resolve_stage(i, "questions"))
    for d in docs + questions:  # finished (resolve_stage)
        shard_paths(d)  # a damaged shard is named before OUT is created (each is hashed once per process)
    return docs, questions


def _buckets(stages: list[Path], stdin: bool) -> int:
    rows = sum(load_manifest(s).rows or 0 for s in stages) + (STDIN_ROWS_ESTIMATE if stdin else 0)
    return max(1, min(MAX_BUCKETS, math.ceil(rows / ROWS_PER_BUCKET)))


def _read_stdin(spill: Spill) -> None:
    for table, lineno, row in stdin_rows("documents"):
        try:
            if table == "documents":
                spill.add_document(row["doc_id"], row["title"], row["text"], row.get("datasets") or [])
            elif table == "questions":
                spill.add_question({name: row.get(name) for name in QUESTIONS.names}, "<stdin>", f"line {lineno}")
            else:
                raise InputError(f"<stdin>, line {lineno}: unknown _table {table!r} (expected documents or questions)")
        except KeyError as e:
            raise InputError(f"<stdin>, line {lineno}: a {table} row without {e}") from None


def merge(inputs: list[str | Path], out: str | Path, *, overwrite: bool = False, rows_per_part: int | None = None) -> dict[str, Any]:
    if len(inputs) < 1:
        raise InputError("corpus merge needs at least one input directory")
    docs, questions = _stages(inputs)
    stdin = any(is_stdio(i) for i in inputs)
    names = [str(p) for p in docs + questions] + (["-"] if stdin else [])
    params = {"op": "merge", **rows_per_part_param(rows_per_part)}
    doc_spec = StageSpec("documents", DOCUMENTS, params, names)
    q_spec = StageSpec("questions", QUESTIONS, params, names)
    identity = {"params": params, "inputs": doc_spec.identity()["inputs"]}

    def fill(work: Path) -> SpillPlan:
        spill = Spill(work, doc_buckets=_buckets(docs, stdin), question_buckets=_buckets(questions, stdin), identity=identity)
        try:
            with progress() as bar:
                task = bar.add_task("reading corpora", total=sum(load_manifest(s).rows or 0 for s in docs + questions))
                if stdin:  # `corpus ingest ... --out -` rows, tagged with their table
                    _read_stdin(spill)
                for stage in docs:
                    for batch in iter_batches(stage):
                        for row in batch.to_pylist():
                            spill.add_document(row["doc_id"], row["title"], row["text"], row["datasets"] or [])
                        bar.advance(task, batch.num_rows)
                for stage in questions:
                    n = 0
                    for batch in iter_batches(stage):
                        for row in batch.to_pylist():
                            n += 1
                            spill.add_question(row, str(stage), f"row {n}")
                        bar.advance(task, batch.num_rows)
            return spill.close()
        except BaseException:
            spill.abort()
            raise

    resumed = run_two_phase(out, WORK_DIR, doc_spec, q_spec, identity, fill, overwrite=overwrite)
    if is_stdio(out):
        return {"out": "-"}
    result: dict[str, Any] = {"out": str(out), "resumed": resumed, "rejected": {}}
    for table in ("documents", "questions"):
        d = Path(out) / table
        if (d / MANIFEST).exists():
            m = load_manifest(d)
            result[table] = m.rows or 0
            for reason, n in m.counters.rejected.items():
                result["rejected"][f"{table}: {reason}"] = n
            if table == "documents":
                result["documents_merged"] = m.counters.merged
    return result


class MergeSummary(Report, kw_only=True):
    """``corpus merge --json``: a table's figures only where its stage was written."""

    out: str
    resumed: bool
    rejected: dict[str, int]
    documents: int | msgspec.UnsetType = msgspec.UNSET
    documents_merged: int | msgspec.UnsetType = msgspec.UNSET
    questions: int | msgspec.UnsetType = msgspec.UNSET
