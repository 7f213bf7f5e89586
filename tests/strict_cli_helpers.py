"""`grtool` run with bytes arguments (file names that are not UTF-8 pass as they are), and its error lines: one line,
no traceback."""

from __future__ import annotations

import subprocess

from inprocess_helpers import grtool_run


HANG_GUARD = 300  # seconds: far past what any of these commands takes; only a hang reaches it


def grtool(*args, env: dict | None = None, process: bool = False) -> subprocess.CompletedProcess:
    """`grtool ARGS` (bytes arguments passed as they are: file names that are not UTF-8), in this process
    (tests/inprocess_helpers.py); ``process``: a child, where a hang is the failure looked for."""
    return grtool_run(args, env=env, text=False, process=process, timeout=HANG_GUARD)


def errors_of(proc: subprocess.CompletedProcess) -> list[str]:
    err = proc.stderr.decode("utf-8", "backslashreplace")
    assert "Traceback" not in err and "RecursionError" not in err, err[-3000:]
    return [line for line in err.splitlines() if "error:" in line]


def one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Exit ``code`` with one error line holding every needle, and no traceback."""
    errors = errors_of(proc)
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}\n{proc.stderr.decode()[-3000:]}"
    assert len(errors) == 1, errors
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


DEEP = "[" * 100_000 + "]" * 100_000
