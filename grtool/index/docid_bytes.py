"""The index's docid texts as sorted bytes on disk, for bracket decoding's byte-level prefix questions.

Bracket decoding (:mod:`grtool.index.text_constraint`) asks "does some docid start with these bytes?", "is this
a whole docid?" and "which distinct bytes come next?". The FM-index answers in token ids of one tokenization,
but an off-the-shelf model writes a docid with any tokens whose bytes fit, so the questions are about bytes.
Holding every docid in a Python list would cost gigabytes at millions of docids; these files answer the same
questions memory-mapped, by binary search, so a process maps them instead of reading them::

    docid_bytes.bin           the docid texts between the brackets, UTF-8, sorted bytewise, distinct, concatenated
    docid_bytes_offsets.npy   uint64, n + 1: text i is bin[offsets[i]:offsets[i + 1]]
    docid_bytes_keys.npy      uint64, n: text i's first 8 bytes as a big-endian number (zero-padded), so most of
                              a binary search is one numpy ``searchsorted`` instead of Python comparisons
    docid_bytes.json          what they were made from (docids.parquet's BLAKE3), with which brackets, and each
                              file's size and BLAKE3; written last, so the files it vouches for are complete

Docids that contain a bracket are left out (they could never be written between brackets). The files are
written on the first bracket run over an index (:func:`open_docid_bytes`, under a lock, each file renamed into
place), not by ``index build``: they hold every docid's text uncompressed (~2.5x the FM arrays), which only
bracket decoding needs. Opening them checks each file's size and digest (once per process): damaged files, or
files of another docids.parquet, are written anew (with a warning). Writing them sorts the texts out of core: a
scratch file of the texts and a few numpy integers per docid, never a Python object per docid.
"""

from __future__ import annotations

import bisect
import fcntl
import mmap
import os
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import numpy as np
import orjson

from grtool.docid import DOCID_END, DOCID_START
from grtool.errors import InputError
from grtool.log import log
from grtool.records import Count, DamagedRecord, read_record

TEXT = "docid_bytes.bin"
OFFSETS = "docid_bytes_offsets.npy"
KEYS = "docid_bytes_keys.npy"
RECORD = "docid_bytes.json"
FILES = (TEXT, OFFSETS, KEYS, RECORD)
FORMAT = "grtool-docid-bytes/1"
SOURCE = "docids.parquet"
_LOCK = ".docid_bytes.lock"
_CHUNK = 1 << 13  # docids per vectorized step while sorting (bounds the temporary arrays and the scratch pages touched)
_WRITE_CHUNK = 1 << 13  # docids per copy into the sorted file (the copy takes 16 bytes of index per text byte)
_START, _END = DOCID_START.encode(), DOCID_END.encode()


# ------------------------------------------------------------------------------------------ reading


class DocidBytes:
    """The sorted docid texts, memory-mapped: ``len``, ``[i]`` (bytes), :meth:`bisect_left`, :meth:`byte_at`."""

    def __init__(self, text: bytes | mmap.mmap, offsets: np.ndarray, keys: np.ndarray, path: Path | None = None):
        self.path = path
        self._text = text
        self._offsets = offsets  # kept: the memoryview below reads through its mapping
        self._off = memoryview(offsets) if len(offsets) else memoryview(np.zeros(1, np.uint64))
        self._keys = keys
        self._n = len(keys)

    @classmethod
    def from_texts(cls, texts, open: bytes = b"[", close: bytes = b"]") -> "DocidBytes":
        """In memory, from an iterable of str/bytes (tests and small sets); the same filtering as the files."""
        docs = sorted({t.encode() if isinstance(t, str) else bytes(t) for t in texts} - {b""})
        docs = [d for d in docs if open not in d and close not in d]
        offsets = np.zeros(len(docs) + 1, np.uint64)
        offsets[1:] = np.cumsum([len(d) for d in docs], dtype=np.uint64)
        keys = np.array([_key(d) for d in docs], dtype=np.uint64)
        return cls(b"".join(docs), offsets, keys)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> bytes:
        if not 0 <= i < self._n:
            if -self._n <= i < 0:
                i += self._n
            else:
                raise IndexError(i)
        off = self._off
        return self._text[off[i] : off[i + 1]]

    def __iter__(self):
        return (self[i] for i in range(self._n))

    def byte_at(self, i: int, n: int) -> int:
        """Byte ``n`` of text ``i`` (the caller knows the text is longer than ``n``)."""
        return self._text[self._off[i] + n]

    def bisect_left(self, x: bytes, lo: int = 0, hi: int | None = None) -> int:
        """The first position in [lo, hi) whose text is ≥ ``x`` (``bisect.bisect_left`` on the texts)."""
        hi = self._n if hi is None else hi
        if hi - lo > _SMALL:
            # The first 8 bytes narrow [lo, hi) to the texts that share them, in one numpy call.
            k = _key(x)
            a, b = self._keys[lo:hi].searchsorted(np.array([k, k + 1] if k < _MAX_KEY else [k, k], np.uint64)).tolist()
            if k == _MAX_KEY:
                b = hi - lo
            if a == b:
                return lo + a
            lo, hi = lo + a, lo + b
        return bisect.bisect_left(self, x, lo, hi)  # compare whole texts

    def starts(self, q: bytes) -> bool:
        """Some text starts with ``q``."""
        i = self.bisect_left(q)
        return i < self._n and self[i].startswith(q)

    def __contains__(self, q: bytes) -> bool:
        i = self.bisect_left(q)
        return i < self._n and self[i] == q


