"""The triples lookup (:class:`grtool.docid.lookup.TripleLookup`) as files, memory-mapped, built once per triples stage.

`retrieve`, `eval recall`, `export kto` and `filters` resolve docids to documents through the lookup's sorted
arrays. Building them from the triples stage costs a pass over every shard and, in memory, ~150 bytes per triple
(1.5 GB at 10M triples), on every run. So they are written once as flat files and every later run maps them;
a process then holds only the pages its lookups touch::

    fkeys.bin  uint64   sorted forward keys (one per (triple, document))    fdocs.bin  uint32|64  document rows
    bkeys.bin  uint64   sorted flipped keys                                 bfwd.bin   uint32|64  forward key rows
    doc_hashes.bin  uint64  sorted hashes of the document ids
    doc_ids.bin, doc_ids_offsets.bin (uint64, n + 1)   the document ids, row for row
    lookup.json         what they hold (lengths, dtypes, the stage and its fingerprint); written last

**Where**: ``$GRTOOL_CACHE/lookups/<key>/`` (:func:`grtool.userinput.cache_root`), never inside the triples
stage (an input, which grtool does not write) nor an index (`eval recall`, `export kto` and `filters` have none,
and `retrieve --triples` may name another stage than the index's). The key is a digest of the stage's shard
records (their sha256, checked against the shards before every use, so a changed stage is a new key, never the
old files), the polars version and a probe hash (the keys are polars hashes, stable only for one polars
build), and this format. A directory is written under a temporary name and renamed into place, so readers
see whole lookups only, and concurrent runs (Slurm array tasks) at worst build it twice. Delete the cache
directory at any time; a cache that cannot be written gets a lookup built in a temporary directory instead.
The cache is bounded: after writing a lookup, the least recently used others are removed until the cache
holds at most ``$GRTOOL_LOOKUP_CACHE_GB`` (default 20; :func:`evict`).

**Building** is bounded: shard by shard, the hashes go to scratch files grouped by their top bits (buckets of
≤ ~1M rows: hashes are uniform), then each bucket is sorted on its own and appended to the sorted files, so
the peak is one shard plus one bucket (~100 MB) whatever the stage's size.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from grtool.docid import normalize_expr
from grtool.docid.lookup import HASH_SEED, TripleLookup, _dedupe, _index_type, hash_keys, release_build_memory
from grtool.errors import InputError
from grtool.log import log
from grtool.records import Count, DamagedRecord, read_record
from grtool.store.reading import arrow_source

FORMAT = "grtool-triple-lookup/1"
RECORD = "lookup.json"
BUCKET_ROWS = 1 << 18  # rows per bucket when sorting (a bucket costs ~100 bytes a row while sorted: ~25 MB)
_PROBE = ["grtool lookup probe", "Kiel, located in, Germany"]  # hashes that must agree for files to be reused


def cache_dir() -> Path:
    from grtool.userinput import cache_root

    return cache_root() / "lookups"


def stage_key(stage: Path) -> str:
    """The cache key of a triples stage: its shards' content (the sha256 their records promise), polars and its
    hash of the probe strings, and this format."""
    from grtool.store.records import load_shard_records

    h = hashlib.blake2b(digest_size=16)
    h.update(f"{FORMAT}\npolars {pl.__version__} {hash_keys(_PROBE).tolist()}\n".encode())
    for name, rec in sorted(load_shard_records(stage).items()):
        h.update(f"{name}:{rec.sha256}\n".encode())
    return h.hexdigest()


def open_lookup(triples: str | Path, *, root: Path | None = None, bucket_rows: int = BUCKET_ROWS) -> TripleLookup:
    """The lookup of a triples stage (run or stage directory): its files in the cache, written first when missing."""
    from grtool.store.records import resolve_stage
    from grtool.store.stage import shard_paths

    stage = resolve_stage(triples, "triples")
    shards = shard_paths(stage)  # checks every shard against its record before the key trusts the records
    if not shards:
        return _empty()
    missing = {"doc_id", "head", "relation", "tail"} - set(pq.read_schema(arrow_source(shards[0])).names)
    if missing:
        raise InputError(f"{shards[0]}: not a triples table (missing columns {', '.join(sorted(missing))})")
    key = stage_key(stage)
    base = root if root is not None else cache_dir()
    final = base / key
    if _complete(final):
        _touch(final)
        return load_lookup(final)
    limit = cache_limit()  # a bad $GRTOOL_LOOKUP_CACHE_GB stops the run before anything is written
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=base))
    except OSError as e:
        log.warning("%s: cannot write the triples lookup cache (%s); building it in a temporary directory for this run", base, e.strerror)
        return _build_elsewhere(stage, shards, bucket_rows)
    try:
        write_lookup(stage, shards, tmp, bucket_rows=bucket_rows)
        try:
            os.rename(tmp, final)
        except OSError:  # another process put it there first: use its files
            if not _complete(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("triples lookup of %s written to %s", stage, final)
    evict(base, keep=final, limit=limit)
    return load_lookup(final)


def _touch(d: Path) -> None:
    """Mark a lookup used now (its record's mtime): eviction removes the least recently used first."""
    try:
        os.utime(d / RECORD)
    except OSError:  # a read-only cache: used as it is, never evicted by this process
        pass


def cache_limit() -> int:
    """Bytes the lookup cache may hold (``$GRTOOL_LOOKUP_CACHE_GB``, default 20)."""
    from grtool.userinput import env

    return int(env("GRTOOL_LOOKUP_CACHE_GB") * 2**30)


def evict(base: Path, keep: Path, limit: int, stale_after: float = 86_400) -> list[Path]:
    """Remove the least recently used lookups until the cache holds at most ``limit`` bytes (``keep``, the one
    just written, always stays), and temporaries left by runs killed over ``stale_after`` seconds ago. An
    entry is first renamed out of place, so no run can open it half-deleted; a run that mapped its files keeps
    them (the kernel holds an unlinked file until it is unmapped). Returns what was removed."""
    import time

    entries, removed = [], []
    now = time.time()
    for d in base.iterdir() if base.is_dir() else ():
        try:
            if d.name.startswith("."):  # a lookup being written, or left by a killed run or eviction
                if d.is_dir() and (d.name.startswith(".evicted-") or now - d.stat().st_mtime > stale_after):
                    removed.append(_remove(d, base))
                continue
            if d != keep and _complete(d):
                size = sum(f.stat().st_size for f in d.iterdir())
                entries.append(((d / RECORD).stat().st_mtime, size, d))
        except OSError:  # another run removed it meanwhile
            continue
    try:
        total = sum(size for _, size, _ in entries) + sum(f.stat().st_size for f in keep.iterdir())
    except OSError:  # ``keep`` removed by another run's eviction meanwhile: nothing of ours to count
        total = sum(size for _, size, _ in entries)
    for _, size, d in sorted(entries):  # least recently used first
        if total <= limit:
            break
        removed.append(_remove(d, base))
        total -= size
        log.info("triples lookup cache over %.1f GB: removed %s (least recently used)", limit / 2**30, d.name)
    return [d for d in removed if d is not None]


def _remove(d: Path, base: Path) -> Path | None:
    gone = base / f".evicted-{d.name}.{os.getpid()}"
    try:
        os.rename(d, gone)
    except OSError:  # already removed or renamed by another run
        return None
    shutil.rmtree(gone, ignore_errors=True)
    return d


def _build_elsewhere(stage: Path, shards: list[Path], bucket_rows: int) -> TripleLookup:
    """Build in a temporary directory, map the files and remove the directory (the mappings stay valid)."""
    tmp = Path(tempfile.mkdtemp(prefix="grtool-lookup-"))
    try:
        write_lookup(stage, shards, tmp, bucket_rows=bucket_rows)
        return load_lookup(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _empty() -> TripleLookup:
    empty = np.zeros(0, np.uint64)
    return TripleLookup(empty, np.zeros(0, np.uint32), empty, np.zeros(0, np.uint32), empty, b"", np.zeros(1, np.uint64), 0)


def _complete(d: Path) -> bool:
    return (d / RECORD).is_file()


# ------------------------------------------------------------------------------------------ reading

ARRAYS = ("fkeys", "fdocs", "bkeys", "bfwd", "doc_hashes", "doc_ids_offsets")


class ArraySpec(msgspec.Struct):
    dtype: Literal["<u4", "<u8"]
    length: Count


class LookupArrays(msgspec.Struct):
    fkeys: ArraySpec
    fdocs: ArraySpec
    bkeys: ArraySpec
    bfwd: ArraySpec
    doc_hashes: ArraySpec
    doc_ids_offsets: ArraySpec


class LookupRecord(msgspec.Struct):
    """lookup.json, declared once (:mod:`grtool.records`): what :func:`write_lookup` writes, what every use decodes."""

    format: Literal["grtool-triple-lookup/1"]
    stage: str
    count: Count  # triple rows read
    documents: Count
    doc_ids_bytes: Count
    arrays: LookupArrays

    def __post_init__(self) -> None:
        a = self.arrays
        for name in ("fkeys", "bkeys", "doc_hashes", "doc_ids_offsets"):  # hashes and byte offsets: 64-bit
            if getattr(a, name).dtype != "<u8":
                raise ValueError(f"arrays.{name}.dtype: {getattr(a, name).dtype}, expected <u8")
        pairs = (("fdocs", "fkeys", 0), ("bfwd", "bkeys", 0), ("doc_hashes", None, self.documents), ("doc_ids_offsets", None, self.documents + 1))
        for name, beside, want in pairs:
            n = getattr(a, beside).length if beside else want
            if getattr(a, name).length != n:
                raise ValueError(f"arrays.{name}.length: {getattr(a, name).length:,}, expected {n:,} ({'one per ' + beside if beside else 'from documents'})")
        for name in ("fkeys", "bkeys"):  # one per (triple, document) at most
            if getattr(a, name).length > self.count:
                raise ValueError(f"arrays.{name}.length: {getattr(a, name).length:,} keys from {self.count:,} triples")
        if self.documents > self.count:
            raise ValueError(f"documents: {self.documents:,} documents from {self.count:,} triples")


_REWRITE = "delete the directory, the next run writes it again"


def read_lookup_record(d: Path) -> LookupRecord:
    """lookup.json of a lookup directory through its declaration (:class:`DamagedRecord` naming the field)."""
    try:
        return read_record(d / RECORD, LookupRecord, what="triples lookup record")
    except DamagedRecord as e:
        raise DamagedRecord(f"{e}; {_REWRITE}") from None


def load_lookup(d: Path) -> TripleLookup:
    """Map a lookup directory; a file whose size is not what lookup.json records is an error naming it."""
    record = read_lookup_record(d)
    try:
        arrays = {name: _map(d, name, getattr(record.arrays, name)) for name in ARRAYS}
    except (OSError, ValueError) as e:
        raise InputError(f"{d}: damaged triples lookup ({e}); {_REWRITE}") from None
    text_size = record.doc_ids_bytes
    if (d / "doc_ids.bin").stat().st_size != text_size or int(arrays["doc_ids_offsets"][-1]) != text_size:
        raise InputError(f"{d}: damaged triples lookup (doc_ids.bin is not {text_size:,} bytes); {_REWRITE}")
    text = np.memmap(d / "doc_ids.bin", np.uint8, "r") if text_size else b""
    return TripleLookup(arrays["fkeys"], arrays["fdocs"], arrays["bkeys"], arrays["bfwd"], arrays["doc_hashes"], text, arrays["doc_ids_offsets"],
                        record.count, d)  # fmt: skip


def lookup_problems(d: Path) -> list[str]:
    """For `grtool validate`: a lookup directory's record and files, one line per problem."""
    from grtool.errors import GrtoolError

    try:
        load_lookup(d)
    except (GrtoolError, OSError) as e:
        return [str(e)]
    return []


def _map(d: Path, name: str, spec: ArraySpec) -> np.ndarray:
    dtype, n = np.dtype(spec.dtype), spec.length
    path = d / f"{name}.bin"
    if path.stat().st_size != n * dtype.itemsize:
        raise ValueError(f"{path.name} is {path.stat().st_size:,} bytes, not {n:,} × {dtype.itemsize}")
    return np.memmap(path, dtype, "r", shape=(n,)) if n else np.zeros(0, dtype)


# ------------------------------------------------------------------------------------------ writing


class _Appender:
    """A raw array file written piece by piece; its dtype and length go to lookup.json."""

    def __init__(self, path: Path, dtype: Any):
        self.f = open(path, "wb")
        self.dtype = np.dtype(dtype)
        self.length = 0

    def add(self, arr: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(arr, self.dtype).tobytes())
        self.length += len(arr)

    def close(self) -> dict[str, Any]:
        self.f.close()
        return {"dtype": self.dtype.str, "length": self.length}


class _Buckets:
    """A scratch file of fixed-width rows (uint64 columns), written shard by shard grouped by bucket; a bucket is
    read back as the concatenation of its segment in every shard."""

    def __init__(self, path: Path, width: int, buckets: int):
        self.path, self.width, self.buckets = path, width, buckets
        self.f = open(path, "wb")
        self.counts: list[np.ndarray] = []  # per shard: rows per bucket

    def add(self, bucket: np.ndarray, *columns: np.ndarray) -> np.ndarray:
        """Append rows (grouped by ``bucket``); returns the order they were written in."""
        order = np.argsort(bucket, kind="stable")
        self.f.write(np.column_stack([c[order].astype(np.uint64, copy=False) for c in columns]).tobytes())  # never via float64
        self.counts.append(np.bincount(bucket, minlength=self.buckets))
        return order

    def finish(self) -> None:
        self.f.close()
        counts = np.array(self.counts, np.int64).reshape(-1, self.buckets)
        self.count = counts
        self.start = (np.cumsum(counts.ravel()) - counts.ravel()).reshape(counts.shape)

    def read(self, b: int) -> np.ndarray:
        parts = []
        with open(self.path, "rb") as f:
            for s in range(len(self.count)):
                n = int(self.count[s, b])
                if n:
                    f.seek(int(self.start[s, b]) * 8 * self.width)
                    parts.append(np.fromfile(f, np.uint64, n * self.width))
        arr = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        return arr.reshape(-1, self.width)


def write_lookup(stage: Path, shards: list[Path], out: Path, *, bucket_rows: int = BUCKET_ROWS) -> None:
    """Write the lookup files of a triples stage into the directory ``out``."""
    from grtool.store.reading import read_shard_frame
    from grtool.store.records import load_shard_records

    rows = sum(r.rows for r in load_shard_records(stage).values())
    bits = max(0, math.ceil(math.log2(max(rows, 1) / bucket_rows)))
    nb = 1 << bits

    def bucket_of(h: np.ndarray) -> np.ndarray:
        return (h >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(len(h), np.int64)

    fwd = _Buckets(out / "forward.scratch", 2, nb)  # (forward key, document hash)
    flip = _Buckets(out / "flipped.scratch", 2, nb)  # (flipped key, forward key)
    docs = _Buckets(out / "docs.scratch", 2, nb)  # (document hash, id length)
    names = open(out / "docs_text.scratch", "wb")
    name_bytes: list[np.ndarray] = []  # per shard: id bytes per bucket
    count = 0
    # Shard by shard (a part holds ≤ ~100K rows). The keys are made from the parts (grtool.docid.triple_key /
    # flip_key), not read from the stored docid column: the triples stage may have used other markers.
    keys = (pl.col("head", "relation", "tail").pipe(normalize_expr), pl.col("doc_id"))
    hashed = (
        pl.concat_str([pl.col("head"), pl.col("relation"), pl.col("tail")], separator=",").hash(HASH_SEED).alias("forward"),
        pl.concat_str([pl.col("tail"), pl.col("relation"), pl.col("head")], separator=",").hash(HASH_SEED).alias("flipped"),
        pl.col("doc_id").hash(HASH_SEED).alias("doc"),
    )
    for shard in shards:
        part = (
            read_shard_frame(shard, ["doc_id", "head", "relation", "tail"])
            .filter(pl.all_horizontal(pl.col("head", "relation", "tail", "doc_id").is_not_null()))
            .select(*keys)
            .select(*hashed, pl.col("doc_id"))
        )
        count += part.height
        forward, flipped, doc = (part.get_column(c).to_numpy() for c in ("forward", "flipped", "doc"))
        fwd.add(bucket_of(forward), forward, doc)
        flip.add(bucket_of(flipped), flipped, forward)
        ids = part.select("doc", "doc_id").unique(subset="doc", keep="first", maintain_order=True)
        h = ids.get_column("doc").to_numpy()
        text = ids.get_column("doc_id").to_arrow().cast(pa.large_binary())
        lengths = np.diff(np.frombuffer(text.buffers()[1], np.int64)[text.offset : text.offset + len(text) + 1])
        bucket = bucket_of(h)
        order = docs.add(bucket, h, lengths)
        ordered = text.take(pa.array(order))
        buf = ordered.buffers()
        off = np.frombuffer(buf[1], np.int64)[ordered.offset : ordered.offset + len(ordered) + 1]
        if buf[2] is not None and off[-1] > off[0]:
            names.write(memoryview(buf[2])[int(off[0]) : int(off[-1])])
        name_bytes.append(np.bincount(bucket, weights=lengths, minlength=nb).astype(np.int64))
        del part, forward, flipped, doc, ids, text, ordered
    for b in (fwd, flip, docs):
        b.finish()
    names.close()
    nbytes = np.array(name_bytes, np.int64).reshape(-1, nb)
    nstart = (np.cumsum(nbytes.ravel()) - nbytes.ravel()).reshape(nbytes.shape)
    release_build_memory()

    # The document table: per bucket, the distinct hashes sorted and their ids in that order.
    doc_hashes = _Appender(out / "doc_hashes.bin", np.uint64)
    doc_ids = open(out / "doc_ids.bin", "wb")
    doc_offsets = _Appender(out / "doc_ids_offsets.bin", np.uint64)
    doc_offsets.add(np.zeros(1, np.uint64))
    written = 0
    with open(out / "docs_text.scratch", "rb") as f:
        for b in range(nb):
            pairs = docs.read(b)
            texts = []
            for s in range(len(nbytes)):
                if nbytes[s, b]:
                    f.seek(int(nstart[s, b]))
                    texts.append(f.read(int(nbytes[s, b])))
            h, lengths = pairs[:, 0], pairs[:, 1].astype(np.int64)
            uniq, first = np.unique(h, return_index=True)
            starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64)
            blob = np.frombuffer(b"".join(texts), np.uint8)
            take_len = lengths[first]
            if len(first):
                shift = np.repeat(starts[first] - np.r_[0, np.cumsum(take_len)[:-1]], take_len)
                doc_ids.write(blob[np.arange(int(take_len.sum())) + shift].tobytes())
            doc_hashes.add(uniq)
            doc_offsets.add(written + np.cumsum(take_len).astype(np.uint64))
            written += int(take_len.sum())
            del pairs, texts, blob
    doc_ids.close()
    arrays = {"doc_hashes": doc_hashes.close(), "doc_ids_offsets": doc_offsets.close()}
    n_docs = arrays["doc_hashes"]["length"]
    hashes_map = _map(out, "doc_hashes", msgspec.convert(arrays["doc_hashes"], ArraySpec))

    # Forward keys: each row's document row, sorted by (key, document) without repeats.
    arrays["fkeys"], arrays["fdocs"] = _keyed_rows(fwd, nb, hashes_map, out / "fkeys.bin", out / "fdocs.bin", _index_type(n_docs))
    fkeys_map = _map(out, "fkeys", msgspec.convert(arrays["fkeys"], ArraySpec))
    # Flipped keys: the first row of each triple's forward key (rows of one key are adjacent), sorted by (key, row)
    # without repeats: a key that is the flip of several triples picks the smallest forward key.
    arrays["bkeys"], arrays["bfwd"] = _keyed_rows(flip, nb, fkeys_map, out / "bkeys.bin", out / "bfwd.bin", _index_type(len(fkeys_map)))
    del hashes_map, fkeys_map
    for scratch in ("forward.scratch", "flipped.scratch", "docs.scratch", "docs_text.scratch"):
        (out / scratch).unlink()
    record = {"format": FORMAT, "stage": str(stage.resolve()), "count": count, "documents": n_docs, "doc_ids_bytes": written, "arrays": arrays}
    (out / RECORD).write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    release_build_memory()


def _drop(arr: np.ndarray) -> None:
    """Let the pages of a mapped array the last bucket read stop counting in this process (the kernel keeps them
    cached): the build's memory stays one bucket, not the whole sorted file."""
    mm = getattr(arr, "_mmap", None)
    if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED)


def _keyed_rows(spill, buckets: int, targets: np.ndarray, keys_file: Path, rows_file: Path, dtype: type) -> tuple[dict, dict]:
    """Per bucket of ``spill``'s (key, target) pairs: each target's row in the sorted ``targets``, the pairs then
    sorted by (key, row) without repeats, appended to ``keys_file`` and ``rows_file`` (their records returned)."""
    keys, rows = _Appender(keys_file, np.uint64), _Appender(rows_file, dtype)
    for b in range(buckets):
        pairs = spill.read(b)
        row_of = _sorted_search(targets, pairs[:, 1]).astype(dtype)
        k, v, _ = _dedupe(pairs[:, 0], row_of)
        keys.add(k)
        rows.add(v)
        del pairs, row_of, k, v
        _drop(targets)
    return keys.close(), rows.close()


def _sorted_search(keys: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """``searchsorted(keys, needles, 'left')`` with the needles visited in order (a mapped ``keys`` is then read
    front to back, not at random)."""
    order = np.argsort(needles, kind="stable")
    out = np.empty(len(needles), np.int64)
    out[order] = np.searchsorted(keys, needles[order], "left")
    return out
