"""Gaps left by the first pass of issue #36 (DESIGN §8), each closed with a real `grtool` subprocess on real files:
deep nesting in every JSON or TOML file a user hands in, typed records for the dedup spill plan and the Slurm job,
file names that are not UTF-8, leftovers beyond stage directories, and `status --json` of a whole run.

A subprocess timeout is only a guard against a hang, never a measurement."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES

HANG_GUARD = 300  # seconds: far past what any of these commands takes; only a hang reaches it
DEEP = "[" * 100_000 + "]" * 100_000


def grtool(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`grtool ARGS` (bytes arguments passed as they are: file names that are not UTF-8)."""
    cmd = [sys.executable.encode(), b"-m", b"grtool", *(a if isinstance(a, bytes) else os.fsencode(str(a)) for a in args)]
    return subprocess.run(cmd, capture_output=True, env={**os.environ, **(env or {})}, timeout=HANG_GUARD)


def errors_of(proc: subprocess.CompletedProcess) -> list[str]:
    err = proc.stderr.decode("utf-8", "backslashreplace")
    assert "Traceback" not in err and "RecursionError" not in err, err[-3000:]
    return [line for line in err.splitlines() if "error:" in line]


def one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Exit ``code`` with one error line holding every needle, and no traceback."""
    errors = errors_of(proc)
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}\n{proc.stderr.decode()[-3000:]}"
    assert len(errors) == 1, errors
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


# ------------------------------------------------------------------ 1. deep nesting in what users hand in


def test_a_deeply_nested_deepspeed_config_is_one_line(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n')
    ds = tmp_path / "ds.json"
    ds.write_text(DEEP)
    one_line(grtool("train", "sft", data, "--out", tmp_path / "ckpt", "--deepspeed", ds), 2, "--deepspeed", "ds.json")


def test_a_deeply_nested_pipeline_file_is_one_line(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text(f"v = {DEEP}\n")
    one_line(grtool("pipeline", "run", f), 2, "run.toml", "nested")


def test_a_deeply_nested_set_value_is_one_line():
    demo = EXAMPLES.parent / "demo.toml"
    deep = "[" * 60_000 + "]" * 60_000  # one argument holds at most 128 KiB
    one_line(grtool("pipeline", "run", demo, "--dry-run", "--set", f"ingest-hotpotqa.limit={deep}"), 2, "--set", "nested")


def test_a_deeply_nested_record_in_the_out_directory_is_treated_as_a_damaged_one(tmp_path):
    """--overwrite reads the record of what --out holds: a 100,000-deep one is as damaged as broken JSON."""
    outcomes = []
    for name, record in (("broken", "{bad"), ("deep", DEEP)):
        stage = tmp_path / name / "documents"
        stage.mkdir(parents=True)
        (stage / "_manifest.json").write_text(record)
        proc = grtool("corpus", "ingest", EXAMPLES / "2wikimultihopqa", "--out", tmp_path / name, "--overwrite")
        outcomes.append((proc.returncode, len(errors_of(proc))))
    assert outcomes[0] == outcomes[1] == (2, 1)


def test_a_million_deep_array_item_is_refused_in_bounded_memory(tmp_path):
    """ijson's items() keeps a path per level (memory quadratic in the depth): the corpus reader must stop it at
    the nesting limit, so a 1,000,000-deep record costs no more memory than a 100-deep one."""
    peaks = {}
    for levels in (150, 1_000_000):
        f = tmp_path / str(levels) / "hotpot_dev_distractor_v1.json"
        f.parent.mkdir()
        f.write_text('[{"_id": "a", "question": "q", "answer": "a", "supporting_facts": [], "type": "x", "level": "y", '
                     '"context": ' + "[" * levels + "]" * levels + "}]")
        proc = subprocess.Popen([sys.executable, "-m", "grtool", "corpus", "ingest", str(f), "--out", str(f.parent / "o")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err = proc.stderr.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 2 and "nested deeper" in err and "Traceback" not in err, err[-2000:]
        peaks[levels] = usage.ru_maxrss  # KiB on Linux
    # a quadratic path would need terabytes; 200 MiB of slack covers allocator noise
    assert peaks[1_000_000] < peaks[150] + 200 * 1024, peaks


# ------------------------------------------------------------------ 2. the dedup spill plan is a typed record


def _plan(rows: list, buckets: int) -> str:
    table = f'{{"buckets": {buckets}, "rows": {rows}, "rejects": 0}}'
    return f'{{"identity": {{}}, "documents": {table}, "questions": {table}}}'


@pytest.mark.parametrize("work", ["_ingest_work", "_merge_work"])
@pytest.mark.parametrize("plan, field", [
    (_plan([1, 2], 3), "rows"),  # a count per bucket, not fewer
    (_plan([-1], 1), "rows"),
    (_plan([1], 0), "buckets"),
    (_plan([1], 1).replace('"identity": {}', '"identity": {"x": ' + DEEP + "}"), "nested"),
])
def test_a_damaged_spill_plan_is_one_line_naming_it(tmp_path, work, plan, field):
    """A spill plan left by a stopped ingest or merge is read back through its declaration: a damaged one is one
    line naming plan.json and the field (exit 1), never a traceback nor rows written by a wrong plan."""
    source = tmp_path / "corpus"
    if work == "_merge_work":
        grtool("corpus", "ingest", EXAMPLES / "2wikimultihopqa", "--out", source).check_returncode()
    out = tmp_path / "out"
    (out / work).mkdir(parents=True)
    (out / work / "plan.json").write_text(plan)
    args = ("ingest", EXAMPLES / "2wikimultihopqa") if work == "_ingest_work" else ("merge", source)
    one_line(grtool("corpus", *args, "--out", out), 1, "plan.json", field)


# ------------------------------------------------------------------ 3. the Slurm job record is written from its declaration


def test_the_slurm_job_records_are_exactly_their_declaration(tmp_path):
    """Every _pipeline/slurm/STAGE.json a run submits is the bytes its declaration encodes: the writer builds the
    SlurmJobRecord, so no field can be written that the reader does not know."""
    import slurm_fakes
    from slurm_plan_helpers import plan_config

    from grtool.pipeline.records import read_slurm_job
    from grtool.records import to_builtins
    from grtool.store.records import dumps

    env = slurm_fakes.install(tmp_path / "slurm")
    out = tmp_path / "run"
    config = Path(plan_config(tmp_path, "", "{ tasks = 3 }", out))
    proc = grtool("pipeline", "run", config, "--executor", "slurm", env=env)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    records = sorted((out / "_pipeline" / "slurm").glob("*.json"))
    assert [p.stem for p in records] == ["index", "ingest", "triples"]
    for path in records:
        record = read_slurm_job(path)
        assert path.read_bytes() == dumps(to_builtins(record)), path
    triples = read_slurm_job(out / "_pipeline" / "slurm" / "triples.json")
    assert triples.tasks == 3 and triples.jobs.run and triples.jobs.finalize


# ------------------------------------------------------------------ 4. directory names that are not UTF-8


def test_an_index_under_a_name_that_is_not_utf8_is_queried_and_validated(tmp_path):
    """grtool writes UTF-8 names only; a user may move what it wrote under any name the file system holds."""
    import json

    from index_helpers import BUNDLED, write_triples_stage

    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    write_triples_stage(tmp_path / "triples", rows)
    built = grtool("index", "build", tmp_path / "triples", "-t", "llama3", "--out", tmp_path / "idx")
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    odd = os.fsencode(tmp_path) + b"/run\xff"
    os.mkdir(odd)
    os.rename(tmp_path / "idx", os.fsdecode(odd + b"/idx"))
    os.rename(tmp_path / "triples", os.fsdecode(odd + b"/triples"))
    query = grtool("index", "query", odd + b"/idx", "Old Harbor Bridge")
    assert query.returncode == 0, query.stderr.decode()[-2000:]
    for target in (odd + b"/idx", odd):
        proc = grtool("validate", target)
        assert proc.returncode == 0 and not errors_of(proc), proc.stderr.decode()[-2000:]


def test_export_sft_reads_stages_under_a_name_that_is_not_utf8(tmp_path, shared_data):
    from sample_helpers import build_samples, write_chains

    samples = build_samples(shared_data, tmp_path / "corpus")
    write_chains(samples, tmp_path / "filtered")
    odd = os.fsencode(tmp_path) + b"/run\xff"
    os.mkdir(odd)
    for name in ("corpus", "filtered"):
        os.rename(tmp_path / name, os.fsdecode(odd + b"/" + name.encode()))
    out = tmp_path / "sft.json"
    proc = grtool("export", "sft", odd + b"/filtered", "--corpus", odd + b"/corpus", "--out", out)
    assert proc.returncode == 0 and not errors_of(proc), proc.stderr.decode()[-2000:]
    assert out.stat().st_size > 0
    proc = grtool("validate", out)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]


# ------------------------------------------------------------------ 5. leftovers of a killed index build


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_killed_index_builds_temporary_directory_is_named_by_validate_and_removed_by_the_next_build(tmp_path):
    """`index build` writes into .<out>.<pid>.tmp beside --out; SIGKILL leaves it (with its scratch files)."""
    import json

    from index_helpers import BUNDLED, write_triples_stage

    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    write_triples_stage(tmp_path / "triples", rows)
    build = ("index", "build", tmp_path / "triples", "-t", "llama3", "--out", tmp_path / "idx")
    assert grtool(*build).returncode == 0
    left = tmp_path / f".idx.{_dead_pid()}.tmp"
    left.mkdir()
    (left / ".scratch-tokens.u32").write_bytes(b"\0" * 64)
    proc = grtool("validate", tmp_path / "idx")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert f"left by a killed `index build` beside it: {left.name}" in proc.stderr.decode() + proc.stdout.decode()
    assert grtool(*build, "--overwrite").returncode == 0
    assert not left.exists()
    proc = grtool("validate", tmp_path / "idx")
    assert proc.returncode == 0 and left.name not in proc.stderr.decode() + proc.stdout.decode()


# ------------------------------------------------------------------ 6. status --json of a run lists what the text lists


def test_status_json_of_a_run_lists_its_indexes_exports_checkpoints_and_pipeline_stages(tmp_path):
    """`status RUN --json`: one object with the stage directories' status (as before, under "stages") beside the
    indexes, exports, training outputs and pipeline stages the tables show; a stage directory keeps its object."""
    import json

    from index_helpers import BUNDLED, write_triples_stage

    run = tmp_path / "run"
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    write_triples_stage(run / "triples", rows)
    assert grtool("index", "build", run / "triples", "-t", "llama3", "--out", run / "index").returncode == 0
    (run / "_pipeline").mkdir()
    (run / "_pipeline" / "triples.json").write_text(json.dumps(
        {"stage": "triples", "command": "grtool triples extract", "outputs": [str(run / "triples")], "seconds": 1.5,
         "finished": "2026-01-01T00:00:00+00:00"}))
    proc = grtool("status", run, "--json")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    got = json.loads(proc.stdout)
    assert sorted(got) == ["checkpoints", "exports", "indexes", "pipeline", "slurm_jobs", "stages"]
    assert [Path(s["path"]).name for s in got["stages"]] == ["triples"] and got["stages"][0]["table"] == "triples"
    assert [Path(i["path"]).name for i in got["indexes"]] == ["index"] and got["indexes"][0]["kind"] == "fm"
    assert got["exports"] == got["checkpoints"] == got["slurm_jobs"] == []
    assert [p["stage"] for p in got["pipeline"]] == ["triples"] and got["pipeline"][0]["seconds"] == 1.5
    alone = json.loads(grtool("status", run / "triples", "--json").stdout)  # a stage directory: its own object
    assert alone == got["stages"][0]
