"""Output paths: names that can be written and recorded, and where one path lies relative to another."""

from __future__ import annotations

import os
from pathlib import Path

from grtool.errors import InputError, printable


def check_name(path: str | Path) -> None:
    """Refuse a path whose name is not valid UTF-8: manifests, rejects and Parquet record names as UTF-8."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{printable(path)}: the file name is not valid UTF-8; rename it") from None


def refuse_missing_before_dotdot(path: str | Path, flag: str = "--out") -> None:
    """``a/b/../c`` where ``a/b`` does not exist: the system resolves ``..`` through folders that are there, so
    writing it would first make ``a/b``, a stray folder, for a file the user meant at ``a/c``."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if part == ".." and i and not Path(*parts[:i]).exists():
            raise InputError(f"{flag} {printable(path)}: {printable(Path(*parts[:i]))} does not exist, so the '..' after it names no folder; write the path without it")


def empty_directory(path: str | Path) -> bool:
    """A directory itself (not a link to one) holding nothing: an output made there replaces nothing."""
    p = Path(path)
    return p.is_dir() and not p.is_symlink() and not any(p.iterdir())


def prepare_out_dir(path: str | Path) -> Path:
    """Create an output directory (and its parents), or say in one line why it cannot be one."""
    if str(path) == "":
        raise InputError("--out is empty: name an output directory ('-' writes JSON Lines to stdout)")
    p = Path(path)
    check_name(p)
    if p.exists() and not p.is_dir():
        raise InputError(f"{p}: --out names an existing file, not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise InputError(f"{p}: cannot create the output directory: {printable(e.filename)} is a file, not a directory") from None
    except OSError as e:
        raise InputError(f"{p}: cannot create the output directory ({e.strerror})") from None
    return p


def named(path: str | Path) -> Path:
    """``path`` with a name of its own, so that a record can be named beside it: ``.`` and ``..`` made absolute."""
    p = Path(path)
    return p if p.name else Path(os.path.abspath(p))


def real(path: str | Path) -> Path:
    """The absolute path with every symlink resolved (also of a path that does not exist yet)."""
    return Path(os.path.realpath(path))


def is_within(path: Path, other: Path) -> bool:
    """``path`` equals ``other`` or lies below it (both resolved)."""
    return path == other or other in path.parents
