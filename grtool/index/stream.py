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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from grtool.docid import DOCID_END, DOCID_START, SPECIAL, docid_text_problem, normalize_expr, triple_problem
from grtool.errors import InputError
from grtool.index.tokenizer import DocidTokenizer
from grtool.store.io import InputTable
from grtool.store.reading import iter_shard_batches

READ_BATCH = 262_144  # rows per record batch read from a shard
TOKENIZE_CHUNK = 32_768  # sequences tokenized (and written) at a time (their ids are Python lists meanwhile)
CHECK_EVERY = 64  # while pieces are joined, every 64th docid is also tokenized whole and compared
AGREEMENT_SAMPLE = 2_048  # docids checked before joining pieces is trusted for a tokenizer
TOKEN_DTYPE = np.uint32

_S, _E = len(DOCID_START), len(DOCID_END)
# A superset of what docid_text_problem rejects (Rust regex; [\s\x1c-\x1f] covers every str.isspace character):
# the rows it flags are judged by the Python rule itself.
_SUSPECT = (
    r"^[\s\x1c-\x1f]*$|<docid_start>|<docid_end>|[\[\]\x00-\x1f\x7f-\x9f\x{2028}\x{2029}]"
    r"|^[\s\x1c-\x1f]*,|,[\s\x1c-\x1f]*,|,[\s\x1c-\x1f]*$"
)
_ALNUM_END = r"[\p{L}\p{N}]$"  # a piece ending in a letter or digit never shares a pre-token with the comma after it


@dataclass
class Skipped:
    """Docids the syntax rule rejects (as :class:`grtool.index.build.SyntaxReport`)."""

    reasons: dict[str, int] = field(default_factory=dict)
    first: str | None = None

    @property
    def count(self) -> int:
        return sum(self.reasons.values())

    def summary(self) -> str:
        return ", ".join(f"{reason} {n}" for reason, n in sorted(self.reasons.items()))


@dataclass
class Sequences:
    """The sequences of a docid index, in order (docid strings sorted), as columns: ``docid``, ``flipped``,
    and the character lengths ``lh``/``lr`` of the head and relation where the string is the rendering of
    parts (null otherwise); the documents as a CSR map into the sorted ``doc_ids``."""

    frame: pl.DataFrame
    offsets: np.ndarray  # int64 [k + 1]
    docs: np.ndarray  # uint32
    doc_ids: pl.Series
    unsplit: int = 0
    symmetric: int = 0
    skipped: Skipped = field(default_factory=Skipped)

    @property
    def docids(self) -> pa.Array:
        return self.frame.get_column("docid").to_arrow().cast(pa.string())


def _batches(table: InputTable, part: int, columns: list[str]) -> Iterator[pl.DataFrame]:
    """One part's rows as frames of ``columns`` (strings; a missing column, or a value that is not a string,
    is null: the reference path treats them alike)."""
    path = table.parts[part]
    if path is None:
        for rows in table.iter_part(part, columns=columns):
            yield pl.DataFrame({c: [v if isinstance(v := r.get(c), str) else None for r in rows] for c in columns}, schema={c: pl.String for c in columns})
        return
    have = set(pq.read_schema(path).names)
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


def read_sequences(path: str | Path, flips: bool = False) -> Sequences:
    """The sequences and documents of a docid index from the triples stage at ``path`` (see the module docstring)."""
    from grtool.index.build import _flip_from_parts  # the Python rule for the rare rows the columns cannot settle

    table = InputTable.open(path, "triples")
    columns = ["doc_id", "docid", "head", "relation", "tail"]
    skipped = Skipped()
    skipped_docids: set[str] = set()
    valid_docids: set[str] = set()  # only docids a suspect row named (rare)
    frames: list[pl.DataFrame] = []
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
                skipped.reasons[problem.reason] = skipped.reasons.get(problem.reason, 0) + 1
                if skipped.first is None:
                    skipped.first = f"{where}, row {row0 + i + 1}: {docid[:120]!r}: {problem.detail}"
                skipped_docids.add(docid)
                keep[i] = False
            # a row whose parts are strings but whose docid is not their rendering: the Python flip rule
            alt = [None] * df.height if flips else None
            if flips:
                odd = df.filter(~pl.col("renders") & pl.col("head").is_not_null() & pl.col("relation").is_not_null() & pl.col("tail").is_not_null())
                for i, docid, h, r, t in odd.select("row", "docid", "head", "relation", "tail").iter_rows():
                    alt[i] = _flip_from_parts(docid, (h, r, t))
            df = df.with_columns(pl.Series("alt", alt, dtype=pl.String) if flips else pl.lit(None, pl.String).alias("alt"))
            frames.append(df.filter(pl.Series(keep)).select("docid", "doc_id", "lh", "lr", "alt"))
            row0 += len(keep)
    rows = pl.concat(frames, rechunk=True) if frames else pl.DataFrame(schema={"docid": pl.String, "doc_id": pl.String, "lh": pl.UInt32, "lr": pl.UInt32, "alt": pl.String})
    del frames
    if rows.height == 0:
        raise InputError(f"{path}: no triples to index" + (f" ({skipped.count} docids skipped: {skipped.summary()})" if skipped.count else ""))
    return _sequences(rows, flips, skipped)


