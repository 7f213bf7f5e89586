"""Streaming readers for the release files: records one at a time, whatever the container.

What a file is comes from its bytes, not its name:
- compression by magic number: gzip, bzip2 (also multi-stream), xz, or none;
- a tar archive (the HotpotQA Wikipedia dump ships as a ``.tar.bz2`` of ``.bz2`` files) is walked member by
  member, each member sniffed again;
- layout by the first non-blank byte: ``[`` is one JSON array (streamed item by item with ijson's C backend,
  so a 540 MB array never sits in memory), ``{`` is JSON Lines;
- Parquet (``PAR1``, what ``Dataset.to_parquet`` writes) and Arrow IPC files and streams (the ``.arrow`` files of a
  ``Dataset.save_to_disk`` folder) by their magic bytes, read with pyarrow one record batch at a time. In a
  ``save_to_disk`` folder the ``state.json`` / ``dataset_info.json`` records are not inputs; its split comes
  from ``state.json`` (``_split``) or the folder's name.

A file that cannot be read to its end (truncated, corrupt, not JSON) raises :class:`InputError` naming the
file and the position; callers read every input fully before committing anything.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import re
import sys
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import ijson
import orjson

from grtool.errors import InputError
from grtool.store.io import is_stdio
from grtool.errors import printable
from grtool.store.fingerprints import tree_files
from grtool.userinput import TooDeep, check_nesting, may_nest_deeply, missing_input, nesting_events

READ_BUFFER = 1 << 20
_BOM = b"\xef\xbb\xbf"
_DECOMPRESS_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error, tarfile.TarError)

try:  # the C backend parses several times faster than the pure-Python one; fall back if it is missing
    _ijson = ijson.get_backend("yajl2_c")
except Exception:  # pragma: no cover - depends on the installed wheel
    _ijson = ijson


_DOC_SUFFIXES = {".md", ".rst", ".html", ".pdf"}
_DOC_STEMS = ("readme", "license", "licence", "copying", "notice", "sources")


def _is_documentation(f: Path) -> bool:
    return f.suffix.lower() in _DOC_SUFFIXES or f.name.lower().startswith(_DOC_STEMS)


HF_STATE = "state.json"  # beside the .arrow files of a Dataset.save_to_disk folder, with dataset_info.json
HF_INFO = "dataset_info.json"
HF_DICT = "dataset_dict.json"  # DatasetDict.save_to_disk: the splits' folders below it


def _is_dataset_record(f: Path) -> bool:
    """A ``save_to_disk`` folder's own JSON record, not data."""
    if f.name == HF_DICT:
        return True
    return f.name in (HF_STATE, HF_INFO) and (f.parent / HF_STATE).is_file() and (f.parent / HF_INFO).is_file()


def dataset_folder_split(path: Path) -> str | None:
    """The split of an Arrow file in a ``save_to_disk`` folder: ``state.json``'s ``_split``, else the folder's name
    (``validation`` → ``dev`` like a file name); None elsewhere."""
    from grtool.corpus.datasets import split_from_name

    state = path.parent / HF_STATE
    if not (state.is_file() and (path.parent / HF_INFO).is_file()):
        return None
    try:
        given = orjson.loads(state.read_bytes()).get("_split") if state.stat().st_size < 1 << 20 else None  # a record, not data
    except (orjson.JSONDecodeError, AttributeError, OSError):
        given = None
    if isinstance(given, str) and given.strip():
        return split_from_name(given) or given.strip()
    return split_from_name(path.parent.name)


def input_files(path: str | Path, exclude: Iterable[str | Path] = ()) -> list[Path]:
    """A file, or every data file below a directory.

    In a directory, hidden and ``_``-prefixed entries, documentation (README, LICENSE, ``*.md``, ...) and the
    ``exclude`` paths (the run's own output, when ``--out`` lies inside the input directory) are skipped; a
    file named on the command line is always read. A name that is not valid UTF-8 is refused.
    """
    p = Path(path)
    if is_stdio(path):  # "-": standard input, any container (detected from its bytes)
        return [p]
    if p.is_file():
        return [p]
    if p.is_dir():
        files = [f for rel, f in tree_files(p, exclude) if not any(part.startswith((".", "_")) for part in Path(rel).parts) and not _is_documentation(f) and not _is_dataset_record(f)]
        if not files:
            raise InputError(f"{p}: directory holds no input files")
        return files
    raise missing_input(p)


