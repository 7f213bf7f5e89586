"""A pipeline adapted to a cluster without editing it: `--set vars.NAME` moves every job that uses the var, the
Slurm dry run's job table, paths a stage reads checked before the first stage runs, `pipeline status`, `--json`."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import REPO, write_pipeline_file
from slurm_plan_helpers import plan_config

from grtool.pipeline.config import load_pipeline
from grtool.pipeline.slurm import gpus_per_task, time_hours

HOTPOT = REPO / "examples" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"


def _slurm_config(tmp_path) -> str:
    """The plan tests' pipeline with its partitions and GPUs as [vars] (a table after [slurm] ends it)."""
    variables = '[vars]\ngpu_partition = "gpu"\ngpus = 2'
    return plan_config(tmp_path, variables, '{ partition = "{gpu_partition}", tasks = 3, gres = "gpu:{gpus}", time = "2:00:00" }')


def _local_config(tmp_path, merge_args: tuple[str, ...] = ("{out}/corpus",)) -> str:
    stages = [
        {"name": "ingest", "run": "corpus ingest", "args": [HOTPOT], "options": {"out": "{out}/corpus"}},
        {"name": "merge", "run": "corpus merge", "args": list(merge_args), "options": {"out": "{out}/merged"}},
        {"name": "stats", "run": "corpus stats", "args": ["{out}/merged"], "options": {"json": True}, "stdout": "{out}/stats.json"},
    ]
    return str(write_pipeline_file(tmp_path / "local.toml", stages, out=tmp_path / "run"))


def _section(out: str, name: str) -> str:
    """The script printed under ``# ---- …/NAME`` by the dry run."""
    return next(part for part in out.split("# ---- ") if part.split()[0].endswith("/" + name))


def test_a_var_moves_every_job_that_uses_it_and_the_finalize_job_stays_off_the_gpu_partition(tmp_path, cli):
    config = _slurm_config(tmp_path)
    out = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run",
              "--set", "vars.gpu_partition=h100", "--set", "slurm.account=proj", "--set", "slurm.qos=high").stdout  # fmt: skip
    triples, finalize, ingest = _section(out, "triples.sbatch"), _section(out, "triples.finalize.sbatch"), _section(out, "ingest.sbatch")
    assert "#SBATCH --partition=h100" in triples and "#SBATCH --gres=gpu:2" in triples and "#SBATCH --account=proj" in triples
    # The GPU array's finalize job needs no GPU: it runs where the [slurm] defaults send a job, named (never the
    # cluster's default partition, which may not exist or be forbidden), not on the GPU partition (#48).
    assert all(f"#SBATCH {d}" in finalize for d in ("--partition=cpu", "--account=proj", "--qos=high"))
    assert "h100" not in finalize and "--gres" not in finalize, finalize
    assert "#SBATCH --partition=cpu" in ingest and "#SBATCH --account=proj" in ingest
    # The table before the scripts: 3 tasks x 2 GPUs x 2 hours at most.
    table = out.split("# ---- ")[0].splitlines()
    assert f"relative paths are resolved from {Path.cwd()}" in table[0]
    row = next(line.split() for line in table if line.startswith("#   triples"))
    assert row[1:] == ["triples", "h100", "gpu:2", "3", "-", "-", "2:00:00", "12"], row
    assert next(line for line in table if line.startswith("#   total")).split()[-1] == "12"
    assert not (tmp_path / "run").exists()


def test_an_unknown_var_is_refused_with_the_closest_name(tmp_path, cli):
    proc = cli("pipeline", "run", _slurm_config(tmp_path), "--executor", "slurm", "--dry-run", "--set", "vars.gpu_partiton=h100", check=2)
    message = " ".join(proc.stderr.split())
    assert "--set 'vars.gpu_partiton=h100'" in message and "no var 'gpu_partiton'" in message and "did you mean 'gpu_partition'" in message


def test_the_recipe_adapts_with_vars_and_refuses_a_missing_deepspeed_config(cli):
    recipe = REPO / "examples" / "slurm" / "recipe.toml"
    moved = ("--set", f"vars.data={HOTPOT}", "--set", "vars.gpu_partition=h100", "--set", "vars.gpus_per_node=4", "--set", "slurm.account=proj")
    out = cli("pipeline", "run", recipe, "--executor", "slurm", "--dry-run", "--no-check-env", *moved).stdout  # the cluster's environment is not here
    train = _section(out, "train-sft.sbatch")
    assert "#SBATCH --partition=h100" in train and "#SBATCH --gres=gpu:4" in train and "--num_processes 4 -m grtool train sft" in train
    assert "#SBATCH --partition=gpu" not in out and "#SBATCH --partition=cpu" in out
    # A wrong path in the last stages is found by the dry run, not days later when the jobs reach it.
    proc = cli("pipeline", "run", recipe, "--executor", "slurm", "--dry-run", *moved, "--set", "train-sft.deepspeed=nope.json", check=2)
    message = " ".join(proc.stderr.split())
    assert "stage 'train-sft', --deepspeed: nope.json does not exist and no stage before it writes it" in message, message
    assert f"relative paths are resolved from {Path.cwd()}" in message


