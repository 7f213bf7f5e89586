"""One reader for files of JSON records: a JSON array (streamed record by record, whatever its layout) or JSON Lines.

Rows a user hands in (export files, training data) are read here, record by record, each with its position
("record N" in an array, "line N" in JSON Lines) for messages. A file of any size is streamed: an array through
ijson's event parser, never loaded whole. Nesting is bounded (:data:`MAX_DEPTH`): a record nested thousands
deep is one error naming it, not a crash (ijson's prefix-tracking readers take memory quadratic in the depth,
and a recursive decoder the stack).

The bottom floor: it imports only :mod:`grtool.errors` (and ijson, orjson), so every package can use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import ijson
import orjson
from ijson.common import ObjectBuilder

from grtool.errors import InputError

try:  # the C backend parses several times faster than the pure-Python one; fall back if it is missing
    _ijson = ijson.get_backend("yajl2_c")
except Exception:  # pragma: no cover - depends on the installed wheel
    _ijson = ijson

# Deeper than any record grtool writes or reads (a chat row is 3 deep); orjson's own limit is 1024.
MAX_DEPTH = 256
_OPEN = frozenset(("start_map", "start_array"))
_CLOSE = frozenset(("end_map", "end_array"))


class RecordsError(InputError):
    """The file cannot be read as records (not JSON, a truncated array, a broken line); the message names the
    position, callers add the file."""


def first_byte(path: Path) -> bytes:
    """The first byte that is not whitespace (or a UTF-8 byte order mark); b"" for an empty file."""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(4096)
            if not chunk:
                return b""
            chunk = chunk.removeprefix(b"\xef\xbb\xbf").lstrip()
            if chunk:
                return chunk[:1]


def iter_json_records(path: Path, json_array: bool | None = None) -> Iterator[tuple[str, Any]]:
    """``(position, record)`` of a JSON array or a JSON Lines file (``json_array=None``: by the first byte)."""
    first = first_byte(path)
    if json_array is None:
        json_array = first == b"["
    if not json_array:
        yield from _iter_lines(path)
        return
    if first != b"[":
        what = {b"{": "a JSON object", b"": "an empty file"}.get(first, "not a JSON array")
        raise RecordsError(f"{what}, expected a JSON array of records")
    with open(path, "rb") as f:
        yield from _iter_array(f)


def _iter_lines(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield f"line {n}", orjson.loads(line)
                except orjson.JSONDecodeError as e:  # also nesting deeper than orjson's limit
                    raise RecordsError(f"line {n} is not valid JSON ({e})") from None


def _iter_array(f: BinaryIO) -> Iterator[tuple[str, Any]]:
    """The items of the top-level array, built from parser events with the depth counted (no prefixes)."""
    events = _ijson.basic_parse(f, use_float=True)
    n, depth, builder = 0, 0, ObjectBuilder()
    try:
        next(events)  # start_array: the first byte is "["
        for event, value in events:
            if depth == 0:
                if event == "end_array":
                    for _ in events:  # the parser refuses anything after the array
                        pass
                    return
                builder = ObjectBuilder()
            if event in _OPEN:
                depth += 1
                if depth > MAX_DEPTH:
                    raise RecordsError(f"record {n + 1} is nested deeper than {MAX_DEPTH} levels (not a record grtool reads)")
            elif event in _CLOSE:
                depth -= 1
            builder.event(event, value)
            if depth == 0:
                n += 1
                yield f"record {n}", builder.value
    except ijson.JSONError as e:
        why = " ".join(str(e).split()[:12]) or type(e).__name__  # yajl draws the spot on further lines
        kind = "truncated" if "premature EOF" in why or isinstance(e, ijson.IncompleteJSONError) and "EOF" in why else "malformed"
        raise RecordsError(f"record {n + 1}: {kind} JSON array after {n} complete records ({why})") from None
