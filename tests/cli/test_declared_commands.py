"""A command is declared once (grtool/cli/commands.py): a toy command, declared and registered by a program that
runs ``grtool``, runs as a pipeline stage (locally and planned for Slurm) with no other module of grtool edited; and
the declarations of grtool's own commands say what every path parameter is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from conftest import REPO

# A program that declares `grtool toy count` (one file: its Typer function and its declaration), then runs grtool.
TOY = '''
import sys
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import typer

from grtool import extras
from grtool.cli.commands import Command, Group, PathKind, TableOutput, register
from grtool.cli.options import NumShards, ShardIndex


def count(
    text: Annotated[Path, typer.Argument(help="A text file.")],
    out: Annotated[Path, typer.Option("--out", help="Directory of the counts, one file per shard.")],
    chart: Annotated[bool, typer.Option("--chart", help="Also draw a chart (needs grtool[plot]).")] = False,
    num_shards: NumShards = 1,
    shard_index: ShardIndex = 0,
) -> None:
    """Count the lines of a file: each shard counts every NUM_SHARDS-th line."""
    lines = text.read_text().splitlines()[shard_index::num_shards]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"count-{shard_index}.txt").write_text(f"{len(lines)}\\n")


def lengths(
    text: Annotated[Path, typer.Argument(help="A text file.")],
    out: Annotated[Path, typer.Option("--out", help="Stage directory of the line lengths.")],
) -> None:
    """Write each line's length as a stage table of the toy's own (toy_lengths)."""
    from grtool.store.partloop import Output, PartLoop
    from grtool.store.stage import StageSpec

    rows = [{"line": i, "chars": len(t)} for i, t in enumerate(text.read_text().splitlines())]

    def write(part):
        part.shard.count_in(len(rows))
        part.shard.write_rows(rows)

    loop = PartLoop([Output(out, StageSpec("toy_lengths", LENGTHS, {}, [str(text)]))], 1)
    loop.run(write)
    loop.finish()


LENGTHS = pa.schema([("line", pa.int64()), ("chars", pa.int64())])
register(Group("toy", "Toy commands."))
register(Command("toy count", count, reads={"text": PathKind.FILE}, writes={"out": PathKind.DIRECTORY},
                 extras=lambda options: [("plot", "--chart")] if options["chart"] else []))
# the stage and its table, declared once: --out writes a stage of toy_lengths, one row per line
register(Command("toy lengths", lengths, reads={"text": PathKind.FILE}, writes={"out": TableOutput("toy_lengths", LENGTHS, ("line",))}))

if "--hide-plot" in sys.argv:  # the plot extra looks uninstalled
    sys.argv.remove("--hide-plot")
    extras.EXTRAS["plot"] = (("grtool_no_such_module", "plot-package"),)

from grtool.cli.main import run

run()
'''


def _toy(tmp_path: Path, *args: object, check: int = 0) -> subprocess.CompletedProcess:
    program = tmp_path / "toy_grtool.py"
    program.write_text(TOY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(program), *map(str, args)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def _toy_pipeline(write_pipeline, tmp_path: Path, **options: object) -> Path:
    text = tmp_path / "lines.txt"
    text.write_text("".join(f"line {i}\n" for i in range(5)))
    stage = {"name": "count", "run": "toy count", "args": [str(text)], "options": {"out": "{out}/counts", **options}, "slurm": {"tasks": 2}}
    return write_pipeline([stage], out=str(tmp_path / "run"))


def test_a_toy_command_runs_as_a_pipeline_stage(tmp_path, write_pipeline):
    config = _toy_pipeline(write_pipeline, tmp_path)
    assert "Count the lines of a file" in _toy(tmp_path, "toy", "count", "--help").stdout
    _toy(tmp_path, "pipeline", "run", config)
    assert (tmp_path / "run" / "counts" / "count-0.txt").read_text() == "5\n"
    assert (tmp_path / "run" / "_pipeline" / "count.json").is_file()
    plan = _toy(tmp_path, "pipeline", "run", config, "--dry-run").stdout
    assert "# count: done" in plan and "# 0 of 1 stages to run" in plan  # done stages are skipped


def test_a_toy_command_is_planned_as_a_slurm_array(tmp_path, write_pipeline):
    config = _toy_pipeline(write_pipeline, tmp_path)
    out = _toy(tmp_path, "pipeline", "run", config, "--executor", "slurm", "--dry-run").stdout
    script = out.split("count.sbatch")[1].split("# ----")[0]
    assert "#SBATCH --array=0-1" in script and "grtool toy count" in script and "--num-shards 2" in script
    assert "grtool pipeline finalize --merge" in out
    assert not (tmp_path / "run").exists()


def test_a_toy_command_declares_what_it_reads_and_needs(tmp_path, write_pipeline):
    missing = tmp_path / "missing.txt"
    config = write_pipeline([{"name": "count", "run": "toy count", "args": [str(missing)], "options": {"out": "{out}/counts"}}], out=str(tmp_path / "run"))
    proc = _toy(tmp_path, "pipeline", "run", config, check=2)
    assert "stage 'count', argument TEXT" in proc.stderr and "does not exist" in proc.stderr  # checked before it runs
    config = _toy_pipeline(write_pipeline, tmp_path, chart=True)
    proc = _toy(tmp_path, "pipeline", "run", config, "--hide-plot", check=2)
    assert "stage 'count': --chart needs" in " ".join(proc.stderr.split())
    assert not (tmp_path / "run").exists()


def test_a_toy_stage_table_is_declared_once_and_read_as_grtool_reads_its_own(tmp_path):
    """`toy lengths` writes a table grtool does not have (toy_lengths), declared beside the command: `validate` and
    `status` read its stage as they read grtool's own (its records and shards), `show` prints its rows by their key
    and columns; a grtool that was never told of the
    table names the manifest's table as unknown (exit 1), never a traceback or a silent pass."""
    import pyarrow.parquet as pq

    text = tmp_path / "lines.txt"
    text.write_text("a\nbb\nccc\n")
    out = tmp_path / "run" / "lengths"
    _toy(tmp_path, "toy", "lengths", text, "--out", out)
    assert pq.read_table(out / "part-00000.parquet").to_pylist() == [{"line": 0, "chars": 1}, {"line": 1, "chars": 2}, {"line": 2, "chars": 3}]
    said = " ".join(_toy(tmp_path, "validate", tmp_path / "run").stderr.split())
    assert "ok " in said and "(toy_lengths, 1 shards, 3 rows)" in said and "1 ok, 0 with problems" in said, said
    assert "toy_lengths" in _toy(tmp_path, "status", out, "--json").stdout
    shown = [json.loads(line) for line in _toy(tmp_path, "show", out, "--json").stdout.splitlines()]  # by its columns
    assert [(r["kind"], r["key"], r["fields"], r["text"]) for r in shown] == [("toy_lengths", {"line": i}, {"chars": i + 1}, None) for i in range(3)]
    # a grtool without the declaration: the manifest names a table it does not know
    proc = subprocess.run([sys.executable, "-m", "grtool", "validate", str(tmp_path / "run")], capture_output=True, text=True)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 1 and "'toy_lengths' is neither a table of grtool nor one a command declared" in said and "Traceback" not in said, said


