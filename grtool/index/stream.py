"""`index build --source docids` without a Python object per docid.

The triples stage is read batch by batch into Arrow/polars columns (the row checks, the docid syntax and the
flips are column expressions; only the rare rows they flag go through the Python rules of
:mod:`grtool.docid`); the distinct docids, their documents and their sorted order are columnar too. The token ids
go straight to a file on disk (``tokens.u32`` in the build's temporary directory) that the FM build reads as a
read-only memory map, its pages given back as they are read.

Tokenizing: a docid rendered from its stored parts is ``<docid_start>head, relation, tail<docid_end>``, and
relations repeat massively, heads and tails recur. Where the tokenizer splits the text at the boundaries of
``head`` / ``, relation`` / ``, tail`` (a regex pre-tokenizer that never joins a letter or digit with the comma
after it: the GPT-2 / tiktoken byte-level BPEs), the ids of the whole docid are the ids of those three pieces
joined, so each distinct piece of a batch is tokenized once. That is checked per tokenizer on a sample of the
corpus's docids before it is used, and spot-checked on every 64th docid while it is used (any difference: the
whole build tokenizes every docid whole); docids whose parts end in another character are tokenized whole.

The result equals :func:`grtool.index.build.read_docids` + :func:`grtool.index.build.tokenize` (the in-memory
reference, kept for the test that compares the two) array for array.
"""

from __future__ import annotations

import heapq
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from grtool.docid import (
    DOCID_END,
    DOCID_START,
    SPECIAL,
    PartProblem,
    Triple,
    docid_text_problem,
    flip,
    normalize,
    normalize_expr,
    triple_key,
    triple_problem,
)
from grtool.errors import InputError
from grtool.docid.lookup import release_build_memory
from grtool.index.tokenizer import DocidTokenizer
from grtool.store.io import InputTable
from grtool.store.reading import arrow_source, iter_shard_batches, shard_rows

READ_BATCH = 262_144  # rows per record batch read from a shard
TOKENIZE_CHUNK = 32_768  # sequences tokenized (and written) at a time (their ids are Python lists meanwhile)
CHECK_EVERY = 64  # while pieces are joined, every 64th docid is also tokenized whole and compared
AGREEMENT_SAMPLE = 2_048  # docids checked before joining pieces is trusted for a tokenizer
TOKEN_DTYPE = np.uint32
DOCIDS_ROW_GROUP = 1 << 16  # docids.parquet in row groups of this many rows (its readers take whole row groups)

_S, _E = len(DOCID_START), len(DOCID_END)
# A superset of what docid_text_problem rejects (Rust regex; [\s\x1c-\x1f] covers every str.isspace character):
# the rows it flags are judged by the Python rule itself.
_SUSPECT = (
    r"^[\s\x1c-\x1f]*$|<docid_start>|<docid_end>|[\[\]\x00-\x1f\x7f-\x9f\x{2028}\x{2029}]"
    r"|^[\s\x1c-\x1f]*,|,[\s\x1c-\x1f]*,|,[\s\x1c-\x1f]*$"
)
_ALNUM_END = r"[\p{L}\p{N}]$"  # a piece ending in a letter or digit never shares a pre-token with the comma after it


@dataclass
class SyntaxReport:
    """Docids of an (older) triples stage that the docid syntax (:func:`grtool.docid.triple_problem`) rejects:
    how many distinct docids per reason code, and the first of them (file, row, docid, why)."""

    reasons: dict[str, int] = field(default_factory=dict)
    first: str | None = None

    def add(self, where: str, row_no: int, docid: str, problem: PartProblem) -> None:
        self.reasons[problem.reason] = self.reasons.get(problem.reason, 0) + 1
        if self.first is None:
            self.first = f"{where}, row {row_no}: {docid[:120]!r}: {problem.detail}"

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def summary(self) -> str:
        return ", ".join(f"{reason} {n}" for reason, n in sorted(self.reasons.items()))


def inner_text(docid: str) -> str:
    """A docid's text between its markers."""
    return docid[len(DOCID_START) : len(docid) - len(DOCID_END)]


def flip_from_parts(docid: str, parts: tuple[object, object, object]) -> str | None:
    """The tail-first spelling of ``docid`` rendered from the row's own head, relation, tail, when the text is
    their rendering (as written, or by its key and parts the syntax accepts); else None."""
    if not all(isinstance(p, str) for p in parts):
        return None
    triple: Triple = parts  # type: ignore[assignment]
    if docid == SPECIAL.render(*triple) or (normalize(inner_text(docid)) == triple_key(*triple) and triple_problem(triple) is None):
        return SPECIAL.render(*flip(triple))
    return None


