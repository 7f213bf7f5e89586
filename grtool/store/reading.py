"""The one checked way commands read the Parquet shards of a stage directory (DESIGN §8: damaged bytes give an
error naming the file, never a crash and never a different answer with exit 0).

Before a shard is read it is checked against its completion record (``_shards/part-N.json``): present, the
recorded size, the recorded sha256 (once per process and unchanged file), and the table's schema in its footer.
Hashing costs about 0.85 s per GB of shards (sha256 at ~1.2 GB/s), 5-25 % of reading those bytes into rows;
without it, bytes overwritten inside a compressed page can decode into different rows with no error at all.
What pyarrow or polars still raise while reading (lazily, batch by batch, or at a lazy frame's ``collect``)
becomes the same one-line :class:`~grtool.errors.DataProblem` (exit 1) naming the shard.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from grtool.errors import DataProblem
from grtool.records import file_kind
from grtool.errors import printable

MAX_DETAIL = 200  # characters of a reader's message kept in the one-line error

# Errors a Parquet reader raises on damaged bytes. polars' are added when polars is imported (always, in practice).
_READ_ERRORS: tuple[type[BaseException], ...] = (pa.ArrowException, OSError, ValueError, EOFError)
try:
    import polars as pl

    _READ_ERRORS += (pl.exceptions.PolarsError,)
except ImportError:  # pragma: no cover - polars is a dependency
    pl = None  # type: ignore[assignment]

_VERIFIED: set[tuple] = set()  # (path, dev, inode, size, mtime, ctime) of shards whose sha256 matched this process


def damaged(shard: str | Path, what: str) -> DataProblem:
    """The one-line error for a shard that cannot be trusted or read."""
    shard = Path(shard)
    return DataProblem(f"{printable(shard)}: damaged Parquet shard ({what}); run grtool validate {printable(shard.parent)}")


def short(error: BaseException) -> str:
    """A reader's message, one line and short (pyarrow's carry file names and C++ detail)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 1] + "…"


class Committed(Protocol):
    """What :func:`verify_shard` reads of a shard record (:class:`grtool.store.records.ShardRecord`, whose module
    imports this one)."""

    bytes: int
    sha256: str