_SMALL = 32  # ranges this short are searched by comparing texts directly (cheaper than a numpy call)
_MAX_KEY = (1 << 64) - 1


def _key(b: bytes) -> int:
    return int.from_bytes(b[:8].ljust(8, b"\0"), "big")


class _FileEntry(msgspec.Struct):
    bytes: Count
    blake3: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class DocidBytesRecord(msgspec.Struct):
    """docid_bytes.json, declared once (:mod:`grtool.records`)."""

    format: Literal["grtool-docid-bytes/1"]
    source_blake3: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    open: Annotated[str, msgspec.Meta(min_length=1)]
    close: Annotated[str, msgspec.Meta(min_length=1)]
    docids: Count
    source: Literal["docids.parquet"] = SOURCE
    files: dict[Literal["docid_bytes.bin", "docid_bytes_offsets.npy", "docid_bytes_keys.npy"], _FileEntry] | None = None  # None: written before it listed them

    def __post_init__(self) -> None:
        if self.open == self.close:
            raise ValueError(f"open and close are the same bracket {self.open!r}")
        if self.files is not None:
            if set(self.files) != {TEXT, OFFSETS, KEYS}:
                raise ValueError(f"files: lists {sorted(self.files)}, not {TEXT}, {OFFSETS} and {KEYS}")
            if self.files[KEYS].bytes < 8 * self.docids or self.files[OFFSETS].bytes < 8 * (self.docids + 1):
                raise ValueError(f"docids: {self.docids:,} texts cannot fit the key and offset files listed")


def read_docid_bytes_record(index_dir: Path) -> DocidBytesRecord:
    """docid_bytes.json through its declaration (:class:`DamagedRecord` naming the field)."""
    return read_record(index_dir / RECORD, DocidBytesRecord, what="bracket decoding record")


def _current(index_dir: Path, source: Path, ob: bytes, cb: bytes) -> bool:
    """The files exist, are complete and were made from this docids.parquet with these brackets. A record that
    does not decode is not current: the files are derived from docids.parquet and are written anew (a warning
    says so)."""
    from grtool.store.fingerprints import file_hash

    try:
        record = read_docid_bytes_record(index_dir)
    except (FileNotFoundError, DamagedRecord):
        return False
    return (
        record.open == ob.decode() and record.close == cb.decode()
        and record.source_blake3 == file_hash(source) and all((index_dir / f).is_file() for f in FILES)
        and _intact(index_dir, record)
    )  # fmt: skip


def _intact(index_dir: Path, record: DocidBytesRecord) -> bool:
    """Each file has the size and digest the record lists (a record written before it listed them: True)."""
    from grtool.store.fingerprints import file_hash

    if record.files is None:
        return True
    for name, rec in record.files.items():
        path = index_dir / name
        if path.stat().st_size != rec.bytes or file_hash(path) != rec.blake3:
            return False
    return True


