"""Reading what a command left: its stderr without the console's wrapping, its files as a snapshot, a table's rows by key."""

from __future__ import annotations

import hashlib
from pathlib import Path


def snapshot(root: Path) -> dict[str, str]:
    """Every file below ``root`` (or ``root`` itself) with its sha256: equal snapshots = nothing touched."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(f.relative_to(root.parent)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def one_line(text: str) -> str:
    return " ".join(text.split())


def no_spaces(text: str) -> str:
    """stderr without the console's line wrapping (which may also fold a long path): whitespace removed."""
    return "".join(text.split())


def rows_by(table, key: str) -> dict:
    return {r[key]: r for r in table.to_pylist()}
