"""`grtool pipeline run` safety: the file is checked against its schema before any stage runs (exit 2, one line
naming file, stage and key), and a failing stage keeps the report its `stdout` wrote before."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from log_helpers import unstamped

MUSIQUE = "musique/musique_ans_v1.0_dev.example.jsonl"


def _pipeline(tmp_path, examples, stats: str) -> str:
    """An ingest stage (cheap, real) then a `corpus stats` stage whose TOML lines are ``stats``."""
    path = tmp_path / "pipe.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            out = "{tmp_path / 'run'}"

            [[stages]]
            name = "ingest"
            run = "corpus ingest"
            args = ["{examples / MUSIQUE}"]
            options = {{ out = "{{out}}/ingest" }}

            [[stages]]
            name = "stats"
            run = "corpus stats"
            """
        )
        + textwrap.dedent(stats)
    )
    return str(path)


def _refused(cli, config, *words, tmp_path) -> str:
    """The run exits 2 with one line naming the file and ``words``, no traceback, and no stage ran."""
    proc = cli("pipeline", "run", config, check=2)
    lines = unstamped(proc.stderr.strip())
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in (config, *words):
        assert word in " ".join(proc.stderr.split()), (word, proc.stderr)
    assert not (tmp_path / "run").exists()  # checked before the first stage ran
    return lines[0]


def _load_error(tmp_path, examples, stats: str, overrides: list[str] | None = None) -> str:
    """The same check in-process (the variants; the CLI's exit code and line are tested once per kind)."""
    from grtool.errors import InputError
    from grtool.pipeline.config import load_pipeline

    with pytest.raises(InputError) as error:
        load_pipeline(_pipeline(tmp_path, examples, stats), overrides)
    return str(error.value)


def test_a_wrong_type_names_stage_and_key(tmp_path, examples, cli):
    # before: AttributeError ('str' object has no attribute 'items') once the stage came to run, after ingest ran
    _refused(cli, _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = "json"\n'), "stage 'stats'", "key 'options'", "got a string", tmp_path=tmp_path)
    for stats, words in [
        # before: an inline table became the option's text "{'a': 1}"
        ('args = ["{out}/ingest"]\noptions = { json = true, plot = { a = 1 } }\n', ["stage 'stats'", "option 'plot'", "got a table"]),
        ('args = ["{out}/ingest", 3]\n', ["stage 'stats'", "key 'args', item 2", "got an integer"]),
        ('args = ["{out}/ingest"]\nstdout = 1\n', ["stage 'stats'", "key 'stdout'", "got an integer"]),
        ('args = ["{out}/ingest"]\n[[stages]]\nname = 3\nrun = "x"\n', ["stage 3", "key 'name'", "got an integer"]),
    ]:
        message = _load_error(tmp_path, examples, stats)
        assert all(w in message for w in words), (words, message)


def test_string_args_are_an_error_not_characters(tmp_path, examples, cli):
    config = _pipeline(tmp_path, examples, 'args = "{out}/ingest"\n')
    line = _refused(cli, config, "stage 'stats'", "key 'args'", "got a string", 'args = ["a", "b"]', tmp_path=tmp_path)
    assert "'/'" not in line  # before: one argument per character ('/', 't', 'm', 'p', ...)
    assert cli("pipeline", "run", config, "--dry-run", check=2).stderr.count("\n") == 1  # the plan refuses it too


def test_only_out_is_a_placeholder(tmp_path, examples, cli):
    """Python format fields are not expanded (before: `{out.__class__}` became "<class 'str'>")."""
    stats = 'args = ["{out}/ingest"]\noptions = { json = true, plot = "%s" }\n'
    line = _refused(cli, _pipeline(tmp_path, examples, stats % "{out.__class__}"), "stage 'stats'", "option 'plot'", "{out.__class__}", tmp_path=tmp_path)
    assert "{{" in line  # says how to write a literal brace
    for value in ["{out:>40}", "{0}", "{outt}/x", "{out!r}", "a}b", "{"]:
        message = _load_error(tmp_path, examples, stats % value)
        assert "stage 'stats', option 'plot'" in message and "{{" in message, message
        message = _load_error(tmp_path, examples, 'args = ["{out}/ingest"]\n', [f"stats.plot={value}"])
        assert "--set 'stats.plot=" in message and "{{" in message, message


def test_doubled_braces_are_literal(tmp_path, examples, cli):
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = { plot = "{{out}}-{out}.png" }\n')
    assert f"--plot '{{out}}-{tmp_path / 'run'}.png'" in cli("pipeline", "run", config, "--dry-run").stdout


@pytest.mark.parametrize(
    "stats, words",
    [
        ('args = ["{out}/ingest"]\noptons = { json = true }\n', ["stage 'stats'", "unknown key 'optons'", "did you mean 'options'"]),
        ('args = ["{out}/ingest"]\n[stages.options]\njson = true\n[[stage]]\nname = "x"\n', ["top level", "unknown key 'stage'", "did you mean 'stages'"]),
    ],
)
def test_an_unknown_key_names_stage_and_key(tmp_path, examples, cli, stats, words):
    _refused(cli, _pipeline(tmp_path, examples, stats), *words, tmp_path=tmp_path)


def test_the_demo_file_passes_the_schema(cli):
    from conftest import REPO

    from grtool.pipeline.config import load_pipeline

    pipeline = load_pipeline(REPO / "examples" / "demo.toml")
    assert len(pipeline.stages) > 20 and all("{" not in " ".join(s.argv()) for s in pipeline.stages)


def test_a_failing_stage_keeps_its_earlier_report(tmp_path, examples, cli):
    """`stdout = FILE` goes to a temporary file renamed on success: a failed rerun leaves FILE as it was."""
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = { json = true }\nstdout = "{out}/reports/stats.json"\n')
    cli("pipeline", "run", config)
    report = tmp_path / "run" / "reports" / "stats.json"
    before = report.read_bytes()
    assert json.loads(before)
    shutil.rmtree(tmp_path / "run" / "ingest")  # the stats stage's input is gone: it runs again and fails
    proc = cli("pipeline", "run", config, "--from", "stats", check=False)
    assert proc.returncode != 0 and "stats" in proc.stderr
    assert report.read_bytes() == before  # before: emptied when the stage started
    assert sorted(p.name for p in report.parent.iterdir()) == ["stats.json"]  # no temporary file left behind
