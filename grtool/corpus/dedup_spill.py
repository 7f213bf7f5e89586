"""Deduplication with bounded memory: spill rows to hash buckets, then write each bucket's distinct rows.

Phase 1 (:class:`Spill`) streams every input once. Each document goes to the bucket ``crc32(doc_id) % K`` and
each question to ``crc32(qid) % K`` (Arrow IPC files in a work directory), tagged with its input sequence
number; records that do not fit go to a rejects file. Nothing is written to the output yet, so a bad input
file stops the run with no shard visible.

Phase 2 plans the output parts from the bucket counts — consecutive small buckets are packed into one part of at
most ``max_rows`` spilled rows, a bucket bigger than that is split over several parts — and then, one part at a
time (:func:`write_document_part`, :func:`question_part_writer`, driven by a ``PartLoop`` per table), loads its
buckets, keeps the first occurrence (lowest sequence number) of each key and writes it. Memory is bounded by one
part (or one big bucket), not by the input. All of it is deterministic, so a resumed run rebuilds exactly the parts
that are missing.

- documents: duplicates are folded into the first row (``datasets`` becomes the sorted union) and counted
  as ``merged``;
- questions: a qid seen before is rejected with reason ``duplicate qid`` (it is a different record claiming
  the same key, not the same row).
"""

from __future__ import annotations

import fnmatch
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
import orjson
import polars as pl
import pyarrow as pa

from grtool.corpus.datasets import gold_incomplete_expr
from grtool.errors import InputError
from grtool.holds import hold
from grtool.store.outputs import file_kind_name
from grtool.records import Count, read_record, to_builtins
from grtool.store.schemas import DOCUMENTS, QUESTIONS
from grtool.store.stage import MAX_ROWS_PER_SHARD
from grtool.store.records import atomic_write_bytes, dumps

DOC_SPILL = pa.schema([("seq", pa.int64()), *DOCUMENTS])
QUESTION_SPILL = pa.schema([("seq", pa.int64()), *QUESTIONS, ("source", pa.string()), ("position", pa.string())])
PLAN = "plan.json"
FLUSH_ROWS = 32_768
MAX_BUCKETS = 256
BUCKET_TARGET_BYTES = 32 << 20  # of (estimated, decompressed) input per bucket


class TableSpill(msgspec.Struct, forbid_unknown_fields=True):
    """One table's spill in the plan: its bucket count, the rows spilled to each bucket, the rejects."""

    buckets: Annotated[int, msgspec.Meta(ge=1, le=MAX_BUCKETS)]
    rows: list[Count]
    rejects: Count

    def __post_init__(self) -> None:
        if len(self.rows) != self.buckets:  # phase 2 reads bucket i for rows[i]: a shorter list loses buckets
            raise ValueError(f"rows: {len(self.rows)} counts for {self.buckets} buckets")


