"""`grtool pipeline run` safety: the file is checked against its schema before any stage runs (exit 2, one line
naming file, stage and key), and a failing stage keeps the report its `stdout` wrote before."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from log_helpers import unstamped

MUSIQUE = "musique/musique_ans_v1.0_dev.example.jsonl"


def _pipeline(tmp_path, examples, stats: str) -> str:
    """An ingest stage (cheap, real) then a `corpus stats` stage whose TOML lines are ``stats``."""
    path = tmp_path / "pipe.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            out = "{tmp_path / "run"}"

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
    recorded = json.loads((report.parent / ".stats.json.grtool-file.json").read_text())["command"]
    assert recorded[:3] == ["grtool", "corpus", "stats"]  # the stage's own command line, not `grtool pipeline run`
    shutil.rmtree(tmp_path / "run" / "ingest")  # the stats stage's input is gone: it runs again and fails
    proc = cli("pipeline", "run", config, "--from", "stats", check=False)
    assert proc.returncode != 0 and "stats" in proc.stderr
    assert report.read_bytes() == before  # before: emptied when the stage started
    assert sorted(p.name for p in report.parent.iterdir()) == [".stats.json.grtool-file.json", "stats.json"]  # its record; no temporary file left behind
    report.unlink()  # removed: validate's advice runs the stage's command into the file again
    err = " ".join(cli("validate", report, check=1).stderr.split())
    assert f"removed, or a run stopped before its file was in place: run grtool corpus stats {tmp_path / 'run' / 'ingest'} --json > {report} again" in err, err


def _dry_run_refused(cli, config, *args) -> str:
    """The dry run exits 2 with one line (no traceback) and returns it."""
    proc = cli("pipeline", "run", config, "--dry-run", *args, check=2)
    lines = unstamped(proc.stderr.strip())
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_a_var_named_out_is_refused_naming_both(tmp_path, examples, cli):
    # before: [vars] out replaced {out} in every stage, while the plan's summary still named the top-level out (exit 0)
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\n')
    text = open(config).read()
    with open(config, "w") as f:
        f.write(text.replace("\n[[stages]]", f'\n[vars]\nout = "{tmp_path / "elsewhere"}"\n\n[[stages]]', 1))
    line = _dry_run_refused(cli, config)
    assert "[vars] 'out'" in line and str(tmp_path / "elsewhere") in line and str(tmp_path / "run") in line, line
    assert not (tmp_path / "elsewhere").exists()


def test_a_stdout_file_through_a_missing_folder_is_refused_at_the_dry_run(tmp_path, examples, cli):
    # before: the dry run passed, ingest ran, then the stats stage refused its stdout
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = { json = true }\nstdout = "{out}/nodir/../stats.json"\n')
    line = _dry_run_refused(cli, config)
    assert "stdout" in line and "nodir does not exist, so the '..' after it names no folder" in line, line


def test_a_var_holding_a_placeholder_is_refused(tmp_path, examples, cli):
    # before: {out} stayed "{out}" in the path, and the stage said "{out}/ingest does not exist"
    config = _pipeline(tmp_path, examples, 'args = ["{data}"]\n')
    text = open(config).read()
    with open(config, "w") as f:
        f.write(text.replace("\n[[stages]]", '\n[vars]\ndata = "{out}/ingest"\n\n[[stages]]', 1))
    line = _dry_run_refused(cli, config)
    assert "[vars] 'data' ('{out}/ingest') holds the placeholder {out}" in line, line
    with open(config, "w") as f:  # nan is TOML's word for no number (before: `--split nan`)
        f.write(text.replace("\n[[stages]]", "\n[vars]\ndata = nan\n\n[[stages]]", 1))
    assert "[vars] 'data': nan, but a var is text" in _dry_run_refused(cli, config)


@pytest.mark.parametrize(
    "options, words",
    [
        # before: `--split` took the next option as its value (`--split --strict`: split "--strict", exit 0)
        ("options = { split = true, strict = true }", ["stage 'ingest'", "option 'split'", "true is not a value of --split"]),
        ("options = { split = false }", ["stage 'ingest'", "option 'split'", "false is not a value"]),
        # before: `--split ''` passed the dry run
        ('options = { split = "" }', ["stage 'ingest'", "option 'split'", "'' is empty"]),
        ('options = { split = "  " }', ["stage 'ingest'", "option 'split'", "is empty"]),
        ("options = { rows_per_part = true }", ["stage 'ingest'", "option 'rows_per_part'", "true is not a value"]),
    ],
)
def test_boolean_or_empty_values_of_text_options_are_refused(tmp_path, examples, cli, options, words):
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\n')
    text = open(config).read().replace('options = { out = "{out}/ingest" }', options.replace("{ ", '{ out = "{out}/ingest", '))
    with open(config, "w") as f:
        f.write(text)
    line = _dry_run_refused(cli, config)
    assert all(w in line for w in [config, *words]), (words, line)


def test_an_empty_or_boolean_set_value_is_refused(tmp_path, examples, cli):
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\n')
    # blamed on the --set that gave it, not on the file (before: "pipe.toml: stage 'stats', option 'plot'"), a choice or
    # a bound the command refuses too, and a var
    assert _dry_run_refused(cli, config, "--set", "ingest.dataset=bogus").startswith("error: --set 'ingest.dataset=bogus' (")
    assert _dry_run_refused(cli, config, "--set", "ingest.rows_per_part=0").startswith("error: --set 'ingest.rows_per_part=0' (")
    assert "--rows-per-part 16" in cli("pipeline", "run", config, "--dry-run", "--set", "ingest.rows_per_part=0x10").stdout  # an integer as TOML reads it
    assert "error: --set 'stats.plot=': '' is empty" in _dry_run_refused(cli, config, "--set", "stats.plot=")
    assert "error: --set 'stats.plot=true': true is not a value of --plot" in _dry_run_refused(cli, config, "--set", "stats.plot=true")
    # a flag still takes true or false, and a value option its value
    assert "--split dev" in cli("pipeline", "run", config, "--dry-run", "--set", "ingest.split=dev", "--set", "stats.json=true").stdout


def test_an_unknown_set_option_suggests_the_stages_options(tmp_path, examples, cli):
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\n')
    # before: Click's "No such option: --rows-per-prt", without the stage's options
    line = _dry_run_refused(cli, config, "--set", "ingest.rows_per_prt=5")
    assert "--set 'ingest.rows_per_prt=5'" in line and "no option 'rows_per_prt'" in line and "did you mean 'rows_per_part'?" in line, line
    assert "its options: out, dataset, split, strict, overwrite, rows_per_part" in line, line
    line = _dry_run_refused(cli, config, "--set", "ingest.nosuch=x")
    assert "did you mean" not in line and "its options: out, dataset" in line, line
    line = _dry_run_refused(cli, config, "--set", "ingest.dataset=musique", "--set", "ingest.outt=x")
    assert "no option 'outt' (did you mean 'out'?)" in line, line


WIKI = "2wikimultihopqa/dev.example.json"


@pytest.mark.parametrize(
    "bad, words",
    [
        # a stage directory of another table: before, refused only when export-sft started
        ({"name": "bad", "run": "export sft", "args": ["{out}/gold"], "options": {"corpus": "{out}/gold", "out": "{out}/sft2.json"}},
         ["stage 'bad', --corpus", "stage 'gold' writes a stage directory of table 'chains' there", "reads 'questions'"]),
        # a run directory that gets no stage of the table: before, refused only when filters started
        ({"name": "bad", "run": "filters apply", "args": ["{out}/evidence"], "options": {"corpus": "{out}/ingest", "triples": "{out}/evidence", "out": "{out}/filtered"}},
         ["stage 'bad', argument CHAINS", "no stage before this one writes a stage directory of table 'chains' there", "triples/ (triples, stage 'evidence')"]),
        # a directory made outside the pipeline, checked on disk as the command checks it
        ({"name": "bad", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "OUTSIDE", "out": "{out}/gold2"}},
         ["stage 'bad', --triples", "outside/triples", "no 'triples' stage directory here"]),
    ],
)  # fmt: skip
def test_a_stage_reading_a_table_that_is_not_there_is_refused_before_any_stage_runs(tmp_path, examples, cli, write_pipeline, bad, words):
    outside = tmp_path / "outside"
    cli("corpus", "ingest", str(examples / MUSIQUE), "--out", str(outside))
    stages = [
        {"name": "ingest", "run": "corpus ingest", "args": [str(examples / WIKI)], "options": {"out": "{out}/ingest"}},
        {"name": "evidence", "run": "triples evidence", "args": ["{out}/ingest"], "options": {"out": "{out}/evidence"}},
        {"name": "gold", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "{out}/evidence", "out": "{out}/gold"}},
        {"name": "sft", "run": "export sft", "args": ["{out}/gold"], "options": {"corpus": "{out}/ingest", "out": "{out}/sft.json"}},
    ]
    assert cli("pipeline", "run", str(write_pipeline(stages, out=str(tmp_path / "run"))), "--dry-run").returncode == 0  # rightly wired
    bad = json.loads(json.dumps(bad).replace("OUTSIDE", str(outside)))
    line = _refused(cli, str(write_pipeline([*stages, bad], out=str(tmp_path / "run"))), *words, tmp_path=tmp_path)
    assert "Traceback" not in line


def _wired(examples, *stages: dict) -> list[dict]:
    """2Wiki ingested to {out}/ingest and its evidence triples to {out}/evidence, then ``stages``."""
    return [
        {"name": "ingest", "run": "corpus ingest", "args": [str(examples / WIKI)], "options": {"out": "{out}/ingest"}},
        {"name": "evidence", "run": "triples evidence", "args": ["{out}/ingest"], "options": {"out": "{out}/evidence"}},
        *stages,
    ]


@pytest.mark.parametrize(
    "stages, words",
    [
        # a run directory inside a run directory is not a stage of the table it is named after
        ([{"name": "nested", "run": "triples evidence", "args": ["{out}/ingest"], "options": {"out": "{out}/ingest/triples"}},
          {"name": "gold", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "{out}/ingest", "out": "{out}/gold"}}],
         ["stage 'gold', --triples", "stage 'nested' writes a run directory at", "not a stage directory of table 'triples'"]),
        # an index directory holds no stage tables
        ([{"name": "index", "run": "index build", "args": ["{out}/evidence"], "options": {"tokenizer": "default", "out": "{out}/index"}},
          {"name": "gold", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "{out}/index", "out": "{out}/gold"}}],
         ["stage 'gold', --triples", "stage 'index' writes a directory there that holds no stage tables"]),
        # the message names what the run directory gets from each stage
        ([{"name": "gold", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "{out}/evidence", "out": "{out}/evidence/gold"}},
          {"name": "sft", "run": "export sft", "args": ["{out}/evidence"], "options": {"corpus": "{out}/ingest", "out": "{out}/sft.json"}}],
         ["stage 'sft', argument FILTERED", "no stage before this one writes a stage directory of table 'chains' there", "gold/ (chains, stage 'gold')"]),
    ],
)  # fmt: skip
def test_table_checks_follow_what_the_stages_before_write(tmp_path, examples, cli, write_pipeline, stages, words):
    _refused(cli, str(write_pipeline(_wired(examples, *stages), out=str(tmp_path / "run"))), *words, tmp_path=tmp_path)


def test_a_table_written_by_an_output_among_the_args_is_not_refused(tmp_path, examples, cli, write_pipeline):
    # `--out` given in args: what the stage writes is not declared, so it may be the table a later stage reads
    gold = {"name": "gold", "run": "chains gold", "args": ["{out}/ingest", "--out", "{out}/evidence/chains"], "options": {"triples": "{out}/evidence"}}
    sft = {"name": "sft", "run": "export sft", "args": ["{out}/evidence"], "options": {"corpus": "{out}/ingest", "out": "{out}/sft.json"}}
    cli("pipeline", "run", str(write_pipeline(_wired(examples, gold, sft), out=str(tmp_path / "run"))), "--dry-run")


def test_a_stage_left_out_by_from_is_not_taken_to_have_written_its_table(tmp_path, examples, cli, write_pipeline):
    gold = {"name": "gold", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "{out}/evidence", "out": "{out}/evidence/chains"}}
    sft = {"name": "sft", "run": "export sft", "args": ["{out}/evidence"], "options": {"corpus": "{out}/ingest", "out": "{out}/sft.json"}}
    config = str(write_pipeline(_wired(examples, gold, sft), out=str(tmp_path / "run")))
    cli("pipeline", "run", config, "--until", "evidence")
    # before: the plan took gold's chains as made, and export sft failed when it ran
    err = cli("pipeline", "run", config, "--from", "sft", "--dry-run", check=2).stderr
    assert "stage 'sft', argument FILTERED" in err and "no 'chains' stage directory here" in err, err


def test_a_damaged_record_read_at_the_plan_names_stage_and_option(tmp_path, examples, cli, write_pipeline):
    outside = tmp_path / "outside"
    cli("corpus", "ingest", str(examples / WIKI), "--out", str(outside))
    (outside / "questions" / "_manifest.json").write_text('{"table": 3}')
    gold = {"name": "gold", "run": "chains gold", "args": [str(outside)], "options": {"triples": "{out}/evidence", "out": "{out}/gold"}}
    err = cli("pipeline", "run", str(write_pipeline(_wired(examples, gold), out=str(tmp_path / "run"))), "--dry-run", check=False).stderr
    assert "stage 'gold', argument CORPUS" in err and "questions/_manifest.json" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "stages, words",
    [
        # before: each passed the dry run, and the pipeline stopped at that stage after the ones before it ran
        ([{"name": "index", "run": "index build", "args": ["{out}/evidence/triples"], "options": {"tokenizer": "default", "out": "{out}/evidence/triples/idx"}}],
         ["stage 'index' option out", "lies inside", "a stage directory stage 'evidence' option out writes"]),
        ([{"name": "index", "run": "index build", "args": ["{out}/evidence/triples"], "options": {"tokenizer": "default", "out": "{out}/ingest/questions"}}],
         ["stage 'index' option out", "questions: is", "a stage directory stage 'ingest' option out writes"]),
        ([{"name": "filters", "run": "filters apply", "args": ["{out}/gold"], "options": {"corpus": "{out}/ingest", "triples": "{out}/evidence", "out": "{out}/f", "report": "{out}/f/r.md"}}],
         ["stage 'filters'", "--report", "--out"]),
        # before: the dev file export sft writes beside --out was not declared, and gmr's export replaced it
        ([{"name": "sft", "run": "export sft", "args": ["{out}/gold"], "options": {"corpus": "{out}/ingest", "out": "{out}/data/sft.json", "dev_share": 0.3}},
          {"name": "gmr", "run": "export gmr", "args": ["{out}/ingest"], "options": {"out": "{out}/data/sft_dev.json"}}],
         ["stage 'sft' option out (the file beside it)", "stage 'gmr' option out", "sft_dev.json"]),
        # before: an option spelled with a hyphen in the file was run as given, and never read as the dev share
        ([{"name": "sft", "run": "export sft", "args": ["{out}/gold"], "options": {"corpus": "{out}/ingest", "out": "{out}/data/sft.json", "dev-share": 0.3}},
          {"name": "all", "run": "export sft", "args": ["{out}/gold"], "options": {"corpus": "{out}/ingest", "out": "{out}/data/sft_dev.json", "all-candidates": True}}],
         ["stage 'sft' option out (the file beside it)", "stage 'all' option out", "sft_dev.json"]),
    ],
)  # fmt: skip
def test_a_stages_outputs_are_checked_against_each_other_and_its_inputs_at_the_dry_run(tmp_path, examples, cli, write_pipeline, stages, words):
    gold = {"name": "gold", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "{out}/evidence", "out": "{out}/gold"}}
    _refused(cli, str(write_pipeline(_wired(examples, gold, *stages), out=str(tmp_path / "run"))), *words, tmp_path=tmp_path)


def test_a_directory_of_the_users_where_a_stage_writes_is_refused_at_the_dry_run(tmp_path, examples, cli, write_pipeline):
    """Before: the dry run passed, the stages before it ran, and the index stage then refused the directory (and
    its suggested --overwrite refused it too)."""
    index = {"name": "index", "run": "index build", "args": ["{out}/evidence"], "options": {"tokenizer": "default", "out": "{out}/index"}}
    gold = {"name": "gold", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "{out}/evidence", "out": "{out}/gold"}}
    config = str(write_pipeline(_wired(examples, index, gold), out=str(tmp_path / "run")))
    (tmp_path / "run" / "gold").mkdir(parents=True)
    (tmp_path / "run" / "gold" / ".gitkeep").write_text("")  # a stage directory may hold the user's files: its command writes beside them
    cli("pipeline", "run", config, "--dry-run")
    (tmp_path / "run" / "index").mkdir(parents=True)
    (tmp_path / "run" / "index" / "notes.txt").write_text("mine\n")
    line = _dry_run_refused(cli, config)
    assert "stage 'index' option out" in line and "holds notes.txt and nothing grtool wrote there" in line, line
    assert not (tmp_path / "run" / "ingest").exists()
    (tmp_path / "run" / "index" / "notes.txt").unlink()  # empty: the stage writes it
    cli("pipeline", "run", config, "--dry-run")
    cli("pipeline", "run", config)  # and the stage directory with the user's file beside its parts is written
    assert (tmp_path / "run" / "gold" / ".gitkeep").exists() and (tmp_path / "run" / "gold" / "_manifest.json").is_file()


def test_the_run_directory_may_be_placed_by_a_var(tmp_path, examples, cli, write_pipeline):
    ingest = {"name": "ingest", "run": "corpus ingest", "args": [str(examples / MUSIQUE)], "options": {"out": "{out}/ingest"}}
    # before: the stages wrote under a literal '{base}/run'
    plan = cli("pipeline", "run", str(write_pipeline([ingest], out="{base}/run", vars={"base": str(tmp_path / "b")})), "--dry-run").stdout
    assert f"--out {tmp_path / 'b' / 'run' / 'ingest'}" in plan, plan
    err = cli("pipeline", "run", str(write_pipeline([ingest], out="{bse}/run", vars={"base": "b"})), "--dry-run", check=2).stderr
    assert "out: unknown placeholder {bse}" in err, err


@pytest.mark.parametrize("value, said", [("", "{base} is empty, so '{base}/run' would become a path at the root"), (" ", "{base} is empty"),
                                         (True, "[vars] 'base': true, but a var is text")])  # fmt: skip
def test_a_var_that_would_root_a_path_or_is_true_is_refused(tmp_path, examples, cli, write_pipeline, value, said):
    """Before: `base = ""` made `{base}/run` the root's /run (exit 0), and `tag = true` the text 'True'. An empty var
    that ends a name (`run{suffix}`) is fine."""
    ingest = {"name": "ingest", "run": "corpus ingest", "args": [str(examples / MUSIQUE)], "options": {"out": "{out}/ingest"}}
    err = " ".join(cli("pipeline", "run", str(write_pipeline([ingest], out="{base}/run", vars={"base": value})), "--dry-run", check=2).stderr.split())
    assert said in err, err
    config = str(write_pipeline([ingest], out="{base}/run", vars={"base": str(tmp_path / "b")}))
    err = " ".join(cli("pipeline", "run", config, "--dry-run", "--set", f"vars.base={'true' if value is True else value}", check=2).stderr.split())
    assert said.removeprefix("[vars] 'base': ").split(",")[0] in err, err
    suffixed = str(write_pipeline([ingest], out=str(tmp_path / "run{suffix}"), vars={"suffix": ""}))
    assert f"--out {tmp_path / 'run' / 'ingest'}" in cli("pipeline", "run", suffixed, "--dry-run").stdout
    # two empty vars before the slash, and an option spelled with = in the args, are caught the same way
    err = " ".join(cli("pipeline", "run", str(write_pipeline([ingest], out="{a}{b}/run", vars={"a": "", "b": ""})), "--dry-run", check=2).stderr.split())
    assert "{a}, {b} are empty, so '{a}{b}/run' would become a path at the root" in err, err
    spelled = {**ingest, "args": [*ingest["args"], "--out={a}/x"], "options": {}}
    err = " ".join(cli("pipeline", "run", str(write_pipeline([spelled], out=str(tmp_path / "run"), vars={"a": ""})), "--dry-run", check=2).stderr.split())
    assert "{a} is empty, so '--out={a}/x' would become a path at the root" in err, err


def test_an_option_spelled_both_ways_is_refused(tmp_path, examples, cli, write_pipeline):
    """`dev-share` and `dev_share` are one option: a stage holds it under one key, so a file giving both is refused
    (before: both reached the command line, the last one winning)."""
    gmr = {"name": "gmr", "run": "export gmr", "args": ["{out}/ingest"], "options": {"out": "{out}/g.jsonl", "chunk-questions": 5, "chunk_questions": 7}}
    ingest = {"name": "ingest", "run": "corpus ingest", "args": [str(examples / MUSIQUE)], "options": {"out": "{out}/ingest"}}
    _refused(cli, str(write_pipeline([ingest, gmr], out=str(tmp_path / "run"))), "option 'chunk_questions' is given twice", "'chunk-questions'", tmp_path=tmp_path)


def test_an_export_stage_whose_dev_file_is_gone_is_run_again(tmp_path, examples, cli, write_pipeline):
    """The dev file `export sft --dev-share` writes is one of the stage's outputs: before, with it deleted the stage
    was "done" (exit 0, nothing re-exported) and a later stage reading it was refused as reading what no stage writes."""
    gold = {"name": "gold", "run": "chains gold", "args": ["{out}/ingest"], "options": {"triples": "{out}/evidence", "out": "{out}/gold"}}
    sft = {"name": "sft", "run": "export sft", "args": ["{out}/gold"], "options": {"corpus": "{out}/ingest", "out": "{out}/data/sft.json", "dev-share": 0.5}}
    reads_dev = {"name": "check", "run": "validate", "args": ["{out}/data/sft_dev.json"]}
    config = str(write_pipeline(_wired(examples, gold, sft, reads_dev), out=str(tmp_path / "run")))
    cli("pipeline", "run", config)
    (tmp_path / "run" / "data" / "sft_dev.json").unlink()
    plan = " ".join(cli("pipeline", "run", config, "--dry-run").stdout.split())
    assert "sft_dev.json" in plan and "missing" in plan, plan
    cli("pipeline", "run", config)
    assert (tmp_path / "run" / "data" / "sft_dev.json").is_file()


def test_a_stage_s_stdout_meeting_its_own_output_is_refused_at_the_dry_run(tmp_path, examples, cli):
    """Its command checks its own options against each other but never sees its stdout: the two claims of one path
    in one process wrote the JSON over the plot's bytes, and every later run called the file the user's."""
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = { json = true, plot = "{out}/reports/same.png" }\nstdout = "{out}/reports/same.png"\n')
    for dry in (["--dry-run"], []):
        err = cli("pipeline", "run", config, *dry, check=2).stderr
        assert "stage 'stats' stdout" in err and "is also stage 'stats' option plot" in " ".join(err.split()), err
    assert not (tmp_path / "run").exists()


def test_an_empty_stdout_is_refused_when_the_file_is_read(tmp_path, examples, cli):
    """Before: the dry run showed no redirection and the stage then failed on '.', a path nobody wrote."""
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = { json = true }\nstdout = " "\n')
    assert "stage 'stats': stdout is empty" in cli("pipeline", "run", config, "--dry-run", check=2).stderr


def test_an_edited_report_blocks_only_a_run_of_its_own_stage(tmp_path, examples, cli):
    """A report grtool wrote and a user changed is theirs: a run that would write it again (its stage sees its output
    changed) is refused before any stage runs; a run that leaves that stage out is not (before: every stage's files
    were checked, selected or not)."""
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = { json = true }\nstdout = "{out}/reports/stats.json"\n')
    cli("pipeline", "run", config)
    report = tmp_path / "run" / "reports" / "stats.json"
    report.write_text(report.read_text() + " ")
    err = cli("pipeline", "run", config, "--dry-run", check=2).stderr
    assert "stage 'stats' stdout" in err and "was changed since grtool wrote it" in err
    assert "# 0 of 1 stages to run" in cli("pipeline", "run", config, "--until", "ingest", "--dry-run").stdout
    cli("pipeline", "run", config, "--until", "ingest")
    assert report.read_text().endswith(" ")


def test_a_stage_s_plot_is_one_of_its_outputs(tmp_path, examples, cli):
    """A report option (--plot, --report, --trec-run) is one of the stage's recorded outputs, as its stdout is: a
    plot edited by hand makes the stage's outputs changed, and the run that would write it again is refused before
    any stage runs, naming the file (before: the stage was shown done, yet the option check refused the file);
    a plot removed is written again."""
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = { plot = "{out}/reports/stats.png" }\n')
    cli("pipeline", "run", config)
    plot = tmp_path / "run" / "reports" / "stats.png"
    plot.write_bytes(plot.read_bytes() + b"edited")
    plan = " ".join(cli("pipeline", "run", config, "--dry-run", check=2).stderr.split())
    assert "stage 'stats': --plot" in plan and "was changed since grtool wrote it" in plan, plan
    plot.unlink()
    plan = " ".join(cli("pipeline", "run", config, "--dry-run").stdout.split())
    assert "stats.png" in plan and "missing" in plan, plan
    cli("pipeline", "run", config)
    assert plot.is_file()
    assert "# 0 of 2 stages to run" in cli("pipeline", "run", config, "--dry-run").stdout


def test_an_output_written_among_a_stage_s_args_is_one_of_its_outputs(tmp_path, examples, cli):
    """`args = [..., "--plot", P]` writes P as `options.plot = P` does: before, P was no output of the stage (fingerprinted
    as its input), and a second stage writing P replaced it with exit 0."""
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest", "--plot", "{out}/reports/same.png"]\n')
    plan = " ".join(cli("pipeline", "run", config, "--dry-run").stdout.split())
    assert "outputs: " + str(tmp_path / "run" / "reports" / "same.png") in plan, plan
    path = Path(config)
    path.write_text(path.read_text() + '\n[[stages]]\nname = "overlap"\nrun = "corpus overlap"\nargs = ["{out}/ingest"]\noptions = { plot = "{out}/reports/same.png" }\n')
    err = " ".join(cli("pipeline", "run", config, "--dry-run", check=2).stderr.split())
    assert "stage 'stats' option plot" in err and "stage 'overlap' option plot" in err, err


def test_the_dry_run_plan_escapes_control_characters(tmp_path, examples, cli, write_pipeline):
    """A stage name or path holding ESC or BEL reached the terminal raw in the plan (the logs escape them). The
    plan's command lines still run in bash as they are: a control character as $'\x1b', a newline inside its
    quotes, a no-break space as it is."""
    import subprocess

    out = str(tmp_path / "run" / "in\x1bgest\xa0x")
    ingest = {"name": "g\x1b[31mX\x07", "run": "corpus ingest", "args": [str(examples / MUSIQUE)], "options": {"out": out}}
    gmr = {"name": "gmr", "run": "export gmr", "args": [out], "options": {"out": "{out}/g.jsonl", "split": "two\nlines"}}
    plan = cli("pipeline", "run", str(write_pipeline([ingest, gmr], out=str(tmp_path / "run"))), "--dry-run").stdout
    assert "\x1b" not in plan and "\x07" not in plan and "# g\\x1b[31mX\\x07: to run" in plan, plan
    commands = plan.split("\n# ")[1:3]
    for line, last in zip(commands, [out, "two\nlines"]):
        words = subprocess.run(["bash", "-c", "printf '%s\\0' " + line.split("\n", 1)[1].removeprefix("grtool ")], capture_output=True, text=True).stdout
        assert words.split("\0")[-2] == last, (line, words)


def test_a_stage_record_of_an_older_grtool_holding_its_plot_as_an_input_is_done(tmp_path, examples, cli):
    """An older grtool fingerprinted a stage's --plot as one of its inputs; after an upgrade the plot is an output,
    and the stage stays done (before: 'inputs changed', so it ran again and a later stage was stale)."""
    config = _pipeline(tmp_path, examples, 'args = ["{out}/ingest"]\noptions = { plot = "{out}/reports/stats.png" }\n')
    cli("pipeline", "run", config)
    record_path = tmp_path / "run" / "_pipeline" / "stats.json"
    record = json.loads(record_path.read_text())
    plot = str(tmp_path / "run" / "reports" / "stats.png")
    record["inputs"][plot] = record["files"].pop(plot)  # as the older grtool recorded it
    record_path.write_text(json.dumps(record))
    assert "# 0 of 2 stages to run" in cli("pipeline", "run", config, "--dry-run").stdout


def test_set_overrides_an_option_written_among_the_args(tmp_path, examples, cli, write_pipeline):
    """`--set stage.out=B` replaces `--out A` written in the stage's args (before this change set, both reached the
    command line and the last won; then the stage was refused as giving --out twice)."""
    ingest = {"name": "ingest", "run": "corpus ingest", "args": [str(examples / MUSIQUE), "--out", "{out}/a", "--rows-per-part=5"]}
    config = str(write_pipeline([ingest], out=str(tmp_path / "run")))
    plan = cli("pipeline", "run", config, "--dry-run", "--set", "ingest.out={out}/b").stdout
    assert f"--rows-per-part=5 --out {tmp_path / 'run' / 'b'}" in plan and "/a" not in plan.split("\n")[2], plan


def test_a_stage_s_identity_is_quoted_as_earlier_records_quote_it():
    """The plan shows a control character as $'\\t'; the identity a completion record keeps stays shlex's, so a stage an
    earlier grtool finished with such an option is still done (before: 'the command differs', and it ran again)."""
    import shlex

    from grtool.pipeline.config import Stage

    stage = Stage("s", "export sft", ["c"], {"system": "You are\ta retriever.", "out": "o"})
    assert stage.identity() == shlex.join(["grtool", "export", "sft", "c", "--system", "You are\ta retriever.", "--out", "o"])
    assert "$'You are\\x09a retriever.'" in stage.command_line()
