"""`grtool` run with bytes arguments (file names that are not UTF-8 pass as they are), and its error lines: one line,
no traceback."""

from __future__ import annotations

import os
import subprocess
import sys


HANG_GUARD = 300  # seconds: far past what any of these commands takes; only a hang reaches it


def grtool(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`grtool ARGS` (bytes arguments passed as they are: file names that are not UTF-8)."""
    cmd = [sys.executable.encode(), b"-m", b"grtool", *(a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args)]
    return subprocess.run(cmd, capture_output=True, env={**os.environ, **(env or {})}, timeout=HANG_GUARD)


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
