"""Training options are checked against the model and the data before anything is written (issue #46, item 4):
a --lora-target that names a block rather than a layer LoRA can adapt, a --lora-rank beyond the model's hidden
size, and KTO labels that are not JSON booleans were accepted and failed later (in peft, in the allocator) or,
for labels, trained silently on the text "false" as desirable. Each is one line, exit 2, and --out is not made.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the model's config is read (the embedded model, converted once per cache)

TINY = ["--cutoff-len", "128", "--per-device-batch-size", "2"]


def _rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"Which river runs through town {i}?"}],
             "completion": [{"role": "assistant", "content": f"The Lowe runs through town {i}."}]} for i in range(n)]  # fmt: skip


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refused(proc, *words: str) -> None:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    err = " ".join(proc.stderr.split())
    assert all(w in err for w in words), err


def test_a_lora_target_that_is_no_adaptable_layer_is_refused_before_out(tmp_path, cli):
    data = _write(tmp_path / "sft.jsonl", _rows(4))
    out = tmp_path / "ckpt"
    _refused(cli("train", "sft", data, "--out", out, "--lora", "--lora-target", "mlp", *TINY, check=False),
             "--lora-target mlp", "no layer LoRA can adapt named mlp", "q_proj")  # fmt: skip
    assert not out.exists()


def test_a_lora_rank_beyond_the_hidden_size_is_refused_before_out(tmp_path, cli):
    data = _write(tmp_path / "sft.jsonl", _rows(4))
    out = tmp_path / "ckpt"
    _refused(cli("train", "sft", data, "--out", out, "--lora", "--lora-rank", "1000000000", *TINY, check=False),
             "--lora-rank 1000000000", "hidden size of 576")  # fmt: skip
    assert not out.exists()


@pytest.mark.parametrize("label", ["false", "true", 0, 1, None])
def test_kto_labels_must_be_json_booleans(tmp_path, cli, label):
    rows = [dict(r, label=i % 2 == 0) for i, r in enumerate(_rows(4))]
    rows[1]["label"] = label
    data = _write(tmp_path / "kto.jsonl", rows)
    out = tmp_path / "ckpt"
    _refused(cli("train", "kto", data, "--out", out, *TINY, check=False), "row 2", f"label {label!r} is not true or false")
    assert not out.exists()


def test_retrieve_beams_has_a_checked_bound(cli):
    proc = cli("retrieve", "x", "--index", "y", "--beams", "2147483647", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--beams" in proc.stderr, proc.stderr


def test_system_reaches_every_row_of_a_file_or_is_refused(tmp_path):
    from grtool.errors import InputError
    from grtool.train.data import load_kto, load_sft

    data = _write(tmp_path / "sft.jsonl", _rows(3))
    loaded = load_sft(data, system="Answer with docids.")
    assert [r["prompt"][0] for r in loaded.rows] == [{"role": "system", "content": "Answer with docids."}] * 3
    kto = _write(tmp_path / "kto.jsonl", [dict(r, label=i % 2 == 0) for i, r in enumerate(_rows(4))])
    assert all(r["prompt"][0]["content"] == "Be brief." for r in load_kto(kto, system="Be brief.").rows)
    own = _rows(2)
    own[1]["prompt"].insert(0, {"role": "system", "content": "Mine."})
    with pytest.raises(InputError, match=r"row 2: has a system prompt of its own"):
        load_sft(_write(tmp_path / "own.jsonl", own), system="Answer with docids.")
    assert len(load_sft(_write(tmp_path / "same.jsonl", own), system="Mine.").rows[1]["prompt"]) == 2  # the same one: kept once


def test_prompts_beyond_the_cutoff_are_counted_and_dropped_or_refused(tmp_path, cli):
    rows = _rows(6)
    for r in rows[:2]:  # two prompts far beyond 128 tokens
        r["prompt"][0]["content"] = "Which river runs through the old mill town? " * 40
    data = _write(tmp_path / "sft.jsonl", rows)
    proc = cli("train", "sft", data, "--out", tmp_path / "ckpt", "--dry-run", "--json", *TINY)
    assert json.loads(proc.stdout)["rows"] == 4
    assert "2 of 6 rows dropped: the prompt alone is at least --cutoff-len 128 tokens (row 1" in " ".join(proc.stderr.split())
    every = _write(tmp_path / "long.jsonl", [dict(r, prompt=[{"role": "user", "content": "word " * 300}]) for r in _rows(4)])
    _refused(cli("train", "sft", every, "--out", tmp_path / "ckpt2", *TINY, check=False), "every prompt is at least --cutoff-len 128 tokens")
    assert not (tmp_path / "ckpt2").exists()


def test_an_export_changed_since_its_record_is_refused(tmp_path, cli):
    """An `export sft` file with a row appended by hand: its record would say which questions it trains on while
    the rows hold one more (a dev question trained on, and the overlap check told otherwise)."""
    from run_helpers import write_small_run

    write_small_run(tmp_path / "run", tmp_path / "responses.jsonl")
    data = tmp_path / "sft.json"
    cli("export", "sft", tmp_path / "run" / "chains", "--corpus", tmp_path / "run", "--out", data)
    cli("train", "sft", data, "--out", tmp_path / "plan", "--dry-run", *TINY)  # as exported: trains
    rows = json.loads(data.read_text())
    rows.append({**rows[0], "conversations": [{"from": "human", "value": "A dev question?"}, {"from": "gpt", "value": "Its answer."}]})
    data.write_text(json.dumps(rows))
    _refused(cli("train", "sft", data, "--out", tmp_path / "ckpt", "--dry-run", *TINY, check=False), "changed since `export` wrote it", "sft.json.grtool.json")


def test_an_export_stopped_before_its_rename_is_named_as_such(tmp_path, cli):
    """Killed between its record and its rename, an export holds the bytes it replaced: train says to export it
    again, as validate does (before: "changed since `export` wrote it … move it away")."""
    import signal

    from hold_helpers import held
    from run_helpers import write_small_run

    write_small_run(tmp_path / "run", tmp_path / "responses.jsonl")
    data = tmp_path / "sft.json"
    export = ["export", "sft", tmp_path / "run" / "chains", "--corpus", tmp_path / "run", "--out", data]
    cli(*export)
    assert held([*export, "--system", "Think first."], "recorded", signal.SIGKILL, tmp_path / "holds").returncode == -signal.SIGKILL
    _refused(cli("train", "sft", data, "--out", tmp_path / "ckpt", "--dry-run", *TINY, check=False), "an export stopped before its new file was in place", "export it again")