def _batches(table: InputTable, part: int, columns: list[str]) -> Iterator[pl.DataFrame]:
    """One part's rows as frames of ``columns`` (strings; a missing column, or a value that is not a string,
    is null: the reference path treats them alike)."""
    path = table.parts[part]
    if path is None:
        for rows in table.iter_part(part, columns=columns):
            yield pl.DataFrame({c: [v if isinstance(v := r.get(c), str) else None for r in rows] for c in columns}, schema={c: pl.String for c in columns})
        return
    have = set(pq.read_schema(arrow_source(path)).names)
    wanted = [c for c in columns if c in have]
    for batch in iter_shard_batches(path, wanted, READ_BATCH):
        df = pl.from_arrow(batch)
        assert isinstance(df, pl.DataFrame)
        yield df.select(
            [pl.col(c).cast(pl.String) if df.schema[c] in (pl.String, pl.Categorical) else pl.lit(None, pl.String).alias(c) for c in wanted]
            + [pl.lit(None, pl.String).alias(c) for c in columns if c not in have]
        )


def _first_row_problem(df: pl.DataFrame, where: str, row0: int) -> None:
    """The reference path's row checks, in its order: the first bad row raises."""
    docid, doc_id = pl.col("docid"), pl.col("doc_id")
    empty = docid.is_null() | (docid == "")
    unmarked = ~(docid.str.starts_with(DOCID_START) & docid.str.ends_with(DOCID_END)) | (docid.str.len_chars() <= _S + _E)
    no_doc = doc_id.is_null() | (doc_id == "")
    flags = df.select(empty.alias("e"), unmarked.alias("m"), no_doc.alias("d"))
    bad = flags.select(pl.any_horizontal(pl.all()).fill_null(True).arg_true()).to_series()
    if not len(bad):
        return
    i = int(bad[0])
    e, m, _ = flags.row(i)
    row_no = row0 + i + 1
    text = df.get_column("docid")[i]
    if e or text is None:
        raise InputError(f"{where}, row {row_no}: empty docid")
    if m:
        raise InputError(f"{where}, row {row_no}: docid {text[:80]!r} is not '{DOCID_START}head, relation, tail{DOCID_END}'")
    raise InputError(f"{where}, row {row_no}: empty doc_id")


def _parts_expr(h: str, r: str, t: str) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """Whether ``docid`` is the rendering of the row's parts; the head's and relation's lengths in characters."""
    rendered = pl.concat_str([pl.lit(DOCID_START), pl.col(h), pl.lit(", "), pl.col(r), pl.lit(", "), pl.col(t), pl.lit(DOCID_END)])
    renders = (pl.col("docid") == rendered).fill_null(False)
    return renders, pl.when(renders).then(pl.col(h).str.len_chars()), pl.when(renders).then(pl.col(r).str.len_chars())


def _piece(docid: pl.Expr, lh: pl.Expr, lr: pl.Expr, which: str) -> pl.Expr:
    """head / relation / tail of a rendered docid, cut by the recorded lengths."""
    if which == "h":
        return docid.str.slice(_S, lh)
    if which == "r":
        return docid.str.slice(_S + lh + 2, lr)
    return docid.str.slice(_S + lh + lr + 4, docid.str.len_chars() - (_S + _E + 4) - lh - lr)


ROWS_PER_BUCKET = 200_000  # rows of the stage settled in memory at a time (one bucket: its docids deduped, grouped, sorted)
MAX_BUCKETS = 512
MERGE_ROWS = 200_000  # rows held over all sorted runs at once while they are merged
RUN_BATCH = 1_024  # rows per record batch of a sorted run
MERGE_BATCHES = 4  # batches a run the merge may hold (with MERGE_ROWS, the larger)
ROW_GROUP = DOCIDS_ROW_GROUP
_ROW_SCHEMA = {"docid": pl.String, "doc_id": pl.String, "lh": pl.UInt32, "lr": pl.UInt32, "alt": pl.String, "g": pl.UInt64}
_SEQ_SCHEMA = {"docid": pl.String, "flipped": pl.Boolean, "lh": pl.UInt32, "lr": pl.UInt32}