def test_a_table_is_declared_with_a_key_of_its_own_columns_and_only_once():
    import pyarrow as pa

    from grtool.cli.commands import TableOutput
    from grtool.store.schemas import register_table

    schema = pa.schema([("id", pa.string())])
    with pytest.raises(ValueError, match="names no column"):
        register_table("toy_bad_key", schema, ("nope",))
    with pytest.raises(ValueError, match=r"the columns shown \['nope'\] are not in its schema"):
        register_table("toy_bad_view", schema, ("id",), text="nope")
    with pytest.raises(ValueError, match="its text column 'n' holds int64, not text"):
        register_table("toy_bad_text", pa.schema([("id", pa.string()), ("n", pa.int64())]), ("id",), text="n")
    from grtool.store.schemas import TRIPLES

    register_table("triples", TRIPLES, ("doc_id", "idx"))  # grtool's own table declared again as it is: nothing to do
    with_text = pa.schema([("id", pa.string()), ("t", pa.string()), ("n", pa.int64())])
    for _ in range(2):  # the same declaration twice (its fields by default): the second is nothing to do
        register_table("toy_twice", with_text, ("id",), text="t")
    with pytest.raises(ValueError, match="declared already, with another schema, key or view"):
        register_table("toy_twice", with_text, ("id",), text="t", fields=())
    with pytest.raises(TypeError, match="with the table's schema"):
        TableOutput("triples", key=("doc_id",))
    with pytest.raises(ValueError, match="lower-case letters"):
        register_table("Toy Table", schema, ("id",))
    with pytest.raises(ValueError, match="declared already"):
        register_table("documents", schema, ("id",))


