"""`grtool pipeline run`: plan, resume, overrides, errors; the stages run the very commands users type."""

from __future__ import annotations

import json

import pytest

from conftest import TEST_DATA, write_pipeline_file
from grtool.errors import InputError
from grtool.pipeline.config import load_pipeline


def _stages(examples) -> list[dict]:
    return [
        {"name": "ingest-2wiki", "run": "corpus ingest", "args": [examples / "2wikimultihopqa" / "data_ids_dev.example.json"], "options": {"out": "{out}/ingest/2wiki"}},
        {"name": "ingest-musique", "run": "corpus ingest", "args": [examples / "musique" / "musique_ans_v1.0_dev.example.jsonl"], "options": {"out": "{out}/ingest/musique"}},
        {"name": "merge", "run": "corpus merge", "args": ["{out}/ingest/2wiki", "{out}/ingest/musique"], "options": {"out": "{out}/corpus"}},
        {"name": "stats", "run": "corpus stats", "args": ["{out}/corpus"], "options": {"json": True}, "stdout": "{out}/reports/stats.json"},
    ]


def _config(tmp_path, examples, *more: dict) -> str:
    return str(write_pipeline_file(tmp_path / "pipe.toml", [*_stages(examples), *more], out=tmp_path / "run"))


def _plan(cli, config, *extra):
    out = cli("pipeline", "run", config, "--dry-run", *extra).stdout
    return {line.split(":")[0][2:]: line.split(":")[1].split(";")[0].split(" (")[0].strip() for line in out.splitlines() if line.startswith("# ") and ";" in line}


def test_run_resume_and_plan(tmp_path, examples, cli):
    config = _config(tmp_path, examples)
    assert set(_plan(cli, config).values()) == {"to run"}
    cli("pipeline", "run", config, "--until", "ingest-musique")
    plan = _plan(cli, config)
    assert plan == {"ingest-2wiki": "done", "ingest-musique": "done", "merge": "to run", "stats": "to run"}
    proc = cli("pipeline", "run", config, "--dry-run")
    assert "grtool corpus merge" in proc.stdout and "# 2 of 4 stages to run: merge, stats" in proc.stdout

    cli("pipeline", "run", config, "--json", tmp_path / "summary.json")
    assert set(_plan(cli, config).values()) == {"done"}
    stats = json.loads((tmp_path / "run" / "reports" / "stats.json").read_text())
    assert stats  # the stats command's own JSON report, captured from its stdout
    summary = {row["stage"]: row for row in json.loads((tmp_path / "summary.json").read_text())}
    assert summary["merge"]["rows"] > 0
    cli("validate", tmp_path / "run")


def test_changed_command_is_not_done(tmp_path, examples, cli):
    config = _config(tmp_path, examples)
    cli("pipeline", "run", config, "--until", "ingest-2wiki")
    plan = _plan(cli, config, "--set", "ingest-2wiki.split=validation")
    assert plan["ingest-2wiki"] == "changed"
    # Running it anyway hits the stage directory's own guard: different parameters are an error.
    proc = cli("pipeline", "run", config, "--until", "ingest-2wiki", "--set", "ingest-2wiki.split=validation", check=2)
    assert "ingest-2wiki" in proc.stderr and "overwrite" in proc.stderr
    cli("pipeline", "run", config, "--until", "ingest-2wiki", "--set", "ingest-2wiki.split=validation", "--set", "ingest-2wiki.overwrite=true")


def test_partial_stage_is_reported(tmp_path, examples, cli):
    config = _config(tmp_path, examples)
    cli("pipeline", "run", config, "--until", "ingest-2wiki")
    # Remove one committed shard record: the stage directory is now half done.
    records = sorted((tmp_path / "run" / "ingest" / "2wiki").rglob("_shards/part-*.json"))
    records[0].unlink()
    assert _plan(cli, config)["ingest-2wiki"] == "partial"


