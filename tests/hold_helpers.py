"""A ``grtool`` child held at a named point (grtool/holds.py, ``GRTOOL_HOLD=POINT:DIR``) while a test signals it:
the test waits for a state, never for a time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REACH_GUARD = 600  # seconds: a hang guard only (a loaded machine importing torch takes a minute), never a wait


def held(args: list, point: str, signum: int, holds: Path) -> subprocess.CompletedProcess:
    """Run ``grtool args`` until it waits at ``point``, send ``signum``, release it; its result. Its output goes to
    files while it runs (a pipe nobody reads would stop a chatty child before it gets there)."""
    holds.mkdir(exist_ok=True)
    env = {**os.environ, "GRTOOL_HOLD": f"{point}:{holds}", "COLUMNS": "10000"}
    reached = holds / f"{point}.reached"
    with open(holds / "stdout", "w+") as out, open(holds / "stderr", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "grtool", *map(str, args)], stdout=out, stderr=err, text=True, env=env)
        try:
            deadline = time.monotonic() + REACH_GUARD
            while not reached.exists():  # a state, not a time: the process either gets there or ends
                if proc.poll() is not None or time.monotonic() > deadline:
                    said = "did not reach" if proc.poll() is None else f"ended with {proc.returncode} before reaching"
                    raise AssertionError(f"{said} {point}:\n{(holds / 'stderr').read_text()[-3000:]}")
                time.sleep(0.01)
            assert reached.read_text() == str(proc.pid)
            proc.send_signal(signum)
            (holds / f"{point}.release").write_text("")
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, (holds / "stdout").read_text(), (holds / "stderr").read_text())
