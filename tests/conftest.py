from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from paths_helpers import EXAMPLES, REPO, TEST_DATA  # noqa: F401 (the tests import them from here too)

# Real third-party dataset records beside the repository (CI has them, a fresh clone does not). Only the tests
# marked real_data read them; GRTOOL_SHARED_DATA points elsewhere (an empty path: as if absent).
SHARED_DATA = Path(os.environ.get("GRTOOL_SHARED_DATA", REPO.parent / "shared" / "data"))
REAL_DATA_ABSENT = "real-data test: ../shared/data absent"

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist exports COLUMNS=80 and LINES=24 to its workers; the
    for name in ("COLUMNS", "LINES"):  # commands under test must see what a log without a terminal has
        os.environ.pop(name, None)
    # Each worker's model children get their share of the cores: torch's default, a thread per core in every
    # process, puts twice as many spinning OpenMP threads as cores on the machine, and every small operation then
    # waits on descheduled threads: two processes decoding with the embedded model on two cores took 2.4 s a token
    # each with two threads, 0.14 s with one (prefill 11 s against 1.1 s).
    _share = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))


def pytest_collection_modifyitems(config, items):
    """The longest test files first (tests/durations_helpers.py; `make test` keeps this order with xdist's
    --no-loadscope-reorder). Where the real records are absent, the real_data tests (and only they) are skipped,
    under one reason."""
    from durations_helpers import file_seconds, longest_first

    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0].removeprefix("tests/"), []).append(item)
    items[:] = [item for name in longest_first(list(by_file), file_seconds()) for item in by_file[name]]
    if SHARED_DATA.is_dir():
        return
    for item in items:
        if item.get_closest_marker("real_data"):
            item.add_marker(pytest.mark.skip(reason=REAL_DATA_ABSENT))


def pytest_terminal_summary(terminalreporter):
    """Name and count what a clone without ../shared/data leaves out, so nothing else can hide among the skips."""
    skipped = terminalreporter.stats.get("skipped", [])
    real = sum("real_data" in getattr(r, "keywords", {}) for r in skipped)
    if real:
        terminalreporter.write_line(f"{real} real-data tests skipped: ../shared/data absent")


@pytest.fixture(scope="session")
def _slurm_client_without_controller(tmp_path_factory) -> Path:
    from slurm_fakes import install_client_without_controller

    return install_client_without_controller(tmp_path_factory.mktemp("slurm-client"))


@pytest.fixture(autouse=True)
def _no_real_slurm(request, monkeypatch):
    """Every test but those marked real_slurm meets a Slurm client whose controller cannot be reached: what CI's
    machine has, answered at once (its own client waits out a 9 to 18 s timeout a call), and never a real cluster
    of the machine the suite runs on. Tests of the Slurm executor put their own stand-in first (slurm_fakes.py)."""
    if request.node.get_closest_marker("real_slurm") is None:
        folder = request.getfixturevalue("_slurm_client_without_controller")
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def shared_data(request) -> Path:
    """The real dataset records beside the repository: only for tests marked real_data (their point is reading
    real third-party records; every other test runs on the bundled examples)."""
    if request.node.get_closest_marker("real_data") is None:
        raise pytest.UsageError(f"{request.node.nodeid} reads ../shared/data: mark it @pytest.mark.real_data or use the examples")
    return SHARED_DATA


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict:
    """The samples corpus (tests/sample_helpers.py), ingested once per test module (nothing writes into it)."""
    from sample_helpers import build_samples

    root = tmp_path_factory.mktemp("samples") / "corpus"
    info = build_samples(root)
    info["root"] = root
    return info


def run_cli(*args: str, input: str | None = None, env: dict | None = None, check: bool | int = True, process: bool = False) -> subprocess.CompletedProcess:
    """Run `grtool ARGS` through the console entry point's function in this process (tests/inprocess_helpers.py
    says what that leaves out: ``process=True`` runs a real child); check=int asserts that exit code."""
    from inprocess_helpers import grtool_run

    proc = grtool_run(args, input=input, env=env, process=process)
    expected = 0 if check is True else check
    if check is not False and proc.returncode != expected:
        raise AssertionError(f"{' '.join(map(str, proc.args))} exited {proc.returncode}, expected {expected}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture
def cli():
    return run_cli


def _toml_value(value: object) -> str:
    """A TOML value from Python data: strings as JSON writes them (valid TOML basic strings), lists, inline tables."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML value for {value!r}")


def _toml_key(key: str) -> str:
    import json
    import re

    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def pipeline_toml(stages: list[dict], **top: object) -> str:
    """The text of a pipeline file: ``top`` holds its top-level values (``out``, ``note``) and tables (``vars``,
    ``slurm``: dicts); each stage is a dict of its keys (``name``, ``run``, ``args``, ``options``, ``outputs``,
    ``stdout``, ``slurm``), written in that order."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in top.items() if not isinstance(v, dict)]
    for table, values in ((k, v) for k, v in top.items() if isinstance(v, dict)):
        lines += [f"[{table}]", *(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in values.items())]
    for stage in stages:
        lines.append("[[stages]]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in stage.items()]
    return "\n".join(lines) + "\n"


def write_pipeline_file(path: Path | str, stages: list[dict], **top: object) -> Path:
    """Write the pipeline file ``path`` from Python data (see :func:`pipeline_toml`); returns its path."""
    Path(path).write_text(pipeline_toml(stages, **top))
    return Path(path)


@pytest.fixture
def write_pipeline(tmp_path):
    """``write_pipeline(stages, out=..., path=TMP/pipeline.toml, vars={...}, slurm={...})``: the pipeline file
    written from Python data (see :func:`pipeline_toml`); returns its path."""

    def write(stages: list[dict], path: Path | str | None = None, **top: object) -> Path:
        return write_pipeline_file(path if path is not None else tmp_path / "pipeline.toml", stages, **top)

    return write


# --- The shared SFT checkpoint (tests/train_helpers.py trains it; issue #48) -------------------------------------
@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory) -> Path:
    """One real SFT checkpoint of the tiny model per test session, shared by every xdist worker (4 steps, its
    checkpoint-4 kept): read it, copy it (train_helpers.finished_copy) or copy its checkpoint-4, never write into it."""
    pytest.importorskip("trl")  # an install without the train extra cannot make it
    from train_helpers import shared_sft_checkpoint

    return shared_sft_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer SmolLM2 of random weights with the embedded model's tokenizer (train_helpers.tiny_model): for the
    tests of the training machinery. Read only."""
    pytest.importorskip("transformers")
    from train_helpers import tiny_model

    return tiny_model(tmp_path_factory)


def pytest_sessionfinish(session):
    """The controller removes the shared checkpoint (with its optimizer state) once every worker is done."""
    import shutil

    from train_helpers import SHARED_SFT_FOLDER

    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    factory = getattr(session.config, "_tmp_path_factory", None)  # pytest's own, set up before the session starts
    if factory is not None:
        shutil.rmtree(factory.getbasetemp() / SHARED_SFT_FOLDER, ignore_errors=True)


# --- end of the shared SFT checkpoint ------------------------------------------------------------------------------
