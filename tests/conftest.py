from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "data"
SHARED_DATA = REPO.parent / "shared" / "data"

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist exports COLUMNS=80 and LINES=24 to its workers; the
    for name in ("COLUMNS", "LINES"):  # commands under test must see what a log without a terminal has
        os.environ.pop(name, None)


@pytest.fixture
def shared_data() -> Path:
    """The real dataset samples beside the repository (CI has them); skipped where absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


def run_cli(*args: str, input: str | None = None, env: dict | None = None, check: bool | int = True) -> subprocess.CompletedProcess:
    """Run the real `grtool` console entry point in a subprocess; check=int asserts that exit code."""
    cmd = [sys.executable, "-m", "grtool", *map(str, args)]
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, env={**os.environ, **(env or {})})
    expected = 0 if check is True else check
    if check is not False and proc.returncode != expected:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}, expected {expected}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture
def cli():
    return run_cli
