"""Errors that the CLI turns into a clear message and an exit code."""

from __future__ import annotations

import os
from pathlib import Path

EXIT_OK = 0
EXIT_DATA = 1  # the data has problems (validation failed, a guard tripped)
EXIT_USAGE = 2  # usage or input error
# Nothing is wrong with the command or the data, it could not go on now (a server down after retries, the output
# locked by another run, SIGTERM): the same command run again later resumes. 75 is sysexits' EX_TEMPFAIL.
EXIT_TRANSIENT = 75
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): the user stopped it; a retry loop must not start it again


def printable(path: str | Path) -> str:
    """A path for messages (every message that names a file uses it), whatever bytes its name holds (non-UTF-8 bytes shown as ``\\xff``)."""
    return os.fsencode(str(path)).decode("utf-8", "backslashreplace")


class GrtoolError(Exception):
    """An error meant for the user: the message says what is wrong and where."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(GrtoolError):
    """Bad input: a file that cannot be read, an unknown schema, a malformed record under --strict."""


class DataProblem(GrtoolError):
    """The run finished but the data failed a check (exit 1)."""

    exit_code = EXIT_DATA


class TransientError(GrtoolError):
    """A failure that is not the command's nor the data's: try the same command again later (exit 75)."""

    exit_code = EXIT_TRANSIENT


class GuardTripped(DataProblem):
    """A stage's guard stopped the run (exit 1). ``guard`` names it by the option that sets it, ``numbers`` holds
    what it measured; both go into the stage's manifest (:mod:`grtool.store.stops`), so `grtool validate` fails
    the stage until it is re-run and passes, or the trip is accepted."""

    def __init__(self, message: str, *, guard: str, numbers: dict[str, object]):
        super().__init__(message)
        self.guard = guard
        self.numbers = numbers


class MissingDependency(GrtoolError):
    """An optional package a feature needs is not installed; the message gives the exact pip line.

    ``extra``: the grtool extra that brings the package (``llm``, ``plot``, ...); the pip line is then
    ``pip install 'grtool[extra]'`` unless ``pip_args`` says otherwise."""

    def __init__(self, feature: str, package: str | list[str], pip_args: str | None = None, detail: object = None, *, extra: str | None = None):
        self.extra = extra
        why = f" ({detail})" if detail else ""
        if pip_args is None:
            pip_args = f"'grtool[{extra}]'"
        names = [package] if isinstance(package, str) else list(package)
        what = f"the PyPI package {names[0]}, which is" if len(names) == 1 else f"the PyPI packages {', '.join(names)}, which are"
        super().__init__(f"{feature} needs {what} not installed{why}; install it with: pip install {pip_args}")


def where(path: object, position: object | None = None) -> str:
    """'file' or 'file, record N' for error messages."""
    return f"{path}" if position is None else f"{path}, {position}"
