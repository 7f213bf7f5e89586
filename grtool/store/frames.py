"""The running command's frame: the stage directories it opened for writing, where its outcome is recorded.

:func:`recording` wraps one grtool command (the CLI entry point; each stage of `grtool pipeline run`); every
:class:`~grtool.store.stage.StageWriter` opened inside it registers with :func:`opened`; the block failing records
the stop in each of them, the block succeeding clears their task's stop (the records: :mod:`grtool.store.stops`).
Every command starts inside a frame, `grtool --help` too, so this module imports nothing heavy: the records are
read and written only when a frame holds a directory.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grtool.store.layout import MANIFEST


@dataclass
class _Opened:
    path: Path
    task: str
    command: list[str]


_frames: list[dict[Path, _Opened]] = []
_frames_lock = threading.Lock()


def opened(path: str | Path, shards: tuple[int, int] | None, command: list[str]) -> None:
    """A stage writer of the running command opened ``path`` (its manifest exists): its outcome is recorded
    there. Outside :func:`recording` (grtool used as a library) nothing is recorded."""
    from grtool.store.stops import task_key

    with _frames_lock:
        if _frames:
            p = Path(path)
            _frames[-1].setdefault(p.resolve(), _Opened(p, task_key(shards), list(command)))


def is_interruption(exc: BaseException) -> bool:
    """Ctrl-C / SIGTERM and the like: the run stopped on request, resumable, not a failure of the stage.

    KeyboardInterrupt and other non-``Exception`` exits, Click's ``Abort`` (what Ctrl-C becomes inside a Click
    command), any exception with a true ``interruption`` attribute, and a transient failure (exit 75: a server
    down, a lock held): nothing is wrong with the stage, its unfinished parts show as such, and there would be
    nothing to ``--accept``."""
    from grtool.errors import EXIT_TRANSIENT

    if not isinstance(exc, Exception) or getattr(exc, "interruption", False) or getattr(exc, "exit_code", None) == EXIT_TRANSIENT:
        return True
    return any(cls.__name__ == "Abort" and cls.__module__.endswith("click.exceptions") for cls in type(exc).__mro__)


@dataclass
class Outcome:
    """What the caller of :func:`recording` tells it: the exit code the command returned without raising."""

    exit_code: int | None = 0

    def returned(self, code: object) -> None:
        self.exit_code = code if isinstance(code, int) else 0


@contextlib.contextmanager
def recording() -> Iterator[Outcome]:
    """Run one grtool command: on failure record the stop in every stage directory it opened for writing, on
    success clear their stop of the task that ran. Nested frames (a pipeline's stages) each keep their own.

    The caller passes a returned exit code to :meth:`Outcome.returned`: Typer returns Ctrl-C as exit code 130
    instead of raising, so only a returned 0 is a success; another returned code neither records nor clears.
    """
    frame: dict[Path, _Opened] = {}
    outcome = Outcome()
    with _frames_lock:
        _frames.append(frame)
    try:
        yield outcome
    except BaseException as exc:
        if not is_interruption(exc) and not getattr(exc, "_grtool_stop_recorded", False):
            _record_stops(frame, exc)
            with contextlib.suppress(Exception):
                exc._grtool_stop_recorded = True  # type: ignore[attr-defined]  # an outer frame does not record it again
        raise
    else:
        if not outcome.exit_code:
            _clear_stops(frame)
    finally:
        with _frames_lock:  # by identity: two empty frames are equal dicts
            del _frames[next(i for i in range(len(_frames) - 1, -1, -1) if _frames[i] is frame)]


def _record_stops(frame: dict[Path, _Opened], exc: BaseException) -> None:
    if frame:
        from grtool.store.stops import record_stop, stop_record

        for o in frame.values():
            _quietly(record_stop, o.path, stop_record(exc, o.task, o.command))


def _clear_stops(frame: dict[Path, _Opened]) -> None:
    if frame:
        from grtool.store.stops import clear_stops

        for o in frame.values():
            _quietly(clear_stops, o.path, o.task)


def _quietly(fn, path: Path, *args: Any) -> None:
    """Bookkeeping after the command's outcome is known never hides that outcome: a failure here is a warning."""
    try:
        fn(path, *args)
    except Exception as e:
        from grtool.log import log

        log.warning("%s: could not update the stop record in %s (%s)", path, MANIFEST, e)
