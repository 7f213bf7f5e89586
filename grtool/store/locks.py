"""One writer per output (DESIGN §8): flock locks that name the live run, for every kind of output.

A stage directory is locked from inside (``_run.lock``, plus one lock per array task). An output that is
replaced whole or renamed into place (an index, a checkpoint, an exported file) is locked by a file beside it
(``.<name>.grtool.lock``): a lock inside would go with the directory it guards.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import msgspec
import orjson

from grtool.errors import InputError, TransientError, printable
from grtool.holds import hold
from grtool.invocation import current_command
from grtool.secrets import redact_argv
from grtool.store.layout import RUN_LOCK, TASK_LOCK
from grtool.store.paths import prepare_out_dir
from grtool.records import DamagedRecord, mode_name, read_record
from grtool.store.records import PartCount, Text, now

BESIDE_LOCK = ".{name}.grtool.lock"  # the lock of an output replaced whole, in the output's parent directory


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a scratch file named by a dead one is a killed run's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def beside_lock(out: str | Path) -> Path:
    """The lock file of an output that is replaced whole (an index, a checkpoint, an exported file)."""
    p = Path(os.path.realpath(out))  # links resolved in order (``link/../idx``): one lock for every spelling of a path
    return p.parent / BESIDE_LOCK.format(name=p.name)


def open_lock_file(path: Path) -> int:
    """The lock file ``path`` opened to read and write, made when absent: never through a link (a link put there
    would have its target written over with the holder's line) and never anything but a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise InputError(f"{printable(path.parent)}: cannot write there ({e.strerror}), where the output's lock {printable(path.name)} goes: write the output to a folder you can write") from None
        if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        fd = None
    if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    what = mode_name(os.lstat(path).st_mode)
    if fd is not None:
        os.close(fd)
    raise InputError(f"{printable(path)}: is {what} where grtool keeps the lock of the output beside it: remove it, then run again")


class _Hold:
    def __init__(self, fd: int, mode: int):
        self.fd, self.mode, self.count = fd, mode, 1


_HOLDS: dict[str, _Hold] = {}  # lock file -> this process's hold (re-entrant: one process runs stages in turn)
_NO_LOCKS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)
_warned_no_locks = False