def load_docid_bytes(index_dir: str | Path) -> DocidBytes:
    """The files of an index directory, memory-mapped (they must exist: :func:`open_docid_bytes` makes them),
    each checked against the size and digest docid_bytes.json records (files written before it recorded them:
    sizes against each other only)."""
    from grtool.index.base import damaged, load_array

    d = Path(index_dir)
    try:
        record = read_docid_bytes_record(d)
        intact = _intact(d, record)
    except OSError:
        raise damaged(d, RECORD, "unreadable, or a file it lists is missing") from None
    if not intact:
        raise damaged(d, "docid_bytes files", f"not the files {RECORD} records (size or content differs)")
    offsets = np.asarray(load_array(d / OFFSETS, dtype=np.uint64))
    keys = np.asarray(load_array(d / KEYS, dtype=np.uint64))
    size = (d / TEXT).stat().st_size
    if len(offsets) != len(keys) + 1 or (len(keys) and int(offsets[-1]) != size):
        raise damaged(d, OFFSETS, f"{len(offsets):,} offsets for {len(keys):,} texts of {size:,} bytes")
    if len(keys) != record.docids:
        raise DamagedRecord(f"{d / RECORD}: bracket decoding record: field docids: {record.docids:,}, the files hold {len(keys):,} texts (edited or damaged)")
    if not size:
        return DocidBytes(b"", offsets, keys, d)
    with open(d / TEXT, "rb") as f:
        text = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return DocidBytes(text, offsets, keys, d)


