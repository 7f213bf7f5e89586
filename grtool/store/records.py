"""Files and records of a stage directory: written atomically (readers see nothing or the whole file), read with
their fields type-checked (an edited or damaged record is one line naming it, never a TypeError deep inside a command).
The bottom of the store: it imports no module that writes stages."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import orjson

from grtool.errors import InputError
from grtool.store.diskfull import writing
from grtool.store.layout import MANIFEST, SHARDS_DIR, TMP_SUFFIX, part_name


# --------------------------------------------------------------------------------------------- files


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or the whole file."""
    tmp = path.with_name(path.name + f".{os.getpid()}" + TMP_SUFFIX)
    try:
        with writing(path, len(data)), open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a disk-full write leaves no half file taking the space
        raise
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def commit_file(tmp: Path, final: Path) -> None:
    """fsync a finished temporary file and rename it into place."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


# -------------------------------------------------------------------------------------------- reads


# The fields grtool reads from its records, with their types: an edited or damaged record is one line, never a
# TypeError deep inside a command.
_MANIFEST_FIELDS = {"table": str, "schema": list, "inputs": list, "params": dict, "num_parts": int, "stops": dict}
_SHARD_FIELDS = {"file": str, "bytes": int, "rows": int, "sha256": str, "counters": dict, "rejects_file": str}


def _checked_record(f: Path, data: Any, fields: dict[str, type], what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InputError(f"{f}: {what} is a JSON {type(data).__name__}, not an object (edited or damaged)")
    for key, typ in fields.items():
        value = data.get(key)
        if value is not None and (not isinstance(value, typ) or (typ is int and isinstance(value, bool))):
            raise InputError(f"{f}: {what} field {key!r} is {value!r}, not a{'n' if typ is int else ''} {typ.__name__} (edited or damaged)")
    return data


def load_manifest(path: str | Path) -> dict[str, Any]:
    p = Path(path) / MANIFEST
    try:
        data = json.loads(p.read_bytes())
    except FileNotFoundError:
        raise InputError(f"{Path(path)}: not a stage directory (no {MANIFEST})") from None
    except ValueError as e:  # also bytes that are not UTF-8
        raise InputError(f"{p}: manifest is not valid JSON ({e})") from None
    return _checked_record(p, data, _MANIFEST_FIELDS, "manifest")


def load_shard_records(path: str | Path) -> dict[str, dict[str, Any]]:
    """Completion records of the committed shards, by part name."""
    d = Path(path) / SHARDS_DIR
    records: dict[str, dict[str, Any]] = {}
    if d.is_dir():
        for f in sorted(d.glob("part-*.json")):
            try:
                data = json.loads(f.read_bytes())
            except ValueError as e:  # also bytes that are not UTF-8
                raise InputError(f"{f}: shard record is not valid JSON ({e})") from None
            records[f.stem] = _checked_record(f, data, _SHARD_FIELDS, "shard record")
    return records


def is_stage_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def resolve_stage(path: str | Path, table: str) -> Path:
    """Accept a stage directory of ``table`` or a run directory holding ``<table>/``."""
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():  # a FIFO or a device: named as what it is
        from grtool.userinput import missing_input

        raise missing_input(p)
    for candidate in (p, p / table):
        if is_stage_dir(candidate):
            got = load_manifest(candidate).get("table")
            if got == table:
                return candidate
            if candidate == p and not (p / table).exists():
                raise InputError(f"{p}: a stage directory of table {got!r}, expected {table!r}")
    raise InputError(f"{p}: no {table!r} stage directory here or in {p / table}")


def now() -> str:
    """The time records carry: UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def part_on_disk(path: str | Path, record: dict[str, Any]) -> bool:
    """The part a shard record names is there as committed: a regular file of the recorded size (a removed,
    truncated or replaced part is not, so resume redoes it; its bytes are hashed by ``validate``, not here)."""
    name = record.get("file")
    if not isinstance(name, str) or "/" in name:
        return False
    try:
        st = (Path(path) / name).stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == record.get("bytes")


def parts_not_on_disk(path: str | Path, num_parts: int | None, records: dict[str, dict[str, Any]]) -> list[str]:
    """The planned parts of a stage that are not committed on disk: no shard record, or not :func:`part_on_disk`."""
    if num_parts is None:
        return []
    return [part_name(i) for i in range(num_parts) if part_name(i) not in records or not part_on_disk(path, records[part_name(i)])]
