"""One output claim (grtool/store/outputs.py): every output option of every declared command is refused, before the
command does any work and naming both paths, when it names an input of the command or of the pipeline, a record of
another output, a path inside another output, the pipeline file, or an existing file grtool did not write.

The cases are made from the declarations (``Command(reads=..., writes=...)``): a new command that declares its
outputs is covered without editing this file. Each command runs as ``grtool`` parses it (its Click command,
in this process): a case that is not refused would start the command's work on empty inputs and fail otherwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import write_pipeline_file
from grtool.cli.commands import click_command, declared, option_flag
from grtool.errors import InputError
from grtool.pipeline.registry import PathKind

OUTPUTS = sorted((words, name) for words, command in declared().items() for name in command.writes)
USER_TEXT = b"the user's own notes\n"


def _value(param, kind: PathKind | None, tmp: Path) -> str:
    """A value the command parses: an existing file or directory for a path it reads, else a plain one."""
    if kind in (PathKind.FILE, PathKind.LABELLED_FILE):
        path = tmp / f"in_{param.name}.jsonl"
        path.write_text("{}\n")
        return f"a={path}" if kind is PathKind.LABELLED_FILE else str(path)
    if kind is not None:
        path = tmp / f"in_{param.name}"
        path.mkdir(exist_ok=True)
        return str(path)
    choices = getattr(getattr(param, "type", None), "choices", None)
    return str(choices[0].value if hasattr(choices[0], "value") else choices[0]) if choices else "1"


def _arguments(words: str, output: str, target: Path, tmp: Path, given: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line writing ``output`` to ``target``: every required parameter filled, and the read parameter
    ``given`` too; returns it and the paths it reads by parameter name."""
    command = declared()[words]
    arguments: list[str] = []
    reads: dict[str, str] = {}
    for param in click_command(words).params:
        if param.name == output:
            arguments += [option_flag(command, output), str(target)]
        elif param.required or param.name == given:
            value = _value(param, command.reads.get(param.name), tmp)
            if param.name in command.reads:
                reads[param.name] = value.split("=", 1)[-1]
            arguments += [value] if param.param_type_name == "argument" else [max(param.opts, key=len), value]
    return arguments, reads


def _refused(words: str, arguments: list[str]) -> str:
    with pytest.raises(InputError) as refused:
        click_command(words).main(arguments, prog_name=f"grtool {words}", standalone_mode=False)
    return str(refused.value)


def _an_input(words: str) -> str:
    """The read parameter the input case names: a required one, else the first declared."""
    command = declared()[words]
    required = [p.name for p in click_command(words).params if p.required and p.name in command.reads]
    return (required or list(command.reads))[0]


@pytest.mark.parametrize(("words", "output"), OUTPUTS)
def test_an_output_that_is_an_input_is_refused(words, output, tmp_path):
    read = _an_input(words)
    _, reads = _arguments(words, output, tmp_path / "unused", tmp_path, given=read)
    target = Path(reads[read])
    before = target.read_bytes() if target.is_file() else sorted(target.iterdir())
    arguments, _ = _arguments(words, output, target, tmp_path, given=read)
    message = _refused(words, arguments)
    assert f"{option_flag(declared()[words], output)} {target}: is the input {target}" in message
    assert (target.read_bytes() if target.is_file() else sorted(target.iterdir())) == before


RECORDS = ["_manifest.json", "index.json", "grtool.json", "grtool-run.json", "data.jsonl.grtool.json", ".notes.md.grtool-file.json"]


@pytest.mark.parametrize("record", RECORDS)
@pytest.mark.parametrize(("words", "output"), OUTPUTS)
def test_an_output_named_as_a_record_is_refused(words, output, record, tmp_path):
    target = tmp_path / "elsewhere" / record
    message = _refused(words, _arguments(words, output, target, tmp_path)[0])
    assert f"{target}: {record} is the name of the record grtool keeps of an output" in message
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(("words", "output"), OUTPUTS)
def test_an_output_in_a_pipelines_records_is_refused(words, output, tmp_path):
    records = tmp_path / "run" / "_pipeline"
    message = _refused(words, _arguments(words, output, records / "stage.out", tmp_path)[0])
    assert f"{records / 'stage.out'}: lies in {records}, where a pipeline keeps its stage records" in message
    assert not records.exists()


@pytest.mark.parametrize("what", ["stage", "index", "checkpoint"])
@pytest.mark.parametrize(("words", "output"), OUTPUTS)
def test_an_output_inside_another_output_is_refused(words, output, what, tmp_path):
    other = tmp_path / what
    other.mkdir()
    record = {"stage": ("_manifest.json", "{}"), "index": ("index.json", '{"format": "grtool-index-1"}'), "checkpoint": ("grtool.json", "{}")}[what]
    (other / record[0]).write_text(record[1])
    message = _refused(words, _arguments(words, output, other / "inside", tmp_path)[0])
    assert f"{other / 'inside'}: lies inside {other}, a{'n' if what == 'index' else ''} {what} directory grtool wrote" in message
    assert sorted(p.name for p in other.iterdir()) == [record[0]]


