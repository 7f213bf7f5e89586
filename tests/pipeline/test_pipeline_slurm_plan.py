"""`pipeline run --executor slurm` without a cluster: the plan (scripts, dependency graph) and the checks made
before anything is submitted. The runs against a real Slurm are in tests/pipeline/test_slurm.py."""

from __future__ import annotations

import os
import json
import shlex
from pathlib import Path

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
    # --no-check-env: the recipe's setup line activates the cluster's environment, which is not here
    out = cli(
        "pipeline",
        "run",
        REPO / "examples" / "slurm" / "recipe.toml",
        "--executor",
        "slurm",
        "--dry-run",
        "--no-check-env",
        "--set",
        f"vars.data={REPO / 'examples' / 'data' / 'hotpotqa' / 'hotpot_dev_distractor_v1.example.json'}",
    ).stdout
    assert "#SBATCH --array=0-15" in out and "#SBATCH --gres=gpu:8" in out
    assert "srun --cpus-per-task=32 accelerate launch --multi_gpu --num_processes 8 -m grtool train sft" in out
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
    # --num-shards among a stage's args: each task's line would give it twice (before: planned, then every task refused)
    config = Path(plan_config(tmp_path))
    config.write_text(config.read_text().replace('args = ["{out}/corpus"]', 'args = ["{out}/corpus", "--num-shards", "3"]'))
    message = " ".join(cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", check=2).stderr.split())
    assert "stage 'triples', slurm 'tasks': the stage sets --num-shards/--shard-index itself" in message, message
    proc = cli("pipeline", "run", plan_config(tmp_path), "--wait", check=2)
    assert "--wait: only with --executor slurm" in proc.stderr
    # No sbatch here: refused before the first stage's job is written or submitted.
    path = os.path.dirname(os.__file__)  # a PATH without sbatch
    proc = cli("pipeline", "run", plan_config(tmp_path), "--executor", "slurm", check=2, env={"PATH": path})
    assert "no sbatch on PATH" in proc.stderr and not (tmp_path / "run").exists()


def test_the_plan_imports_each_stage_s_backend_through_its_setup_line(tmp_path, cli):
    """A vLLM stage's job fails days later when its environment has no vllm: the dry run runs the stage's setup
    line in a shell and imports the package with that environment's python, and names the stage, the package and
    the setup line when it does not import (#48). The environment is a real virtualenv without vllm; the same
    environment with a ``vllm`` package directory on PYTHONPATH passes (the real vllm takes ~40 s to import)."""
    import subprocess
    import sys

    env_dir = tmp_path / "job env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    activate = f"source {shlex.quote(str(env_dir / 'bin' / 'activate'))}"

    def vllm_config(setup: str) -> str:
        path = Path(plan_config(tmp_path, f"setup = {json.dumps(setup)}"))
        path.write_text(path.read_text().replace('backend = "openai", base_url = "http://127.0.0.1:9/v1"', 'backend = "vllm", model = "m"'))
        return str(path)

    config = vllm_config(activate)
    proc = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", check=2)
    line = " ".join(proc.stderr.split())
    assert "stage 'triples' (--backend vllm) needs the Python package vllm" in line and f"after its setup line {activate!r}" in line, line
    assert "No module named 'vllm'" in line and "grtool[vllm]" in line and not proc.stdout, line
    assert not (tmp_path / "run").exists()
    # The same pipeline submitted is refused the same way, before sbatch is looked for.
    assert "needs the Python package vllm" in cli("pipeline", "run", config, "--executor", "slurm", check=2).stderr
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    setup = f"{activate}; export PYTHONPATH={shlex.quote(str(site))}"
    plan = cli("pipeline", "run", vllm_config(setup), "--executor", "slurm", "--dry-run").stdout
    assert "--backend vllm" in plan and setup in plan
    # No python after the setup line: every package is named as not tried, with the shell's own words.
    proc = cli("pipeline", "run", vllm_config("PATH=/nonexistent"), "--executor", "slurm", "--dry-run", check=2)
    assert "needs the Python package vllm" in proc.stderr and "python: command not found" in proc.stderr, proc.stderr
    # --no-check-env: a plan made away from the cluster.
    assert "--backend vllm" in cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", "--no-check-env").stdout