@dataclass
class Sequences:
    """The sequences of a docid index, in order (docid strings sorted), on disk: ``seq_file`` (Parquet: ``docid``,
    ``flipped``, and the character lengths ``lh``/``lr`` of the head and relation where the string is the
    rendering of parts, null otherwise) and ``docids.parquet`` in ``workdir``; in memory only fixed-width arrays:
    the documents as a CSR map into the sorted ``doc_ids``."""

    seq_file: Path
    count: int
    offsets: np.ndarray  # int64 [k + 1]
    docs: np.ndarray  # uint32
    flipped: np.ndarray  # bool [k]
    doc_ids: pl.Series
    unsplit: int = 0
    symmetric: int = 0
    skipped: SyntaxReport = field(default_factory=SyntaxReport)
    # what pieces_agree checks: sequences with lh set spread evenly over the corpus, drawn by the merge
    sample: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=_SEQ_SCHEMA))

    @property
    def frame(self) -> pl.DataFrame:
        """All sequences as one frame (small corpora, tests)."""
        from grtool.store.reading import read_shards_frame

        return read_shards_frame([self.seq_file])

    def chunks(self, rows: int) -> Iterator[pl.DataFrame]:
        for batch in pq.ParquetFile(self.seq_file).iter_batches(batch_size=rows):
            df = pl.from_arrow(batch)
            assert isinstance(df, pl.DataFrame)
            yield df