def test_bad_configs(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("out = 'x'\n[[stages]]\nname = 'a'\n")
    with pytest.raises(InputError, match="stage 'a': missing key 'run'"):
        load_pipeline(bad)
    bad.write_text("[[stages]]\nname='a'\nrun='corpus stats'\n[[stages]]\nname='a'\nrun='corpus stats'\n")
    with pytest.raises(InputError, match="used twice"):
        load_pipeline(bad)
    bad.write_text("[[stages]]\nname='a'\nrun='corpus stats'\nargs=['{nope}']\n")
    with pytest.raises(InputError, match="placeholder"):
        load_pipeline(bad)
    with pytest.raises(InputError, match="no such pipeline file"):
        load_pipeline(tmp_path / "missing.toml")
    good = tmp_path / "good.toml"
    good.write_text("[[stages]]\nname='a'\nrun='corpus stats'\nargs=['x']\noptions={json=true}\n")
    with pytest.raises(InputError, match="stage.key=value"):
        load_pipeline(good, ["a=1"])
    with pytest.raises(InputError, match="no stage named"):
        load_pipeline(good, ["b.x=1"])
    p = load_pipeline(good, ["a.top=3", 'a.name="q"', "a.flag=false"])
    assert p.stages[0].argv() == ["corpus", "stats", "x", "--json", "--top", "3", "--name", "q", "--no-flag"]
    # a fraction is passed on as written: `--plot 1e3`, not the `--plot 1000.0` of the TOML float it also reads as;
    # an integer as TOML reads it (0x10 is 16)
    p = load_pipeline(good, ["a.plot=1e3", "a.top=0x10"])
    assert p.stages[0].argv() == ["corpus", "stats", "x", "--json", "--plot", "1e3", "--top", "16"]


def test_demo_plan_lists_every_stage(cli):
    from conftest import REPO

    out = cli("pipeline", "run", REPO / "examples" / "demo.toml", "--dry-run").stdout  # every stage, done or not, prints its command
    for command in ("corpus ingest", "corpus merge", "triples extract", "chains synthesize", "filters apply", "index build", "export sft"):
        assert f"grtool {command}" in out


def test_changed_input_remakes_the_stage_and_what_reads_it(tmp_path, examples, cli):
    import shutil

    data = tmp_path / "data"
    data.mkdir()
    source = data / "dev.jsonl"
    shutil.copy(examples / "musique" / "musique_ans_v1.0_dev.example.jsonl", source)
    stages = _stages(examples)
    stages[1]["args"] = [source]
    path = write_pipeline_file(tmp_path / "pipe2.toml", stages, out=tmp_path / "run")
    cli("pipeline", "run", path)
    assert set(_plan(cli, path).values()) == {"done"}
    questions_before = json.loads((tmp_path / "run" / "reports" / "stats.json").read_text())

    lines = source.read_text().splitlines(keepends=True)
    source.write_text("".join(lines[:-1]))  # one question fewer
    plan = _plan(cli, path)
    assert plan == {"ingest-2wiki": "done", "ingest-musique": "inputs changed", "merge": "stale", "stats": "stale"}
    cli("pipeline", "run", path)
    assert set(_plan(cli, path).values()) == {"done"}
    proc = cli("corpus", "stats", tmp_path / "run" / "corpus", "--json")
    assert json.loads(proc.stdout) != questions_before
    cli("validate", tmp_path / "run")
    got = {row["qid"] for row in _questions(tmp_path / "run" / "corpus")}
    assert len(got) == len({json.loads(l)["id"] for l in lines[:-1]}) + _count_2wiki(examples)


def _questions(run_dir):
    import pyarrow.parquet as pq

    return [r for f in sorted((run_dir / "questions").glob("part-*.parquet")) for r in pq.read_table(f).to_pylist()]


def _count_2wiki(examples) -> int:
    return len(json.loads((examples / "2wikimultihopqa" / "data_ids_dev.example.json").read_text()))


def test_each_stage_records_its_own_command(tmp_path, examples, cli):
    """A stage run by `pipeline run` records its own equivalent `grtool …` line, not `grtool pipeline run FILE`."""
    import shlex

    from grtool.store.schemas import TRIPLES
    from grtool.store.stage import StageSpec, StageWriter

    rows = [json.loads(line) for line in (TEST_DATA / "index_triples.jsonl").read_text().splitlines()]
    triples = tmp_path / "triples"
    writer = StageWriter(triples, StageSpec("triples", TRIPLES, params={"test": True}, command=["grtool", "test"]), num_parts=1)
    with writer.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    writer.finish()
    config = _config(tmp_path, examples, {"name": "index", "run": "index build", "args": [triples], "options": {"tokenizer": "qwen", "out": "{out}/index"}})
    cli("pipeline", "run", config, "--until", "merge")
    cli("pipeline", "run", config, "--from", "index")
    pipeline = load_pipeline(config)
    run_dir = tmp_path / "run"
    recorded = {
        "ingest-2wiki": [run_dir / "ingest" / "2wiki"],
        "ingest-musique": [run_dir / "ingest" / "musique"],
        "merge": [run_dir / "corpus" / "questions", run_dir / "corpus" / "documents"],
    }
    for stage in pipeline.stages:
        if stage.name == "stats":
            continue
        expected = shlex.split(stage.command_line())
        assert json.loads((run_dir / "_pipeline" / f"{stage.name}.json").read_text())["command"] == stage.command_line()
        if stage.name == "index":
            assert json.loads((run_dir / "index" / "index.json").read_text())["command"] == expected
            continue
        manifests = [p for d in recorded[stage.name] for p in d.rglob("_manifest.json")]
        assert manifests, stage.name
        for manifest in manifests:
            assert json.loads(manifest.read_text())["command"] == expected, manifest


def test_stage_registry_matches_the_cli():
    """The registry names every stage command of `grtool`, and knows which take --overwrite, as the CLI parses them."""
    import typer.main

    from grtool.cli.main import app
    from grtool.cli.stages import CliCommands, stage_function
    from grtool.pipeline.config import Stage
    from grtool.pipeline.runner import accepts_overwrite as accepts

    COMMANDS = CliCommands()
    accepts_overwrite = lambda stage: accepts(COMMANDS, stage)  # noqa: E731

    found = {}
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        for sub_name, sub in getattr(command, "commands", {None: command}).items():
            found[" ".join(w for w in (name, sub_name) if w)] = sub
    found.pop("pipeline run")
    found.pop("pipeline finalize")  # a Slurm job's own last step, not a stage
    found.pop("pipeline status")  # reads a pipeline's records, not a stage
    assert set(COMMANDS.names()) == set(found)
    for run, command in found.items():
        assert stage_function(run) is not None
        assert accepts_overwrite(Stage("s", run)) == any(p.name == "overwrite" for p in command.params), run
    assert accepts_overwrite(Stage("s", "corpus  ingest")) and not accepts_overwrite(Stage("s", "corpus stats"))
    assert not accepts_overwrite(Stage("s", "no such command"))
