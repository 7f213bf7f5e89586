"""One way to read back a JSON record grtool wrote (DESIGN §8): every record kind is a msgspec ``Struct``, declared
once in the package that owns it, and every reader decodes it through :func:`read_record`. Types, enumerations and
bounds are ``Meta`` constraints; rules between fields are ``__post_init__`` checks that raise ``ValueError``. A
record that fails is one :class:`DamagedRecord` line naming the file and the field, exit 1 — never a traceback, a
hang or an answer.

The bottom floor: it imports only :mod:`grtool.errors`, so every package can declare its records here.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from grtool.errors import DataProblem

# ---- the bounded types records are made of

# JSON numbers past 2**53 lose precision in most readers; no count grtool writes comes near it.
_MAX_COUNT = 2**53
Count = Annotated[int, msgspec.Meta(ge=0, le=_MAX_COUNT)]
PositiveCount = Annotated[int, msgspec.Meta(ge=1, le=_MAX_COUNT)]
# NaN fails every comparison, so these refuse it; JSON itself has no infinity, and 1e999 is "out of range".
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e12)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
# Units per second (rows a part wrote per second): at most a count over a millisecond.
Rate = Annotated[float, msgspec.Meta(ge=0.0, le=1000.0 * _MAX_COUNT)]
Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
# A file named by a record lives beside it: no directory parts, no parent, no hidden tricks.
FileName = Annotated[str, msgspec.Meta(pattern=r"^(?!\.\.?$)[^/\x00]+$", max_length=255)]  # not "." nor ".."

# A record is small (a manifest with every input's fingerprint is tens of KB); a larger one was not written by
# grtool, and reading it whole could exhaust memory.
MAX_RECORD_BYTES = 64 * 2**20

T = TypeVar("T")


class Report(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A command's ``--json`` report, declared beside the code that builds it and named by the command's
    declaration (``Command(report="module:Name")``): `grtool` prints a report only as converted through it
    (:func:`grtool.cli.options.print_report`), so a field the declaration lacks, or a value of another type, fails
    every run (and every test) that prints it. The field order is the order of the printed JSON."""


class DamagedRecord(DataProblem):
    """A record grtool wrote does not decode through its declaration: edited or damaged (exit 1)."""


def field_message(error: msgspec.ValidationError, within: str = "") -> str:
    """msgspec says "Expected `int` >= 0 - at `$.num_parts`"; users read "field num_parts: expected `int` >= 0".
    ``within``: the field the checked value sits in, for a part of a record checked on its own."""
    text = str(error)
    message, sep, at = text.rpartition(" - at `")
    if not sep:
        if not within:
            return text[:1].lower() + text[1:]
        message, at = text, "$"
    field = at.rstrip("`").removeprefix("$").removeprefix(".")
    if message.startswith("field ") and ": " in message:  # a rule of a record nested in this one names its own field
        inner, message = message.removeprefix("field ").split(": ", 1)
        field = f"{field}.{inner}" if field else inner
    if within:
        field = within + ("." if field and not field.startswith("[") else "") + field
    return f"field {field or '(the whole record)'}: {message[:1].lower()}{message[1:]}"


def check_timestamp(value: str | None, field: str) -> None:
    """A time a record carries is an ISO 8601 time (a ``__post_init__`` rule; ``None`` or empty: not recorded)."""
    import datetime as _dt

    if not value:
        return
    try:
        _dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"field {field}: {value!r} is not an ISO 8601 time") from None


def decode_record(data: bytes | str, kind: type[T], *, source: object, what: str) -> T:
    """Decode ``data`` (the bytes of ``source``) as a ``kind`` record; :class:`DamagedRecord` names what fails.

    The whole text is checked for UTF-8 first: msgspec checks only the strings it decodes, so a stray byte in a
    key or in a field the declaration skips passed here and broke the caller's own decode of the same bytes."""
    if not isinstance(data, str):
        try:
            str(data, "utf-8")
        except UnicodeDecodeError as e:
            raise DamagedRecord(f"{source}: {what} is not UTF-8 text (byte {e.start}) (edited or damaged)") from None
    try:
        record = msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as e:
        raise DamagedRecord(f"{source}: {what}: {field_message(e)} (edited or damaged)") from None
    except msgspec.DecodeError as e:
        raise DamagedRecord(f"{source}: {what} is not valid JSON ({e}){_near_field(data, str(e))} (edited or damaged)") from None
    except RecursionError:  # JSON nested thousands deep (even inside a field the declaration skips)
        raise DamagedRecord(f"{source}: {what} is nested deeper than any record grtool writes (edited or damaged)") from None
    _refuse_repeated_key(data, source, what)
    return record


def _refuse_repeated_key(data: bytes | str, source: object, what: str) -> None:
    """JSON readers keep the last of two values for one key without a word: which one was meant is unknown."""
    twice = _repeated_key(data)
    if twice is not None:
        raise DamagedRecord(f"{source}: {what}: field {twice} is given twice in one object (edited or damaged)")


def _repeated_key(data: bytes | str) -> str | None:
    """The first key that an object of the JSON text ``data`` (valid JSON) gives twice, or None. grtool never
    writes one; msgspec, like every JSON reader, would keep the last value without a word."""
    import json

    repeated: list[str] = []

    def check(pairs: list[tuple[str, Any]]) -> None:
        keys = [key for key, _ in pairs]
        if len(set(keys)) < len(keys) and not repeated:
            repeated.append(next(key for n, key in enumerate(keys) if key in keys[:n]))

    try:
        json.loads(data, object_pairs_hook=check)
    except (ValueError, RecursionError):  # what msgspec read and Python's reader will not (a 5,000-digit number)
        return None
    return repeated[0] if repeated else None


