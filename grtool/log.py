"""Logs and progress go to stderr; stdout is reserved for data (``--out -``) and ``--json`` reports.

On a terminal, Rich draws as usual (tables at the terminal's width, live progress bars). Without one (Slurm,
CI, ``2> file``, a pipe) the output is written for a log: Rich's 80-column fallback would cut paths and
headers, so the consoles are :data:`LOG_WIDTH` wide (an exported ``COLUMNS`` wins), and :func:`progress`
prints a plain line (done/total, rate, elapsed, ETA) every ``GRTOOL_PROGRESS_INTERVAL`` seconds (default
10; 0 = at every step) and a last one when the stage ends.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import threading
from typing import IO

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

LOG_WIDTH = 160  # columns of output that no terminal limits: wide enough for paths, table headers, option names
PROGRESS_INTERVAL = 10.0  # seconds between plain progress lines without a terminal (env GRTOOL_PROGRESS_INTERVAL)

console = Console(stderr=True)
stage_summary = Console(stderr=True)  # what a stage did (counts, where files went): silent under --quiet, unlike reports
log = logging.getLogger("grtool")
_state = {"quiet": False, "verbose": False}


def log_width(stream: IO | None) -> int | None:
    """Columns for Rich output to ``stream``: an exported ``COLUMNS``, else None on a terminal (Rich measures
    it), else :data:`LOG_WIDTH`, never Rich's 80-column fallback."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if stream is not None and stream.isatty():
            return None
    except (AttributeError, ValueError):  # a closed or unusual stream
        pass
    return LOG_WIDTH


def configure(verbose: bool = False, quiet: bool = False) -> None:
    _state["quiet"], _state["verbose"] = quiet, verbose
    stage_summary.quiet = quiet
    for c in (console, stage_summary):
        c.width = log_width(c.file)  # None: Rich measures the terminal each time
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    log.handlers.clear()
    log.addHandler(RichHandler(console=console, show_path=False, show_time=False, markup=False))
    log.setLevel(level)
    log.propagate = False


def is_quiet() -> bool:
    return _state["quiet"]


def flags() -> list[str]:
    """The ``--quiet``/``--verbose`` in effect, for a command run inside this one (a pipeline stage)."""
    return ["--quiet"] if _state["quiet"] else ["--verbose"] if _state["verbose"] else []


def progress(*extra_columns) -> Progress:
    """Progress on stderr, silent under --quiet: a Rich bar on a terminal, plain lines in a log (:class:`LogProgress`).

    Callers use Rich's API either way (``add_task``, ``update``, ``advance``; ``extra_columns`` are
    ``TextColumn``s over the task's fields, which the plain line shows too).
    """
    if not _state["quiet"] and not console.is_terminal:
        return LogProgress(*extra_columns, interval=progress_interval())
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra_columns,
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        disable=_state["quiet"],
        transient=False,
    )


def progress_interval() -> float:
    value = os.environ.get("GRTOOL_PROGRESS_INTERVAL")
    if not value:
        return PROGRESS_INTERVAL
    try:
        return max(0.0, float(value))
    except ValueError:
        log.warning("GRTOOL_PROGRESS_INTERVAL=%r is not a number of seconds; using %g", value, PROGRESS_INTERVAL)
        return PROGRESS_INTERVAL


class LogProgress(Progress):
    """Rich's task bookkeeping without the live display: a plain line per unfinished task every ``interval``
    seconds (from a background thread, so a stage stuck on one long request still shows it is alive; with
    ``interval`` 0, at every update instead) and a last line per task when the display stops.

    ``triples extract: 12/25 (48%), 0.40/s, 35 tok/s, elapsed 0:00:30, ETA 0:00:32``
    """

    def __init__(self, *extra_columns, interval: float = PROGRESS_INTERVAL):
        super().__init__(*extra_columns, console=console, disable=True)
        self.extra_columns = extra_columns
        self.interval = interval
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False

    def start(self) -> None:
        if self.interval > 0 and self._thread is None:
            self._stopped.clear()
            self._thread = threading.Thread(target=self._tick, name="grtool-progress", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stopped.set()
            self._thread.join()
            self._thread = None
        self._emit(final=True)

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        self._failed = exc_type is not None
        super().__exit__(exc_type, exc_val, exc_tb)

    def update(self, task_id: TaskID, **kwargs) -> None:
        super().update(task_id, **kwargs)
        if self.interval <= 0:
            self._emit(only=task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        if self.interval <= 0:
            self._emit(only=task_id)

    def _tick(self) -> None:
        while not self._stopped.wait(self.interval):
            self._emit()

    def _emit(self, *, final: bool = False, only: TaskID | None = None) -> None:
        with self._lock:
            lines = [self.line(t, final=final) for t in self._tasks.values() if (final or not t.finished) and only in (None, t.id)]
        for line in lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)

    def line(self, task: Task, *, final: bool = False) -> str:
        """One plain progress line for ``task``."""
        done, total = task.completed, task.total
        elapsed = task.elapsed or 0.0
        head = f"{task.description}: {_count(done)}"
        if total:
            head += f"/{_count(total)} ({min(done / total, 1.0):.0%})"
        parts = [head]
        rate = done / elapsed if elapsed > 0 else None
        if rate is not None:
            parts.append(f"{rate:,.2f}/s" if rate < 10 else f"{rate:,.0f}/s")
        for column in self.extra_columns:
            rendered = column.render(task)
            if isinstance(rendered, Text) and rendered.plain.strip():
                parts.append(rendered.plain.strip())
        parts.append(f"elapsed {_clock(elapsed)}")
        if final:
            parts.append("stopped" if self._failed else "done")
        elif total and rate:
            parts.append(f"ETA {_clock(max(total - done, 0) / rate)}")
        return ", ".join(parts)


def _count(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _clock(seconds: float) -> str:
    return str(_dt.timedelta(seconds=int(seconds)))


configure()
