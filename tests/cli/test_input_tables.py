"""The stage tables a command reads (``reads={"chains": TableInput("chains")}``) are checked before it does any work:
every such read parameter of every declared command, given a stage directory of another table, is refused naming
the option, the path and the table it expected, and the command's output is not made. The cases come from the
declarations, so a new command that declares what it reads is covered without editing this file.

A file where a directory is expected (a JSON Lines file: `eval recall`'s RESPONSES) is the command's to judge, as
is a path that does not exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from grtool.cli.commands import click_command, declared, option_flag
from grtool.errors import InputError
from grtool.pipeline.registry import PathKind

READS = sorted((words, name) for words, command in declared().items() for name in command.input_tables)


def _value(param, kind: PathKind | None, tmp: Path) -> str:
    """A value the command parses for another required parameter: a file for a file it reads, a path not there for
    a directory it reads (the command's to judge, after the checks), else a plain value."""
    if kind in (PathKind.FILE, PathKind.LABELLED_FILE):
        path = tmp / f"in_{param.name}.jsonl"
        path.write_text("{}\n")
        return str(path)
    if kind is not None:
        return str(tmp / f"absent_{param.name}")
    choices = getattr(getattr(param, "type", None), "choices", None)
    return str(choices[0].value if hasattr(choices[0], "value") else choices[0]) if choices else "1"


def _other_table(samples: dict, tables: tuple[str, ...]) -> Path:
    """A stage directory of a table the parameter does not read (documents holds no questions, and the reverse)."""
    return samples["root"] / ("documents" if "documents" not in tables else "questions" if "questions" not in tables else "documents")


def test_every_command_that_reads_stage_tables_declares_some():
    assert len(READS) >= 20 and ("filters apply", "chains") in READS and ("export sft", "filtered") in READS


@pytest.mark.parametrize(("words", "name"), READS)
def test_a_stage_of_another_table_is_refused_before_any_work(words, name, tmp_path, samples):
    command = declared()[words]
    wrong = _other_table(samples, command.input_tables[name])
    arguments: list[str] = []
    outputs = []
    for param in click_command(words).params:
        if param.name == name:
            value = str(wrong)
        elif param.required:
            kind = command.writes.get(param.name)
            value = str(tmp_path / f"out_{param.name}") if kind is not None else _value(param, command.reads.get(param.name), tmp_path)
            outputs += [Path(value)] if kind is not None else []
        else:
            continue
        arguments += [value] if param.param_type_name == "argument" else [max(param.opts, key=len), value]
    with pytest.raises(InputError) as refused:
        click_command(words).main(arguments, prog_name=f"grtool {words}", standalone_mode=False)
    message = str(refused.value)
    assert message.startswith(f"{option_flag(command, name)}: {wrong}"), message
    assert "expected" in message or "stage directory here" in message, message
    assert not any(o.exists() for o in outputs), outputs


def test_a_json_lines_file_where_a_stage_may_be_read_is_the_commands_to_judge(tmp_path, samples, cli):
    # `eval recall RESPONSES` reads a stage directory or a JSON Lines file: the file is not refused as "no stage".
    responses = tmp_path / "responses.jsonl"
    responses.write_text("")
    proc = cli("eval", "recall", responses, "--corpus", samples["root"], "--triples", samples["root"], check=False)
    assert "stage directory here" not in proc.stderr, proc.stderr


def test_standard_output_redirected_into_a_stage_it_reads_is_refused(tmp_path, samples):
    """`export gmr RUN --out - > RUN/questions/x.jsonl` wrote its rows as a stray file inside the stage it reads
    (exit 0); now refused before any work. Beside the stages, inside the run directory, is fine."""
    import shutil
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(samples["root"], run)
    stray = run / "questions" / "x.jsonl"

    def export(into: Path) -> subprocess.CompletedProcess:
        with open(into, "wb") as stdout:
            return subprocess.run([sys.executable, "-m", "grtool", "export", "gmr", str(run), "--out", "-"], stdout=stdout, stderr=subprocess.PIPE, text=True)

    refused = export(stray)
    assert refused.returncode == 2 and "standard output, redirected to" in refused.stderr and "lies inside the input" in refused.stderr, refused.stderr
    assert stray.stat().st_size == 0  # what the shell made, and nothing more
    beside = run / "gmr.jsonl"
    assert export(beside).returncode == 0 and beside.stat().st_size > 0
    with open(stray, "wb") as stdout:  # a run directory read whole: its stages are what the command reads
        stats = subprocess.run([sys.executable, "-m", "grtool", "corpus", "stats", str(run), "--json"], stdout=stdout, stderr=subprocess.PIPE, text=True)
    assert stats.returncode == 2 and "lies inside the input" in stats.stderr and stray.stat().st_size == 0, stats.stderr