class _SpreadSample:
    """Every ``step``-th of a stream of rows, ``step`` doubling (and every second row kept dropped) whenever more
    than twice ``size`` are held: about ``size`` rows spread evenly over a stream of unknown length, in one pass.
    The rows are copied out as Python values: a polars string column gathered from a frame keeps that frame's
    whole string buffer alive."""

    def __init__(self, size: int):
        self.size, self.step, self.seen, self.rows = size, 1, 0, []

    def add(self, df: pl.DataFrame) -> None:
        first = (-self.seen) % self.step
        if first < df.height:
            self.rows.extend(df.slice(first).gather_every(self.step).rows())
        self.seen += df.height
        while len(self.rows) > 2 * self.size:
            self.rows, self.step = self.rows[::2], self.step * 2

    def frame(self, schema: dict[str, Any]) -> pl.DataFrame:
        rows = self.rows[:: max(1, -(-len(self.rows) // self.size))]
        return pl.DataFrame(rows, schema=schema, orient="row")


class _Spill:
    """Frames appended to numbered files on disk (Arrow IPC, lz4), read back one file at a time."""

    def __init__(self, workdir: Path, name: str, schema: dict[str, Any], batch_rows: int | None = None):
        self.workdir, self.name, self.schema, self.batch_rows = workdir, name, schema, batch_rows
        self.writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}

    def path(self, b: int) -> Path:
        return self.workdir / f"{self.name}-{b}.arrow"

    def add(self, b: int, df: pl.DataFrame) -> None:
        if df.height == 0:
            return
        table = df.select(list(self.schema)).to_arrow()
        if b not in self.writers:
            self.writers[b] = pa.ipc.new_file(self.path(b), table.schema, options=pa.ipc.IpcWriteOptions(compression="lz4"))
        self.writers[b].write_table(table, max_chunksize=self.batch_rows)

    def route(self, df: pl.DataFrame, bucket: pl.Expr, buckets: int) -> None:
        if buckets == 1:
            return self.add(0, df)
        for (b,), part in df.with_columns(bucket.alias("_b")).partition_by("_b", as_dict=True, include_key=False).items():
            self.add(int(b), part)

    def take(self, b: int) -> pl.DataFrame:
        """File ``b``'s frames (removed from disk)."""
        w = self.writers.pop(b, None)
        if w is None:
            return pl.DataFrame(schema=self.schema)
        w.close()
        with pa.memory_map(str(self.path(b))) as src:
            df = pl.from_arrow(pa.ipc.open_file(src).read_all())
        self.path(b).unlink()
        assert isinstance(df, pl.DataFrame)
        return df.rechunk()


def _bucket_of(col: pl.Expr, buckets: int) -> pl.Expr:
    return (_key(col).hash(seed=27) % buckets).cast(pl.UInt32)


def _planned_rows(table: InputTable) -> int | None:
    n = 0
    for p in table.parts:
        if p is None:
            return None
        n += shard_rows(p)
    return n


def read_sequences(path: str | Path, flips: bool = False, workdir: str | Path | None = None) -> Sequences:
    """The sequences and documents of a docid index from the triples stage at ``path`` (see the module docstring),
    with ``docids.parquet`` written into ``workdir`` (default: a temporary directory removed with the result).

    Bounded memory: the checked rows go to buckets on disk split by a hash of their docid's key (every spelling
    of a key, hence every row of a docid, in one bucket); each bucket is deduped and grouped on its own (the
    "first row wins" rule and the order of flips carry the global row number ``g``), written sorted, and the
    sorted runs are merged chunk by chunk."""

    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="grtool-seqs-")) if own else Path(workdir)
    table = InputTable.open(path, "triples")
    planned = _planned_rows(table)
    buckets = 16 if planned is None else max(1, min(MAX_BUCKETS, -(-planned // ROWS_PER_BUCKET)))
    spill_rows = _Spill(work, ".scratch-rows", _ROW_SCHEMA)
    columns = ["doc_id", "docid", "head", "relation", "tail"]
    skipped = SyntaxReport()
    skipped_docids: set[str] = set()
    valid_docids: set[str] = set()  # only docids a suspect row named (rare)
    doc_ids = [pl.Series("doc_id", [], dtype=pl.String)]
    held_ids = 0
    g = 0
    try:
        for part in range(table.num_parts):
            where = table.parts[part] or "<stdin>"
            row0 = 0
            for df in _batches(table, part, columns):
                _first_row_problem(df, where, row0)
                renders, lh, lr = _parts_expr("head", "relation", "tail")
                inner = pl.col("docid").str.slice(_S, pl.col("docid").str.len_chars() - _S - _E)
                df = df.with_columns(renders.alias("renders"), lh.cast(pl.UInt32).alias("lh"), lr.cast(pl.UInt32).alias("lr"),
                                     inner.str.contains(_SUSPECT).alias("suspect"), pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"))  # fmt: skip
                keep = np.ones(df.height, dtype=bool)
                for i, docid, h, r, t, rend in df.filter(pl.col("suspect")).select("row", "docid", "head", "relation", "tail", "renders").iter_rows():
                    if docid in skipped_docids:
                        keep[i] = False
                        continue
                    if docid in valid_docids:
                        continue
                    problem = docid_text_problem(docid[_S : len(docid) - _E])
                    if problem is None:
                        valid_docids.add(docid)
                        continue
                    if flips and rend:
                        problem = triple_problem((h, r, t)) or problem  # name the part
                    skipped.add(where, row0 + i + 1, docid, problem)
                    skipped_docids.add(docid)
                    keep[i] = False
                # a row whose parts are strings but whose docid is not their rendering: the Python flip rule
                alt = [None] * df.height if flips else None
                if flips:
                    odd = df.filter(~pl.col("renders") & pl.col("head").is_not_null() & pl.col("relation").is_not_null() & pl.col("tail").is_not_null())
                    for i, docid, h, r, t in odd.select("row", "docid", "head", "relation", "tail").iter_rows():
                        alt[i] = flip_from_parts(docid, (h, r, t))
                df = df.with_columns(pl.Series("alt", alt, dtype=pl.String) if flips else pl.lit(None, pl.String).alias("alt"))
                kept = df.filter(pl.Series(keep)).select("docid", "doc_id", "lh", "lr", "alt")
                kept = kept.with_columns(pl.int_range(g, g + kept.height, dtype=pl.UInt64).alias("g"))
                g += kept.height
                doc_ids.append(kept.get_column("doc_id").unique())
                if sum(len(d) for d in doc_ids) > 2 * max(held_ids, 1 << 16):  # deduped now and then, not per batch
                    doc_ids = [pl.concat(doc_ids).unique()]
                    held_ids = len(doc_ids[0])
                spill_rows.route(kept, _bucket_of(pl.col("docid"), buckets), buckets)
                row0 += len(keep)
                del df, kept
                release_build_memory()
        if g == 0:
            raise InputError(f"{path}: no triples to index" + (f" ({skipped.count} docids skipped: {skipped.summary()})" if skipped.count else ""))
        seqs = _sequences(spill_rows, buckets, pl.concat(doc_ids).unique().sort(), flips, skipped, work)
    except BaseException:
        for w in spill_rows.writers.values():
            w.close()
        if own:
            shutil.rmtree(work, ignore_errors=True)
        raise
    if own:
        weakref.finalize(seqs, shutil.rmtree, work, True)
    return seqs


def _key(col: pl.Expr) -> pl.Expr:
    return normalize_expr(col.str.slice(_S, col.str.len_chars() - _S - _E))


def _first_of_bucket(rows: pl.DataFrame, doc_index: pl.DataFrame, flips: bool) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame | None, int]:
    """One bucket's distinct docids (what its first row says, and that row's ``g``), its (key, document) pairs and,
    with flips, each docid's flipped spelling with the key it comes from."""
    docid = pl.col("docid")
    first = rows.unique(subset="docid", keep="first", maintain_order=True)
    # joined with all documents once per bucket (O(buckets x documents) hashing; polars' search_sorted of the
    # bucket's document ids in the sorted doc_ids measured 1.5x slower at 5M triples)
    pairs = rows.select(_key(docid).alias("key"), "doc_id").unique().join(doc_index, on="doc_id").select("key", "di")
    forward = first.select("docid", pl.lit(False).alias("flipped"), "lh", "lr", "g")
    if not flips:
        return forward, pairs, None, 0
    lh, lr = pl.col("lh"), pl.col("lr")
    h, r, t = (_piece(docid, lh, lr, w) for w in "hrt")
    rendered = pl.concat_str([pl.lit(DOCID_START), t, pl.lit(", "), r, pl.lit(", "), h, pl.lit(DOCID_END)])
    flipped = first.select(
        docid.alias("source"),
        pl.when(lh.is_not_null()).then(rendered).otherwise(pl.col("alt")).alias("docid"),
        # the flipped spelling's own head and relation: the source's tail and relation
        pl.when(lh.is_not_null()).then(docid.str.len_chars() - (_S + _E + 4) - lh - lr).cast(pl.UInt32).alias("lh"),
        lr,
        "g",
    )
    unsplit = flipped.get_column("docid").null_count()
    return forward, pairs, flipped.drop_nulls("docid"), unsplit


def _sequences(spill_rows: _Spill, buckets: int, doc_ids: pl.Series, flips: bool, skipped: SyntaxReport, work: Path) -> Sequences:
    docid = pl.col("docid")
    doc_index = doc_ids.to_frame().with_row_index("di")
    # sorted runs in small record batches: the merge holds a few of each run at a time
    runs = _Spill(work, ".scratch-run", {**_SEQ_SCHEMA, "di": pl.List(pl.UInt32)}, batch_rows=RUN_BATCH)
    unsplit = symmetric = 0
    if flips:
        # pass 1: each bucket's docids and pairs kept for pass 2; its flips (and the documents they map to: those
        # of their source's key, before flips add any) sent to the bucket of the flipped spelling's key
        fwd = _Spill(work, ".scratch-fwd", {"docid": pl.String, "flipped": pl.Boolean, "lh": pl.UInt32, "lr": pl.UInt32, "g": pl.UInt64})
        own_pairs = _Spill(work, ".scratch-pairs", {"key": pl.String, "di": pl.UInt32})
        flips_in = _Spill(work, ".scratch-flips", {"docid": pl.String, "lh": pl.UInt32, "lr": pl.UInt32, "g": pl.UInt64})
        edges_in = _Spill(work, ".scratch-edges", {"key": pl.String, "di": pl.UInt32})
        for b in range(buckets):
            forward, pairs, flipped, n = _first_of_bucket(spill_rows.take(b), doc_index, True)
            unsplit += n
            assert flipped is not None
            edges = flipped.select(_key(pl.col("source")).alias("key"), _key(docid).alias("fkey")).unique()
            flips_in.route(flipped, _bucket_of(docid, buckets), buckets)
            moved = edges.join(pairs, on="key").select(pl.col("fkey").alias("key"), "di")
            edges_in.route(moved, (pl.col("key").hash(seed=27) % buckets).cast(pl.UInt32), buckets)
            fwd.add(b, forward)
            own_pairs.add(b, pairs)
            del forward, pairs, flipped, edges, moved
        for b in range(buckets):
            forward, pairs = fwd.take(b), own_pairs.take(b)
            flipped = flips_in.take(b).sort("g")  # the order of their sources' first rows
            names = forward.select("docid")
            symmetric += flipped.join(names, on="docid", how="semi").height
            extra = flipped.join(names, on="docid", how="anti", maintain_order="left").unique(subset="docid", keep="first", maintain_order=True)
            forward = pl.concat([forward, extra.select("docid", pl.lit(True).alias("flipped"), "lh", "lr", "g")])
            pairs = pl.concat([pairs, edges_in.take(b)]).unique()
            runs.add(b, _sorted_run(forward, pairs))
            release_build_memory()
    else:
        for b in range(buckets):
            forward, pairs, _, _ = _first_of_bucket(spill_rows.take(b), doc_index, False)
            runs.add(b, _sorted_run(forward, pairs))
            release_build_memory()
    return _merge_runs(runs, buckets, doc_ids, flips, skipped, unsplit, symmetric, work)


def _sorted_run(forward: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """A bucket's sequences sorted, each with the sorted documents of its key."""
    groups = pairs.group_by("key").agg(pl.col("di").sort())
    return forward.sort("docid").with_columns(_key(pl.col("docid")).alias("key")).join(groups, on="key", how="left", maintain_order="left").drop("key", "g")


def _merge_runs(runs: _Spill, buckets: int, doc_ids: pl.Series, flips: bool, skipped: SyntaxReport, unsplit: int, symmetric: int, work: Path) -> Sequences:
    """The sorted runs (no docid in two of them) merged into ``.scratch-seqs.parquet`` and ``docids.parquet``,
    chunk by chunk: each emission writes every buffered row up to the smallest of the open runs' last buffered
    docids."""
    present = [b for b in range(buckets) if b in runs.writers]
    for b in present:
        runs.writers.pop(b).close()
    # read, not memory-mapped: the pages of a mapped run stay in the process's RSS once read, and the runs
    # together are every docid (GBs at tens of millions of triples)
    readers = {b: pa.ipc.open_file(pa.OSFile(str(runs.path(b)))) for b in present}
    nexts = {b: 0 for b in present}
    seq_file = work / ".scratch-seqs.parquet"
    docid_schema = pa.schema([("docid", pa.string())] + ([("flipped", pa.bool_())] if flips else []))
    seq_writer = pq.ParquetWriter(seq_file, pa.schema([("docid", pa.string()), ("flipped", pa.bool_()), ("lh", pa.uint32()), ("lr", pa.uint32())]), compression="lz4")
    docid_writer = pq.ParquetWriter(work / "docids.parquet", docid_schema, compression="zstd")
    pending: list[pl.DataFrame] = []
    lengths: list[np.ndarray] = []
    docs: list[np.ndarray] = []
    flags: list[np.ndarray] = []
    count = 0
    sample = _SpreadSample(AGREEMENT_SAMPLE)

    def emit(df: pl.DataFrame, final: bool = False) -> None:
        nonlocal count
        if df.height:
            pending.append(df.select("docid", "flipped"))
            seq_writer.write_table(df.select("docid", "flipped", "lh", "lr").to_arrow().cast(seq_writer.schema))
            di = df.get_column("di")
            lengths.append(di.list.len().to_numpy().astype(np.int64))
            docs.append(di.explode().to_numpy().astype(np.uint32))
            flags.append(df.get_column("flipped").to_numpy().astype(bool))
            sample.add(df.select("docid", "flipped", "lh", "lr").filter(pl.col("lh").is_not_null()))
            count += df.height
        held = sum(p.height for p in pending)
        if held >= ROW_GROUP or (final and held):
            out = pl.concat(pending)
            cut = held if final else held - held % ROW_GROUP
            docid_writer.write_table(out.head(cut).select("docid", *(["flipped"] if flips else [])).to_arrow().cast(docid_schema), row_group_size=ROW_GROUP)
            pending[:] = [out.slice(cut)] if cut < held else []

    def read_next(b: int) -> int:
        """Buffer run ``b``'s next record batch; while the run has more, it waits in ``open_runs`` under its last docid."""
        r = readers[b]
        got = pl.DataFrame(schema=runs.schema)
        while got.height == 0 and nexts[b] < r.num_record_batches:
            got = pl.from_arrow(r.get_batch(nexts[b]))
            assert isinstance(got, pl.DataFrame)
            nexts[b] += 1
        if got.height:
            buf[b].append(got)
        if nexts[b] < r.num_record_batches:
            heapq.heappush(open_runs, (got.get_column("docid")[-1], b))  # got is not empty: batches were left
        return got.height

    # Every run is read a batch at a time, always the one whose buffered rows end first (the smallest last docid):
    # only that one can raise the cutoff. Once ``bound`` rows are held, every row up to the cutoff (the smallest
    # last docid of the runs with more to read) is emitted at once; the Python work per batch is a heap step, and
    # per emission one search per run (a search per run per batch made the merge quadratic: 137 s at 20M triples).
    buf: dict[int, list[pl.DataFrame]] = {b: [] for b in present}
    open_runs: list[tuple[str, int]] = []
    held = sum(read_next(b) for b in present)
    bound = max(MERGE_ROWS, MERGE_BATCHES * RUN_BATCH * len(present))  # ~half a batch a run stays past the cutoff
    stalled, emissions = False, 0
    try:
        while open_runs or held:
            if open_runs and (held < bound or stalled):
                held += read_next(heapq.heappop(open_runs)[1])
                stalled = False
                continue
            cutoff = open_runs[0][0] if open_runs else None
            taken = []
            for b in present:
                if not buf[b]:
                    continue
                df = pl.concat(buf[b]) if len(buf[b]) > 1 else buf[b][0]
                n = df.height if cutoff is None else df.get_column("docid").search_sorted(cutoff, side="right")
                if n:
                    taken.append(df.head(n))
                buf[b] = [df.slice(n)] if n < df.height else []
                held -= n
            stalled = not taken  # every row held is past the cutoff: read on beyond the bound
            if taken:
                emit(pl.concat(taken).sort("docid"))
                emissions += 1
                if emissions % 8 == 0:
                    release_build_memory()  # the pools keep the decompressed batches' pages otherwise
        emit(pl.DataFrame(schema={**_SEQ_SCHEMA, "di": pl.List(pl.UInt32)}), final=True)
    finally:
        seq_writer.close()
        docid_writer.close()
        readers.clear()
        for b in present:
            runs.path(b).unlink(missing_ok=True)
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return Sequences(seq_file, count, offsets, np.concatenate(docs) if docs else np.zeros(0, np.uint32), np.concatenate(flags) if flags else np.zeros(0, bool),
                     doc_ids, unsplit, symmetric, skipped, sample.frame(_SEQ_SCHEMA))  # fmt: skip


# ------------------------------------------------------------------------------------------- tokenize


class _Joined(Exception):
    """Joining pieces gave other ids than the whole docid: tokenize every docid whole."""


def _encode_pool(tok: DocidTokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``texts`` concatenated, and where each starts (one more entry: the end)."""
    ids = tok.encode_batch(texts)
    starts = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=starts[1:])
    flat = np.fromiter((t for x in ids for t in x), dtype=np.int64, count=int(starts[-1]))
    return flat, starts


def _gather(pool: np.ndarray, seg_src: np.ndarray, seg_len: np.ndarray) -> np.ndarray:
    """pool[src : src + len] of every segment, concatenated."""
    total = int(seg_len.sum())
    out_start = np.zeros(len(seg_len), dtype=np.int64)
    np.cumsum(seg_len[:-1], out=out_start[1:])
    idx = np.arange(total, dtype=np.int64) + np.repeat(seg_src - out_start, seg_len)
    return pool[idx]


def _encode_chunk(tok: DocidTokenizer, chunk: pl.DataFrame, join: bool, check_every: int = CHECK_EVERY) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of a chunk of sequences (concatenated) and the length of each; joined from pieces, every
    ``check_every``-th of those also tokenized whole and compared (:class:`_Joined` when they differ)."""
    texts = chunk.get_column("docid")
    k = chunk.height
    if not join:
        flat, starts = _encode_pool(tok, texts.to_list())
        return flat, np.diff(starts)
    docid, lh, lr = pl.col("docid"), pl.col("lh"), pl.col("lr")
    cols = chunk.select(
        (lh.is_not_null() & _piece(docid, lh, lr, "h").str.contains(_ALNUM_END) & _piece(docid, lh, lr, "r").str.contains(_ALNUM_END)).fill_null(False).alias("ok"),
        _piece(docid, lh, lr, "h").alias("h"),
        pl.concat_str([pl.lit(", "), _piece(docid, lh, lr, "r")]).alias("r"),
        pl.concat_str([pl.lit(", "), _piece(docid, lh, lr, "t")]).alias("t"),
    )
    ok = cols.get_column("ok").to_numpy()
    # one pool: the two markers, then each distinct piece, then the docids tokenized whole
    pool_parts: list[np.ndarray] = [np.array([tok.start_id, tok.end_id], dtype=np.int64)]
    base = 2
    segs_src = np.zeros((k, 5), dtype=np.int64)
    segs_len = np.zeros((k, 5), dtype=np.int64)
    okc = cols.filter(pl.Series(ok))
    rows_ok = np.flatnonzero(ok)
    segs_src[rows_ok, 0], segs_len[rows_ok, 0] = 0, 1
    segs_src[rows_ok, 4], segs_len[rows_ok, 4] = 1, 1
    for j, name in enumerate("hrt", start=1):
        uniq, codes = np.unique(okc.get_column(name).to_numpy(), return_inverse=True) if okc.height else (np.array([], dtype=object), np.zeros(0, np.int64))
        flat, starts = _encode_pool(tok, uniq.tolist())
        pool_parts.append(flat)
        segs_src[rows_ok, j] = base + starts[codes]
        segs_len[rows_ok, j] = np.diff(starts)[codes]
        base += len(flat)
    rows_whole = np.flatnonzero(~ok)
    if len(rows_whole):
        flat, starts = _encode_pool(tok, texts.gather(rows_whole).to_list())
        pool_parts.append(flat)
        segs_src[rows_whole, 0] = base + starts[:-1]
        segs_len[rows_whole, 0] = np.diff(starts)
    pool = np.concatenate(pool_parts)
    lengths = segs_len.sum(axis=1)
    ids = _gather(pool, segs_src.reshape(-1), segs_len.reshape(-1))
    check = rows_ok[::check_every]
    if len(check):
        want, want_starts = _encode_pool(tok, texts.gather(check).to_list())
        ends = np.cumsum(lengths)
        for n, s in enumerate(check):
            if not np.array_equal(ids[ends[s] - lengths[s] : ends[s]], want[want_starts[n] : want_starts[n + 1]]):
                raise _Joined
    return ids, lengths


def pieces_agree(tok: DocidTokenizer, seqs: pl.DataFrame) -> bool:
    """Whether ``tok`` gives each of a sample of the corpus's docids the ids of its pieces joined (the whole
    docid tokenized too, and compared)."""
    sample = seqs.filter(pl.col("lh").is_not_null())
    if sample.height == 0:
        return False
    step = max(1, sample.height // AGREEMENT_SAMPLE)
    sample = sample.gather_every(step).head(AGREEMENT_SAMPLE)
    try:
        _encode_chunk(tok, sample, join=True, check_every=1)
    except _Joined:
        return False
    return True


def tokenize_to_file(tok: DocidTokenizer, seqs: "pl.DataFrame | Sequences", path: Path, join: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize the sequences in order into ``path`` (uint32 ids, written chunk by chunk): the ids as a read-only
    memory map, and the length of each sequence. ``seqs``: a frame, or :class:`Sequences` read from disk chunk by
    chunk. ``join`` None: join pieces when :func:`pieces_agree`."""
    if isinstance(seqs, Sequences):
        count, chunks, sample = seqs.count, lambda: seqs.chunks(TOKENIZE_CHUNK), lambda: seqs.sample
    else:
        frame = seqs
        count, sample = frame.height, lambda: frame
        chunks = lambda: (frame.slice(lo, TOKENIZE_CHUNK) for lo in range(0, frame.height, TOKENIZE_CHUNK))  # noqa: E731
    if join is None:
        s = sample()
        join = "lh" in s.columns and pieces_agree(tok, s)
    lengths = np.zeros(count, dtype=np.int64)
    try:
        with open(path, "wb") as f:
            lo = 0
            for n, chunk in enumerate(chunks(), start=1):
                ids, lens = _encode_chunk(tok, chunk, join)
                lengths[lo : lo + len(lens)] = lens
                lo += len(lens)
                f.write(ids.astype(TOKEN_DTYPE).tobytes())
                if n % 8 == 0:
                    release_build_memory()  # the pages the tokenizer's threads freed, not kept chunk after chunk
    except _Joined:
        return tokenize_to_file(tok, seqs, path, join=False)
    if (lengths == 0).any():
        raise InputError(f"sequence {int(np.flatnonzero(lengths == 0)[0])} tokenizes to nothing")
    size = os.path.getsize(path)
    flat = np.memmap(path, dtype=TOKEN_DTYPE, mode="r") if size else np.zeros(0, TOKEN_DTYPE)
    return flat, lengths