@dataclass
class Stream:
    """One decompressed stream of records: a file, or a member of a tar archive."""

    name: str  # for messages: "path" or "path:member"
    data: BinaryIO  # decompressed bytes
    raw: BinaryIO  # the file on disk, for progress (tell() = compressed bytes consumed)
    table: str | None = None  # PARQUET, ARROW_FILE or ARROW_STREAM: records are a table's rows, not JSON
    split: str | None = None  # the split a Hugging Face dataset folder gives its Arrow files


PARQUET, ARROW_FILE, ARROW_STREAM = "Parquet", "Arrow file", "Arrow stream"


def _table_kind(head: bytes) -> str | None:
    if head.startswith(b"PAR1"):
        return PARQUET
    if head.startswith(b"ARROW1"):
        return ARROW_FILE
    if head.startswith(b"\xff\xff\xff\xff"):  # an IPC stream's continuation marker (save_to_disk writes streams)
        return ARROW_STREAM
    return None


def _sniff(buf: io.BufferedReader) -> str:
    head = buf.peek(6)[:6]
    if head.startswith(b"\x1f\x8b"):
        return "gzip"
    if head.startswith(b"BZh"):
        return "bzip2"
    if head.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    return "none"


def _decompressed(buf: io.BufferedReader) -> io.BufferedReader:
    kind = _sniff(buf)
    if kind == "gzip":
        inner: BinaryIO = gzip.GzipFile(fileobj=buf, mode="rb")
    elif kind == "bzip2":
        inner = bz2.BZ2File(buf, mode="rb")
    elif kind == "xz":
        inner = lzma.LZMAFile(buf, mode="rb")
    else:
        return buf
    return io.BufferedReader(inner, READ_BUFFER)  # type: ignore[arg-type]


def _is_tar(buf: io.BufferedReader) -> bool:
    head = buf.peek(512)
    return len(head) >= 262 and head[257:262] == b"ustar"


class _Stdin(io.RawIOBase):
    """Standard input as a raw stream whose ``tell()`` counts the bytes read (a pipe cannot seek)."""

    def __init__(self) -> None:
        self.f = sys.stdin.buffer
        self.pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.read1(len(b)) if hasattr(self.f, "read1") else self.f.read(len(b))
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self.pos


def open_streams(path: Path) -> Iterator[Stream]:
    """The decompressed record streams of one input file (one, or one per tar member); ``-`` is stdin."""
    raw: BinaryIO = _Stdin() if is_stdio(path) else open(path, "rb", buffering=0)  # type: ignore[assignment]
    try:
        buf = io.BufferedReader(raw, READ_BUFFER)
        table = _table_kind(buf.peek(6)[:6])
        if table is not None:
            if is_stdio(path):
                raise InputError(f"<stdin>: {table} data is read from a file only: give its path")
            yield Stream(printable(path), buf, raw, table, dataset_folder_split(path))
            return
        try:
            data = _decompressed(buf)
            tar = _is_tar(data)
        except _DECOMPRESS_ERRORS as e:
            raise InputError(f"{path}, start of file: truncated or corrupt compressed data ({e})") from None
        if not tar:
            yield Stream(printable(path), data, raw)
            return
        try:
            with tarfile.open(fileobj=data, mode="r|") as archive:
                for member in archive:
                    if not member.isfile() or Path(member.name).name.startswith((".", "_")):
                        continue
                    fobj = archive.extractfile(member)
                    assert fobj is not None
                    inner = io.BufferedReader(fobj, READ_BUFFER)  # type: ignore[arg-type]
                    yield Stream(f"{printable(path)}:{member.name}", _decompressed(inner), raw)
        except _DECOMPRESS_ERRORS as e:
            raise InputError(f"{path}: truncated or corrupt archive ({e})") from None
    finally:
        raw.close()