def test_declaring_a_command_twice_or_before_its_group_is_refused():
    from grtool.cli import commands
    from grtool.cli.corpus import ingest_cmd

    with pytest.raises(ValueError, match="declared twice"):
        commands.register(commands.Command("corpus ingest", ingest_cmd))
    with pytest.raises(ValueError, match="register its group 'nogroup' first"):
        commands.register(commands.Command("nogroup ingest", ingest_cmd))
    with pytest.raises(TypeError, match="not a parameter of ingest_cmd"):
        commands.Command("corpus ingest", ingest_cmd, reads={"no_such": commands.PathKind.FILE})


def test_every_path_parameter_of_a_stage_command_is_declared_read_or_written():
    """A path the declaration leaves out would not be checked before a pipeline runs (and not fingerprinted)."""
    from grtool.cli.commands import click_command
    from grtool.cli.stages import CliCommands

    stages = CliCommands()
    not_paths = {("index query", "text")}  # a positional argument that is a docid, not a file
    for run in stages.names():
        declared = stages.declared(run)
        assert declared is not None
        hints = typing.get_type_hints(declared.function)
        for param in click_command(run).params:
            positional = not param.opts[0].startswith("-")
            if (positional or _names_a_path(hints.get(param.name))) and (run, param.name) not in not_paths:
                assert param.name in {**declared.reads, **declared.writes}, (run, param.name)
    run_writers = {"corpus ingest", "corpus merge", "corpus split", "triples extract", "triples evidence"}
    assert {run for run in stages.names() if stages.writes_run_directory(run)} == run_writers
    sharded = {"triples extract", "chains synthesize", "chains gold", "filters apply", "retrieve", "eval answer"}  # eval answer: its model answers
    assert {run for run in stages.names() if stages.shards(run)} == sharded


def _names_a_path(hint: object) -> bool:
    return hint is Path or any(_names_a_path(a) for a in typing.get_args(hint))


def test_the_cli_modules_import_no_cycle():
    """`pipeline run` runs its sibling commands through the root command its context holds, not by importing
    cli/main.py: no circle main -> pipeline -> stages -> main (lazy imports counted)."""
    from imports_helpers import cycles, import_graph

    assert [c for c in cycles(import_graph()) if any(m.startswith("grtool.cli") for m in c)] == []


def test_the_names_a_declaration_gives_are_its_commands_signature():
    """A command with added parameters (``allows_empty``, ``llm_options``) names them before its signature is
    made (declaring evaluates no annotation): the names are the signature's, in its order, for every command."""
    import inspect

    from grtool.cli.commands import declared
    from grtool.pipeline.registry import parameter_names

    added = 0
    for words, command in declared().items():
        names = parameter_names(command.function)
        added += hasattr(command.function, "parameter_names")
        assert names == list(inspect.signature(command.function).parameters), words
        assert set(typing.get_type_hints(command.function)) >= set(names), words
    assert added >= 10  # corpus ingest and merge, triples extract, chains synthesize and gold, retrieve, eval answer, ...
