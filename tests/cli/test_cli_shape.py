"""One CLI shape (#38): the input rule and its deprecated spellings, one metavar style in --help, tables that fit a
100-column terminal, messages without Python reprs, and `grtool status RUN` listing everything a run holds.

The run is real and model-free (tests/report_helpers.py: the 2Wiki sample, its evidence triples, a pipeline of
`chains gold`, the filters, the SFT export, recall and its comparison), plus an index built with a small tokenizer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from report_helpers import build_run

from grtool.store.stage import read_table

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")  # what starts each line without a terminal
BOX = re.compile("[│┃┏┡└┌├╭╰]")  # a line of a Rich table or panel
REPRS = re.compile(r"\{'|None,|\(None|\[\('|\['|': ")  # dicts, tuples, lists and None as Python prints them
WIDE = {"COLUMNS": "100"}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("shape")
    out = build_run(root)
    # a word-level tokenizer over the triples' own words: docids tokenize without unknown tokens
    words = {w for d in read_table(out / "triples", ["docid"]).column("docid").to_pylist() for w in re.findall(r"\w+|[^\w\s]", d)}
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(sorted(words) + ["[UNK]"])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(root / "tokenizer.json"))
    run_cli("-q", "index", "build", out / "triples", "--tokenizer", root / "tokenizer.json", "--kind", "numpy", "--out", out / "index")
    return out


def _lines(proc) -> list[str]:
    return [TIMESTAMP.sub("", line) for line in (proc.stdout + proc.stderr).splitlines()]


# ------------------------------------------------------------------------------------------------ the input rule


def test_the_old_positional_spelling_warns_once_and_writes_the_same_rows(run: Path, tmp_path: Path) -> None:
    corpus, triples = run / "corpus", run / "triples"
    new = run_cli("chains", "gold", corpus, "--triples", triples, "--out", tmp_path / "new")
    old = run_cli("chains", "gold", corpus, triples, "--out", tmp_path / "old")
    assert "deprecated" not in new.stderr
    warnings = [line for line in old.stderr.splitlines() if "deprecated" in line]
    assert len(warnings) == 1 and f"--triples {triples}" in warnings[0] and "chains gold" in warnings[0]
    columns = ["qid", "text", "docids", "flipped"]
    assert read_table(tmp_path / "old", columns).to_pylist() == read_table(tmp_path / "new", columns).to_pylist()
    # both spellings at once, or neither: usage errors
    assert run_cli("chains", "gold", corpus, triples, "--triples", triples, "--out", tmp_path / "x", check=2).returncode == 2
    assert "--triples" in run_cli("chains", "gold", corpus, "--out", tmp_path / "x", check=2).stderr


def test_a_pipeline_stage_in_the_old_spelling_runs_with_one_warning(run: Path, tmp_path: Path) -> None:
    toml = tmp_path / "old.toml"
    toml.write_text(f'out = "{tmp_path}"\n\n[[stages]]\nname = "chains"\nrun = "chains gold"\n'
                    f'args = ["{run / "corpus"}", "{run / "triples"}"]\noptions = {{ out = "{{out}}/chains" }}\n')  # fmt: skip
    proc = run_cli("pipeline", "run", toml, process=True)  # a warning said once per process
    assert sum("deprecated" in line for line in proc.stderr.splitlines()) == 1  # checked, then run: warned once
    assert read_table(tmp_path / "chains").num_rows > 0


def test_every_command_takes_at_most_one_input_as_an_argument() -> None:
    """The rule: the main input positional, every other input a named option (index query's TEXT is no input)."""
    from grtool.cli.reference import commands

    for words, cmd in commands():
        arguments = [p.name for p in cmd.params if type(p).__name__.endswith("Argument") and p.name != "text"]
        assert len(arguments) <= 1, (words, arguments)
        for name in ("corpus", "triples", "index"):
            options = [p for p in cmd.params if p.name == name and not type(p).__name__.endswith("Argument")]
            assert all(f"--{name}" in p.opts for p in options), (words, name)


def test_the_rule_is_written_in_the_command_reference() -> None:
    from grtool.cli.shape import INPUT_RULE

    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert INPUT_RULE.lower() in " ".join(page.replace("**", "").replace("`", "").split()).lower()


# ----------------------------------------------------------------------------------------------------- --help


def test_help_has_one_metavar_style_and_says_what_out_writes() -> None:
    from typer.testing import CliRunner

    from grtool.cli.main import app
    from grtool.cli.reference import commands

    runner = CliRunner()
    for words, cmd in commands():
        text = runner.invoke(app, [*words, "--help"], env=WIDE, terminal_width=100).output
        usage = next(line for line in text.splitlines() if "Usage:" in line)
        assert "{" not in usage and "<" not in usage, (words, usage)  # CORPUS, not {corpus}
        table = "".join(line for line in text.splitlines() if BOX.search(line))
        for wrong in ("<bool>", "<str>", "<path>", "<int", "<float", "<list"):
            assert wrong not in table, (words, wrong)
        for p in cmd.params:
            if getattr(p, "is_flag", False):
                assert p.display_type_rich(None) is None, (words, p.name)  # a flag shows no metavar
            if "--out" in getattr(p, "opts", []):
                assert "to write" in p.help, (words, p.help)
    assert "Stage directory to write" in runner.invoke(app, ["filters", "apply", "--help"], env=WIDE, terminal_width=100).output
    assert "Run directory to write" in runner.invoke(app, ["corpus", "ingest", "--help"], env=WIDE, terminal_width=100).output


# ------------------------------------------------------------------------------------- tables and messages


def test_tables_fit_100_columns_and_messages_hold_no_python_reprs(run: Path) -> None:
    responses = run.parent / "responses"
    lines = {}
    for args in (
        ["status", run], ["status", run / "chains"], ["validate", run], ["corpus", "stats", run / "corpus"],
        ["corpus", "overlap", run / "corpus"], ["triples", "collisions", run / "triples"], ["index", "stats", run / "index"],
        ["eval", "recall", responses / "gold.jsonl", "--corpus", run / "corpus", "--triples", run / "triples"],
        ["eval", "compare", f"gold={run}/reports/recall-gold.json", f"first={run}/reports/recall-first.json"],
        ["pipeline", "status", run], ["pipeline", "run", run.parent / "run.toml", "--dry-run"],
        ["chains", "gold", run / "corpus", "--triples", run / "triples", "--out", run.parent / "again"],
    ):  # fmt: skip
        lines[" ".join(map(str, args[:2]))] = _lines(run_cli(*args, env=WIDE, check=False))
    for name, text in lines.items():
        assert text, name
        too_wide = [line for line in text if BOX.search(line) and len(line) > 100]
        assert not too_wide, (name, too_wide)
        reprs = [line for line in text if REPRS.search(line)]
        assert not reprs, (name, reprs)
    assert any("15 questions chained, rejected: none" in line for line in lines["chains gold"]), lines["chains gold"]  # every evidence matches its title
    stats = lines["index stats"]  # a nested value: one key a line
    assert any("core_seconds: " in line for line in stats) and not any("core_seconds" in line and "read_seconds" in line for line in stats)


def test_validate_names_a_stage_without_manifest_without_none(tmp_path: Path, run: Path) -> None:
    folder = tmp_path / "orphan"
    folder.mkdir()
    (folder / "part-00000.parquet").write_bytes((run / "triples" / "part-00000.parquet").read_bytes())
    text = "\n".join(_lines(run_cli("validate", folder, check=1)))
    assert "None" not in text and "0 shards" in text


# --------------------------------------------------------------------------------------------------- status RUN


def test_status_of_a_run_lists_indexes_exports_and_the_pipelines_stages(run: Path) -> None:
    text = "\n".join(_lines(run_cli("status", run, env=WIDE)))
    for title in ("stage status", "indexes", "exports", "pipeline stages"):
        assert re.search(rf"^{title}$", text, re.M), title
    assert re.search(r"│ index\s+│ numpy\s+│ docids", text)
    assert re.search(r"│ export/sft\.json\s+│ sft\s+│ llamafactory-sharegpt", text)
    finished = {json.loads(p.read_text())["stage"] for p in (run / "_pipeline").glob("*.json")}
    assert finished and all(re.search(rf"│ {re.escape(name)}\s+│ done\s+│ 20\d\d-", text) for name in finished)
    assert re.search(r"│ filtered\s+│ chains", text)  # stage paths relative to the run


@pytest.mark.slow
def test_status_of_a_run_lists_its_checkpoints(sft_checkpoint: Path, tmp_path: Path) -> None:
    """The session's real training run (tests/conftest.py: 4 steps, its checkpoint-4 kept), its files linked."""
    import os
    import shutil

    shutil.copytree(sft_checkpoint, tmp_path / "ckpt", copy_function=os.symlink)  # status walks real folders only
    text = "\n".join(_lines(run_cli("status", tmp_path, env=WIDE, check=False)))
    assert re.search(r"^checkpoints$", text, re.M)
    assert re.search(r"│ ckpt\s+│ train sft\s+│ 4\s+│ finished 20\d\d-.*│ checkpoint-4", text)


def test_pipeline_status_wider_than_the_terminal_prints_a_block_per_stage(run: Path) -> None:
    plain = run_cli("pipeline", "status", run, env=WIDE).stdout.splitlines()
    assert plain[0].split()[:2] == ["stage", "state"] and all(len(line) <= 100 for line in plain)
    narrow = run_cli("pipeline", "status", run, env={"COLUMNS": "50"}).stdout.splitlines()
    assert all(len(line) <= 50 for line in narrow)
    stages = [line for line in narrow if not line.startswith(" ")]
    assert stages == [line.split()[0] for line in plain[1:]]  # the same stages, in the same order
    assert narrow[1] == "  state: done" and narrow[2].startswith("  finished: 20")


def test_train_dry_run_spells_its_configuration_as_the_config_file_does(run: Path, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    text = _lines(run_cli("train", "sft", run / "export" / "sft.json", "--out", tmp_path / "ckpt", "--dry-run"))
    config = [line.strip() for line in text if line.startswith("  ")]
    assert "packing: false" in config and "deepspeed: null" in config
    assert not [line for line in text if re.search(r": (None|True|False)$", line)]