def repeated_key_in(line: bytes, value: Any) -> str | None:
    """The first key an object of the JSON ``line`` gives twice, given its decoded ``value``: None without one.
    For rows users hand in (JSON Lines), read by the million: the ``":`` the text holds are counted against the keys
    the decoded value holds (a repeated key is lost in decoding), and only a line where they differ (a repeated
    key, a space before a colon, a quote and colon inside a text) is read again, slowly, to name the key."""
    named = line.count(b'":')
    if b'" ' in line or b'"\t' in line or b'"\r' in line or b'"\n' in line:  # a blank between a key and its colon
        named = len(_KEY_END.findall(line))
    return _repeated_key(line) if named != _keys_held(value) else None


_KEY_END = re.compile(rb'"[ \t\r\n]*:')


def _keys_held(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(_keys_held(v) for v in value.values() if isinstance(v, (dict, list)))
    if isinstance(value, list):
        return sum(_keys_held(v) for v in value if isinstance(v, (dict, list)))
    return 0


def _near_field(data: bytes | str, message: str) -> str:
    """ ", in field num_parts" for a value JSON has no word for (a bare NaN, Infinity): the last key before the
    byte msgspec names, so the line says which field to look at."""
    import re

    at = re.search(r"\(byte (\d+)\)", message)
    if at is None:
        return ""
    head = data[: int(at.group(1))]
    head = head.decode("utf-8", "replace") if isinstance(head, bytes) else head
    keys = re.findall(r'"((?:[^"\\]|\\.){1,200})"\s*:', head)
    return f", in field {keys[-1]}" if keys else ""


def read_record_bytes(path: Path, *, what: str) -> bytes:
    """The bytes of a record file: a regular file of bounded size (a FIFO would hang the reader, a directory or a
    device is not a record). ``FileNotFoundError`` passes through: callers say what a missing record means."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise DamagedRecord(f"{path}: {what} is a directory, not a file (edited or damaged)") from None
    except OSError as e:
        raise DamagedRecord(f"{path}: {what} cannot be read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DamagedRecord(f"{path}: {what} is {mode_name(st.st_mode)}, not a regular file (edited or damaged)")
        if st.st_size > MAX_RECORD_BYTES:
            raise DamagedRecord(f"{path}: {what} is {st.st_size:,} bytes, larger than any record grtool writes ({MAX_RECORD_BYTES:,}) (edited or damaged)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_RECORD_BYTES + 1)
    except OSError as e:
        raise DamagedRecord(f"{path}: {what} cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)


def read_json_record(path: str | Path, *, what: str) -> Any:
    """The JSON value of a record file, for a reader that takes any record whole without its declaration (`status`,
    the check of what ``--overwrite`` may replace): bounded and regular (:func:`read_record_bytes`), valid JSON, no
    key given twice in an object; :class:`DamagedRecord` otherwise."""
    import orjson

    data = read_record_bytes(Path(path), what=what)
    try:
        value = orjson.loads(data)  # bounded nesting, unlike json's recursion
    except orjson.JSONDecodeError as e:
        raise DamagedRecord(f"{path}: {what} is not valid JSON ({e}) (edited or damaged)") from None
    _refuse_repeated_key(data, path, what)
    return value


def read_record(path: str | Path, kind: type[T], *, what: str) -> T:
    """Read and decode the record at ``path`` through its declaration ``kind``."""
    p = Path(path)
    return decode_record(read_record_bytes(p, what=what), kind, source=p, what=what)


def to_builtins(record: Any) -> Any:
    """A record as plain JSON values (dicts, lists), for writers that add it to a larger document."""
    return msgspec.to_builtins(record)


def undeclared_keys(written: Any, decoded: Any, within: str = "") -> list[str]:
    """The keys of ``written`` (a record about to be written: JSON values, or Structs, which hold only declared
    fields) that its decoded form (a Struct or JSON values) lacks, at any depth (``sizes.docids_skipped``): fields
    its declaration does not name, which every typed reader would drop. Lists are not descended into."""
    if not isinstance(written, dict):
        return []
    if isinstance(decoded, msgspec.Struct):
        children = {f.encode_name: getattr(decoded, f.name) for f in msgspec.structs.fields(decoded)}
    elif isinstance(decoded, dict):
        children = decoded
    else:
        return []
    missing = [f"{within}{key}" for key in written if key not in children]
    for key in written.keys() & children.keys():
        missing += undeclared_keys(written[key], children[key], f"{within}{key}.")
    return missing


def refuse_undeclared(written: dict[str, Any], decoded: Any, *, source: str | Path, what: str) -> None:
    """Refuse to write a record with a key, at any depth, that its declaration (the type of ``decoded``) would
    drop for every typed reader: a writer's bug stops at the write, naming the field."""
    dropped = undeclared_keys(written, decoded)
    if dropped:
        raise DamagedRecord(f"{source}: {what}: field {dropped[0]} is not declared by {type(decoded).__name__}, so its readers would drop it")


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))  # fmt: skip


def mode_name(mode: int) -> str:
    """What a path of ``mode`` (``os.stat``, or ``os.lstat`` for a link itself) is, for messages: 'a FIFO', ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def file_kind(path: str | Path) -> str | None:
    """What a path is when it is not a regular file or a directory ('a FIFO', 'a character device', ...), else
    None: messages name special files as what they are instead of "no such file"."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return mode_name(mode)