def _key(col: pl.Expr) -> pl.Expr:
    return normalize_expr(col.str.slice(_S, col.str.len_chars() - _S - _E))


def _sequences(rows: pl.DataFrame, flips: bool, skipped: Skipped) -> Sequences:
    docid = pl.col("docid")
    # each distinct docid with what its first row says (the reference path keeps the first row's parts)
    first = rows.unique(subset="docid", keep="first", maintain_order=True)
    doc_ids = rows.get_column("doc_id").unique().sort()
    doc_index = doc_ids.to_frame().with_row_index("di")
    pairs = rows.select(_key(docid).alias("key"), "doc_id").unique().join(doc_index, on="doc_id").select("key", "di")
    del rows
    forward = first.select("docid", pl.lit(False).alias("flipped"), "lh", "lr")
    unsplit = symmetric = 0
    if flips:
        lh, lr = pl.col("lh"), pl.col("lr")
        h, r, t = (_piece(docid, lh, lr, w) for w in "hrt")
        rendered = pl.concat_str([pl.lit(DOCID_START), t, pl.lit(", "), r, pl.lit(", "), h, pl.lit(DOCID_END)])
        flipped = first.select(
            docid.alias("source"),
            pl.when(lh.is_not_null()).then(rendered).otherwise(pl.col("alt")).alias("docid"),
            # the flipped spelling's own head and relation: the source's tail and relation
            pl.when(lh.is_not_null()).then(docid.str.len_chars() - (_S + _E + 4) - lh - lr).cast(pl.UInt32).alias("lh"),
            lr,
        )
        unsplit = flipped.get_column("docid").null_count()
        flipped = flipped.drop_nulls("docid")
        # a flip maps to the documents of its source's key (all spellings of it, before flips add any)
        edges = flipped.select(_key(pl.col("source")).alias("key"), _key(docid).alias("fkey")).unique()
        pairs = pl.concat([pairs, edges.join(pairs, on="key").select(pl.col("fkey").alias("key"), "di")]).unique()
        names = forward.select("docid")
        symmetric = flipped.join(names, on="docid", how="semi").height
        extra = flipped.join(names, on="docid", how="anti", maintain_order="left").unique(subset="docid", keep="first", maintain_order=True)
        forward = pl.concat([forward, extra.select("docid", pl.lit(True).alias("flipped"), "lh", "lr")])
        del flipped, extra, edges
    del first
    groups = pairs.group_by("key").agg(pl.col("di").sort())
    del pairs
    seqs = forward.sort("docid").with_columns(_key(docid).alias("key")).join(groups, on="key", how="left", maintain_order="left").drop("key")
    del forward, groups
    lengths = seqs.get_column("di").list.len().to_numpy().astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    docs = seqs.get_column("di").explode().to_numpy().astype(np.uint32)
    return Sequences(seqs.drop("di"), offsets, docs, doc_ids, unsplit, symmetric, skipped)


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
        (lh.is_not_null() & _piece(docid, lh, lr, "h").str.contains(_ALNUM_END) & _piece(docid, lh, lr, "r").str.contains(_ALNUM_END))
        .fill_null(False).alias("ok"),
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


def tokenize_to_file(tok: DocidTokenizer, seqs: pl.DataFrame, path: Path, join: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize the sequences in order into ``path`` (uint32 ids, written chunk by chunk): the ids as a read-only
    memory map, and the length of each sequence. ``join`` None: join pieces when :func:`pieces_agree`."""
    if join is None:
        join = "lh" in seqs.columns and pieces_agree(tok, seqs)
    lengths = np.zeros(seqs.height, dtype=np.int64)
    try:
        with open(path, "wb") as f:
            for lo in range(0, seqs.height, TOKENIZE_CHUNK):
                ids, lens = _encode_chunk(tok, seqs.slice(lo, TOKENIZE_CHUNK), join)
                lengths[lo : lo + len(lens)] = lens
                f.write(ids.astype(TOKEN_DTYPE).tobytes())
    except _Joined:
        return tokenize_to_file(tok, seqs, path, join=False)
    if (lengths == 0).any():
        raise InputError(f"sequence {int(np.flatnonzero(lengths == 0)[0])} tokenizes to nothing")
    size = os.path.getsize(path)
    flat = np.memmap(path, dtype=TOKEN_DTYPE, mode="r") if size else np.zeros(0, TOKEN_DTYPE)
    return flat, lengths