class _Counting:
    """File wrapper that counts bytes handed to the parser, for error positions."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.pos += len(b)
        return b


def iter_records(stream: Stream) -> Iterator[tuple[str, Any]]:
    """``(position, record)`` pairs; position reads "record N" (JSON array) or "line N" (JSON Lines).

    JSON Lines records come as the undecoded line (``bytes``), so that a caller may decode only the fields
    it needs (see :func:`parse_line` for the general case).
    """
    name, data = stream.name, stream.data
    if stream.table is not None:
        yield from _iter_table_rows(stream)
        return
    try:
        head = data.peek(64)
        if head.startswith(_BOM):
            data.read(len(_BOM))
            head = data.peek(64)
        # skip leading whitespace to see the first real byte
        while head and head[:1].isspace():
            stripped = head.lstrip()
            data.read(len(head) - len(stripped))
            head = data.peek(64)
    except _DECOMPRESS_ERRORS as e:
        raise InputError(f"{name}: truncated or corrupt compressed data at the start ({e})") from None
    if not head:
        return
    first = head[:1]
    if first == b"[":
        yield from _iter_array(name, data)
    elif first == b"{":
        yield from _iter_lines(name, data)
    else:
        raise InputError(f"{name}: not JSON: expected a JSON array or JSON Lines, the file starts with {head[:20]!r}")


TABLE_BATCH_ROWS = 1024  # rows decoded at a time from a Parquet or Arrow input


def _iter_table_rows(stream: Stream) -> Iterator[tuple[str, Any]]:
    """``("row N", record)`` of a Parquet or Arrow input, one record batch at a time (its nested lists and structs
    become lists and dicts, as ``datasets`` gives them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 0
    try:
        if stream.table == PARQUET:
            batches: Iterable[Any] = pq.ParquetFile(stream.data).iter_batches(batch_size=TABLE_BATCH_ROWS)
        elif stream.table == ARROW_FILE:
            reader = pa.ipc.open_file(stream.data)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = pa.ipc.open_stream(stream.data)
        for batch in batches:
            for record in batch.to_pylist():
                n += 1
                yield f"row {n}", record
    except (pa.ArrowException, OSError, ValueError) as e:
        raise InputError(f"{stream.name}, row {n + 1}: not a readable {stream.table} file after {n} rows ({e})") from None


def _iter_array(name: str, data: BinaryIO) -> Iterator[tuple[str, Any]]:
    counted = _Counting(data)
    n = 0
    # Small reads: yajl makes the events of a whole read at once, each with its path, which costs the square of
    # the depth of a deeply nested read; 4 KB reads parse as fast as 64 KB ones.
    events = nesting_events(_ijson.parse(counted, use_float=True, buf_size=4096), lambda: InputError(f"{name}, record {n + 1}: {TooDeep()}"))
    items = _ijson.items(events, "item")
    while True:
        try:
            record = next(items)
        except StopIteration:
            return
        except _DECOMPRESS_ERRORS as e:
            raise InputError(f"{name}, record {n + 1}: truncated or corrupt compressed data after {n} complete records ({e})") from None
        except ijson.JSONError as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__  # yajl adds a drawing
            kind = "truncated" if "premature EOF" in why else "malformed"
            raise InputError(f"{name}, record {n + 1}: {kind} JSON array near byte {counted.pos} after {n} complete records ({why})") from None
        n += 1
        yield f"record {n}", record


def _iter_lines(name: str, data: BinaryIO) -> Iterator[tuple[str, bytes]]:
    lineno = 0
    first = True
    try:
        for line in data:
            lineno += 1
            if line.strip():
                if may_nest_deeply(line):
                    _check_line_nesting(name, f"line {lineno}", line)
                if first:
                    first = False
                    problem = _not_json_lines(name, line, data)
                    if problem is not None:
                        raise problem
                yield f"line {lineno}", line
    except _DECOMPRESS_ERRORS as e:
        raise InputError(f"{name}, line {lineno + 1}: truncated or corrupt compressed data ({e})") from None


def _check_line_nesting(name: str, position: str, line: bytes) -> None:
    try:
        check_nesting(orjson.loads(line))
    except orjson.JSONDecodeError as e:
        if "recursion" not in str(e) and "depth" not in str(e):
            return  # not JSON: the readers say so
        raise InputError(f"{name}, {position}: {TooDeep()}") from None
    except TooDeep as e:
        raise InputError(f"{name}, {position}: {e}") from None


class _Prefixed:
    """A reader that gives ``head`` and then the rest of ``data``."""

    def __init__(self, head: bytes, data: BinaryIO):
        self.head, self.data = head, data

    def read(self, n: int = -1) -> bytes:
        if self.head:
            out, self.head = (self.head, b"") if n < 0 or n >= len(self.head) else (self.head[:n], self.head[n:])
            return out
        return self.data.read(n)


_EVENT_KIND = {"string": "string", "number": "number", "integer": "number", "double": "number", "boolean": "boolean", "null": "null"}


def _not_json_lines(name: str, first_line: bytes, data: BinaryIO) -> InputError | None:
    """A first line that is not JSON in a file starting with ``{``: one JSON object spread over many lines
    (e.g. a ``{title: [sentences]}`` corpus)? Then the error names that shape; None when it is not one."""
    try:
        orjson.loads(first_line)
        return None
    except orjson.JSONDecodeError:
        pass
    keys: list[tuple[str, str]] = []
    depth, pending = 0, None
    try:
        for _, event, value in _ijson.parse(_Prefixed(first_line, data)):
            if depth == 1 and pending is not None and event != "map_key":
                kind = {"start_array": "list", "start_map": "object"}.get(event) or _EVENT_KIND.get(event, event)
                keys.append((pending, kind))
                pending = None
                if len(keys) >= 4:
                    break
            if event in ("start_map", "start_array"):
                depth += 1
            elif event in ("end_map", "end_array"):
                depth -= 1
                if depth == 0:
                    break
            elif event == "map_key" and depth == 1:
                pending = value
    except (ijson.JSONError, *_DECOMPRESS_ERRORS):
        pass
    if not keys:
        return None
    shape = ", ".join(f"{k!r}: {kind}" for k, kind in keys[:3]) + (", …" if len(keys) > 3 else "")
    guess = " (a mapping of titles to sentence lists?)" if all(kind == "list" for _, kind in keys) else ""
    return InputError(
        f"{name}: the file is one JSON object spread over several lines, {{{shape}}}{guess}, not records: expected a JSON array of records or JSON Lines (one record per line) of a supported dataset"
    )


_LONG_NUMBER = re.compile(rb"\d{19}")


def _whole(digits: str) -> int | str:
    """An integer of a JSON line: as a number within 64 bits (what every writer of the record can hold), else as
    its digits."""
    value = int(digits)
    return value if -(2**63) <= value < 2**64 else digits


def long_integers_kept(line: bytes, record: Any) -> Any:
    """The ``record`` orjson decoded from ``line``, read again where it holds an integer past 64 bits, each such
    integer as its digits: orjson reads one as a float, rounded, and ids would lose digits and collide. Such a
    line is rare (19 digits or more in a row); an id is text."""
    return json.loads(line, parse_int=_whole) if _LONG_NUMBER.search(line) else record


def parse_line(name: str, position: str, line: bytes) -> Any:
    """Decode one JSON Lines record; a line that is not JSON is a broken file, not a bad record."""
    try:
        return long_integers_kept(line, orjson.loads(line))
    except orjson.JSONDecodeError as e:
        cut = "" if line.endswith(b"\n") else " (last line cut short: truncated file?)"
        raise InputError(f"{name}, {position}: not valid JSON{cut} ({e}); expected JSON Lines (one record per line) or a JSON array") from None