@pytest.mark.parametrize(("words", "output"), OUTPUTS)
def test_an_existing_file_grtool_did_not_write_is_refused(words, output, tmp_path):
    """A report, plot or JSON file over a user's file; a directory output where a user's file is."""
    target = tmp_path / "notes.md"
    target.write_bytes(USER_TEXT)
    message = _refused(words, _arguments(words, output, target, tmp_path)[0])
    assert f"{target}: " in message and "grtool did not write" in message
    assert target.read_bytes() == USER_TEXT


WORK_FILES = [".notes.md.grtool.lock", ".notes.4242.grtool-tmp.md", ".grtool-clearing"]


@pytest.mark.parametrize("name", WORK_FILES)
@pytest.mark.parametrize(("words", "output"), OUTPUTS)
def test_an_output_named_like_a_file_grtool_keeps_while_it_writes_is_refused(words, output, name, tmp_path):
    """A lock, a temporary file or a clear's marker is removed by a later run (the lock of notes.md, the clean-up of
    a killed run's temporary file): an output named so would be lost, so none is ever one."""
    target = tmp_path / "elsewhere" / name
    message = _refused(words, _arguments(words, output, target, tmp_path)[0])
    assert f"{target}: {name} is named like a file grtool keeps while it writes" in message
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize(("words", "output"), OUTPUTS)
def test_an_empty_output_path_is_refused_not_read_as_the_current_directory(words, output, tmp_path):
    arguments = _arguments(words, output, tmp_path / "placeholder", tmp_path)[0]
    arguments[arguments.index(str(tmp_path / "placeholder"))] = ""
    message = _refused(words, arguments)
    assert f"{option_flag(declared()[words], output)} is empty" in message


@pytest.mark.parametrize(("words", "output"), OUTPUTS)
def test_an_output_whose_dotdot_follows_a_missing_folder_is_refused(words, output, tmp_path):
    """``out/sub/../x`` with no ``out/sub``: writing it would first make the stray folder ``sub`` (before: made)."""
    target = f"{tmp_path / 'out' / 'sub'}/../x.json"
    (tmp_path / "out").mkdir()
    message = _refused(words, _arguments(words, output, Path(target), tmp_path)[0])
    assert f"{tmp_path / 'out' / 'sub'} does not exist, so the '..' after it names no folder" in message
    assert list((tmp_path / "out").iterdir()) == []


REPORTS = [(words, output) for words, output in OUTPUTS if declared()[words].writes[output] is PathKind.REPORT]


@pytest.mark.parametrize(("words", "output"), REPORTS)
def test_a_single_file_output_ending_in_a_slash_is_refused_not_written_as_a_file_by_the_folder_s_name(words, output, tmp_path):
    arguments = _arguments(words, output, tmp_path / "placeholder", tmp_path)[0]
    arguments[arguments.index(str(tmp_path / "placeholder"))] = f"{tmp_path / 'reports'}/"
    message = _refused(words, arguments)
    assert f"{tmp_path / 'reports'}/: ends in '/', so it names a directory, and the option writes one file" in message
    assert not (tmp_path / "reports").exists()


STAGE_OUTPUTS = [(words, output) for words, output in OUTPUTS if declared()[words].stage]


@pytest.mark.parametrize("collision", ["the pipeline file", "an input of another stage"])
@pytest.mark.parametrize(("words", "output"), STAGE_OUTPUTS)
def test_a_stage_option_writing_over_what_the_pipeline_reads_is_refused(words, output, collision, tmp_path, examples):
    """Before any stage runs (the dry run too): a stage's output option naming the pipeline file, or a file an
    earlier stage reads (`report = "docs.jsonl"`)."""
    raw = tmp_path / "documents.jsonl"
    raw.write_bytes((examples / "generic" / "documents.jsonl").read_bytes())
    config = tmp_path / "p.toml"
    target = config if collision == "the pipeline file" else raw
    ingest = {"name": "ingest", "run": "corpus ingest", "args": [examples / "generic" / "questions_dev.jsonl", raw], "options": {"dataset": "generic", "out": "{out}/corpus"}}
    tested = {"name": "tested", "run": words, "options": {output: target, **({"out": "{out}/tested"} if output != "out" else {})}}
    write_pipeline_file(config, [ingest, tested], out=tmp_path / "run")
    before = config.read_bytes(), raw.read_bytes()
    for dry in ([], ["--dry-run"]):
        message = _refused("pipeline run", [str(config), *dry])
        assert f"stage 'tested' option {output} {target}: is the input {target}" in message
    assert (config.read_bytes(), raw.read_bytes()) == before
    assert not (tmp_path / "run").exists()
