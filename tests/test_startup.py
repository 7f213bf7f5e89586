"""`grtool` starts without its heavy libraries: `--help`, `--version` and `status STAGE` never import polars,
pyarrow, numpy, torch or transformers (bench/startup.py measures what that saves), and the commands are made into
Click commands only when looked up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_cli

HEAVY = ("polars", "pyarrow", "numpy", "torch", "transformers")

# Runs `grtool ARGS...` in this child process, then prints which of the modules named in its first argument got
# imported (the command's exit code is the child's).
LOADED = """
import json, sys

watched, args = sys.argv[1].split(","), sys.argv[2:]
sys.argv = ["grtool", *args]
from grtool.cli.main import run

try:
    run(ends_process=False)
except SystemExit as e:
    code = e.code
print(json.dumps(sorted(m for m in watched if m in sys.modules)), file=sys.stderr)
sys.exit(code)
"""


def loaded(*args: str, watched: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``watched`` that ``grtool ARGS`` imports; the command must succeed."""
    proc = subprocess.run([sys.executable, "-c", LOADED, ",".join(watched), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def stage(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("startup") / "corpus"
    run_cli("-q", "corpus", "ingest", EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json", "--out", out)
    return out / "documents"


@pytest.mark.parametrize("args", [["--help"], ["corpus", "--help"], ["corpus", "ingest", "--help"], ["--version"]])
def test_help_and_version_import_no_heavy_library(args):
    assert loaded(*args) == []


def test_version_does_not_load_the_help_renderer():
    """Typer's help renderer (rich.markdown, rich.traceback: as much again as Typer itself) loads only to draw help."""
    assert loaded("--version", watched=("typer.rich_utils",)) == []
    assert loaded("--help", watched=("typer.rich_utils",)) == ["typer.rich_utils"]


def test_status_of_a_stage_reads_its_records_without_parquet(stage):
    """`status STAGE` reads the JSON records and the parts' sizes; the Parquet libraries stay unloaded."""
    assert loaded("status", str(stage)) == []
    assert loaded("status", str(stage), "--json") == []


def test_status_without_parquet_still_sees_a_truncated_or_removed_part(stage, tmp_path):
    import shutil

    copy = tmp_path / "documents"
    shutil.copytree(stage, copy)
    part = copy / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:100])
    shown = json.loads(run_cli("status", copy, "--json").stdout)
    assert shown["parts_pending"] == ["part-00000"] and not shown["complete"]
    part.unlink()
    assert json.loads(run_cli("status", copy, "--json").stdout)["parts_pending"] == ["part-00000"]


def test_commands_are_made_when_looked_up():
    """Naming a group's commands makes none of them; looking one up makes it alone (`grtool status DIR` makes one
    command; a group's --help makes its own commands, to show their help)."""
    import typer.main

    from grtool.cli.main import app

    root = typer.main.get_command(app)
    assert "corpus" in root.commands and "status" in root.commands and "nothing" not in root.commands
    assert root.commands.made == {}  # nothing made by listing or membership
    ctx = root.make_context("grtool", ["corpus"], resilient_parsing=True)
    corpus = root.get_command(ctx, "corpus")
    assert list(root.commands.made) == ["corpus"] and corpus.commands.made == {}
    assert "ingest" in list(corpus.commands) and corpus.commands.made == {}
    ingest = corpus.get_command(ctx, "ingest")
    assert list(corpus.commands.made) == ["ingest"] and any(p.name == "out" for p in ingest.params)
