"""The Slurm executor builds its batch scripts safely (#36 §5, #37 §5), against the stand-in Slurm of
tests/slurm_fakes.py, whose ``sbatch`` executes every script it is given.

- Every ``[slurm]`` value is checked at load against the shape Slurm accepts for its key (no control
  characters anywhere): a bad one is exit 2 naming the stage, the key, the value (escaped) and the shape, before
  a script is written or run.
- Paths and arguments reach the job exactly as written (spaces, quotes, ``$()``), in ``#SBATCH`` lines and
  in the script's commands.
- An ``sbatch`` answer that is not a job id fails the run naming the stage; nothing waits on it.
- A stage with more tasks than the cluster's MaxArraySize is several arrays, each task still one shard.
- ``SLURM_ARRAY_TASK_COUNT``/``_ID`` are checked before they are used.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

import slurm_fakes
from conftest import REPO
from slurm_plan_helpers import plan_config

HOTPOT = REPO / "examples" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"


def _config(folder: Path, out: Path, *, slurm: str = "", triples: str = "{ tasks = 3 }") -> Path:
    return Path(plan_config(folder, slurm, triples, out))


def _toml(text: str) -> str:
    """A TOML basic string holding ``text`` exactly (JSON's escapes are TOML's)."""
    return json.dumps(text)


def test_the_issue_newline_in_partition_is_refused_and_runs_nothing(tmp_path, cli):
    marker = tmp_path / "X"
    env = slurm_fakes.install(tmp_path / "slurm")
    config = _config(tmp_path, tmp_path / "run")
    config.write_text(config.read_text().replace('partition = "cpu"', f"partition = {_toml('cpu' + chr(10) + 'touch ' + str(marker))}"))
    proc = cli("pipeline", "run", config, "--executor", "slurm", check=2, env=env)
    line = proc.stderr.strip().splitlines()[-1]
    assert "[slurm] 'partition'" in line and "'cpu\\ntouch " in line and "partition name" in line, proc.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()
    assert slurm_fakes.records(tmp_path / "slurm", "sbatch") == []  # nothing reached sbatch


@pytest.mark.parametrize("key", ["partition", "account", "qos", "time", "mem", "gres"])
def test_dangerous_characters_in_a_stage_value_and_through_set_and_vars_are_refused(tmp_path, cli, key):
    marker = tmp_path / "X"
    env = slurm_fakes.install(tmp_path / "slurm")
    bad = f"1$(touch {marker})"
    config = _config(tmp_path, tmp_path / "run", triples=f"{{ tasks = 3, {key} = {_toml(bad)} }}")
    proc = cli("pipeline", "run", config, "--executor", "slurm", check=2, env=env)
    assert f"stage 'triples', slurm {key!r}" in proc.stderr and "$(touch" in proc.stderr and "expected" in proc.stderr, proc.stderr
    config = _config(tmp_path, tmp_path / "run")
    proc = cli("pipeline", "run", config, "--executor", "slurm", "--set", f"triples.slurm.{key}=a\tb`touch {marker}`", check=2, env=env)
    assert f"triples.slurm.{key}=" in proc.stderr and "\\t" in proc.stderr, proc.stderr
    assert not marker.exists() and not (tmp_path / "run").exists()
    assert slurm_fakes.records(tmp_path / "slurm", "sbatch") == []


def test_a_var_substituted_into_a_slurm_value_is_checked_after_substitution(tmp_path, cli):
    config = _config(tmp_path, tmp_path / "run", triples='{ tasks = 3, partition = "{part}" }')
    config.write_text(config.read_text() + '\n[vars]\npart = "gpu"\n')  # at the end: keys after [vars] would be its own
    cli("pipeline", "run", config, "--executor", "slurm", "--dry-run")
    proc = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", "--set", "vars.part=gpu\u2028x", check=2)
    assert "stage 'triples', slurm 'partition'" in proc.stderr and "'gpu\\u2028x'" in proc.stderr, proc.stderr


def test_a_var_in_setup_or_launch_goes_in_as_one_quoted_word(tmp_path, cli):
    marker = tmp_path / "X"
    env = slurm_fakes.install(tmp_path / "slurm")
    config = _config(tmp_path, tmp_path / "run", slurm='setup = "cd {venv}"\nlaunch = "env {flag} "', triples="{ tasks = 2 }")
    config.write_text(config.read_text() + f'\n[vars]\nvenv = {_toml(f"my env; touch {marker}")}\nflag = "A=1 $(touch {marker})"\n')
    plan = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", env=env).stdout
    assert f"cd 'my env; touch {marker}'" in plan, plan
    cli("pipeline", "run", config, "--executor", "slurm", env=env)
    assert not marker.exists()
    assert slurm_fakes.records(tmp_path / "slurm", "srun")[0]["argv"][:3] == ["env", f"A=1 $(touch {marker})", "grtool"]


# ---- the shapes, key by key (the checking function itself: many cases, no process each)

CONTROL = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\u0085", "\u2028", "\u2029", "\u200b", "\ufeff", "\u202e"]
SHELL = ["$(id)", "`id`", "'", '"', "#", ";", "|", "&", " ", "\\", "<", ">", "*", "{", "}"]


def _refused(settings: dict, needle: str | None = None) -> str:
    from grtool.errors import InputError
    from grtool.pipeline.slurm_values import check_slurm_settings

    with pytest.raises(InputError) as e:
        check_slurm_settings(settings, "p.toml: stage 's', slurm")
    message = str(e.value)
    assert "\n" not in message and message.startswith("p.toml: stage 's', slurm "), message
    if needle:
        assert needle in message, message
    return message


def _accepted(settings: dict) -> None:
    from grtool.pipeline.slurm_values import check_slurm_settings

    check_slurm_settings(settings, "p.toml: stage 's', slurm")


@pytest.mark.parametrize(
    "key,good",
    [("partition", "gpu"), ("account", "proj_1"), ("qos", "high"), ("time", "10"), ("mem", "16G"), ("gres", "gpu:1"), ("setup", "source .venv/bin/activate"), ("launch", "accelerate launch -m")],
)
def test_no_control_character_in_any_string_key(key, good):
    _accepted({key: good})
    for ch in CONTROL:
        message = _refused({key: good + ch + "x"}, f"{key!r}")
        assert ch not in message and repr(good + ch + "x")[1:-1].split("\\")[0] in message
    _refused({"sbatch": ["--exclusive", "--comment=a\nb"]}, "'sbatch'")


@pytest.mark.parametrize("key", ["partition", "account", "qos", "time", "mem", "gres"])
def test_no_shell_or_sbatch_syntax_in_a_name_or_amount(key):
    good = {"partition": "gpu", "account": "proj", "qos": "high", "time": "10", "mem": "16G", "gres": "gpu:1"}[key]
    for piece in SHELL:
        _refused({key: good + piece}, "expected")
        _refused({key: piece + good}, "expected")
    message = _refused({key: "a" * 5000})
    assert len(message) < 600, message  # a long value is shortened in the message


def test_time_formats():
    for good in ["10", "90", "10:30", "01:00:00", "48:00:00", "2-0", "2-12", "2-12:30", "2-12:30:15", "UNLIMITED", "infinite"]:
        _accepted({"time": good})
    for bad in ["", "0", "00:00:00", "-1", "1:60", "1:2:3:4", "1-", "-5", "1-24", "1-2:60", "1-2:3:61", "1d", "1h", "1:30pm", "1 - 2", "١٢",
                "99999999999"]:  # fmt: skip
        _refused({"time": bad}, "'time'")


def test_memory_amounts():
    for good in ["16G", "4000M", "4000", "512k", "2T", "64g"]:
        _accepted({"mem": good})
    for bad in ["", "0", "0G", "-4G", "16GB", "16 G", "G", "1.5G", "16Gi", "1" * 20, "٤G"]:
        _refused({"mem": bad}, "'mem'")


def test_gres_shapes():
    for good in ["gpu", "gpu:1", "gpu:4", "gpu:a100:2", "gpu:h100:8", "gpu:1g.10gb:1", "gpu:1,shard:2", "nvme:1"]:
        _accepted({"gres": good})
    for bad in ["", "gpu:0", "gpu:-1", "gpu:a100:0", ":1", "gpu:", "gpu::1", "gpu:a:b:1", "gpu:1,", "1:gpu", "gpu:1 ", "gpu:4:2"]:
        _refused({"gres": bad}, "'gres'")


def test_counts_are_positive_bounded_integers():
    for key in ["nodes", "cpus", "tasks", "parallel"]:
        _accepted({key: 1})
        for bad in [0, -1, -(2**63), 10**12, True, 1.5, "4"]:
            _refused({key: bad}, f"{key!r}")


def test_partition_lists_and_names():
    for good in ["gpu", "gpu,cpu", "a100-80g", "long.q", "debug_1"]:
        _accepted({"partition": good})
    for bad in ["", ",gpu", "gpu,", "gpu,,cpu", "-gpu", "--wrap=x", "gpu cpu", "gpü"]:
        _refused({"partition": bad}, "'partition'")
    _refused({"account": "a,b"}, "'account'")


def test_extra_sbatch_arguments():
    _accepted({"sbatch": ["--exclusive", "--constraint=a100", "--comment=my run #1", "--mail-type=END,FAIL"]})
    for bad in ["exclusive", "-N2", "-x", "--", "--=x", "--Bad", "--wrap=touch X", "--dependency=afterok:1", "--array=0-9",
                "--output=/tmp/x", "--chdir=/", "--parsable", "--test-only", "--kill-on-invalid-dep=no", "--exclusive\n", ""]:  # fmt: skip
        _refused({"sbatch": [bad]}, "'sbatch'")
    _refused({"sbatch": "--exclusive"}, "'sbatch'")
    _refused({"sbatch": ["--a"] * 100}, "'sbatch'")


def test_extra_srun_arguments():
    _accepted({"srun": ["--gpu-bind=closest", "--exclusive", "--mpi=pmix"]})
    for bad in ["gpu-bind", "-c8", "--cpus-per-task=2", "--output=x", "--error=x", "--input=x", "--chdir=/", "--pty", "--a;id", "--x\n", ""]:
        _refused({"srun": [bad]}, "'srun'")
    _refused({"srun": "--exclusive"}, "'srun'")


def test_launch_must_split_into_words():
    _accepted({"launch": "accelerate launch --num_processes 8 -m"})
    _refused({"launch": "accelerate 'launch"}, "'launch'")


# ---- paths, quoting and the script's commands, run by the stand-in Slurm


def test_a_run_path_with_spaces_quotes_and_dollars_reaches_the_jobs_exactly(tmp_path, cli):
    marker = tmp_path / "X"
    out = tmp_path / f"my run $(touch {marker}) `touch {marker}` 'q' \"d\" #h 100%j"
    env = slurm_fakes.install(tmp_path / "slurm", max_array_size=1001)
    comment = "--comment=a b #c 'q' \"d\" \\e $(touch " + str(marker) + ")"
    config = _config(tmp_path, out, slurm=f'setup = "true"\nsbatch = [{_toml(comment)}]')
    plan = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", env=env).stdout
    assert not marker.exists() and not out.exists()
    cli("pipeline", "run", config, "--executor", "slurm", env=env)
    assert not marker.exists()
    submitted = [r for r in slurm_fakes.records(tmp_path / "slurm", "sbatch") if not r["test_only"]]
    assert len(submitted) == 4  # ingest, the triples array, its finalize, index
    logs = str(out / "_pipeline" / "logs").replace("%", "%%")  # a '%' of the path is not one of --output's fields
    ingest, triples = submitted[0]["directives"], submitted[1]["directives"]
    assert f"--output={logs}/ingest-%j.out" in ingest and f"--chdir={Path.cwd()}" in ingest and comment in ingest, ingest
    assert f"--output={logs}/triples-%A_%a.out" in triples and "--array=0-2" in triples, triples
    assert "--time=01:00:00" in ingest and "--time=01:00:00" in submitted[2]["directives"]
    runs = slurm_fakes.records(tmp_path / "slurm", "srun")
    assert runs[0]["argv"] == ["grtool", "corpus", "ingest", str(HOTPOT), "--out", f"{out}/corpus"]
    shards = sorted((r["argv"][-1], r["argv"][-3]) for r in runs[1:4])
    assert shards == [("0", "3"), ("1", "3"), ("2", "3")] and all(r["argv"][-4] == "--num-shards" for r in runs[1:4]), runs
    assert runs[1]["argv"][:5] == ["grtool", "triples", "extract", f"{out}/corpus", "--out"]
    finalized = slurm_fakes.records(tmp_path / "slurm", "grtool")
    assert [r["argv"][-1] for r in finalized] == [f"{out}/_pipeline/slurm/ingest.json", f"{out}/_pipeline/slurm/triples.json",
                                                  f"{out}/_pipeline/slurm/index.json"]  # fmt: skip
    assert "'q'" in plan  # the dry run shows the same scripts


def test_a_job_sets_up_before_set_u_gives_srun_its_cpus_and_arguments_and_finalizes_off_the_gpu_partition(tmp_path, cli):
    """What real clusters need (#48): an activation script that reads an unset variable (conda's read PS1) runs
    before ``set -u``; Slurm 22.05-23.02 gives a step one CPU unless srun says --cpus-per-task; a stage's own
    srun arguments; an array's finalize job needs no GPU and queues where the [slurm] defaults send a job."""
    activate = tmp_path / "env dir" / "activate"
    activate.parent.mkdir()
    activate.write_text('if [ -n "$GRTOOL_TEST_NEVER_SET" ]; then echo interactive; fi\nexport ACTIVATED=1\n')
    env = slurm_fakes.install(tmp_path / "slurm")
    env.pop("GRTOOL_TEST_NEVER_SET", None)
    setup = f"source {shlex.quote(str(activate))}"
    config = _config(tmp_path, tmp_path / "run", slurm=f'setup = {_toml(setup)}\ncpus = 4\nqos = "normal"',
                     triples='{ tasks = 2, partition = "gpu", qos = "gpuq", gres = "gpu:1", cpus = 8, srun = ["--gpu-bind=closest"] }')  # fmt: skip
    plan = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", env=env).stdout
    for script in plan.split("# ---- ")[1:]:
        lines = script.splitlines()
        strict = next(i for i, line in enumerate(lines) if line.startswith("set -"))
        assert lines.index(setup) < strict, script
    cli("pipeline", "run", config, "--executor", "slurm", env=env)
    runs = [r["argv"] for r in slurm_fakes.records(tmp_path / "slurm", "srun")]
    assert [r[: r.index("grtool")] for r in runs] == [["--cpus-per-task=4"], *[["--cpus-per-task=8", "--gpu-bind=closest"]] * 2, ["--cpus-per-task=4"]], runs
    finalized = [r["argv"] for r in slurm_fakes.records(tmp_path / "slurm", "grtool")]
    assert len(finalized) == 3 and finalized[1][:3] == ["pipeline", "finalize", "--merge"], finalized  # every job got past its setup
    submitted = [r["directives"] for r in slurm_fakes.records(tmp_path / "slurm", "sbatch") if not r["test_only"]]
    triples, finalize = submitted[1], submitted[2]
    assert {"--partition=gpu", "--qos=gpuq", "--gres=gpu:1"} <= set(triples), triples
    assert "--partition=cpu" in finalize and "--qos=normal" in finalize and not any(d.startswith("--gres") for d in finalize), finalize
    # Without a [slurm] partition the finalize job stays on the stage's partition, still without the GPU.
    config = _config(tmp_path, tmp_path / "run2", triples='{ tasks = 2, partition = "gpu", gres = "gpu:1" }')
    config.write_text(config.read_text().replace('partition = "cpu"', ""))
    plan = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", env=env).stdout
    finalize = plan.split("triples.finalize.sbatch")[1].split("# ----")[0]
    assert "#SBATCH --partition=gpu" in finalize and "--gres" not in finalize and "srun" not in finalize, finalize


def test_a_stage_output_or_path_with_a_newline_is_refused_for_slurm(tmp_path, cli):
    marker = tmp_path / "X"
    env = slurm_fakes.install(tmp_path / "slurm")
    out = str(tmp_path / "run") + f"\ntouch {marker}"
    proc = cli("pipeline", "run", _config(tmp_path, Path(out)), "--executor", "slurm", check=2, env=env)
    assert "\\ntouch" in proc.stderr and "control character" in proc.stderr, proc.stderr
    assert not marker.exists() and slurm_fakes.records(tmp_path / "slurm", "sbatch") == []


# ---- sbatch's answer


@pytest.mark.parametrize("answer", ["garbage output", "", "Submitted batch job", "12abc", "-1", "1;2;3", "Submitted batch job 12; rm -rf"])
def test_an_sbatch_answer_that_is_not_a_job_id_fails_naming_the_stage_and_nothing_depends_on_it(tmp_path, cli, answer):
    env = slurm_fakes.install(tmp_path / "slurm", answer=answer)
    proc = cli("pipeline", "run", _config(tmp_path, tmp_path / "run"), "--executor", "slurm", check=False, env=env)
    assert proc.returncode not in (0, 2), proc.stderr  # not a usage error: sbatch misbehaved
    line = proc.stderr.strip().splitlines()[-1]
    assert "stage 'ingest'" in line and "not a job id" in line and repr(answer) in line, proc.stderr
    submitted = [r for r in slurm_fakes.records(tmp_path / "slurm", "sbatch") if not r["test_only"]]
    assert len(submitted) == 1 and not any(a.startswith("--dependency") for r in submitted for a in r["args"]), submitted
    assert "submitted job" not in proc.stderr


@pytest.mark.parametrize("answer,job", [("123", "123"), ("123;cluster1", "123"), ("Submitted batch job 77", "77")])
def test_an_sbatch_answer_that_is_a_job_id_is_waited_on(tmp_path, cli, answer, job):
    env = slurm_fakes.install(tmp_path / "slurm", answer=answer)
    cli("pipeline", "run", _config(tmp_path, tmp_path / "run"), "--executor", "slurm", env=env)
    submitted = [r for r in slurm_fakes.records(tmp_path / "slurm", "sbatch") if not r["test_only"]]
    assert f"--dependency=afterok:{job}" in submitted[1]["args"], submitted


# ---- MaxArraySize


def test_a_stage_past_max_array_size_is_several_arrays_each_task_one_shard(tmp_path, cli):
    env = slurm_fakes.install(tmp_path / "slurm", max_array_size=3)
    config = _config(tmp_path, tmp_path / "run", triples="{ tasks = 7, parallel = 2 }")
    plan = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run", env=env).stdout
    assert "MaxArraySize 3 (scontrol show config)" in plan, plan
    assert "#   triples (3 arrays: shards 0-2, 3-5, 6 (MaxArraySize 3), one after another (parallel = 2), then triples-finalize) after ingest" in plan, plan
    table = plan.split("\n")[1:4]
    assert table[2].split()[1:7] == ["triples", "cpu", "-", "7", "(3", "arrays)"], table  # the table shows the split
    assert plan.count("#SBATCH --array=0-2%2") == 2 and plan.count("#SBATCH --array=0-0%2") == 1, plan
    cli("pipeline", "run", config, "--executor", "slurm", env=env)
    submitted = [r for r in slurm_fakes.records(tmp_path / "slurm", "sbatch") if not r["test_only"]]
    ingest, a, b, c, fin, index = submitted
    arrays = [a["answer"], b["answer"], c["answer"]]
    assert [next(d for d in r["directives"] if d.startswith("--array=")) for r in (a, b, c)] == ["--array=0-2%2", "--array=0-2%2", "--array=0-0%2"]
    assert f"--dependency=afterok:{ingest['answer']}" in a["args"]
    # parallel holds across the arrays: each one starts after the one before it ended
    assert f"--dependency=afterok:{ingest['answer']},afterany:{a['answer']}" in b["args"], b["args"]
    assert f"--dependency=afterok:{':'.join(arrays)}" in fin["args"], fin["args"]
    assert f"--dependency=afterok:{fin['answer']}" in index["args"]
    runs = [r for r in slurm_fakes.records(tmp_path / "slurm", "srun") if r["argv"][1] == "triples"]
    assert sorted(int(r["argv"][-1]) for r in runs) == list(range(7)) and {r["argv"][-3] for r in runs} == {"7"}, runs
    record = json.loads((tmp_path / "run" / "_pipeline" / "slurm" / "triples.json").read_text())
    assert record["jobs"]["run"] == arrays[0] and record["jobs"]["arrays"] == arrays and record["jobs"]["finalize"] == fin["answer"]
    # status names every array of the split stage, not only the first
    split = f"{', '.join(arrays)} (finalize {fin['answer']})"
    assert split in cli("pipeline", "status", tmp_path / "run", env=env).stdout
    assert split in " ".join(cli("status", tmp_path / "run", env={**env, "COLUMNS": "400"}).stderr.split())  # its tables go to stderr


def test_a_bad_answer_midway_through_a_stage_cancels_its_arrays_and_a_rerun_submits_the_stage_whole(tmp_path, cli):
    env = slurm_fakes.install(tmp_path / "slurm", max_array_size=3, bad_at=4)  # ingest, arrays 1 and 2, then nonsense
    config = _config(tmp_path, tmp_path / "run", triples="{ tasks = 7 }")
    proc = cli("pipeline", "run", config, "--executor", "slurm", check=1, env=env)
    assert "stage 'triples'" in proc.stderr.strip().splitlines()[-1] and "'sbatch: error: try again'" in proc.stderr, proc.stderr
    assert slurm_fakes.records(tmp_path / "slurm", "scancel") == [{"argv": ["101", "102"], "cwd": str(Path.cwd()), "task": None}]
    submitted = [r for r in slurm_fakes.records(tmp_path / "slurm", "sbatch") if not r["test_only"]]
    assert len(submitted) == 4  # index was not submitted
    assert json.loads((tmp_path / "run" / "_pipeline" / "slurm" / "triples.json").read_text())["jobs"] == {}
    env.pop("FAKE_SBATCH_BAD_AT")
    cli("pipeline", "run", config, "--executor", "slurm", env=env)  # scontrol knows no job: everything again
    submitted = [r for r in slurm_fakes.records(tmp_path / "slurm", "sbatch") if not r["test_only"]][4:]
    assert len(submitted) == 6 and json.loads((tmp_path / "run" / "_pipeline" / "slurm" / "triples.json").read_text())["jobs"]["arrays"] == [
        r["answer"] for r in submitted[1:4]]  # fmt: skip


def test_a_rerun_with_the_controller_down_submits_nothing_and_exits_transient(tmp_path, cli):
    """Whether a stage's last jobs still run decides what the new jobs wait for: with no answer from the
    controller, nothing is submitted (exit 75, try again), naming the stage and its jobs."""
    env = slurm_fakes.install(tmp_path / "slurm", max_array_size=3)
    config = _config(tmp_path, tmp_path / "run")
    cli("pipeline", "run", config, "--executor", "slurm", env=env)
    before = len(slurm_fakes.records(tmp_path / "slurm", "sbatch"))  # the stand-in jobs did nothing: every stage is to run again
    proc = cli("pipeline", "run", config, "--executor", "slurm", check=75, env={**env, "FAKE_CONTROLLER_DOWN": "1"})
    line = " ".join(proc.stderr.split())
    assert "cannot tell whether its last jobs" in line and "Unable to contact slurm controller" in line and "nothing was submitted" in line, line
    assert len(slurm_fakes.records(tmp_path / "slurm", "sbatch")) == before


def test_without_max_array_size_the_default_1001_is_assumed_and_said(tmp_path, cli):
    env = slurm_fakes.install(tmp_path / "slurm")  # scontrol show config fails
    plan = cli("pipeline", "run", _config(tmp_path, tmp_path / "run", triples="{ tasks = 1001 }"), "--executor", "slurm", "--dry-run", env=env).stdout
    assert "MaxArraySize 1001 (Slurm's default: scontrol show config did not say)" in plan, plan
    assert "#SBATCH --array=0-1000" in plan and "triples (array 0-1000, then triples-finalize)" in plan
    plan = cli("pipeline", "run", _config(tmp_path, tmp_path / "run", triples="{ tasks = 1002 }"), "--executor", "slurm", "--dry-run", env=env).stdout
    assert "2 arrays: shards 0-1000, 1001" in plan and "#SBATCH --array=0-0" in plan


# ---- SLURM_ARRAY_TASK_COUNT / _ID


def test_slurm_array_variables_are_parsed_and_bounded():
    from grtool.errors import InputError
    from grtool.store.sharding import resolve_sharding, slurm_array_task

    assert slurm_array_task({}) is None
    assert slurm_array_task({"SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_ID": "3"}) == (4, 3)
    assert slurm_array_task({"SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "4"}) == (4, 3)
    assert resolve_sharding(None, None, {"SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_ID": "1"}) == (2, 1)
    assert resolve_sharding(5, 4, {"SLURM_ARRAY_TASK_COUNT": "x"}) == (5, 4)  # options given: the variables are not read
    for env, name in [({"SLURM_ARRAY_TASK_COUNT": "x", "SLURM_ARRAY_TASK_ID": "0"}, "SLURM_ARRAY_TASK_COUNT"),
                      ({"SLURM_ARRAY_TASK_COUNT": "0", "SLURM_ARRAY_TASK_ID": "0"}, "SLURM_ARRAY_TASK_COUNT"),
                      ({"SLURM_ARRAY_TASK_COUNT": "-3", "SLURM_ARRAY_TASK_ID": "0"}, "SLURM_ARRAY_TASK_COUNT"),
                      ({"SLURM_ARRAY_TASK_COUNT": "9" * 30, "SLURM_ARRAY_TASK_ID": "0"}, "SLURM_ARRAY_TASK_COUNT"),
                      ({"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_ID": "3"}, "SLURM_ARRAY_TASK_ID"),
                      ({"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_ID": "-1"}, "SLURM_ARRAY_TASK_ID"),
                      ({"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_ID": "1\n"}, "SLURM_ARRAY_TASK_ID"),
                      ({"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_ID": "١"}, "SLURM_ARRAY_TASK_ID"),
                      ({"SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "z"}, "SLURM_ARRAY_TASK_MIN"),
                      ({"SLURM_ARRAY_TASK_ID": "0"}, "SLURM_ARRAY_TASK_COUNT")]:  # fmt: skip
        with pytest.raises(InputError) as e:
            slurm_array_task(env)
        assert name in str(e.value) and e.value.exit_code == 2, (env, str(e.value))


def test_a_job_s_stdout_is_put_in_place_by_finalize_through_the_claim(tmp_path, cli, examples):
    """The job script moved its stdout over the report with `mv -f`, and only then did finalize write the record:
    a report edited while the job waited was lost, and a finalize that failed left a record of other bytes. Now
    finalize puts it in place as a local run does; a refused file keeps the job's output where it was."""
    out = tmp_path / "run"
    config = tmp_path / "p.toml"
    generic = examples / "generic"
    config.write_text(f"""out = "{out}"
[[stages]]
name = "ingest"
run = "corpus ingest"
args = ["{generic / "questions_dev.jsonl"}", "{generic / "documents.jsonl"}"]
options = {{ dataset = "generic", out = "{{out}}/corpus" }}
[[stages]]
name = "stats"
run = "corpus stats"
args = ["{{out}}/corpus"]
options = {{ json = true }}
stdout = "{{out}}/reports/stats.json"
""")
    cli("pipeline", "run", config, "--until", "ingest")
    env = slurm_fakes.install(tmp_path / "slurm")
    cli("pipeline", "run", config, "--executor", "slurm", env=env)
    [finalize] = [r["argv"] for r in slurm_fakes.records(tmp_path / "slurm", "grtool")]
    record, flag, finished = finalize[-3:]
    report = out / "reports" / "stats.json"
    assert flag == "--stdout-from" and not report.exists()  # the stand-in srun wrote nothing; finalize puts it in
    Path(finished).write_text('{"questions": 3}\n')
    cli("pipeline", "finalize", record, "--stdout-from", finished)
    assert report.read_text() == '{"questions": 3}\n' and not Path(finished).exists()
    recorded = json.loads((report.parent / ".stats.json.grtool-file.json").read_text())
    assert recorded["command"][:3] == ["grtool", "corpus", "stats"] and recorded["stdout"] is True  # the job's standard output
    report.write_text('{"questions": 3, "my note": 1}\n')  # edited while the next job waited
    Path(finished).write_text('{"questions": 4}\n')
    err = cli("pipeline", "finalize", record, "--stdout-from", finished, check=2).stderr
    assert "was changed since grtool wrote it" in err and f"the job's output is kept in {finished}" in " ".join(err.split())
    assert report.read_text() == '{"questions": 3, "my note": 1}\n' and Path(finished).read_text() == '{"questions": 4}\n'