def test_a_missing_input_stops_a_local_run_before_its_first_stage(tmp_path, cli):
    config = _local_config(tmp_path, ("{out}/corpus", "no/such/corpus"))
    for dry in (("--dry-run",), ()):
        proc = cli("pipeline", "run", config, *dry, check=2)
        message = " ".join(proc.stderr.split())
        assert "stage 'merge', argument INPUTS: no/such/corpus does not exist" in message, message
        assert not (tmp_path / "run").exists()  # ingest, before it, did not run either
    # What an earlier stage writes does not exist yet and is fine: the same file without the missing path plans.
    config = _local_config(tmp_path)
    plan = cli("pipeline", "run", config, "--dry-run").stdout
    assert "# 3 of 3 stages to run" in plan and f"# relative paths are resolved from {Path.cwd()}, where the stages run" in plan
    proc = cli("pipeline", "run", config, "--from", "merge", "--dry-run", check=2)  # but not when that stage is left out
    assert "stage 'merge', argument INPUTS" in proc.stderr and "stage 'ingest' writes it, and this run does not include it" in proc.stderr


def test_pipeline_status_of_a_local_run_and_the_json_summary(tmp_path, cli):
    config = _local_config(tmp_path)
    before = json.loads(cli("pipeline", "status", config, "--json").stdout)
    assert [(r["stage"], r["state"]) for r in before["stages"]] == [("ingest", "to run"), ("merge", "to run"), ("stats", "to run")]
    cli("pipeline", "run", config, "--until", "ingest", "--json", tmp_path / "first.json")
    assert [r["stage"] for r in json.loads((tmp_path / "first.json").read_text())] == ["ingest"]
    text = cli("pipeline", "status", config).stdout.splitlines()
    assert text[0].split() == ["stage", "state", "finished", "seconds", "slurm", "jobs", "slurm", "states"]
    ingest, merge = text[1].split(), text[2].split()
    assert ingest[:2] == ["ingest", "done"] and ingest[2] != "-" and merge[:3] == ["merge", "to", "run"]
    # The old name still works, with a warning; both at once is refused.
    proc = cli("pipeline", "run", config, "--summary-json", tmp_path / "all.json")
    assert "--summary-json is deprecated: use --json" in proc.stderr
    assert [r["stage"] for r in json.loads((tmp_path / "all.json").read_text())] == ["ingest", "merge", "stats"]
    proc = cli("pipeline", "run", config, "--summary-json", tmp_path / "a.json", "--json", tmp_path / "b.json", check=2)
    assert "give one of them" in proc.stderr
    after = json.loads(cli("pipeline", "status", config, "--json").stdout)
    assert {r["state"] for r in after["stages"]} == {"done"} and all(r["finished"] and r["slurm"] is None for r in after["stages"])
    # The run directory alone: the stages from their records.
    by_dir = json.loads(cli("pipeline", "status", tmp_path / "run", "--json").stdout)
    assert sorted(r["stage"] for r in by_dir["stages"]) == ["ingest", "merge", "stats"] and {r["state"] for r in by_dir["stages"]} == {"done"}
    assert cli("pipeline", "status", tmp_path, check=2).stderr.count("no pipeline records") == 1


def test_pipeline_status_names_a_stage_s_slurm_jobs_without_slurm_here(tmp_path, cli):
    config = _slurm_config(tmp_path)
    jobs = tmp_path / "run" / "_pipeline" / "slurm"
    jobs.mkdir(parents=True)
    stage = next(s for s in load_pipeline(config).stages if s.name == "triples")  # the record as `pipeline run` writes it
    (jobs / "triples.json").write_text(
        json.dumps({"stage": stage.to_dict(), "out": str(tmp_path / "run"), "overwrite": False, "tasks": 3, "submitted": "2026-01-01T00:00:00+00:00", "jobs": {"run": "41", "finalize": "42"}})
    )
    env = {"PATH": str(Path(json.__file__).parent)}  # a PATH without scontrol
    rows = {r["stage"]: r for r in json.loads(cli("pipeline", "status", config, "--json", env=env).stdout)["stages"]}
    assert rows["triples"]["slurm"]["jobs"] == {"run": "41", "finalize": "42"} and rows["ingest"]["slurm"] is None
    text = cli("pipeline", "status", config, env=env).stdout
    assert "41 (finalize 42)" in text and "no scontrol here" in text


def test_slurm_times_and_gres_as_the_job_table_counts_them():
    assert time_hours("2:00:00") == 2 and time_hours("30") == 0.5 and time_hours("90:00") == 1.5
    assert time_hours("1-12") == 36 and time_hours("1-00:30:00") == 24.5 and time_hours(None) is None and time_hours("soon") is None
    assert gpus_per_task("gpu:h100:4") == 4 and gpus_per_task("gpu") == 1 and gpus_per_task("gpu:2,shard:1") == 2 and gpus_per_task(None) == 0
