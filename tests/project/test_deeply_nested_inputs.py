"""JSON and TOML nested thousands deep in every file a user hands in (DESIGN §8): one error line, bounded memory,
with a real `grtool` subprocess on real files.

A subprocess timeout is only a guard against a hang, never a measurement."""

from __future__ import annotations

import os
import subprocess
import sys


from conftest import EXAMPLES
from strict_cli_helpers import DEEP, errors_of, grtool, one_line


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
    one_line(grtool("pipeline", "run", demo, "--dry-run", "--set", f"ingest-hotpotqa.rows_per_part={deep}"), 2, "--set", "nested")
    # a key the stage lacks: the message quotes the argument cut short, not all of its 120,000 characters
    line = one_line(grtool("pipeline", "run", demo, "--dry-run", "--set", f"ingest-hotpotqa.limit={deep}"), 2, "--set", "has no option 'limit'")
    assert len(line) < 1000 and "(120,022 characters)" in line, line[:300]


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
        f.write_text('[{"_id": "a", "question": "q", "answer": "a", "supporting_facts": [], "type": "x", "level": "y", "context": ' + "[" * levels + "]" * levels + "}]")
        proc = subprocess.Popen([sys.executable, "-m", "grtool", "corpus", "ingest", str(f), "--out", str(f.parent / "o")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        err = proc.stderr.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.returncode == 2 and "nested deeper" in err and "Traceback" not in err, err[-2000:]
        peaks[levels] = usage.ru_maxrss  # KiB on Linux
    # a quadratic path would need terabytes; 200 MiB of slack covers allocator noise
    assert peaks[1_000_000] < peaks[150] + 200 * 1024, peaks


# ------------------------------------------------------------------ 3. the Slurm job record is written from its declaration


# ------------------------------------------------------------------ 5. leftovers of a killed index build
