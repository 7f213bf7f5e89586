"""Fingerprints of inputs: what a manifest records so a changed input is seen (resume refuses a silent mix)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import blake3
import msgspec

from grtool.store.layout import MANIFEST
from grtool.errors import printable
from grtool.store.records import InputRecord, load_shard_records
from grtool.userinput import require_input


class StageInputs(Protocol):
    """What :func:`changed_inputs` reads of a stage's spec (:class:`grtool.store.stage.StageSpec`, which imports
    this module)."""

    inputs: list[str]

    def input_fingerprints(self) -> list[dict[str, Any]]: ...


def fingerprint(path: str | Path, exclude: Iterable[str | Path] = ()) -> dict[str, Any]:
    """A stable fingerprint of an input: a file, a stage directory or a tree of files.

    Files: size plus a BLAKE3 hash of the whole content (memory-mapped, multi-threaded: several GB/s, far
    faster than any stage reads; see ``bench/ingest.py``), so an edit anywhere is seen, even one that keeps
    the size. Stage directories: the shards' sha256. Trees: every file's relative name, size and hash;
    ``exclude`` leaves out paths below the tree (a run's own output written inside its input directory).
    ``path`` is the resolved absolute path: the same input named relatively or absolutely is the same input.
    """
    if str(path) == "-":
        return {"path": "-", "kind": "stdin"}
    p = Path(path)
    require_input(p)  # any name the file system holds: recorded with its non-UTF-8 bytes escaped
    resolved = printable(p.resolve())
    if p.is_file():
        return {"path": resolved, "kind": "file", "size": p.stat().st_size, "blake3": file_hash(p)}
    if (p / MANIFEST).exists():
        records = sorted(load_shard_records(p).items())
        h = hashlib.blake2b(digest_size=16)
        for name, rec in records:
            h.update(f"{name}:{rec.sha256}\n".encode())
        return {"path": resolved, "kind": "stage", "shards": len(records), "blake2b": h.hexdigest()}
    h = blake3.blake3()
    files = index_files(p) or tree_files(p, exclude)
    for rel, f in files:
        h.update(os.fsencode(rel) + f":{f.stat().st_size}:{file_hash(f)}\n".encode())
    return {"path": resolved, "kind": "tree", "files": len(files), "blake3": h.hexdigest()}


INDEX_RECORD = "index.json"


def index_files(root: Path) -> list[tuple[str, Path]] | None:
    """An index directory's own files: its record and the files the record lists (None: no readable record). Files
    grtool writes into an index on first use (the bracket decoding files) are not the index, so a run that reads
    it fingerprints the same before and after them."""
    import orjson

    record = root / INDEX_RECORD
    try:
        listed = orjson.loads(record.read_bytes())["files"] if record.is_file() else None
        names = sorted(n for n in listed if isinstance(n, str) and "/" not in n) if isinstance(listed, dict) else None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if names is None:
        return None
    return sorted([(n, root / n) for n in names if (root / n).is_file()] + [(INDEX_RECORD, record)], key=lambda item: item[1])


def tree_files(root: Path, exclude: Iterable[str | Path] = ()) -> list[tuple[str, Path]]:
    """``(relative name, path)`` of every file below ``root`` in path order, without the ``exclude`` subtrees
    and without grtool stage directories (outputs written inside an input directory are never its input)."""
    skip = {Path(e).resolve() for e in exclude}
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if not (d / n / MANIFEST).is_file() and not (skip and (d / n).resolve() in skip)]
        for n in filenames:
            f = d / n
            if f.is_file() and not (skip and f.resolve() in skip):
                found.append((str(f.relative_to(root)), f))
    return sorted(found, key=lambda item: item[1])  # path order (by components), as input discovery always read


_HASHES: dict[tuple, str] = {}


_HASH_CHUNK = 1 << 24  # 16 MiB: large enough for blake3's threads, small beside any memory budget


def file_hash(path: Path) -> str:
    """BLAKE3 of a file's content, computed once per process for an unchanged file (identity checks repeat)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    digest = _HASHES.get(key)
    if digest is None:
        h = blake3.blake3(max_threads=blake3.blake3.AUTO)
        # read in chunks into one buffer, not mapped: a mapped file's pages all count in the process's RSS while
        # it is hashed (an index's largest array, GBs of shards), read ones only in the page cache
        buf = bytearray(_HASH_CHUNK)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        digest = _HASHES[key] = h.hexdigest()
    return digest


def _sample_hash(path: Path, span: int = 1 << 20) -> str:
    """The fingerprint of grtool ≤ 0.x manifests (first and last MiB): kept to resume their outputs."""
    h = hashlib.blake2b(digest_size=16)
    size = path.stat().st_size
    with open(path, "rb") as f:
        h.update(f.read(span))
        if size > 2 * span:
            f.seek(size - span)
        h.update(f.read(span))
    return h.hexdigest()


def _legacy_fingerprint(p: Path) -> dict[str, Any]:
    if p.is_file():
        return {"kind": "file", "size": p.stat().st_size, "sample_blake2b": _sample_hash(p)}
    h = hashlib.blake2b(digest_size=16)
    files = sorted(f for f in p.rglob("*") if f.is_file())
    for f in files:
        h.update(f"{f.relative_to(p)}:{f.stat().st_size}:{_sample_hash(f)}\n".encode())
    return {"kind": "tree", "files": len(files), "blake2b": h.hexdigest()}


def changed_inputs(old: list[InputRecord], spec: StageInputs) -> list[str]:
    """The inputs of ``spec`` that differ from the fingerprints ``old`` recorded (``[]``: the same inputs).

    Paths compare resolved. A manifest written before whole-file hashes (``sample_blake2b``) is compared with
    the fingerprint it used, so its output still resumes.
    """
    new = spec.input_fingerprints()
    old = msgspec.to_builtins(old)  # the JSON form, as fingerprint() gives the new ones (None fields left out)
    if old == new:
        return []
    if len(old) != len(new):
        return [str(i) for i in spec.inputs] or ["(the list of inputs)"]
    changed = []
    for o, n, name in zip(old, new, spec.inputs):
        if o == n:
            continue
        if o.get("kind") != n.get("kind") or (n["path"] != "-" and str(Path(str(o.get("path"))).resolve()) != n["path"]):
            changed.append(str(name))
            continue
        rest = {k: v for k, v in o.items() if k != "path"}
        if n["kind"] in ("file", "tree") and "blake3" not in o:
            now = _legacy_fingerprint(Path(name))
        else:
            now = {k: v for k, v in n.items() if k != "path"}
        if rest != now:
            changed.append(str(name))
    return changed


def check_inputs(inputs: list[dict[str, Any]], what: str) -> tuple[list[str], list[str]]:
    """Inputs recorded with fingerprints (index.json, export sidecars) against what is there now: a changed input
    makes ``what`` stale (a problem); an input not found from here, or fingerprinted differently, is a note."""
    problems: list[str] = []
    notes: list[str] = []
    if not isinstance(inputs, list) or not all(isinstance(r, dict) and isinstance(r.get("path"), (str, type(None))) for r in inputs):
        return [f"the inputs recorded for {what} are not a list of records (the record was edited or damaged)"], notes
    for rec in inputs:
        p = rec.get("path")
        if not p or rec.get("kind") == "stdin":
            continue
        if not Path(p).exists():
            notes.append(f"input {p} not found from here: not compared")
            continue
        try:
            now = fingerprint(p)
        except Exception as e:  # unreadable now: say so, do not stop the validation
            notes.append(f"input {p} cannot be fingerprinted ({e}): not compared")
            continue
        old = {k: v for k, v in rec.items() if k not in ("path", "table")}
        new = {k: v for k, v in now.items() if k != "path"}
        if set(old) != set(new):
            notes.append(f"input {p} was fingerprinted by another grtool version: not compared")
        elif old != new:
            problems.append(f"stale: input {p} changed since {what} was written (re-run the command that made it)")
    return problems, notes
