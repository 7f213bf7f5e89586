"""`grtool pipeline run --executor slurm` against a real Slurm (slurmctld + slurmd on this machine).

Skipped unless a cluster answers: `make test-slurm` starts one (tests/slurm/cluster.sh), runs this file and
stops it. The pipeline: ingest the HotpotQA example (6 parts of 2 documents) -> triples as an array against a small
OpenAI-compatible server in this process (a canned triple per document) -> a collisions report. Against the
local run of the same file: an array task cancelled mid-way, then the re-run redoes only its missing part and a
second re-run submits nothing; a task whose part trips the empty-output guard fails `--wait` (exit 1, its job
and log named, what depends on it cancelled); a task sent SIGTERM (the time limit's warning) requeues itself and
resumes its stage.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, write_pipeline_file
from llm_helpers import TitleTripleServer

pytestmark = [pytest.mark.real_slurm,
              pytest.mark.skipif(shutil.which("sbatch") is None, reason="no sbatch on PATH: no Slurm here (make test-slurm starts a single-node cluster)")]  # fmt: skip


@functools.cache  # asked once: a client without a controller takes Slurm's message timeout to say so
def _cluster_up() -> bool:
    proc = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    return proc.returncode == 0 and any(s.strip() in ("idle", "mix", "alloc") for s in proc.stdout.splitlines())


@pytest.fixture(scope="module")
def _server():
    with TitleTripleServer(delay=0.7, relation="appears in", tail="HotpotQA") as srv:
        yield srv


@pytest.fixture
def server(_server):
    if not _cluster_up():
        pytest.skip("sbatch is here but no Slurm node answers (start one: tests/slurm/cluster.sh start)")
    _server.delay, _server.empty = 0.7, set()
    _server.titles.clear()
    return _server


@pytest.fixture(scope="module")
def local_out(_server, tmp_path_factory) -> Path:
    """The same pipeline run by the local executor (once for the file): the rows every Slurm run must match."""
    from conftest import run_cli

    tmp = tmp_path_factory.mktemp("local")
    delay, _server.delay = _server.delay, 0.0
    run_cli("pipeline", "run", _pipeline(tmp / "local.toml", tmp / "local", _server.url))
    _server.delay = delay
    _server.titles.clear()
    return tmp / "local"


def _pipeline(path: Path, out: Path, url: str, tasks: int = 3) -> Path:
    hotpot = REPO / "examples" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    return write_pipeline_file(path, [
        {"name": "ingest", "run": "corpus ingest", "args": [hotpot], "options": {"out": "{out}/corpus", "rows_per_part": 2}},
        {"name": "triples", "run": "triples extract", "args": ["{out}/corpus"], "slurm": {"tasks": tasks},
         "options": {"out": "{out}/run", "backend": "openai", "base_url": url, "concurrency": 1, "grounding": "off", "no_cache": True}},
        {"name": "collisions", "run": "triples collisions", "args": ["{out}/run/triples"], "options": {"corpus": "{out}/corpus", "json": True},
         "stdout": "{out}/reports/collisions.json"},
    ], out=out, slurm={"time": "00:10:00", "setup": f"export PATH={Path(sys.executable).parent}:$PATH PYTHONPATH={REPO}"})  # fmt: skip


def _rows(stage: Path) -> list:
    import pyarrow.parquet as pq

    rows = [r for f in sorted(stage.glob("part-*.parquet")) for r in pq.read_table(f).to_pylist()]
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


def _jobs(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "_pipeline" / "slurm").glob("*.json")}


def _states(out: Path) -> dict[str, str]:
    from grtool.pipeline.slurm import job_states

    ids = [j for r in _jobs(out).values() for j in r["jobs"].values()]
    return {k: v["state"] for k, v in job_states(ids).items()}


def _until(check, seconds: float, what: str):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_pipeline_on_slurm_matches_the_local_run_resumes_a_cancelled_task_and_then_submits_nothing(tmp_path, server, local_out, cli):
    out = tmp_path / "slurm"
    config = _pipeline(tmp_path / "slurm.toml", out, server.url)

    plan = cli("pipeline", "run", config, "--executor", "slurm", "--dry-run").stdout
    assert "#SBATCH --array=0-2" in plan and "#SBATCH --signal=TERM@120" in plan and "#SBATCH --requeue" in plan
    assert f"#SBATCH --output={out}/_pipeline/logs/triples-%A_%a.out" in plan
    assert "triples (array 0-2, then triples-finalize) after ingest" in plan and "collisions (one job) after ingest, triples" in plan
    assert not out.exists()  # a dry run writes nothing

    # Submitted without --wait; task 1 is cancelled once it committed its first part (part 1; part 4 is left).
    cli("pipeline", "run", config, "--executor", "slurm")
    array = _jobs(out)["triples"]["jobs"]["run"]
    _until(lambda: (out / "run" / "triples" / "_shards" / "part-00001.json").exists(), 120, "task 1's first part")
    subprocess.run(["scancel", f"{array}_1"], check=True)
    active = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING"}
    _until(lambda: (s := _states(out)) and not any(v in active for v in s.values()), 120, "the jobs to end")
    states = _states(out)
    assert states[f"{array}_1"] == "CANCELLED" and states[f"{array}_0"] == states[f"{array}_2"] == "COMPLETED", states
    finalize, collisions = _jobs(out)["triples"]["jobs"]["finalize"], _jobs(out)["collisions"]["jobs"]["run"]
    assert states[finalize] == states[collisions] == "CANCELLED", states  # --kill-on-invalid-dep: nothing waits forever
    done = sorted(p.name for p in (out / "run" / "triples" / "_shards").glob("part-*.json"))
    assert "part-00004.json" not in done and "part-00001.json" in done, done
    before = {name: (out / "run" / "triples" / "_shards" / name).read_bytes() for name in done}
    status = cli("status", out, env={"COLUMNS": "200"}).stderr
    assert "slurm jobs" in status and "CANCELLED 1" in status, status

    # The same command again, waiting: only the triples stage (its missing part) and what follows are redone.
    server.titles.clear()
    proc = cli("pipeline", "run", config, "--executor", "slurm", "--wait")
    assert "stage ingest: submitted" not in proc.stderr and "stage triples: submitted" in proc.stderr, proc.stderr
    assert set(_states(out).values()) == {"COMPLETED"}, _states(out)
    missing = {json.loads(l)["title"] for l in _jsonl(out / "corpus" / "documents", "part-00004")}
    assert set(server.titles) == missing, (server.titles, missing)  # nothing of a finished part asked again
    for name, data in before.items():
        assert (out / "run" / "triples" / "_shards" / name).read_bytes() == data, name
    assert _rows(out / "run" / "triples") == _rows(local_out / "run" / "triples")
    local_report = (local_out / "reports" / "collisions.json").read_text().replace(str(local_out), str(out))  # it names its inputs
    assert json.loads((out / "reports" / "collisions.json").read_text()) == json.loads(local_report)
    manifest = json.loads((out / "run" / "triples" / "_manifest.json").read_text())
    assert manifest["complete"] and len(manifest["shards"]) == manifest["num_parts"] >= 5
    cli("validate", out)
    assert any(out.glob("_pipeline/logs/triples-*_1.out"))

    # Everything done: nothing is submitted, exit 0; the local plan agrees.
    jobs = _jobs(out)
    proc = cli("pipeline", "run", config, "--executor", "slurm", "--wait")
    assert "nothing to submit" in proc.stderr and _jobs(out) == jobs
    assert "# 0 of 3 stages to run" in cli("pipeline", "run", config, "--dry-run").stdout


def _jsonl(stage: Path, part: str) -> list[str]:
    import pyarrow.parquet as pq

    return [json.dumps(r, default=str) for r in pq.read_table(stage / f"{part}.parquet").to_pylist()]


def _titles(corpus: Path, part: str) -> set[str]:
    return {json.loads(r)["title"] for r in _jsonl(corpus / "documents", part)}


def _tasks(array: str) -> dict[str, dict[str, str]]:
    """Each task of ``array`` (by task id) with its scontrol fields (JobId, JobState, Restarts, ...)."""
    from grtool.pipeline.slurm import _fields

    proc = subprocess.run(["scontrol", "show", "job", "-o", array], capture_output=True, text=True, check=True)
    return {f["ArrayTaskId"]: f for f in map(_fields, proc.stdout.splitlines()) if f.get("ArrayTaskId")}


def test_wait_on_a_failed_task_exits_1_naming_its_job_and_log_and_what_depends_on_it_is_cancelled(tmp_path, server, local_out, cli):
    out = tmp_path / "slurm"
    config = _pipeline(tmp_path / "slurm.toml", out, server.url, tasks=2)
    server.delay = 0.2
    server.empty = _titles(local_out / "corpus", "part-00001")  # task 1's first part: no triple, the guard trips

    proc = cli("pipeline", "run", config, "--executor", "slurm", "--wait", check=1)
    array = _jobs(out)["triples"]["jobs"]["run"]
    finalize, collisions = _jobs(out)["triples"]["jobs"]["finalize"], _jobs(out)["collisions"]["jobs"]["run"]
    states = _states(out)
    assert states[f"{array}_1"] == "FAILED" and states[f"{array}_0"] == "COMPLETED", states
    assert states[finalize] == states[collisions] == "CANCELLED", states  # not left pending on a dependency never met
    log = out / "_pipeline" / "logs" / f"triples-{array}_1.out"
    error = proc.stderr.splitlines()[-1]
    assert f"stage triples: job {array}_1 FAILED (exit 1:0), log {log}" in error and "not run: collisions" in error, proc.stderr
    assert f"job {array}_0" not in error and f"job {finalize} " not in error, error  # the one that failed is named
    said = log.read_text()
    assert "part-00001" in said and "--max-empty-share" in said, said  # grtool's own error line, in the job's log
    assert "scontrol requeue" not in said and "error" not in (out / "_pipeline" / "logs" / f"triples-{array}_0.out").read_text()
    status = cli("status", out, env={"COLUMNS": "200"}).stderr
    assert "CANCELLED 1, COMPLETED 1, FAILED 1" in status and "CANCELLED 1" in status.split("collisions", 1)[1], status
    assert not (out / "_pipeline" / "triples.json").exists()  # the stage is not recorded done
    said = cli("pipeline", "status", config).stdout  # per stage: its jobs, their states, the log of what failed
    assert f"triples: job {array}_1 FAILED (exit 1:0), log {log}" in said and f"job {array}_0 " not in said, said
    assert f"collisions: job {collisions} CANCELLED" in said and "no log (it did not start)" in said, said


def test_a_sigterm_to_a_running_task_requeues_that_task_alone_and_it_resumes_its_stage(tmp_path, server, local_out, cli):
    """What the time limit's warning does (#SBATCH --signal=TERM@120: SIGTERM to the job's steps, not its shell):
    grtool exits 75, the task requeues itself, and its second run resumes the stage, redoing only unfinished
    work. The task signalled is the one whose SLURM_JOB_ID is the array's own id: requeueing that id would
    requeue every task of the array."""
    out = tmp_path / "slurm"
    config = _pipeline(tmp_path / "slurm.toml", out, server.url, tasks=2)
    shards = out / "run" / "triples" / "_shards"
    run = subprocess.Popen([sys.executable, "-m", "grtool", "pipeline", "run", config, "--executor", "slurm", "--wait"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        array = _until(lambda: _jobs(out).get("triples", {}).get("jobs", {}).get("run"), 60, "the triples array")
        # Until the task holding the array's id runs (with two CPUs both tasks run; with one, the other one ended).
        task = _until(lambda: next((i for i, f in _tasks(array).items() if f["JobId"] == array and f["JobState"] == "RUNNING"), None), 90, "the task")
        _until(lambda: (shards / f"part-0000{task}.json").exists(), 60, f"task {task}'s first part")
        kept = {p.name: p.read_bytes() for p in shards.glob("part-*.json") if int(p.stem.split("-")[1]) % 2 == int(task)}
        subprocess.run(["scancel", "--signal=TERM", f"{array}_{task}"], check=True)
        stdout, stderr = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
            subprocess.run(["scancel", *(j for r in _jobs(out).values() for j in r["jobs"].values())])
    assert run.returncode == 0, stderr
    tasks = _tasks(array)
    assert tasks[task]["Restarts"] == "1" and tasks[str(1 - int(task))]["Restarts"] == "0", tasks  # that task alone
    assert set(_states(out).values()) == {"COMPLETED"}, _states(out)
    said = (out / "_pipeline" / "logs" / f"triples-{array}_{task}.out").read_text()
    assert said.count("stopped: SIGTERM received") == 1 and "(exit 75)" in said, said
    for name, data in kept.items():  # the parts it finished before the signal are kept as they were ...
        assert (shards / name).read_bytes() == data, name
    asked = {t: server.titles.count(t) for t in server.titles}
    again = {t for t, n in asked.items() if n > 1}
    for name in kept:  # ... and none of their documents was asked again
        assert not again & _titles(local_out / "corpus", Path(name).stem), (name, again)
    assert set(asked) == {json.loads(r)["title"] for p in sorted((local_out / "corpus" / "documents").glob("part-*.parquet")) for r in _jsonl(local_out / "corpus" / "documents", p.stem)}
    assert _rows(out / "run" / "triples") == _rows(local_out / "run" / "triples")
    local_report = (local_out / "reports" / "collisions.json").read_text().replace(str(local_out), str(out))
    assert json.loads((out / "reports" / "collisions.json").read_text()) == json.loads(local_report)
    cli("validate", out)
