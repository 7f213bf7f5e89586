"""Logs and progress go to stderr; stdout is reserved for data (``--out -``) and ``--json`` reports.

On a terminal, Rich draws as usual (tables at the terminal's width, live progress bars, log records with levels).
Without one (Slurm, CI, ``2> file``, a pipe) the output is written for a log:

- every line starts with the local time (``2026-11-25 15:04:52 ``) and carries no padding; a message is never
  broken over lines (a wrapped line would put a timestamp in the middle of it); tables stay tables, each of
  their lines stamped too;
- the consoles are :data:`grtool.userinput.LOG_WIDTH` wide (an exported ``COLUMNS`` wins): Rich's 80-column fallback would cut
  paths and table headers;
- :func:`progress` prints a plain line when something moved, checked every ``GRTOOL_PROGRESS_INTERVAL`` seconds
  (default 10; 0 = at every step), with what the process is busy with (:func:`activity`: loading a model,
  generating a batch, requests sent); while nothing moves, a ``still ...`` line every :data:`HEARTBEAT` intervals;
  a last line when the stage ends;
- the progress bars of the libraries grtool loads (tqdm in transformers' GGUF loader, huggingface_hub,
  transformers, datasets) are switched off (:func:`quiet_libraries`): they would write ``\r`` frames into the log.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from grtool.userinput import log_width

# Columns of stderr without a terminal: a table as wide as its longest path (a cluster's scratch paths are long);
# lines are never padded (LogConsole strips trailing spaces), so only what is printed takes room.
LOG_TABLE_WIDTH = 400
PROGRESS_INTERVAL = 10.0  # seconds between checks for a progress line without a terminal (env GRTOOL_PROGRESS_INTERVAL)
HEARTBEAT = 6  # intervals without any change before a "still ..." line (a minute by default)
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # what starts every line of a log


class LogConsole(Console):
    """A Rich console that, once :attr:`timestamps` is on (no terminal), starts every line it writes with the
    time, strips the spaces Rich pads lines with, and prints plain strings unbroken however long."""

    timestamps = False
    _line_open = False  # the last write ended inside a line: its continuation gets no second timestamp

    def print(self, *objects: Any, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        if self.timestamps and len(objects) == 1 and isinstance(objects[0], Table) and objects[0].title:
            # A table's title is wrapped to the table's width (a path cut in two): in a log it is a line of its own.
            table = objects[0]
            title, table.title = table.title, None
            try:
                super().print(title, soft_wrap=True, highlight=False)
                super().print(table, **kwargs)
            finally:
                table.title = title
            return
        if soft_wrap is None and self.timestamps and all(isinstance(o, (str, Text)) for o in objects):
            soft_wrap = True  # one message, one line: wrapping would stamp the time into its middle
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        """Every string printed (a line, a table's cell, a log record) with its control characters and newlines
        escaped (:func:`grtool.userinput.escaped`), on a terminal and off one alike: a title holding ``\x1b[31m`` or
        ``\r``, or a path with a newline in its name, cannot colour, rewrite or break the lines around it. Text
        of several lines is printed line by line, or as :func:`lines`."""
        from grtool.userinput import escaped

        return super().render_str(escaped(text), **kwargs)

    def _render_buffer(self, buffer) -> str:  # Rich's hook between rendering and writing (called under its lock)
        text = super()._render_buffer(buffer)
        return stamp_lines(text, self) if self.timestamps and text else text


def lines(items: Any) -> Text:
    """Items one per line in one table cell or message, each escaped as :meth:`LogConsole.render_str` escapes a
    string (whose own newlines would be escaped)."""
    from grtool.userinput import escaped

    return Text("\n").join(Text(escaped(str(item))) for item in items)


def stamp_lines(text: str, state: Any) -> str:
    """``text`` with the time before every non-empty line and no trailing spaces; ``state._line_open`` carries
    over a line that one write leaves unfinished."""
    stamp = time.strftime(TIME_FORMAT)
    pieces = text.split("\n")
    out = []
    for k, piece in enumerate(pieces):
        ended = k < len(pieces) - 1
        if ended:
            piece = piece.rstrip()
        if piece and not state._line_open:
            piece = f"{stamp} {piece}"
        out.append(piece)
        if ended:
            state._line_open = False
        elif piece:
            state._line_open = True
    return "\n".join(out)


console = LogConsole(stderr=True)
stage_summary = LogConsole(stderr=True)  # what a stage did (counts, where files went): silent under --quiet, unlike reports
log = logging.getLogger("grtool")
_state = {"quiet": False, "verbose": False}


class LineHandler(logging.Handler):
    """Log records as plain lines through :data:`console` (which stamps the time): ``message`` at info,
    ``warning: message`` and ``error: message`` above it, ``debug: message`` below. RichHandler lays records out
    as a table as wide as the console, which pads every line of a log to :data:`grtool.userinput.LOG_WIDTH` columns."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record).rstrip()
            if record.name == "py.warnings":
                text = text.split("\n")[0]  # "file:line: Category: message"; the source line below it adds nothing
            if record.levelno != logging.INFO:
                text = f"{record.levelname.lower()}: {text}"
            console.print(text, markup=False, highlight=False, soft_wrap=True)
        except Exception:  # logging must never take the command down
            self.handleError(record)


def configure(verbose: bool = False, quiet: bool = False) -> None:
    _state["quiet"], _state["verbose"] = quiet, verbose
    stage_summary.quiet = quiet
    for c in (console, stage_summary):
        c.width = log_width(c.file, LOG_TABLE_WIDTH)  # None: Rich measures the terminal each time
        c.timestamps = not c.is_terminal
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    if console.timestamps:
        handler: logging.Handler = LineHandler()
    else:
        from rich.logging import RichHandler  # here: a terminal's only

        handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
    log.handlers.clear()
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    if console.timestamps:
        quiet_libraries()
        _adopt_root(handler)


def _adopt_root(handler: logging.Handler) -> None:
    """Records of libraries that log through Python's root logger (trl, peft, accelerate) and Python warnings
    as stamped lines, where nothing else handles the root logger (a test runner's capture does)."""
    root = logging.getLogger()
    if any(not isinstance(h, LineHandler) for h in root.handlers):
        return
    for h in list(root.handlers):
        root.removeHandler(h)
    handler_for_root = LineHandler(logging.WARNING)  # the root's own default level: warnings and errors
    root.addHandler(handler_for_root)
    logging.captureWarnings(True)


# Environment switches read by the libraries when they are imported (tqdm reads TQDM_* at import time).
LIBRARY_SWITCHES = {
    "TQDM_DISABLE": "1",  # every tqdm bar, among them transformers' GGUF de-quantizing loop
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # huggingface_hub's downloads, and transformers' bars (they follow it)
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # datasets' map/filter bars
}
LIBRARY_LOGGERS = ("transformers", "huggingface_hub", "datasets", "peft", "trl", "accelerate")


def quiet_libraries() -> None:
    """Without a terminal: no third-party progress bars and third-party log records as grtool's lines.

    Sets :data:`LIBRARY_SWITCHES` (an exported value wins) before the libraries are imported, and does the same
    for those already imported (their own switches), without importing any. Call it again after importing one
    of them (grtool's backends and trainer do): their loggers get grtool's handler, so a library's warning is a
    stamped ``warning:`` line too. On a terminal it does nothing: there bars draw in place.
    """
    if not console.timestamps:
        return
    for name, value in LIBRARY_SWITCHES.items():
        os.environ.setdefault(name, value)
    modules = sys.modules
    if "huggingface_hub" in modules:
        with contextlib.suppress(Exception):
            modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in modules:
        with contextlib.suppress(Exception):
            modules["transformers"].utils.logging.disable_progress_bar()
    if "datasets" in modules:
        with contextlib.suppress(Exception):
            modules["datasets"].disable_progress_bars()
    handler = log.handlers[0] if log.handlers else LineHandler()
    for name in LIBRARY_LOGGERS:
        if name not in modules:
            continue
        lib = logging.getLogger(name)
        # The libraries' own stream handlers write unstamped lines straight to stderr.
        for h in [h for h in lib.handlers if isinstance(h, (logging.StreamHandler, LineHandler)) and h is not handler]:
            lib.removeHandler(h)
        if handler not in lib.handlers:
            lib.addHandler(handler)
        lib.propagate = False


def is_quiet() -> bool:
    return _state["quiet"]


def flags() -> list[str]:
    """The ``--quiet``/``--verbose`` in effect, for a command run inside this one (a pipeline stage)."""
    return ["--quiet"] if _state["quiet"] else ["--verbose"] if _state["verbose"] else []


# What the process is busy with now: (text, detail, since); see activity().
_activity: dict[str, tuple[str | None, str, float]] = {"now": (None, "", 0.0)}
_live_bars: set[int] = set()  # progress displays running now: an activity shows in them instead of as a log line


@contextlib.contextmanager
def activity(text: str) -> Iterator[None]:
    """Say what the process is busy with inside the block ("loading model X", "generating batch 2/5 (8 prompts)").

    A running progress display shows it (a log's progress line, with how long it has lasted; a column of the
    bar on a terminal), and a change of activity is news worth a line; with no display running it is logged at
    info. The previous activity comes back after the block.
    """
    saved = _activity["now"]
    _activity["now"] = (text, "", time.monotonic())
    if not _live_bars:
        log.info("%s", text)
    try:
        yield
    finally:
        _activity["now"] = saved


def activity_detail(detail: str) -> None:
    """How far the current activity got ("120 of at most 256 tokens", "12 sent, 4 answered"): shown with it,
    but not news by itself (cheap enough to call at every decoding step)."""
    text, _, since = _activity["now"]
    if text is not None:
        _activity["now"] = (text, detail, since)


def current_activity() -> tuple[str | None, str, float]:
    """(text, detail, seconds so far) of the current activity; text None when there is none."""
    text, detail, since = _activity["now"]
    return text, detail, (time.monotonic() - since if text is not None else 0.0)


def describe_activity() -> str:
    text, detail, seconds = current_activity()
    if text is None:
        return ""
    return f"{text}{': ' + detail if detail else ''}, {_clock(seconds)} so far"


class ActivityColumn(ProgressColumn):
    """The current :func:`activity` in a terminal's progress bar."""

    def render(self, task: Task) -> Text:
        text, detail, _ = current_activity()
        return Text(f"{text}{': ' + detail if detail else ''}" if text else "", style="dim")


class TerminalProgress(Progress):
    """Rich's live bar, known to :func:`activity` while it runs."""

    def start(self) -> None:
        _live_bars.add(id(self))
        super().start()

    def stop(self) -> None:
        super().stop()
        _live_bars.discard(id(self))


def progress(*extra_columns) -> Progress:
    """Progress on stderr, silent under --quiet: a Rich bar on a terminal, plain lines in a log (:class:`LogProgress`).

    Callers use Rich's API either way (``add_task``, ``update``, ``advance``; ``extra_columns`` are
    ``TextColumn``s over the task's fields, which the plain line shows too). A task field ``rate`` means the
    caller reports its own rate in a column: the plain line then leaves out its generic one.
    """
    if not _state["quiet"] and not console.is_terminal:
        return LogProgress(*extra_columns, interval=progress_interval())
    return TerminalProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra_columns,
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        ActivityColumn(),
        console=console,
        disable=_state["quiet"],
        transient=False,
    )


def progress_interval() -> float:
    from grtool.userinput import env

    return env("GRTOOL_PROGRESS_INTERVAL")


class LogProgress(Progress):
    """Rich's task bookkeeping without the live display: plain lines for a log.

    A background thread looks every ``interval`` seconds (so a stage stuck on one long request still shows it is
    alive) and prints a task's line when something changed since its last line: units done, the total, or the
    :func:`activity`. While nothing changes, a ``still ...`` line every :data:`HEARTBEAT` intervals says what the
    process is doing and for how long. With ``interval`` 0 a line at every update that changes something instead.
    A last line per task when the display stops.

    ``triples extract: 12/25 (48%), 0.40 docs/s, 35 tok/s, elapsed 0:00:30, ETA 0:00:32; generating batch 2/4 (8 prompts): 87 of at most 256 tokens, 0:00:12 so far``
    """

    def __init__(self, *extra_columns, interval: float = PROGRESS_INTERVAL):
        super().__init__(*extra_columns, console=console, disable=True)
        self.extra_columns = extra_columns
        self.interval = interval
        self.heartbeat = interval * HEARTBEAT
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False
        self._printed: dict[TaskID, tuple[tuple, float, float]] = {}  # per task: what its last line showed, when, and when that last changed

    def start(self) -> None:
        _live_bars.add(id(self))
        if self.interval > 0 and self._thread is None:
            self._stopped.clear()
            self._thread = threading.Thread(target=self._tick, name="grtool-progress", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stopped.set()
            self._thread.join()
            self._thread = None
        _live_bars.discard(id(self))
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
        now = time.monotonic()
        lines = []
        with self._lock:
            for t in self._tasks.values():
                if only not in (None, t.id) or (t.finished and not final):
                    continue
                key = (t.description, t.completed, t.total, current_activity()[0])
                last_key, printed, changed = self._printed.get(t.id, (None, now, now))
                if key != last_key:
                    changed = now
                if final or key != last_key:
                    lines.append(self.line(t, final=final))
                elif self.heartbeat > 0 and now - printed >= self.heartbeat:
                    lines.append(self.line(t, unchanged_for=now - changed))
                else:
                    continue
                self._printed[t.id] = (key, now, changed)
        for line in lines:
            console.print(line, markup=False, highlight=False, soft_wrap=True)

    def line(self, task: Task, *, final: bool = False, unchanged_for: float | None = None) -> str:
        """One plain progress line for ``task``; ``unchanged_for``: seconds since its count or activity last changed."""
        done, total = task.completed, task.total
        elapsed = task.elapsed or 0.0
        head = f"{task.description}: {_count(done)}"
        if total:
            head += f"/{_count(total)} ({min(done / total, 1.0):.0%})"
        parts = [head]
        rate = done / elapsed if elapsed > 0 else None
        if rate is not None and "rate" not in task.fields:
            parts.append(f"{rate:,.2f}/s" if rate < 10 else f"{rate:,.0f}/s")
        for column in self.extra_columns:
            rendered = column.render(task)
            if isinstance(rendered, Text) and rendered.plain.strip():
                parts.append(rendered.plain.strip())
        parts.append(f"elapsed {_clock(elapsed)}")
        if final:
            parts.append("stopped" if self._failed else "done")
            return ", ".join(parts)
        if total and rate:
            parts.append(f"ETA {_clock(max(total - done, 0) / rate)}")
        line = ", ".join(parts)
        doing = describe_activity()
        if doing:
            line += f"; {'still ' if unchanged_for is not None else ''}{doing}"
        elif unchanged_for is not None:
            line += f"; still running, no change for {_clock(unchanged_for)}"
        return line


def _count(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _clock(seconds: float) -> str:
    return str(_dt.timedelta(seconds=int(seconds)))


configure()
