"""`grtool` starts without its heavy libraries: `--help`, `--version` and `status STAGE` never import polars,
pyarrow, numpy, torch or transformers (bench/startup.py measures what that saves), and the commands are made into
Click commands only when looked up. What `--help` and `status STAGE` import beyond `import typer, rich.console` is
held to an allow-list (module names, not timings), and declaring the commands evaluates none of their signatures."""

from __future__ import annotations

import fnmatch
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
    """`status STAGE` reads the JSON records and the parts' sizes; the Parquet libraries stay unloaded. So does
    `status RUN`, which also looks for indexes, exports and checkpoints by their JSON records."""
    assert loaded("status", str(stage)) == []
    assert loaded("status", str(stage), "--json") == []
    assert loaded("status", str(stage.parent)) == []


# Runs `grtool ARGS...` (no arguments: only the import floor) in this child process, then prints every module
# loaded and the declared commands whose signature (their annotations evaluated) was made.
IMPORTED = """
import json, sys

args = sys.argv[1:]
made = []
if args:
    sys.argv = ["grtool", *args]
    from grtool.cli.commands import declared
    from grtool.cli.main import run

    try:
        run(ends_process=False)
    except SystemExit as e:
        assert e.code in (0, None), e.code
    made = sorted(words for words, command in declared().items() if "__signature__" in vars(command.function))
else:
    import typer, rich.console  # the framework's floor
print(json.dumps({"modules": sorted(sys.modules), "signatures": made}), file=sys.stderr)
"""

# grtool's own modules and the other libraries `--help` may import beyond `import typer, rich.console`: the command
# declarations (every module of grtool/cli/ and the constants they name) and Typer's help renderer, without the
# Markdown and traceback renderers it never uses for grtool.
DECLARATIONS = ["grtool", "grtool.cli", "grtool.cli.*", "grtool.errors", "grtool.extras", "grtool.holds", "grtool.invocation", "grtool.signals",
                "grtool.userinput", "grtool.pipeline", "grtool.pipeline.registry", "grtool.store", "grtool.store.frames", "grtool.store.layout",
                "grtool.store.empty", "grtool.llm", "grtool.docid", "grtool.models", "typer._click.*"]  # fmt: skip
TABLES = ["rich.table", "rich.box", "rich.padding", "rich._ratio", "rich._emoji_codes"]
HELP_MAY_IMPORT = [*DECLARATIONS, *TABLES, "typer.rich_utils", "rich.columns", "rich.panel"]
# `status STAGE`: the declarations, the stage's JSON records and their typed readers, and grtool's consoles.
STATUS_MAY_IMPORT = [*DECLARATIONS, *TABLES, "grtool.log", "grtool.inspect", "grtool.inspect.contents", "grtool.records", "grtool.store.records",
                     "grtool.store.status", "grtool.store.stops", "grtool.store.diskfull", "grtool.store.sharding", "grtool.pipeline.records",
                     "msgspec", "msgspec.*", "orjson", "orjson.*", "typing_extensions", "rich.progress", "rich.progress_bar", "rich.live",
                     "rich.live_render", "rich.spinner", "rich._spinners", "rich.filesize", "rich.file_proxy", "rich.ansi"]  # fmt: skip
# Standard library modules that cost a start-up noticeably, and that neither needs: OpenSSL, sockets, the e-mail
# parser and package metadata (which pydantic reads); and for `--help`, logging.
SLOW_STDLIB = ["hashlib", "_hashlib", "ssl", "socket", "email", "importlib.metadata"]


def imported(*args: str) -> tuple[set[str], list[str]]:
    """The modules loaded by ``grtool ARGS`` (none: by the import floor), and the commands whose signature it made."""
    proc = subprocess.run([sys.executable, "-c", IMPORTED, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stderr.strip().splitlines()[-1])
    return set(shown["modules"]), shown["signatures"]


def beyond(allowed: list[str], modules: set[str], floor: set[str], slow: list[str]) -> list[str]:
    """What ``modules`` holds beyond ``floor`` that the allow-list does not name (the standard library is free,
    but for ``slow``)."""
    stdlib = sys.stdlib_module_names
    return sorted(m for m in modules - floor
                  if (m.split(".")[0] not in stdlib and not any(fnmatch.fnmatchcase(m, a) for a in allowed)) or m in slow)  # fmt: skip


@pytest.fixture(scope="module")
def floor() -> set[str]:
    return imported()[0]


def test_help_imports_only_the_declarations_and_the_help_renderer(floor):
    """A module that `grtool --help` starts to import shows up here by name: import it inside the function that
    needs it (a command's work at run time), or add it to the list knowing what it costs (bench/startup.py)."""
    modules, signatures = imported("--help")
    assert beyond(HELP_MAY_IMPORT, modules, floor, [*SLOW_STDLIB, "logging"]) == []
    assert signatures == []  # the commands' lines in the help come from their declarations
    assert not {"rich.markdown", "rich.traceback", "pygments", "pydantic"} & modules


def test_status_of_a_stage_imports_only_its_readers(stage, floor):
    modules, signatures = imported("status", str(stage))
    assert beyond(STATUS_MAY_IMPORT, modules, floor, SLOW_STDLIB) == []
    assert signatures == []  # only `status` was made into a Click command, and its signature is its own
    assert "pydantic" not in modules  # Typer converts status's values without it (grtool/cli/typed.py)


def test_the_allow_lists_catch_what_they_are_meant_to(floor):
    """The check above can fail: a module outside the lists, or a slow standard one, is named."""
    assert beyond(HELP_MAY_IMPORT, floor | {"polars", "grtool.store.io", "grtool.cli.main"}, floor, SLOW_STDLIB) == ["grtool.store.io", "polars"]
    assert beyond(HELP_MAY_IMPORT, floor | {"hashlib", "json"}, floor, SLOW_STDLIB) == ["hashlib"]


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
