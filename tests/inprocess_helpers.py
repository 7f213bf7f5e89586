"""`grtool ARGS` run by the test worker itself, through the console entry point's own function
(:func:`grtool.cli.main.run` with ``ends_process=False``), with what a child process would have had of its own:
argv, environment, stdin, and stdout/stderr at the file-descriptor level (native code and child processes write
there too). A child process costs the interpreter and grtool's imports, 1–2 s of CPU for a light command and
10 s or more for a model command; the suite runs about two thousand of them.

What a process of its own gives and this does not, so tests of these stay subprocesses (``process=True`` or a
direct ``subprocess`` call): signals and exit paths (``exit_now`` ends a process), hold points, hang guards
(a timeout), the log lines libraries and Python warnings write through the root logger (the test runner's
capture holds it), imports (what a command loads), and engines that start processes of their own (vLLM).
``GRTOOL_TEST_SUBPROCESS=1`` runs every call as a subprocess, for a run at full fidelity."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import traceback

ALWAYS_SUBPROCESS = os.environ.get("GRTOOL_TEST_SUBPROCESS") == "1"
# Variables read as an interpreter or a library starts (the path, the locale, thread pools, vLLM's engine
# layout): a run that sets one gets a process of its own, where they take effect.
READ_AT_START = ("PYTHON", "LC_", "LANG", "OMP_", "MKL_", "VLLM_")


def _words(args: tuple) -> list[str]:
    return [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args]


def in_process(args: tuple, input: str | bytes | None = None, env: dict | None = None, text: bool = True, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``grtool ARGS`` here; the result is what ``subprocess.run(..., capture_output=True)`` would return
    (``text``: str outputs, else bytes; a traceback on stderr and exit 1 where the child would have crashed)."""
    from grtool.cli.main import run

    words = _words(args)
    saved_argv, saved_env, saved_cwd = sys.argv, dict(os.environ), os.getcwd()
    saved_streams = sys.stdin, sys.stdout, sys.stderr
    saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
    files = [tempfile.TemporaryFile() for _ in range(3)]
    if input is not None:
        files[0].write(input.encode() if isinstance(input, str) else input)
        files[0].seek(0)
    for stream in saved_streams[1:]:
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for fd, f in enumerate(files):
        os.dup2(f.fileno(), fd)
    # Python's own streams on the new descriptors, as a child has them (UTF-8, errors escaped on stdout/stderr)
    sys.stdin = open(0, encoding="utf-8", errors="surrogateescape", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.argv = ["grtool", *words]
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        run(ends_process=False)
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:  # what the child would have printed before exiting 1
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for fd, saved in enumerate(saved_fds):
            os.dup2(saved, fd)
            os.close(saved)
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
    out, err = (_read(f) for f in files[1:])
    files[0].close()
    if text:
        out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    return subprocess.CompletedProcess([sys.executable, "-m", "grtool", *words], code, out, err)


def _read(f) -> bytes:
    f.seek(0)
    data = f.read()
    f.close()
    return data


def grtool_run(args: tuple, input: str | bytes | None = None, env: dict | None = None, text: bool = True,
               process: bool = False, timeout: float | None = None, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """``grtool ARGS`` in this process, or in a child where ``process`` (or ``GRTOOL_TEST_SUBPROCESS=1``) asks or
    ``env`` sets a variable of :data:`READ_AT_START`."""
    if process or ALWAYS_SUBPROCESS or any(name.startswith(READ_AT_START) for name in env or {}):
        cmd = [sys.executable, "-m", "grtool", *(a if isinstance(a, bytes) else str(a) for a in args)]
        if isinstance(input, str) and not text:
            input = input.encode()
        return subprocess.run(cmd, input=input, capture_output=True, text=text, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})
    return in_process(args, input=input, env=env, text=text, cwd=cwd)