class SpillPlan(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``plan.json`` of a finished phase 1 (written last, so a resumed run trusts the spill it describes)."""

    identity: dict[str, Any]  # the run's parameters and inputs: a plan of another run is not reused
    documents: TableSpill
    questions: TableSpill
    empty_inputs: list[str] = []
    detected: list[dict[str, Any]] = []


def buckets_for_bytes(estimated_bytes: int) -> int:
    return max(1, min(MAX_BUCKETS, math.ceil(estimated_bytes / BUCKET_TARGET_BYTES)))


class _BucketedTable:
    """Rows of one table buffered as tuples, flushed into per-bucket Arrow IPC stream files."""

    def __init__(self, root: Path, name: str, schema: pa.Schema, key: str, k: int):
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schema = schema
        self.key_index = schema.names.index(key)
        self.k = k
        self.buffer: list[tuple] = []
        self.bucket: list[int] = []
        self.writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        self.sinks: dict[int, Any] = {}
        self.rows = [0] * k

    def add(self, row: tuple) -> None:
        """``row`` holds the schema's fields in order."""
        self.buffer.append(row)
        self.bucket.append(zlib.crc32(row[self.key_index].encode("utf-8")) % self.k)
        if len(self.buffer) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        columns = list(zip(*self.buffer))
        table = pa.table([pa.array(col, type=f.type) for col, f in zip(columns, self.schema)], schema=self.schema)
        buckets = np.asarray(self.bucket, dtype=np.int64)
        order = np.argsort(buckets, kind="stable")
        table = table.take(pa.array(order))
        sorted_b = buckets[order]
        starts = np.flatnonzero(np.r_[True, sorted_b[1:] != sorted_b[:-1]])
        ends = np.r_[starts[1:], len(sorted_b)]
        for s, e in zip(starts.tolist(), ends.tolist()):
            b = int(sorted_b[s])
            self._writer(b).write_table(table.slice(s, e - s))
            self.rows[b] += e - s
        self.buffer.clear()
        self.bucket.clear()

    def _writer(self, b: int) -> pa.ipc.RecordBatchStreamWriter:
        if b not in self.writers:
            sink = pa.OSFile(str(self.dir / f"bucket-{b:04d}.arrow"), "wb")
            self.sinks[b] = sink
            self.writers[b] = pa.ipc.new_stream(sink, self.schema)
        return self.writers[b]

    def close(self) -> None:
        self.flush()
        for w in self.writers.values():
            w.close()
        for s in self.sinks.values():
            s.close()


# What a run writes in its work folder (``OUT/_ingest_work``, ``OUT/_merge_work``): the plan, the rejects, the
# generic questions waiting for their documents (grtool.corpus.generic), and each table's buckets in a folder of its
# own. Anything else there is not grtool's and stays, named, when the folder is cleared.
WORK_FILES = (PLAN, f"{PLAN}.*.tmp", "rejects-documents.jsonl", "rejects-questions.jsonl", "generic-questions.jsonl")
WORK_FOLDERS = {"documents": "bucket-[0-9][0-9][0-9][0-9].arrow", "questions": "bucket-[0-9][0-9][0-9][0-9].arrow"}


_WARNED: set[Path] = set()  # the work folders whose user entries were named (once a run: it clears its folder more than once)


def _named_like(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def remove_work(root: Path) -> None:
    """Clear a run's work folder of what grtool writes there (:data:`WORK_FILES`, :data:`WORK_FOLDERS`), and remove
    it when nothing else is left; a user's entry there stays, named in a warning (never deleted, at any depth). A
    link goes, never what it points to."""
    from grtool.log import log

    if root.is_symlink():
        root.unlink()
        return
    if root.exists() and not root.is_dir():
        raise InputError(f"{root}: {file_kind_name(root)} where grtool keeps a run's work folder; move it away and run again")
    if not root.exists():
        return
    left: list[Path] = []
    for entry in root.iterdir():
        buckets = WORK_FOLDERS.get(entry.name)
        if entry.is_symlink() and (buckets is not None or _named_like(entry.name, WORK_FILES)):
            entry.unlink()  # named like grtool's own: the link goes, never what it points to (a spill never writes through it)
        elif buckets is not None and entry.is_dir():
            kept = []
            for f in list(entry.iterdir()):
                if fnmatch.fnmatchcase(f.name, buckets) and (f.is_symlink() or f.is_file()):
                    f.unlink(missing_ok=True)
                else:
                    kept.append(f)
            left += kept
            if not kept:
                entry.rmdir()
        elif _named_like(entry.name, WORK_FILES) and entry.is_file():
            entry.unlink(missing_ok=True)
        else:
            left.append(entry)
    if not left:
        root.rmdir()
    elif root not in _WARNED:
        _WARNED.add(root)
        log.warning("%s: kept %d entr%s grtool did not write there: %s", root, len(left), "y" if len(left) == 1 else "ies", ", ".join(str(e.relative_to(root)) for e in sorted(left)[:5]))


class Spill:
    """Phase 1 sink: documents, questions and rejects of a whole run, bucketed by key."""

    def __init__(self, root: Path, doc_buckets: int, question_buckets: int, identity: dict[str, Any]):
        remove_work(root)  # an earlier run's spill, not reusable
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.identity = identity
        self.seq = 0
        self.docs = _BucketedTable(root, "documents", DOC_SPILL, "doc_id", doc_buckets)
        self.questions = _BucketedTable(root, "questions", QUESTION_SPILL, "qid", question_buckets)
        self.reject_files = {t: open(root / f"rejects-{t}.jsonl", "wb") for t in ("documents", "questions")}
        self.reject_counts = {"documents": 0, "questions": 0}
        self.empty_inputs: list[str] = []  # inputs without a record (a warning beside other inputs)
        self.detected: list[dict[str, Any]] = []  # what each input was read as (ingest)

    def add_document(self, doc_id: str, title: str, text: str, datasets: list[str]) -> None:
        self.seq += 1
        self.docs.add((self.seq, doc_id, title, text, datasets))

    def add_question(self, row: dict[str, Any], source: str, position: str) -> None:
        self.seq += 1
        self.questions.add((self.seq, *(row[name] for name in QUESTIONS.names), source, position))

    def reject(self, table: str, record: Any, reason: str, source: str | None, position: str | None, detail: str | None) -> None:
        entry = {"record": record, "reason": reason, "source": source, "position": position, "detail": detail}
        self.reject_files[table].write(orjson.dumps(entry, default=str) + b"\n")
        self.reject_counts[table] += 1

    def close(self) -> SpillPlan:
        """Flush everything and write the plan: the spill is complete and reusable by a resumed run."""
        self.docs.close()
        self.questions.close()
        for f in self.reject_files.values():
            f.close()
        hold("spilled")  # tests: a run killed with every row in the buckets and no plan yet (nothing reusable)
        plan = SpillPlan(
            identity=orjson.loads(dumps(self.identity)),  # as JSON holds it: compared with a resumed run's
            documents=TableSpill(self.docs.k, list(self.docs.rows), self.reject_counts["documents"]),
            questions=TableSpill(self.questions.k, list(self.questions.rows), self.reject_counts["questions"]),
            empty_inputs=list(self.empty_inputs),
            detected=list(self.detected),
        )
        atomic_write_bytes(self.root / PLAN, dumps(to_builtins(plan)))
        return plan

    def abort(self) -> None:
        for f in self.reject_files.values():
            f.close()
        remove_work(self.root)


def load_plan(root: Path, identity: dict[str, Any]) -> SpillPlan | None:
    """The plan of a finished spill of the same run, or None (then phase 1 runs again)."""
    p = root / PLAN
    if not p.exists():
        return None
    plan = read_record(p, SpillPlan, what="spill plan")
    return plan if plan.identity == orjson.loads(dumps(identity)) else None  # the identity as JSON holds it


# ------------------------------------------------------------------------------------------ phase 2


@dataclass(frozen=True)
class Part:
    """One output part: whole buckets ``buckets``, or chunk ``chunk`` of ``chunks`` of a single big bucket."""

    index: int
    buckets: tuple[int, ...]
    chunk: int = 0
    chunks: int = 1


def plan_parts(rows: list[int], max_rows: int = MAX_ROWS_PER_SHARD) -> list[Part]:
    """Pack consecutive buckets into parts of at most ``max_rows`` spilled rows; split bigger buckets."""
    parts: list[Part] = []
    group: list[int] = []
    group_rows = 0

    def close_group() -> None:
        nonlocal group, group_rows
        if group:
            parts.append(Part(len(parts), tuple(group)))
        group, group_rows = [], 0

    for b, n in enumerate(rows):
        if n == 0:
            continue
        if n > max_rows:
            close_group()
            k = math.ceil(n / max_rows)
            first = len(parts)  # (not len(parts) inside the loop: it grows while the chunks are added)
            parts.extend(Part(first + j, (b,), j, k) for j in range(k))
            continue
        if group_rows + n > max_rows:
            close_group()
        group.append(b)
        group_rows += n
    close_group()
    if not parts:  # an empty table is still one (empty) part, which also carries the rejects
        parts.append(Part(0, ()))
    return parts


def table_parts(plan: SpillPlan, table: str) -> list[Part]:
    """The parts of one table under a plan; ``--rows-per-part`` (in the run's parameters) sets their size."""
    max_rows = plan.identity.get("params", {}).get("rows_per_part") or MAX_ROWS_PER_SHARD
    return plan_parts(_spilled(plan, table).rows, max_rows)


def _spilled(plan: SpillPlan, table: str) -> TableSpill:
    return plan.documents if table == "documents" else plan.questions


def _load(root: Path, table: str, buckets: tuple[int, ...], schema: pa.Schema) -> pl.DataFrame:
    tables = []
    for b in buckets:
        f = root / table / f"bucket-{b:04d}.arrow"
        if f.exists():
            with pa.memory_map(str(f)) as src:
                tables.append(pa.ipc.open_stream(src).read_all())
    t = pa.concat_tables(tables) if tables else schema.empty_table()
    return pl.from_arrow(t).sort("seq")  # type: ignore[return-value]


def _chunk(df: pl.DataFrame, part: Part) -> pl.DataFrame:
    if part.chunks == 1:
        return df
    size = math.ceil(df.height / part.chunks)
    return df.slice(part.chunk * size, size)


def _iter_rejects(root: Path, table: str) -> Iterator[dict[str, Any]]:
    f = root / f"rejects-{table}.jsonl"
    if f.exists():
        with open(f, "rb") as fh:
            for line in fh:
                yield orjson.loads(line)


def _write_rejects(sh: Any, root: Path, table: str, plan: SpillPlan | None = None) -> None:
    """Part 0 carries the run's rejects (and the count of its empty inputs)."""
    n = 0
    for r in _iter_rejects(root, table):
        sh.reject(r["record"], r["reason"], source=r["source"], position=r["position"], detail=r["detail"])
        n += 1
    sh.count_in(n)
    if plan is not None and plan.empty_inputs:
        sh.count("empty_inputs", len(plan.empty_inputs))


def write_document_part(root: Path, plan: SpillPlan, part: Part, sh: Any) -> None:
    """The distinct documents of one part; duplicates fold into the first occurrence."""
    df = _chunk(_fold_documents(_load(root, "documents", part.buckets, DOC_SPILL)), part)
    n_in = int(df["n"].sum()) if df.height else 0
    sh.count_in(n_in)
    sh.count_merged(n_in - df.height)
    if part.index == 0:
        _write_rejects(sh, root, "documents", plan)
    sh.write_table(df.drop("n").to_arrow())


def _fold_documents(df: pl.DataFrame) -> pl.DataFrame:
    # Sorted by seq, so group order and `first` follow the first occurrence: deterministic.
    return df.group_by("doc_id", maintain_order=True).agg(
        pl.col("title").first(),
        pl.col("text").first(),
        pl.col("datasets").list.explode(keep_nulls=False, empty_as_null=False).unique().sort().alias("datasets"),
        pl.len().alias("n"),
    )


def question_duplicates(root: Path, plan: SpillPlan) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """``(duplicate, first)`` for every question whose qid was seen before (reads only the key columns)."""
    cols = ["seq", "qid", "source", "position"]
    for b, n in enumerate(plan.questions.rows):
        if n == 0:
            continue
        df = _load(root, "questions", (b,), QUESTION_SPILL).select(cols)
        dup = df.filter(~pl.col("qid").is_first_distinct())
        if dup.height:
            first = df.filter(pl.col("qid").is_first_distinct())
            joined = dup.join(first, on="qid", suffix="_first")
            for r in joined.sort("seq").iter_rows(named=True):
                yield r, {"source": r["source_first"], "position": r["position_first"]}


def resolve_missing_gold(root: Path, plan: SpillPlan) -> pl.DataFrame:
    """Gold titles absent from a question's own context, looked up among every document of the run.

    HotpotQA fullwiki contexts are retrieved paragraphs and often lack a gold one; ingested (or merged)
    together with the Wikipedia dump, the title names exactly one abstract there. Returns ``seq`` → new
    ``gold_doc_ids`` (supporting-fact order) and ``meta`` (``gold_titles_resolved``, ``gold_titles_missing``
    = what is still unresolved) for the affected questions only; memory is bounded by their number.
    """
    affected: dict[int, dict[str, Any]] = {}
    for b, n in enumerate(plan.questions.rows):
        if n == 0:
            continue
        df = _load(root, "questions", (b,), QUESTION_SPILL).select("seq", "dataset", "gold_doc_ids", "meta")
        df = df.filter(gold_incomplete_expr())
        for r in df.iter_rows(named=True):
            meta = orjson.loads(r["meta"])
            titles = list(dict.fromkeys(sf[0] for sf in meta.get("supporting_facts") or []))
            affected[r["seq"]] = {"dataset": r["dataset"], "gold": r["gold_doc_ids"], "meta": meta, "titles": titles}
    if not affected:
        return pl.DataFrame(schema={"seq": pl.Int64, "gold_new": pl.List(pl.String), "meta_new": pl.String})

    wanted_titles = {t for a in affected.values() for t in a["meta"]["gold_titles_missing"]}
    wanted_ids = {d for a in affected.values() for d in a["gold"]}
    by_title: dict[tuple[str, str], tuple[int, str]] = {}  # (dataset, title) -> (seq, doc_id) of its first document
    title_of: dict[str, str] = {}
    for b, n in enumerate(plan.documents.rows):
        if n == 0:
            continue
        df = _load(root, "documents", (b,), DOC_SPILL).select("seq", "doc_id", "title", "datasets")
        df = df.filter(pl.col("title").is_in(list(wanted_titles)) | pl.col("doc_id").is_in(list(wanted_ids)))
        for r in df.iter_rows(named=True):
            title_of[r["doc_id"]] = r["title"]
            for dataset in r["datasets"] or []:
                key = (dataset, r["title"])
                if r["title"] in wanted_titles and (key not in by_title or r["seq"] < by_title[key][0]):
                    by_title[key] = (r["seq"], r["doc_id"])

    rows = []
    for seq, a in affected.items():
        missing = a["meta"]["gold_titles_missing"]
        gold: list[str] = []
        for t in a["titles"]:
            if t in missing:
                found = by_title.get((a["dataset"], t))
                gold += [found[1]] if found else []
            else:
                gold += [d for d in a["gold"] if title_of.get(d) == t]
        resolved = [t for t in missing if (a["dataset"], t) in by_title]
        if not resolved:
            continue
        meta = {**a["meta"], "gold_titles_resolved": resolved}
        still = [t for t in missing if t not in resolved]
        meta.pop("gold_titles_missing")
        if still:
            meta["gold_titles_missing"] = still
        rows.append({"seq": seq, "gold_new": list(dict.fromkeys(gold)), "meta_new": orjson.dumps(meta).decode()})
    return pl.DataFrame(rows, schema={"seq": pl.Int64, "gold_new": pl.List(pl.String), "meta_new": pl.String})


def question_part_writer(root: Path, plan: SpillPlan) -> Callable[[Part, Any], None]:
    """What writes one part of the questions, in input order; a repeated qid is rejected (see
    :func:`question_duplicates`). Gold titles missing from a context are resolved once, for every part."""
    names = QUESTIONS.names
    fixes = resolve_missing_gold(root, plan)

    def write(part: Part, sh: Any) -> None:
        buckets = _load(root, "questions", part.buckets, QUESTION_SPILL)
        if fixes.height:
            buckets = (
                buckets.join(fixes, on="seq", how="left")
                .with_columns(pl.coalesce("gold_new", "gold_doc_ids").alias("gold_doc_ids"), pl.coalesce("meta_new", "meta").alias("meta"))
                .drop("gold_new", "meta_new")
                .sort("seq")
            )
        # duplicates are decided over whole buckets (a qid lives in one bucket), then chunked
        buckets = buckets.with_columns(pl.col("qid").is_first_distinct().alias("_first"))
        df = _chunk(buckets, part)
        sh.count_in(df.height)
        if part.index == 0:
            _write_rejects(sh, root, "questions", plan)
        dups = df.filter(~pl.col("_first"))
        if dups.height:
            firsts = buckets.filter(pl.col("_first")).select("qid", "source", "position")
            for r in dups.join(firsts, on="qid", suffix="_first").sort("seq").iter_rows(named=True):
                record = {k: r[k] for k in names}
                sh.reject(record, "duplicate qid", source=r["source"], position=r["position"], detail=f"first seen in {r['source_first']}, {r['position_first']}")
        sh.write_table(df.filter(pl.col("_first")).select(names).to_arrow())

    return write