def open_docid_bytes(index_dir: str | Path, open: bytes = b"[", close: bytes = b"]") -> DocidBytes:
    """The docid texts of an index, memory-mapped; written first (under a lock) when missing or made from another
    docids.parquet (an index built before grtool wrote them, or rebuilt since)."""
    d = Path(index_dir)
    source = d / SOURCE
    if not source.is_file():
        raise InputError(f"{d}: no {SOURCE} (bracket decoding needs an index built with --source docids)")
    if not _current(d, source, open, close):
        try:
            fd = os.open(d / _LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise InputError(f"{d}: cannot write the bracket decoding files ({e.strerror}); rebuild the index with `grtool index build` where it can be written") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another process writing them: wait, then use its files
            if not _current(d, source, open, close):
                if (d / RECORD).is_file():
                    log.warning("index %s: its bracket decoding files are stale or damaged (not what %s records): writing them again", d, RECORD)
                write_docid_bytes(d, open, close)
        finally:
            os.close(fd)  # closing releases the lock
    return load_docid_bytes(d)


# ------------------------------------------------------------------------------------------ writing


def write_docid_bytes(index_dir: str | Path, open: bytes = b"[", close: bytes = b"]") -> list[str]:
    """Write the files for ``index_dir/docids.parquet`` (``index build`` calls it once docids.parquet is in its
    directory); returns their names. Memory: a few integers per docid and one Parquet batch, never all texts."""
    from grtool.docid.lookup import release_build_memory
    from grtool.store.fingerprints import file_hash
    from grtool.store.records import atomic_write_bytes, commit_file

    d = Path(index_dir)
    source = d / SOURCE
    scratch = d / f".{TEXT}.{os.getpid()}.scratch"
    tmp = {name: d / f".{name}.{os.getpid()}.tmp" for name in (TEXT, OFFSETS, KEYS)}
    try:
        starts, lengths = _spill(source, scratch, open, close)
        release_build_memory()  # the Parquet reader's buffers (a row group's strings), kept by its pool otherwise
        with _Mapped(scratch) as data:
            order, keys, dup = _sort(data, starts, lengths)
            keep = order[~dup]
            keys = keys[~dup]
            del order, dup
            offsets = np.zeros(len(keep) + 1, np.uint64)
            np.cumsum(lengths[keep], dtype=np.uint64, out=offsets[1:])
            with builtins_open(tmp[TEXT], "wb") as out:
                for at in range(0, len(keep), _WRITE_CHUNK):
                    idx = keep[at : at + _WRITE_CHUNK]
                    out.write(_gather(data, starts[idx], lengths[idx]).tobytes())
                    if at % (64 * _WRITE_CHUNK) == 0:
                        data.drop()
        for name, arr in ((OFFSETS, offsets), (KEYS, keys)):
            with builtins_open(tmp[name], "wb") as out:  # a handle: np.save would append .npy to the name
                np.save(out, arr)
        for name, path in tmp.items():
            commit_file(path, d / name)
        files = {name: {"bytes": (d / name).stat().st_size, "blake3": file_hash(d / name)} for name in (TEXT, OFFSETS, KEYS)}
        record = {"format": FORMAT, "source": SOURCE, "source_blake3": file_hash(source), "open": open.decode(), "close": close.decode(),
                  "docids": len(keys), "files": files}  # fmt: skip
        atomic_write_bytes(d / RECORD, orjson.dumps(record, option=orjson.OPT_INDENT_2))
    finally:
        scratch.unlink(missing_ok=True)
        for path in tmp.values():
            path.unlink(missing_ok=True)
    return list(FILES)


builtins_open = open  # the functions above take a parameter named open (the bracket)


class _Mapped:
    """A scratch file as a uint8 array whose touched pages can be dropped from the process (``drop``)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> "_Mapped":
        size = self.path.stat().st_size
        self._f = builtins_open(self.path, "rb")
        self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.array = np.frombuffer(self._mm, dtype=np.uint8) if size else np.zeros(0, np.uint8)
        return self

    def drop(self) -> None:
        # Clean file pages: the kernel keeps them cached, but they stop counting in this process's RSS.
        if self._mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mm.madvise(mmap.MADV_DONTNEED)

    def __exit__(self, *exc) -> None:
        self.array = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a view still alive: let the collector close it
                pass
        self._f.close()


def _spill(source: Path, scratch: Path, ob: bytes, cb: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Stream docids.parquet into ``scratch`` (its bytes as stored); per docid that can be written between the
    brackets, where its text between the markers starts in the scratch file and how long it is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grtool.store.reading import arrow_source

    try:
        reader = pq.ParquetFile(arrow_source(source))  # a directory name that is not UTF-8 too
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
        raise InputError(f"{source}: not a readable Parquet file ({e}); rebuild the index with `grtool index build`") from None
    starts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    base = 0
    brackets = np.frombuffer(ob + cb, np.uint8)
    with builtins_open(scratch, "wb") as f:
        for batch in reader.iter_batches(batch_size=1 << 16, columns=["docid"]):
            col = batch.column(0)
            if col.null_count:
                col = col.drop_null()
            col = col.cast(pa.large_binary())
            n = len(col)
            if not n:
                continue
            bufs = col.buffers()
            off = np.frombuffer(bufs[1], dtype=np.int64)[col.offset : col.offset + n + 1]
            data = np.frombuffer(bufs[2], dtype=np.uint8)[off[0] : off[-1]] if bufs[2] is not None else np.zeros(0, np.uint8)
            off = off - off[0]
            f.write(data.tobytes())
            s, e = off[:-1].copy(), off[1:]
            marked = _has(data, s, e, _START, at_end=False) & _has(data, s, e, _END, at_end=True) & (e - s >= len(_START) + len(_END))
            s[marked] += len(_START)
            length = e - s - np.where(marked, len(_END), 0)
            ok = length > 0
            hits = np.flatnonzero(np.isin(data, brackets))
            if len(hits):  # a bracket inside the text between the markers: never writable
                row = np.searchsorted(e, hits, "right")
                inside = hits < s[row] + length[row]
                ok[row[inside & (hits >= s[row])]] = False
            starts.append((s + base)[ok])
            lengths.append(length[ok].astype(np.uint32))  # a docid is far below 4 GB
            base += len(data)
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.uint32)
    return np.concatenate(starts), np.concatenate(lengths)


def _has(data: np.ndarray, s: np.ndarray, e: np.ndarray, marker: bytes, at_end: bool) -> np.ndarray:
    """Per text data[s:e], whether it starts (ends) with ``marker``."""
    m = len(marker)
    long = e - s >= m
    at = np.where(long, (e - m) if at_end else s, 0)
    window = data[np.minimum(at[:, None] + np.arange(m), max(len(data) - 1, 0))] if len(data) else np.zeros((len(s), m), np.uint8)
    return long & (window == np.frombuffer(marker, np.uint8)).all(axis=1)


def _keys_at(mapped: _Mapped, starts: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per text, its 8 bytes from ``starts`` (zero-padded past its end: ``rest`` bytes are left) as a big-endian
    number, and min(rest, 9): equal numbers and equal values ≤ 8 mean equal texts, 9 means the text goes on.

    The texts are read in file order, a chunk at a time, and the chunk's pages dropped: read in any other order,
    every text faults in a page and the kernel maps the pages around it too (hundreds of MB per chunk)."""
    data = mapped.array
    keys = np.empty(len(starts), np.uint64)
    ascending = len(starts) < 2 or bool((starts[1:] >= starts[:-1]).all())
    visit = None if ascending else np.argsort(starts, kind="stable")
    cols = np.arange(8)
    last = max(len(data) - 1, 0)
    for at in range(0, len(starts), _CHUNK):
        sel = slice(at, at + _CHUNK) if visit is None else visit[at : at + _CHUNK]
        s, r = starts[sel], rest[sel]
        valid = cols < r[:, None]
        window = np.where(valid, data[np.minimum(s[:, None] + cols, last)], 0).astype(np.uint8)
        keys[sel] = window.view(">u8").ravel()
        mapped.drop()
    return keys, np.minimum(rest, 9).astype(np.uint8)


def _sort(mapped: _Mapped, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, first-8-byte keys in that order, duplicate flags in that order) of the texts, sorted bytewise.

    Sort by the first 8 bytes, then re-sort only the runs that tie, by their next 8 bytes, until none tie. Only
    the order (32-bit while it fits), the keys and two flags per text are full-size; every later round works on
    the rows that still tie."""
    n = len(starts)
    itype = np.uint32 if n < 2**32 else np.int64
    keys, rank = _keys_at(mapped, starts, lengths)
    mapped.drop()
    order = np.argsort(keys, kind="stable").astype(itype)
    keys = keys[order]
    rank = rank[order]
    dup = np.zeros(n, bool)
    # The runs of equal first 8 bytes: sorted by how many bytes are left (a text that ends sorts first), then refined.
    same = keys[1:] == keys[:-1]
    member = np.zeros(n, bool)
    member[:-1] |= same
    member[1:] |= same
    pos = np.flatnonzero(member).astype(itype)
    del member
    group = np.cumsum(~same[pos[1:].astype(np.int64) - 1]).astype(itype) if len(pos) else np.zeros(0, itype)
    group = np.r_[np.zeros(min(len(pos), 1), itype), group]
    del same
    k, r = keys[pos], rank[pos]
    del rank
    perm = np.lexsort((r, group))
    order[pos] = order[pos][perm]
    k, r, group = k[perm], r[perm], group[perm]
    del perm
    depth = 0
    while len(pos) > 1:
        same = (group[1:] == group[:-1]) & (k[1:] == k[:-1]) & (r[1:] == r[:-1])
        dup[pos[1:][same & (r[1:] <= 8)]] = True  # both end here with the same bytes: the same text
        tie = same & (r[1:] == 9)
        if not tie.any():
            break
        member = np.zeros(len(pos), bool)
        member[:-1] |= tie
        member[1:] |= tie
        # A new run starts where a member does not tie with the one before it.
        run_start = member & ~np.r_[False, tie]
        group = np.cumsum(run_start, dtype=itype)[member]
        pos = pos[member]
        depth += 8
        idx = order[pos]
        k, r = _keys_at(mapped, starts[idx] + depth, lengths[idx] - np.uint32(depth))  # > 8 bytes left: no wrap
        mapped.drop()
        perm = np.lexsort((r, k, group))  # runs are contiguous and ascending: reorders within each run
        order[pos] = idx[perm]
        k, r, group = k[perm], r[perm], group[perm]
        del perm, idx
    return order, keys, dup


def _gather(mapped: _Mapped, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The texts data[s:s+l] concatenated, vectorized."""
    lengths = lengths.astype(np.int64)
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.uint8)
    shift = np.repeat(starts - np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    return mapped.array[np.arange(total) + shift]


def record_problems(index_dir: str | Path) -> list[str]:
    """For `grtool validate`: what is wrong with an index's bracket decoding files, when it has them (one line
    each; a bracket run would write them anew, but a damaged record is still reported)."""
    from grtool.errors import GrtoolError

    d = Path(index_dir)
    if not (d / RECORD).exists():
        return []
    try:
        load_docid_bytes(d)
    except GrtoolError as e:
        return [str(e)]
    return []
