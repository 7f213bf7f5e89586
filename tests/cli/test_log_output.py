"""Output a person can read in a log: without a terminal (Slurm, CI, pipes) nothing is cut to 80 columns, long
stages print plain progress lines, progress moves per request, and a failing pipeline still prints its summary.

Every CLI call here runs the real `grtool` in a subprocess with stdout and stderr piped (no TTY) and without
COLUMNS / TERMINAL_WIDTH, as under Slurm.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from grtool.llm.base import Generation
from conftest import write_pipeline_file
from log_helpers import STAMP, check_log, unstamped

PROGRESS_LINE = re.compile(STAMP.pattern + r"reading inputs: [\d,]+/[\d,]+ \(\d+%\), [\d.,]+/s, elapsed \d+:\d\d:\d\d(, ETA \d+:\d\d:\d\d|, done)$", re.M)


def grtool(*args, env: dict | None = None, check: int = 0) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "GRTOOL_PROGRESS_INTERVAL")}
    proc = subprocess.run([sys.executable, "-m", "grtool", *map(str, args)], capture_output=True, text=True, env={**clean, **(env or {})})
    assert proc.returncode == check, f"exit {proc.returncode}, expected {check}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def test_status_prints_every_full_path(tmp_path, examples):
    run = tmp_path / ("a-run-directory-with-a-long-name-" * 2) / "run"  # far beyond 80 columns
    grtool("corpus", "ingest", examples / "musique" / "musique_ans_v1.0_dev.example.jsonl", "--out", run / "ingest")
    err = grtool("status", run).stderr
    lines = err.splitlines()
    assert any(str(run.resolve()) in line for line in lines), f"{run} not on one line of:\n{err}"
    for table in ("documents", "questions"):  # the stages relative to it, whole (the table fits the terminal)
        assert any(f"ingest/{table}" in line for line in lines), f"ingest/{table} not on one line of:\n{err}"
    assert "…" not in err


@pytest.mark.parametrize(
    "command, options",
    [
        (("triples", "extract"), ("--max-empty-share", "--tensor-parallel-size", "--gpu-memory-utilization", "--max-retries")),
        (("chains", "synthesize"), ("--tensor-parallel-size", "--gpu-memory-utilization")),
        (("filters", "apply"), ("--max-chain-tokens", "--all-candidates")),
    ],
)
def test_help_keeps_option_names_whole(command, options):
    out = grtool(*command, "--help").stdout
    assert "…" not in out
    for option in options:
        assert re.search(rf"(^|\s){re.escape(option)}(\s|$)", out, re.M), f"{option} is not whole in:\n{out}"


def test_plain_progress_lines_without_a_terminal(tmp_path, examples):
    files = [examples / "2wikimultihopqa" / "dev.example.json", examples / "musique" / "musique_ans_v1.0_dev.example.jsonl"]
    err = grtool("corpus", "ingest", *files, "--out", tmp_path / "a", env={"GRTOOL_PROGRESS_INTERVAL": "0"}).stderr
    lines = PROGRESS_LINE.findall(err)
    assert len(lines) >= 2, err  # one per step that moved (interval 0) ...
    plain = "\n".join(check_log(err, progress=("reading inputs", "writing shards")))  # stamped, unpadded, no repeats
    assert re.search(r"^reading inputs: ([\d,]+)/\1 \(100%\), .*, done$", plain, re.M), err  # ... and a last one
    assert re.search(r"^writing shards: 2/2 \(100%\), .*, done$", plain, re.M), err
    assert not any("━" in line and not set("┏┳┓┡╇┩") & set(line) for line in err.splitlines())  # no Rich bar, only table rules
    assert any(line.startswith("│ questions ") for line in plain.splitlines()), err  # the summary table, its lines stamped too

    # The default interval (10 s) prints only the last lines for a run this short; --quiet prints none.
    err = grtool("corpus", "ingest", *files, "--out", tmp_path / "b").stderr
    assert len(PROGRESS_LINE.findall(err)) == 1 and "reading inputs" in err
    quiet = grtool("-q", "corpus", "ingest", *files, "--out", tmp_path / "c").stderr
    assert "reading inputs" not in quiet and "writing shards" not in quiet


def test_log_progress_prints_what_changed_and_what_is_happening(capsys):
    from rich.progress import TextColumn

    from grtool.log import LogProgress, activity

    with LogProgress(TextColumn("{task.fields[hits]} hits"), interval=0.05) as bar:
        task = bar.add_task("triples extract", total=25, hits=0)
        with activity("loading model SmolLM2"):
            time.sleep(0.2)  # nothing moves: one line says what is happening
        bar.update(task, advance=12, hits=3)
        time.sleep(0.5)  # nothing moves for longer than the heartbeat (6 intervals): a "still" line, not one per interval
    raw = capsys.readouterr().err
    err = check_log(raw, progress=("triples extract",))
    assert sum("; loading model SmolLM2, 0:00:00 so far" in line for line in err) == 1, err
    moved = [line for line in err if line.startswith("triples extract: 12/25 (48%), ") and "3 hits" in line and ", ETA " in line]
    assert 1 <= len(moved) <= 3 and "still" not in moved[0], err  # was one line every interval (10 here)
    assert any("; still running, no change for " in line for line in moved[1:]), err
    assert err[-1].startswith("triples extract: 12/25 (48%), ") and err[-1].endswith(", done"), err

    with pytest.raises(RuntimeError), LogProgress(interval=60) as bar:
        bar.add_task("chains", total=None)
        raise RuntimeError("boom")
    assert capsys.readouterr().err.strip().endswith("stopped")


def test_library_progress_bars_stay_out_of_a_log():
    # transformers' GGUF loader draws a tqdm bar (tqdm.auto), huggingface_hub its own: both write \r frames.
    code = (
        "import grtool.log\n"
        "from tqdm.auto import tqdm\n"
        "from huggingface_hub.utils import tqdm as hub_tqdm\n"
        "for bar in (tqdm, hub_tqdm):\n"
        "    for _ in bar(range(3), desc='Converting and de-quantizing GGUF tensors...'):\n"
        "        pass\n"
        "import logging, warnings\n"
        "logging.getLogger('trl.trainer').warning('a library warning')\n"
        "warnings.warn('a Python warning')\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TQDM_", "HF_HUB_DISABLE", "HF_DATASETS_DISABLE"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean, check=True)
    lines = check_log(proc.stderr)
    assert "GGUF" not in proc.stderr, proc.stderr
    assert "warning: a library warning" in lines and any(line.startswith("warning: ") and "UserWarning: a Python warning" in line for line in lines), lines


def test_a_failing_pipeline_stage_still_prints_the_summary(tmp_path, examples):
    config = write_pipeline_file(tmp_path / "pipe.toml", [
        {"name": "ingest", "run": "corpus ingest", "args": [examples / "musique" / "musique_ans_v1.0_dev.example.jsonl"], "options": {"out": "{out}/ingest"}},
        {"name": "merge", "run": "corpus merge", "args": ["{out}/ingest", tmp_path / "not-a-corpus"], "options": {"out": "{out}/corpus"}},
        {"name": "stats", "run": "corpus stats", "args": ["{out}/corpus"]},
    ], out=tmp_path / "run")  # fmt: skip
    # A corpus whose documents shard is damaged: found only when merge reads it (the plan reads records alone; a
    # missing path, or one holding no documents stage, is refused before any stage runs).
    grtool("corpus", "ingest", examples / "musique" / "musique_ans_v1.0_dev.example.jsonl", "--out", tmp_path / "not-a-corpus")
    shard = tmp_path / "not-a-corpus" / "documents" / "part-00000.parquet"
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    merge = f"grtool corpus merge {tmp_path / 'run' / 'ingest'} {tmp_path / 'not-a-corpus'} --out {tmp_path / 'run' / 'corpus'}"
    for quiet in ((), ("-q",)):
        err = grtool(*quiet, "pipeline", "run", config, check=1).stderr
        assert "pipeline stopped at stage merge (exit code 1)" in err, err
        assert "  done:   ingest" in err and f"  failed: {merge}" in err and "  left:   stats" in err, err
        assert unstamped(err.strip())[-1].startswith("error: stage 'merge' failed: "), err
        # The table of what the done stages made is a summary: shown, except under --quiet.
        assert ("pipeline summary" in err) == (not quiet), err


@pytest.mark.slow
def test_transformers_backend_reports_each_batch(tmp_path):
    from grtool.llm import Sampling, make_backend
    from grtool.llm.cache import CachedLLM

    backend = make_backend("transformers", batch_size=1)
    prompts = [[{"role": "user", "content": f"Say {word}."}] for word in ("one", "two", "three")]
    sampling = Sampling(max_tokens=2)
    calls: list[list[Generation]] = []
    gens = backend.generate(prompts, sampling, on_done=calls.append)
    assert [len(c) for c in calls] == [1, 1, 1]
    assert sorted(id(g) for c in calls for g in c) == sorted(id(g) for g in gens)

    # The request cache forwards them: progress per batch, then the repeated prompt (generated once), then hits.
    llm = CachedLLM(backend, tmp_path / "cache.sqlite")
    seen: list[list[Generation]] = []
    llm.generate([*prompts, prompts[0]], Sampling(max_tokens=3), on_progress=seen.append)
    assert [len(s) for s in seen] == [1, 1, 1, 1] and [g.cached for s in seen for g in s] == [False, False, False, True]
    seen.clear()
    llm.generate(prompts, Sampling(max_tokens=3), on_progress=seen.append)
    assert [len(s) for s in seen] == [3] and all(g.cached for g in seen[0])


def test_index_json_output_has_no_nan_or_infinity():
    """`index stats/build/query --json` print strict JSON: a non-finite ratio is null (NaN is not JSON)."""
    import json as _json

    import numpy as np

    from grtool.index.build import dump_json

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    text = dump_json({"ratio": float("nan"), "per_doc": np.float64("inf"), "n": np.int64(3), "title": "Lübeck"})
    assert _json.loads(text, parse_constant=refuse) == {"ratio": None, "per_doc": None, "n": 3, "title": "Lübeck"}