def verify_shard(shard: Path, record: Committed, expected: pa.Schema | None = None) -> None:
    """``shard`` against its completion record: present, its size, its sha256, the table's schema."""
    name = f"_shards/{shard.stem}.json"
    try:
        st = shard.stat()
    except FileNotFoundError:
        raise damaged(shard, f"the file is missing; {name} records it as done") from None
    if not stat.S_ISREG(st.st_mode):  # a directory or a FIFO in a shard's place: never opened (a FIFO would hang)
        raise damaged(shard, f"{file_kind(shard) or 'a directory'} in the shard's place, not a file")
    if st.st_size != record.bytes:
        what = "empty" if st.st_size == 0 else "truncated" if st.st_size < record.bytes else "longer than written"
        raise damaged(shard, f"{what}: {st.st_size} bytes, {name} records {record.bytes}")
    key = (str(shard.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _VERIFIED:
        with open_regular(shard) as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != record.sha256:
            raise damaged(shard, f"its bytes changed since it was written: sha256 differs from {name}")
        _VERIFIED.add(key)
    if expected is not None:
        got = open_shard(shard).schema_arrow
        if not got.equals(expected):
            raise damaged(shard, f"schema differs from the table's: {schema_diff(got, expected)}")


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading when it is a regular file, without blocking on a FIFO; else :func:`damaged`."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise damaged(path, f"{file_kind(path) or 'a directory'} in the shard's place, not a file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def arrow_source(path: str | Path) -> str | BinaryIO:
    """What Arrow readers open for ``path``: the path itself, or an open file where the name is not valid UTF-8
    (Arrow takes names as UTF-8 only; Python opens any name the file system holds)."""
    try:
        str(path).encode("utf-8")
        return str(path)
    except UnicodeEncodeError:
        return open_regular(path)


def arrow_sources(paths: list[Path] | list[str]) -> list[Any]:
    """:func:`arrow_source` of each path, for polars' ``scan_parquet``/``read_parquet`` of several files."""
    return [arrow_source(p) for p in paths]


def scan_shards(shards: list[Path] | list[str]) -> "pl.LazyFrame":
    """A lazy polars scan of exactly the files ``shards`` (a stage's :func:`~grtool.store.stage.shard_paths`),
    each name taken literally. polars reads a path holding ``*``, ``?`` or ``[…]`` as a glob by default: the
    shards of a run directory named ``r*`` or ``exp[1]`` would be read with (or as) those of ``r1`` or ``exp1``.
    Every polars read of shards goes through here or :func:`read_shards_frame`; collect it with :func:`collect`."""
    return pl.scan_parquet(arrow_sources(shards), glob=False)


def read_shards_frame(shards: list[Path] | list[str], columns: list[str] | None = None) -> "pl.DataFrame":
    """``shards`` read at once into one polars frame, names literal (see :func:`scan_shards`); a damaged one is
    named like pyarrow's errors."""
    return collect(scan_shards(shards).select(columns) if columns is not None else scan_shards(shards), [Path(s) for s in shards])


def open_shard(shard: str | Path) -> pq.ParquetFile:
    """``pq.ParquetFile`` whose failure (bad magic, cut footer) is a :func:`damaged` error."""
    try:
        return pq.ParquetFile(arrow_source(shard))
    except _READ_ERRORS as e:
        raise damaged(shard, short(e)) from None


def shard_rows(shard: str | Path) -> int:
    """Rows of a shard from its footer."""
    return open_shard(shard).metadata.num_rows


def iter_shard_batches(shard: str | Path, columns: list[str] | None = None, batch_size: int = 65_536) -> Iterator[pa.RecordBatch]:
    """A shard's record batches; errors raised while decoding a later page (they come lazily) are caught too."""
    batches = open_shard(shard).iter_batches(batch_size=batch_size, columns=columns)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except _READ_ERRORS as e:
            raise damaged(shard, short(e)) from None
        yield batch


def read_shard(shard: str | Path, columns: list[str] | None = None) -> pa.Table:
    try:
        return open_shard(shard).read(columns=columns)
    except DataProblem:
        raise
    except _READ_ERRORS as e:
        raise damaged(shard, short(e)) from None


def read_row_group(shard: str | Path, group: int, columns: list[str] | None = None) -> pa.Table:
    try:
        return open_shard(shard).read_row_group(group, columns=columns)
    except DataProblem:
        raise
    except _READ_ERRORS as e:
        raise damaged(shard, short(e)) from None


def read_shard_frame(shard: str | Path, columns: list[str] | None = None) -> "pl.DataFrame":
    """A shard as a polars frame (polars' own reader), with its errors named like pyarrow's."""
    try:
        return pl.read_parquet(arrow_source(shard), columns=columns, glob=False)
    except _READ_ERRORS as e:
        raise damaged(shard, short(e)) from None


def collect(frame: "pl.LazyFrame", shards: list[Path]) -> "pl.DataFrame":
    """``frame.collect()`` for a lazy scan of ``shards``: polars reads pages only here, so its errors come here.

    The failing shard is found by reading each with pyarrow (only on this error path); when every shard reads,
    the error was not about the bytes and is raised as it was."""
    try:
        return frame.collect()
    except _READ_ERRORS:
        for shard in shards:
            read_shard(shard)  # raises the damaged shard's error
        raise


def schema_diff(got: pa.Schema, expected: pa.Schema) -> str:
    g = {f.name: str(f.type) for f in got}
    e = {f.name: str(f.type) for f in expected}
    parts = [f"missing {k}" for k in e if k not in g]
    parts += [f"unexpected {k}" for k in g if k not in e]
    parts += [f"{k} is {g[k]}, expected {e[k]}" for k in e if k in g and g[k] != e[k]]
    return "; ".join(parts) or "field order"
