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

import contextlib
import functools
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


@functools.cache
def _child_errors() -> tuple[str, str]:
    """The error handlers a child's stdin and stdout get here (surrogateescape under the C locale, else strict for
    stdout): a name that is not UTF-8 must fail or pass in-process as it would in a child."""
    probe = "import sys; print(sys.stdin.errors, sys.stdout.errors)"
    stdin, stdout = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    return stdin, stdout


def _check_env(env: dict) -> dict[str, str]:
    """What os.environ would refuse, refused before anything of this process is swapped."""
    values = {str(k): str(v) for k, v in env.items()}
    for k, v in values.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise ValueError(f"environment variable {k!r}={v!r} cannot be set")
    return values


def in_process(args: tuple, input: str | bytes | None = None, env: dict | None = None, text: bool = True, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``grtool ARGS`` here; the result is what ``subprocess.run(..., capture_output=True)`` would return
    (``text``: str outputs, else bytes; a traceback on stderr and exit 1 where the child would have crashed)."""
    from grtool.cli.main import run

    words, values = _words(args), _check_env(env or {})
    stdin_errors, stdout_errors = _child_errors()
    files = [tempfile.TemporaryFile() for _ in range(3)]
    if input is not None:
        files[0].write(input.encode() if isinstance(input, str) else input)
        files[0].seek(0)
    code = 0
    with contextlib.ExitStack() as restore:  # each piece of state put back as soon as it is swapped, whatever is raised
        restore.callback(_close, files)
        restore.callback(_reset_grtool_state)
        saved_argv, saved_streams = sys.argv, (sys.stdin, sys.stdout, sys.stderr)
        restore.callback(setattr, sys, "argv", saved_argv)
        restore.callback(_restore_streams, saved_streams)
        restore.enter_context(_environment(values))
        restore.callback(os.chdir, os.getcwd())
        for stream in saved_streams[1:]:
            _flush(stream)
        for fd, f in enumerate(files):
            saved = os.dup(fd)
            restore.callback(os.close, saved)
            restore.callback(os.dup2, saved, fd)
            os.dup2(f.fileno(), fd)
        # Python's own streams on the new descriptors, as a child has them
        sys.stdin = open(0, encoding="utf-8", errors=stdin_errors, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", errors=stdout_errors, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
        sys.argv = ["grtool", *words]
        if cwd is not None:
            os.chdir(cwd)
        try:
            run(ends_process=False)
        except SystemExit as e:
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        except Exception:  # what the child would have printed before exiting 1 (pytest's own outcomes, a timeout, pass)
            traceback.print_exc()
            code = 1
        finally:
            _flush(sys.stdout)
            _flush(sys.stderr)
        out, err = (_read(f) for f in files[1:])
    if text:
        out, err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    return subprocess.CompletedProcess([sys.executable, "-m", "grtool", *words], code, out, err)


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """``values`` set for the run; afterwards only the variables that changed are put back (never an empty
    environment for a moment: native threads of polars or torch may read it meanwhile)."""
    before = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        for name in [n for n in os.environ if n not in before]:
            del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


def _reset_grtool_state() -> None:
    """What a run leaves in grtool's modules that a child would have taken with it: the log's settings (--quiet,
    the width from COLUMNS), registered credentials (a later test's "the secret is not shown" must not pass
    because an earlier run registered it), and the indexes kept open by path (a test that rebuilds or damages an
    index at the same path must read it again)."""
    from grtool import log, secrets

    log.configure()
    with secrets._lock:
        secrets._patterns.clear()
        secrets._exact.clear()
    for module, cache in (("constraints", "_BUILT"), ("decoding", "_OPEN"), ("text_constraint", "_OPEN")):
        loaded = sys.modules.get(f"grtool.index.{module}")  # only where a run imported it (they import torch)
        if loaded is not None:
            getattr(loaded, cache).clear()


def _restore_streams(streams: tuple) -> None:
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        if stream not in streams:
            stream.close()
    sys.stdin, sys.stdout, sys.stderr = streams


def _flush(stream) -> None:
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


def _close(files: list) -> None:
    for f in files:
        f.close()


def _read(f) -> bytes:
    f.seek(0)
    return f.read()


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
