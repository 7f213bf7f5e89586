"""The recipe teaches splits (#48): in every example pipeline file and every shell block of the README and docs/, a
step that makes training data (chains synthesize / gold, filters apply, export sft / kto) reads train questions only
(`--split train`), and a `train` step trains on data that a step of the same file wrote from `--split train`. A
recipe copied as written then never trains on the questions it is scored on (docs/splits.md)."""

from __future__ import annotations

import re
import shlex

from docs_helpers import DOCS, REPO, grtool_lines, pipeline_files

MAKES_TRAINING_DATA = {("chains", "synthesize"), ("chains", "gold"), ("filters", "apply"), ("export", "sft"), ("export", "kto")}
TRAINS = {("train", "sft"), ("train", "kto")}


def _has_train_split(argv: list[str]) -> bool:
    return any(a == "--split=train" or (a == "--split" and b == "train") for a, b in zip(argv, [*argv[1:], ""]))


def _option(argv: list[str], *names: str) -> str | None:
    return next((b for a, b in zip(argv, [*argv[1:], ""]) if a in names), None)


def split_problems(commands: list[list[str]]) -> list[str]:
    """What breaks the rule among one file's grtool commands (each without the leading ``grtool``)."""
    trained_on = {_option(argv, "--out", "-o") for argv in commands if _has_train_split(argv)}
    problems = []
    for argv in commands:
        kind = tuple(argv[:2])
        line = shlex.join(["grtool", *argv])
        if kind in MAKES_TRAINING_DATA and not _has_train_split(argv):
            problems.append(f"{line}: training data without --split train")
        if kind in TRAINS and (len(argv) < 3 or argv[2] not in trained_on):
            problems.append(f"{line}: trains on data that no step of this file writes with --split train")
    return problems


def _documented_commands() -> dict[str, list[list[str]]]:
    """Each page's grtool commands, and the examples of every command's help (docs/reference/cli.md is generated
    from that help: its examples are checked at their source)."""
    from grtool.cli.reference import render_markdown

    found = {}
    for path in DOCS:
        lines = grtool_lines(path.read_text(encoding="utf-8"))
        found[str(path.relative_to(REPO))] = [shlex.split(line)[1:] for line in lines]
    found["docs/reference/cli.md"] = [*found.get("docs/reference/cli.md", []), *(shlex.split(m)[1:] for m in re.findall(r"Example: (grtool .*)", render_markdown()))]
    return found


def test_every_training_step_of_the_docs_reads_train_questions_only():
    documented = _documented_commands()
    assert any(argv[:2] == ["train", "sft"] for commands in documented.values() for argv in commands)
    problems = [f"{where}: {p}" for where, commands in documented.items() for p in split_problems(commands)]
    assert not problems, "\n".join(problems)


def test_every_training_stage_of_the_example_pipelines_reads_train_questions_only(tmp_path):
    from grtool.pipeline.config import load_pipeline

    files = pipeline_files(tmp_path)
    assert {"examples/laptop.toml", "examples/demo.toml", "examples/slurm/recipe.toml"} <= {where for where, _ in files}
    problems = []
    for where, path in files:
        problems += [f"{where}: {p}" for p in split_problems([stage.argv() for stage in load_pipeline(path).stages])]
    assert not problems, "\n".join(problems)


def test_the_rule_catches_a_step_without_the_split():
    ok = [["filters", "apply", "c", "--split", "train", "--out", "f"], ["export", "sft", "f", "--split=train", "--out", "s.json"], ["train", "sft", "s.json", "--out", "ckpt"]]
    assert split_problems(ok) == []
    assert split_problems([["chains", "synthesize", "corpus", "--out", "c"]]) == ["grtool chains synthesize corpus --out c: training data without --split train"]
    assert "trains on data that no step" in split_problems([["train", "kto", "k.json", "--out", "ckpt"]])[0]
