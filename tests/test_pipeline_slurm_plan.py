"""`pipeline run --executor slurm` without a cluster: the plan (scripts, dependency graph) and the checks made
before anything is submitted. The runs against a real Slurm are in tests/test_slurm.py."""

from __future__ import annotations

import os

from conftest import REPO
from slurm_plan_helpers import plan_config


def test_the_plan_shows_each_job_and_the_dependency_graph_and_writes_nothing(tmp_path, cli):
    config = plan_config(tmp_path)
    out = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", "--set", "triples.slurm.gres=gpu:1", "--set", "slurm.time=2:00:00").stdout
    assert "#SBATCH --array=0-2" in out and "#SBATCH --gres=gpu:1" in out and "#SBATCH --partition=cpu" in out
    assert "#SBATCH --time=2:00:00" in out and "#SBATCH --time=01:00:00" not in out.split("finalize.sbatch")[0]
    assert "srun grtool triples extract" in out and "grtool pipeline finalize --merge" in out
    # An array task requeues itself alone (one task's SLURM_JOB_ID is the array's id, which names every task).
    triples, index = out.split("triples.sbatch")[1].split("# ----")[0], out.split("index.sbatch")[1]
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in triples and "SLURM_JOB_ID" not in triples
    assert 'scontrol requeue "$SLURM_JOB_ID"' in index
    assert "#   triples (array 0-2, then triples-finalize) after ingest" in out and "#   index (one job) after triples" in out
    assert not (tmp_path / "run").exists()


def test_the_recipe_plans_gpu_arrays_and_a_multi_gpu_training_node(tmp_path, cli):
    out = cli("pipeline", "run", REPO / "examples" / "slurm" / "recipe.toml", "--executor", "slurm", "--dry-run", "--set", f"vars.data={REPO / 'examples' / 'data' / 'hotpotqa' / 'hotpot_dev_distractor_v1.example.json'}").stdout
    assert "#SBATCH --array=0-15" in out and "#SBATCH --gres=gpu:8" in out
    assert "srun accelerate launch --multi_gpu --num_processes 8 -m grtool train sft" in out
    assert "#   train-kto (one job) after train-sft, export-kto" in out


def test_slurm_settings_are_checked_before_anything_is_submitted(tmp_path, cli):
    for extra, slurm, set_, words in [
        ("", "{ tasks = 3, taks = 2 }", [], ["stage 'triples', slurm", "unknown key 'taks'", "did you mean 'tasks'"]),
        ('cpus = "eight"', "{ tasks = 3 }", [], ["[slurm] key 'cpus'", "expected an integer"]),
        ("", "{ tasks = 3 }", ["--set", "index.slurm.tasks=2"], ["stage 'index', slurm 'tasks'", "index build does not split its work"]),
        ("", "{ tasks = 0 }", [], ["stage 'triples', slurm 'tasks'", "at least 1"]),
        ("", "{ tasks = 3 }", ["--set", "triples.slurm.parallel=x"], ["--set 'triples.slurm.parallel=x'", "expected an integer"]),
        ("", "{ tasks = 3 }", ["--set", "slurm.partitoin=gpu"], ["unknown Slurm key 'partitoin'", "did you mean 'partition'"]),
    ]:
        proc = cli("pipeline", "run", plan_config(tmp_path, extra, slurm), "--executor", "slurm", *set_, check=2)
        message = " ".join(proc.stderr.split())
        assert all(w in message for w in words), (words, proc.stderr)
        assert not (tmp_path / "run").exists()
    proc = cli("pipeline", "run", plan_config(tmp_path), "--wait", check=2)
    assert "--wait: only with --executor slurm" in proc.stderr
    # No sbatch here: refused before the first stage's job is written or submitted.
    path = os.path.dirname(os.__file__)  # a PATH without sbatch
    proc = cli("pipeline", "run", plan_config(tmp_path), "--executor", "slurm", check=2, env={"PATH": path})
    assert "no sbatch on PATH" in proc.stderr and not (tmp_path / "run").exists()
