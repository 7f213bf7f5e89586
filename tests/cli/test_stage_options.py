"""A command's options as one typed, bounded Struct (grtool/cli/stage_options.py), made from its declaration: a
pipeline stage's options are checked by converting them to it, not by parsing a command line, and the values that
conversion gives are those `grtool` gives the command when it parses the stage's command line."""

from __future__ import annotations

import json

import msgspec
import pytest

from grtool.cli.commands import click_command, declared
from grtool.cli.stage_options import options_type, parameters, stage_values
from grtool.errors import InputError
from grtool.pipeline.config import load_pipeline
from grtool.cli.stages import CliCommands
from paths_helpers import REPO

STAGE_COMMANDS = sorted(words for words, command in declared().items() if command.stage)
EXAMPLES = ["examples/demo.toml", "examples/laptop.toml", "examples/slurm/own-data.toml"]


@pytest.mark.parametrize("words", STAGE_COMMANDS)
def test_every_stage_command_has_a_typed_bounded_options_struct(words):
    command = declared()[words]
    struct = options_type(command)
    assert issubclass(struct, msgspec.Struct)
    fields = {f.name: f for f in msgspec.structs.fields(struct)}
    clicked = {p.name for p in click_command(words).params}
    assert set(fields) == clicked  # every parameter Typer makes, and nothing else
    for p in parameters(command):
        if p.kind in (int, float) and p.low is not None and p.parser is None:
            with pytest.raises(msgspec.ValidationError):  # the option's own bound is the field's
                msgspec.convert({**_required(command), p.name: [p.low - 1] if p.many else p.low - 1}, struct)


def _required(command) -> dict:
    return {p.name: (["x"] if p.many else "x") for p in parameters(command) if p.required}


@pytest.mark.parametrize("example", EXAMPLES)
def test_converted_options_are_what_the_command_gets_from_its_command_line(example, monkeypatch):
    monkeypatch.chdir(REPO)
    pipeline = load_pipeline(example, commands=CliCommands())
    for stage in pipeline.stages:
        command = declared()[stage.run]
        words = len(stage.run.split())
        parsed = click_command(stage.run).make_context(f"grtool {stage.run}", stage.argv()[words:]).params
        converted = stage_values(command, stage.args, stage.options, stage.name).values
        assert converted == parsed, (stage.name, {k: (converted[k], parsed.get(k)) for k in converted if converted[k] != parsed.get(k)})


def test_the_pipeline_checks_options_without_a_command_line_parser(monkeypatch):
    # The plan's checks convert each stage's options to its command's Struct: no Click command is made for them.
    import grtool.cli.commands as commands
    from grtool.pipeline.runner import check_stage_arguments

    monkeypatch.chdir(REPO)
    pipeline = load_pipeline("examples/demo.toml", commands=CliCommands())

    def refused(run):
        raise AssertionError(f"a command line parser was made for {run}")

    monkeypatch.setattr(commands, "click_command", refused)
    check_stage_arguments(CliCommands(), pipeline, pipeline.stages, set())


def _refusal(run: str, args: list, options: dict) -> str:
    with pytest.raises(InputError) as refused:
        CliCommands().check_arguments(run, args, options, "p.toml: stage 's'")
    return str(refused.value)


@pytest.mark.parametrize(
    "run, args, options, words",
    [
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "max_docids": 0}, ["--max-docids '0'", "expected an integer of at least 1"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "min_recall": 1.5}, ["--min-recall '1.5'", "from 0 to 1"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "max_docids": 2.5}, ["--max-docids '2.5'", "expected an integer"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "min_recall": float("nan")}, ["--min-recall 'nan'", "expected a number from 0 to 1"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "redundant": "drop"}, ["--redundant: 'drop' is not one of 'reject', 'trim'"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "max_docid": 3}, ["has no option 'max_docid'", "did you mean 'max_docids'"]),
        ("filters apply", ["c", "d"], {"corpus": "q", "triples": "t", "out": "o"}, ["2 arguments", "takes 1 (CHAINS)", "'d' left over"]),
        ("filters apply", [], {"corpus": "q", "triples": "t", "out": "o"}, ["CHAINS is missing"]),
        ("corpus ingest", [], {"out": "o"}, ["INPUTS is missing"]),  # a required list of arguments, none given
        ("filters apply", ["c"], {"corpus": "q", "out": "o"}, ["--triples is missing"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "json": False}, ["option 'json': false", "--json is an on/off flag without an off form"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": ""}, ["--out is empty"]),
        ("retrieve", ["c"], {"out": "o", "backend": "nope"}, ["--backend: 'nope' is not one of"]),
        # an on/off flag said both ways: in two keys, or a key and a flag among the args (before: the last one won)
        ("export gmr", ["c"], {"out": "o", "memorization": True, "no_memorization": True}, ["--memorization is given both on and off", "memorization = true, no_memorization = true"]),
        ("export gmr", ["c", "--no-memorization"], {"out": "o", "memorization": True}, ["--memorization is given both on and off"]),
        # an option of one value given twice, or a list of values (before: the last won; [] was a traceback)
        ("export gmr", ["c", "--out=x1"], {"out": "x2"}, ["--out takes one value, and is given 2 ('x1', 'x2'"]),
        ("corpus stats", ["c"], {"plot": []}, ["--plot takes one value, not a list (0 given)"]),
        ("corpus stats", ["c"], {"plot": ["a.png", "b.png"]}, ["--plot takes one value"]),
        # a list or a table where text goes: shown as one, not as the quoted text of one
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "split": [["a"]]}, ["--split ['a']: expected text (a list of them)"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "rules": {"a": 1}}, ["--rules {'a': '1'}: expected text"]),
        ("filters apply", ["c"], {"corpus": "q", "triples": "t", "out": "o", "rules": float("nan")}, ["--rules 'nan': expected text"]),  # before: --rules nan
    ],
)  # fmt: skip
def test_a_value_the_command_refuses_is_one_line_naming_stage_and_option(run, args, options, words):
    message = _refusal(run, args, options)
    assert message.startswith("p.toml: stage 's'"), message
    for word in words:
        assert word in message, (word, message)


