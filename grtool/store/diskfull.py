"""A full disk (ENOSPC) or an exhausted quota (EDQUOT), wherever a command writes: one line, exit 1.

Writers mark what they write with :func:`writing` (the file and, when known, the bytes being written); the CLI's
entry point turns any disk-full error into :func:`message`: which file, how much was being written, how much
is free on its file system, and that the output stays resumable. Nothing incomplete is ever visible (shards and
records are written to temporary names and renamed when complete), so re-running the same command after freeing
space resumes where the run stopped.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grtool.errors import printable

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DISK_FULL_TEXTS = ("no space left on device", "disk quota exceeded", "database or disk is full")
STDOUT = "-"
_MARK = "grtool_writing"  # attribute set on the exception: (path, bytes being written or None)


def is_disk_full(error: BaseException) -> bool:
    """ENOSPC/EDQUOT as an OSError, SQLite's SQLITE_FULL, or a library error that carries the OS message."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        if getattr(e, "sqlite_errorname", None) == "SQLITE_FULL":
            return True
        if any(text in str(e).lower() for text in DISK_FULL_TEXTS):
            return True
        e = e.__cause__ or e.__context__
    return False


@contextmanager
def writing(path: str | Path, size: int | None = None) -> Iterator[None]:
    """Name the file a disk-full error inside the block was writing (the innermost mark wins)."""
    try:
        yield
    except BaseException as e:
        if not hasattr(e, _MARK) and is_disk_full(e):
            try:
                setattr(e, _MARK, (str(path), size))
            except AttributeError:  # an exception type without a __dict__: the fallback names the output
                pass
        raise


def message(error: BaseException, command: list[str] | None = None) -> str:
    """The one line for a disk-full error: the file, the bytes being written, the space free, what to do."""
    path, size = getattr(error, _MARK, (None, None))
    if path is None and isinstance(error, OSError) and error.filename:
        path = os.fsdecode(error.filename)
    if path is None:
        path = _file_in_traceback(error)
    needed = f"{_size(size)} being written, " if size else ""
    if path == STDOUT:
        where = _stdout_target()
        free = f" ({needed}{_free(where)})" if Path(where).is_file() else f" ({needed.removesuffix(', ')})" if needed else ""
        return f"standard output ({printable(where)}): no space left on the device{free}; what was written to it is incomplete: free space and run the command again"
    if path is None:
        out = _option(command or [], "--out", "-o")
        path = f"a file under {out}" if out else "a file"
        target = out or "."
    else:
        target = path
    why = "the disk quota is exceeded" if _errno(error) == errno.EDQUOT else "no space left on the device"
    if _errno(error) == errno.ENOSPC and _no_inodes_left(target):
        why = "no inodes left on the file system (it holds as many files as it can, whatever space is free)"
    remedy = "remove files on it" if why.startswith("no inodes") else "free space"
    return f"{printable(path)}: {why} while writing it ({needed}{_free(target)}); nothing incomplete was made visible and the output stays resumable: {remedy} and re-run the same command to resume"


def quiet_stdout() -> None:
    """Point file descriptor 1 at /dev/null so the interpreter's last flush of a full stdout stays silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _file_in_traceback(error: BaseException) -> str | None:
    """The file a plain Python write failed on: the innermost frame holding a file object open for writing
    (``-`` for standard output: a ``--json`` report printed with ``typer.echo``, a stream of rows)."""
    tb = error.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if not isinstance(value, io.IOBase):
                continue
            try:
                if value.fileno() == 1:
                    return STDOUT
            except (OSError, ValueError):
                pass
            name, mode = getattr(value, "name", None), str(getattr(value, "mode", ""))
            if isinstance(name, (str, bytes)) and any(c in mode for c in "wax+"):
                return os.fsdecode(name)
    return None


def _stdout_target() -> str:
    try:
        return os.readlink("/proc/self/fd/1")
    except OSError:
        return "a pipe or file"


def _existing(path: str | Path) -> Path:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _no_inodes_left(path: str | Path) -> bool:
    """The file system of ``path`` is out of file entries (inodes), not of bytes: a handful of entries left (a run
    that failed may have freed the one it held) while a MiB or more is free."""
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return False
    return st.f_files > 0 and st.f_favail < 64 and st.f_bavail * st.f_frsize >= 2**20


# Errors of the file system that say where, not what went wrong in grtool: a read-only file system or cache, a
# directory without write permission, a path component that is a file. One line naming the path, exit 2.
PLACE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EMLINK)


def place_error(error: BaseException) -> str | None:
    """The one line for an OSError about a place (see :data:`PLACE_ERRNOS`, or a path that is not there), or None
    for any other error."""
    if not isinstance(error, OSError) or not error.filename:
        return None
    path = printable(os.fsdecode(error.filename))
    if error.errno in PLACE_ERRNOS:
        hint = ""
        if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            hint = ": grtool cannot write there; give a writable --out (or GRTOOL_CACHE for the cache)"
        return f"{path}: {(error.strerror or str(error)).lower()}{hint}"
    if error.errno == errno.ENOENT:  # a directory that cannot be made (under /proc), a file gone meanwhile
        return f"{path}: {(error.strerror or str(error)).lower()}"
    return None


def _free(path: str | Path) -> str:
    """Space free on the file system holding ``path`` (its nearest existing parent)."""
    p = _existing(path)
    try:
        usage = shutil.disk_usage(p)
    except OSError:
        return "free space unknown"
    return f"{_size(usage.free)} free of {_size(usage.total)} on the file system of {printable(p)}"


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


def _errno(error: BaseException) -> int | None:
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return e.errno
        e = e.__cause__ or e.__context__
    return None


def _option(argv: list[str], *names: str) -> str | None:
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None
