"""The command line of the grtool command being run: what manifests, index.json, export records and run locks record.

It is set explicitly, never read from ``sys.argv`` here: the CLI entry point sets the process's own command line
once (:func:`set_command`), and the pipeline runner sets each stage's exact equivalent ``grtool …`` line while
that stage runs (:func:`command`), so a stage run by ``grtool pipeline run FILE`` records its own command, the
line the pipeline's dry run prints, not ``grtool pipeline run FILE``. Library code embedding grtool without
the CLI records ``["grtool"]`` unless it sets a command itself. Stored redacted (:func:`grtool.secrets.redact_argv`).

A plain module variable, not a context variable: stages write their records from worker threads too.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator

from grtool.errors import printable

_lock = threading.Lock()


def _recordable(argv: Iterable[str]) -> tuple[str, ...]:
    """Redacted, and every word valid UTF-8 (JSON records hold only that): a file name's non-UTF-8 bytes (surrogate
    escapes in Python) are recorded as ``\\xff`` escapes."""
    from grtool.secrets import redact_argv  # here: a command that records nothing (--help) never loads the rules

    return tuple(printable(word) for word in redact_argv(argv))


_command: tuple[str, ...] | None = None
_given: tuple[str, ...] | None = None  # set_command's line, made recordable when first read


def set_command(argv: Iterable[str]) -> None:
    """Set the command line of this process's grtool command (``argv`` starts with ``grtool``)."""
    global _command, _given
    with _lock:
        _command, _given = None, tuple(argv)


def current_command() -> list[str]:
    """The command line to record for what is running now (redacted); ``["grtool"]`` when none was set."""
    global _command, _given
    with _lock:
        if _given is not None:
            _command, _given = _recordable(_given), None
        value = _command
    return list(value) if value is not None else ["grtool"]


@contextlib.contextmanager
def command(argv: Iterable[str]) -> Iterator[None]:
    """Record ``argv`` as the command line while the block runs (a pipeline stage), then restore the previous one."""
    global _command, _given
    with _lock:
        previous = _command, _given
        _command, _given = _recordable(argv), None
    try:
        yield
    finally:
        with _lock:
            _command, _given = previous