def _flock_current(path: Path, mode: int) -> int | None:
    """An flock of ``mode`` on the lock file at ``path`` as it is now: a file its holder removed (and another made
    again) while this process waited guards nothing, so the new one is taken. Its descriptor; None when ``mode``
    has ``LOCK_NB`` and another process holds it."""
    global _warned_no_locks
    while True:
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, mode)
        except OSError as e:
            if e.errno in _NO_LOCKS:  # e.g. Lustre mounted without flock: run unguarded, but say so
                if not _warned_no_locks:
                    from grtool.log import log

                    log.warning("%s: the file system does not support file locks; concurrent runs are not detected", path.parent)
                    _warned_no_locks = True
                return fd
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return None
            raise
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _try_flock(path: Path, mode: int, holder: dict[str, Any] | None = None) -> bool:
    """Take an flock on ``path`` without waiting (False: another process holds it); ``holder`` is written in."""
    key = os.path.abspath(path)
    hold = _HOLDS.get(key)
    if hold is not None:
        if hold.mode != fcntl.LOCK_EX and mode == fcntl.LOCK_EX:
            return False  # this process already writes here as an array task; no upgrade (not atomic)
        hold.count += 1
        return True
    fd = _flock_current(path, mode | fcntl.LOCK_NB)
    if fd is None:
        return False
    _HOLDS[key] = _Hold(fd, mode)
    if holder is not None and mode == fcntl.LOCK_EX:
        data = orjson.dumps(holder, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    return True


def _unflock(path: Path) -> None:
    key = os.path.abspath(path)
    hold = _HOLDS.get(key)
    if hold is None:
        return
    hold.count -= 1
    if hold.count == 0:
        del _HOLDS[key]
        if hold.mode == fcntl.LOCK_EX:  # nobody else holds it: no lock file left behind (a waiting process
            try:  # that opened this file sees it gone once it gets the lock, and takes a new one)
                os.unlink(path)
            except OSError:
                pass
        os.close(hold.fd)  # the lock ends with the last descriptor of its open file


class LockHolder(msgspec.Struct):
    """What a run lock file says about the run holding it (:meth:`RunLock._holder`)."""

    host: Text
    pid: Annotated[int, msgspec.Meta(ge=0, le=2**31)]
    started: Text
    command: list[Text] = []
    task: PartCount | None = None
    tasks: PartCount | None = None


def read_holder(path: Path) -> LockHolder | None:
    """The holder a lock file names; None while it has not written itself yet, or when the file is damaged (the
    message then says no more than that a run holds it)."""
    try:
        return read_record(path, LockHolder, what="lock holder")
    except (OSError, DamagedRecord):
        return None


def _describe(info: LockHolder | None) -> str:
    if info is None:
        return "a grtool process that has not recorded itself yet"
    return f"pid {info.pid} on host {info.host}, started {info.started}, command: {' '.join(info.command)}"


def _live_tasks(directory: Path) -> list[LockHolder | None]:
    """Holders of the array-task locks of a directory that are held right now (by other processes)."""
    live = []
    for f in sorted(directory.glob("_run.task-*.lock")):
        if os.path.abspath(f) in _HOLDS:
            continue
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                live.append(read_holder(f))
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return live


class RunLock:
    """The right to write one directory, held by one run from its start to its end.

    ``shards=(count, index)`` from ``--num-shards/--shard-index``; ``None`` or a count of 1 is a whole run.
    A whole run holds ``_run.lock`` exclusively; an array task holds it shared plus its own
    ``_run.task-I-of-N.lock`` exclusively. So tasks with distinct indices write together, while a second
    whole run, a whole run during tasks, a task during a whole run and a duplicate task fail at once (exit 75: try again later)
    naming the live run (host, pid, start, command). These are flock locks: they end with their process,
    also when it is killed, so there is never a stale lock to remove. One process may take the same lock again
    (a pipeline runs its stages in turn).
    """

    def __init__(self, directory: str | Path, shards: tuple[int, int] | None = None, command: list[str] | None = None, lock_file: str | Path | None = None):
        """``lock_file``: lock this file instead of ``directory/_run.lock`` (an output replaced whole, see
        :func:`output_lock`); ``directory`` then only names the output in messages and is not created."""
        self.dir = Path(directory)
        self.count, self.index = shards if shards is not None else (1, 0)
        self.command = command
        self.lock_file = Path(lock_file) if lock_file is not None else None
        if self.lock_file is not None and self.count > 1:
            raise ValueError("array tasks lock a stage directory, not a lock file beside an output")
        self._held: list[Path] = []

    @property
    def held(self) -> bool:
        return bool(self._held)

    def _holder(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": now(),
            "command": redact_argv(self.command if self.command is not None else current_command()),
        }
        if self.count > 1:
            info.update(task=self.index, tasks=self.count)
        return info

    def acquire(self) -> "RunLock":
        if self.held:
            return self
        if self.lock_file is None:
            prepare_out_dir(self.dir)
            run = self.dir / RUN_LOCK
        else:
            prepare_out_dir(self.lock_file.parent)
            run = self.lock_file
        holder = self._holder()
        if self.count == 1:
            if not _try_flock(run, fcntl.LOCK_EX, holder):
                raise self._busy(run)
            self._held.append(run)
            self._hold_point()
            return self
        if not _try_flock(run, fcntl.LOCK_SH):
            raise self._busy(run)
        self._held.append(run)
        task = self.dir / TASK_LOCK.format(index=self.index, count=self.count)
        if not _try_flock(task, fcntl.LOCK_EX, holder):
            self.release()
            raise TransientError(f"{self.dir}: array task {self.index} of {self.count} is already running here ({_describe(read_holder(task))}); wait until it ends (or stop it), then run again")
        self._held.append(task)
        self._hold_point()
        return self

    def _hold_point(self) -> None:
        try:
            hold("locked")
        except BaseException:  # stopped there: the lock is let go (its file removed) as the caller never got it
            self.release()
            raise

    def _busy(self, run: Path) -> TransientError:
        tasks = _live_tasks(self.dir) if self.lock_file is None else []
        if tasks:
            who = "; ".join(f"array task {t.task if t else None} of {t.tasks if t else None}: {_describe(t)}" for t in tasks)
        else:
            who = f"another run: {_describe(read_holder(run))}"
        this = "this command" if self.count == 1 else f"array task {self.index} of {self.count}"
        return TransientError(f"{self.dir}: is being written by {who}; {this} cannot write it at the same time: wait until that run ends (or stop it), then run again")

    def release(self) -> None:
        while self._held:
            _unflock(self._held.pop())

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def run_lock(directory: str | Path, shards: tuple[int, int] | None = None, command: list[str] | None = None) -> RunLock:
    """``with run_lock(out):`` guards a run that writes more than stage directories (ingest's work directory)."""
    return RunLock(directory, shards, command)


def output_lock(out: str | Path, command: list[str] | None = None) -> RunLock:
    """``with output_lock(out):`` the lock of an output that is replaced whole, taken beside it."""
    return RunLock(out, command=command, lock_file=beside_lock(out))


@contextlib.contextmanager
def updating(path: str | Path) -> Iterator[None]:
    """``with updating(path):`` one process at a time reads, changes and replaces ``path``, a file several outputs
    add to (a folder's ``dataset_info.json``); the next waits its turn, held for the milliseconds of the update."""
    lock = beside_lock(path)
    fd = _flock_current(lock, fcntl.LOCK_EX)  # waits its turn: never None
    assert fd is not None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # still held: no lock file is left behind, and a process waiting on it takes a new one
        os.close(fd)  # closing lets go of the lock
