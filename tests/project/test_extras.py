"""The base install: the data commands import none of the extras' packages, and a command whose extra is
missing stops with the pip line of that extra before it creates anything (`make check-light` proves both on a
real base install in a fresh venv; these run in the full test install)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from grtool import extras
from grtool.errors import EXIT_USAGE, MissingDependency

from conftest import REPO, TEST_DATA

HEAVY = ("torch", "transformers", "spacy", "matplotlib", "vllm", "trl", "peft", "accelerate", "gguf")

# Runs the base commands in one process (a new tokenizer cache: the built-in conversion runs; the triples come on
# stdin), then lists the heavy modules that got imported.
_BASE_COMMANDS = """
import json, sys
from grtool.cli.main import app
hotpot, out = sys.argv[1:3]
for argv in (["corpus", "ingest", hotpot, "--out", out + "/hotpot"], ["corpus", "stats", out + "/hotpot", "--json"],
             ["validate", out + "/hotpot"], ["index", "build", "-", "--tokenizer", "llama3", "--out", out + "/index"],
             ["index", "query", out + "/index", "Old Harbor Bridge,"]):
    code = app(["-q", *argv], standalone_mode=False)
    assert code in (None, 0), (argv, code)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
""" % (HEAVY,)


def test_the_base_commands_import_no_extra(tmp_path, examples):
    proc = subprocess.run(
        [sys.executable, "-c", _BASE_COMMANDS, str(examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"), str(tmp_path / "out")],
        input=(TEST_DATA / "index_triples.jsonl").read_text(), capture_output=True, text=True,
        env={**os.environ, "GRTOOL_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == []
    assert (tmp_path / "out" / "index" / "index.json").is_file()


def test_the_message_names_the_extra():
    e = MissingDependency("--plot", ["matplotlib"], extra="plot")
    assert str(e) == "--plot needs the PyPI package matplotlib, which is not installed; install it with: pip install 'grtool[plot]'"
    assert e.exit_code == EXIT_USAGE
    two = MissingDependency("--backend transformers", ["torch", "transformers"], extra="llm")
    assert "the PyPI packages torch, transformers, which are not installed" in str(two)


@pytest.fixture
def without(monkeypatch):
    """Make an extra look uninstalled: its table entry names a module that does not exist."""

    def hide(extra: str) -> None:
        monkeypatch.setitem(extras.EXTRAS, extra, (("grtool_no_such_module", f"{extra}-package"),))

    return hide


def _run(argv: list[str]) -> MissingDependency:
    from grtool.cli.main import app

    with pytest.raises(MissingDependency) as info:
        app(argv, standalone_mode=False)
    return info.value


@pytest.mark.parametrize(
    ("extra", "argv", "output"),
    [
        ("plot", ["corpus", "stats", "{run}", "--plot", "{tmp}/stats.png"], "stats.png"),
        ("llm", ["triples", "extract", "{run}", "--out", "{tmp}/triples"], "triples"),
        ("vllm", ["triples", "extract", "{run}", "--backend", "vllm", "--out", "{tmp}/triples"], "triples"),
        ("entities", ["chains", "synthesize", "{run}", "--triples", "{tmp}/t", "--backend", "openai", "--no-constrain", "--out", "{tmp}/chains"], "chains"),
        ("llm", ["retrieve", "{run}", "--index", "{tmp}/index", "--out", "{tmp}/responses"], "responses"),
    ],
)
def test_a_missing_extra_stops_the_command_first(tmp_path, without, extra, argv, output):
    run = tmp_path / "run"  # never read: the check comes before the inputs
    without(extra)
    e = _run([a.format(run=run, tmp=tmp_path) for a in argv])
    assert f"install it with: pip install 'grtool[{extra}]'" in str(e) and e.extra == extra
    assert not (tmp_path / output).exists()


def test_training_needs_the_train_extra(tmp_path, without):
    data = tmp_path / "sft.json"
    data.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]))
    without("train")
    e = _run(["train", "sft", str(data), "--out", str(tmp_path / "ckpt"), "--per-device-batch-size", "1"])
    assert "pip install 'grtool[train]'" in str(e) and not (tmp_path / "ckpt").exists()


def test_a_pipeline_checks_every_stage_before_the_first_runs(tmp_path, without, examples, write_pipeline):
    config = write_pipeline([
        {"name": "ingest", "run": "corpus ingest", "args": [examples / "musique" / "musique_ans_v1.0_dev.example.jsonl"], "options": {"out": "{out}/ingest"}},
        {"name": "stats", "run": "corpus stats", "args": ["{out}/ingest"], "options": {"plot": "{out}/stats.png"}},
    ], out=tmp_path / "out")  # fmt: skip
    without("plot")
    e = _run(["pipeline", "run", str(config)])
    assert "stage 'stats': --plot needs" in str(e) and "pip install 'grtool[plot]'" in str(e)
    assert not (tmp_path / "out").exists()


def test_command_extras_of_the_demo():
    from grtool.cli.stages import CliCommands
    from grtool.pipeline.config import load_pipeline

    commands = CliCommands()
    stages = load_pipeline(REPO / "examples" / "demo.toml", None, commands).stages
    needs = {(s.name, extra) for s in stages for extra, _ in commands.extras(s.run, s.args, s.options)}
    assert {("stats", "plot"), ("triples", "llm"), ("chains", "llm"), ("chains", "entities"), ("index", "llm"), ("train-sft", "train"),
            ("retrieve-base", "llm"), ("recall-table", "plot"), ("retrieve-bm25", "bm25")} <= needs  # fmt: skip
    assert not {n for n, _ in needs} & {"ingest-hotpotqa", "merge", "filters", "export-sft", "index-sft", "recall-base", "recall-bm25"}
    assert ("retrieve-bm25", "llm") not in needs  # no model: the LLM extra is not asked for


def _declared_extras() -> dict[str, set[str]]:
    """pyproject.toml's extras, each as the set of package names it brings (nested grtool[...] extras expanded)."""
    import re
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        out: set[str] = set()
        for requirement in declared[extra]:
            nested = re.fullmatch(r"grtool\[([^\]]+)\]", requirement)
            if nested:
                for inner in nested.group(1).split(","):
                    out |= names(inner.strip())
            else:
                out.add(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-"))
        return out

    return {extra: names(extra) for extra in declared}


def test_every_package_an_extra_checks_for_is_declared_in_that_extra():
    """A module `require` looks for but the extra does not install passes here (the test install has it) and
    fails on a user's plain install: bm25s does not bring scipy, and the demo stopped on it."""
    declared = _declared_extras()
    for extra, pairs in extras.EXTRAS.items():
        wanted = {package.lower() for _module, package in pairs}
        assert wanted <= declared[extra], f"[{extra}] checks for {sorted(wanted - declared[extra])} but does not install them"
        if extra != "vllm":  # the CPU demo runs every extra but the GPU build of vLLM
            assert declared[extra] <= declared["demo"], f"the demo extra lacks [{extra}]"