def test_values_are_taken_as_the_command_line_takes_them():
    values = stage_values(declared()["filters apply"], ["c"], {"corpus": "q", "triples": "t", "out": "o", "max_docids": "7", "split": "train", "rules": 5}, "s").values
    assert values["max_docids"] == 7 and values["split"] == ["train"] and values["rules"] == "5"  # text "7", one split, a number as text
    assert values["redundant"].value == "reject" and values["min_recall"] == 1.0  # defaults as the signature gives them
    assert str(values["out"]) == "o" and type(values["out"]).__name__.endswith("Path")


@pytest.mark.parametrize(
    "run, args, options",
    [
        ("filters apply", ["c", "--out", "o", "--json", "--split=train"], {"corpus": "q", "triples": "t", "split": ["dev"]}),
        ("chains gold", ["q", "t"], {"out": "o"}),  # the old spelling: TRIPLES as an argument
        ("corpus merge", ["a", "b", "-o", "m"], {}),
        ("corpus merge", ["a", "-om", "b"], {}),  # a short option's value attached
        # after `--` every word is an argument, a file named like an option too (before: refused)
        ("corpus merge", ["a", "--", "-o", "--json"], {"out": "m"}),
        ("filters apply", ["--", "--out"], {"corpus": "q", "triples": "t", "out": "o"}),
    ],
)
def test_options_written_among_the_args_are_taken_as_the_command_line_takes_them(run, args, options):
    from grtool.pipeline.config import Stage

    stage = Stage("s", run, args, options)
    words = len(run.split())
    parsed = click_command(run).make_context(f"grtool {run}", stage.argv()[words:]).params
    assert stage_values(declared()[run], args, options, "s").values == parsed


def test_set_drops_only_the_option_it_replaces_from_the_args():
    from grtool.cli.stage_options import args_without

    merge = declared()["corpus merge"]
    assert args_without(merge, ["a", "-om", "b", "--json"], "out") == ["a", "b", "--json"]
    assert args_without(merge, ["a", "--out", "m", "--", "--out", "x"], "out") == ["a", "--", "--out", "x"]  # after `--`: arguments
    assert args_without(merge, ["a", "--no-such", "--out=m"], "out") == ["a", "--no-such"]  # an unknown flag is the check's to refuse


@pytest.mark.parametrize("flags", [["--memorization", "--no-memorization"], ["--no-memorization", "--out", "o", "--memorization"]])
def test_an_option_given_twice_on_the_command_line_is_said(flags, tmp_path, samples):
    """Click keeps the last of ``--x --no-x`` (and of ``--out a --out b``) without a word. grtool keeps the last one
    too, as git and argparse do (a base command line and an override after it), and says so in a warning naming
    both: never silent."""
    from conftest import run_cli

    out = tmp_path / "g.jsonl"
    proc = run_cli("export", "gmr", samples["root"], *[str(out) if f == "o" else f for f in flags], *([] if "--out" in flags else ["--out", out]))
    last = flags[-1] if flags[-1].startswith("--") else next(f for f in reversed(flags) if "memorization" in f)
    assert f"are both given: the last one, {last}, is used" in proc.stderr, proc.stderr
    assert ("memorization pairs" in proc.stderr) and (json.loads(out.read_text().splitlines()[-1]) is not None)
    err = run_cli("export", "gmr", "c", "-o", "a.jsonl", "--out=b.jsonl", check=2).stderr
    assert "--out is given 2 times (-o 'a.jsonl', --out 'b.jsonl'): the last one is used" in err, err
    err = run_cli("export", "gmr", "c", "-oa.jsonl", "--out", "b.jsonl", check=2).stderr  # a short option's value attached
    assert "--out is given 2 times (-o 'a.jsonl', --out 'b.jsonl')" in err, err
    assert "Usage:" in run_cli("export", "gmr", "c", "--out", "a", "--out", "b", "--help").stdout  # help is help
    err = run_cli("export", "sft", "c", "--corpus", "s", "--out", "a", "--out", "b", "--system", "-h", check=2).stderr  # -h as a value
    assert "--out is given 2 times" in err, err
    # a flag repeated the same way, and a text value that looks like the other form, are no conflict
    assert "given" not in run_cli("export", "gmr", "c", "--out", "o", "--no-memorization", "--no-memorization", check=2).stderr
    assert "both given" not in run_cli("export", "sft", "c", "--out", "o", "--system", "--no-all-candidates", "--all-candidates", check=2).stderr
