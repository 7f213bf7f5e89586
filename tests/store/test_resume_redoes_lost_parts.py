"""Resume trusts the files, not the manifest (DESIGN §8): a part removed or truncated after a complete run is
redone by the same command, never reported as 'already complete'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grtool.store.stage import read_table

HOTPOT = "hotpotqa/hotpot_train_v1.1.example.json"


def _ingest(cli, data: Path, out: Path):
    return cli("corpus", "ingest", str(data / HOTPOT), "--out", str(out), "--rows-per-part", "4")


def _rows(stage: Path) -> list:
    return sorted(read_table(stage).to_pylist(), key=lambda r: r["doc_id"])


@pytest.fixture
def ingested(cli, examples, tmp_path) -> tuple[Path, list]:
    out = tmp_path / "out"
    _ingest(cli, examples, out)
    assert (out / "documents" / "part-00002.parquet").is_file(), "the example must make at least three parts"
    return out, _rows(out / "documents")


@pytest.mark.parametrize("damage", ["part and record removed", "part removed", "part truncated"])
def test_ingest_redoes_a_part_that_is_gone_from_disk(cli, examples, ingested, damage):
    out, before = ingested
    part, record = out / "documents" / "part-00002.parquet", out / "documents" / "_shards" / "part-00002.json"
    if damage == "part truncated":
        part.write_bytes(part.read_bytes()[:100])
    else:
        part.unlink()
        if damage == "part and record removed":
            record.unlink()
    status = json.loads(cli("status", str(out / "documents"), "--json").stdout)
    assert not status["complete"] and status["parts_pending"] == ["part-00002"]
    again = _ingest(cli, examples, out)
    assert "already complete" not in again.stderr
    assert _rows(out / "documents") == before
    cli("validate", str(out))


def test_merge_redoes_a_part_that_is_gone_from_disk(cli, examples, ingested, tmp_path):
    out, _ = ingested
    merged = tmp_path / "merged"
    args = ("corpus", "merge", str(out), "--out", str(merged), "--rows-per-part", "4")
    cli(*args)
    before = _rows(merged / "documents")
    (merged / "documents" / "part-00001.parquet").unlink()
    (merged / "documents" / "_shards" / "part-00001.json").unlink()
    again = cli(*args)
    assert "already complete" not in again.stderr
    assert _rows(merged / "documents") == before
    cli("validate", str(merged))


def test_a_stage_a_killed_run_left_is_no_commands_input_until_resumed(cli, examples, tmp_path):
    """Killed after its first documents part: before, a command reading the documents (here `index build
    --source documents`) read the parts there as the whole corpus, exit 0. An input must be finished; resuming the
    run makes it one."""
    import signal

    from hold_helpers import held

    out = tmp_path / "out"
    args = ["corpus", "ingest", str(examples / HOTPOT), "--out", str(out), "--rows-per-part", "4"]
    held(args, "committed", signal.SIGKILL, tmp_path / "holds")
    build = ("index", "build", out, "--source", "documents", "--tokenizer", "default", "--kind", "numpy", "--out", tmp_path / "idx")
    err = cli(*build, check=2).stderr
    assert f"{out / 'documents'}: incomplete stage directory (finish or resume the run that writes it first" in " ".join(err.split()), err
    assert not (tmp_path / "idx").exists()  # refused before it wrote anything
    # before: `corpus stats` counted the parts there as the corpus, exit 0, no word of the killed run
    err = cli("corpus", "stats", out, check=2).stderr
    assert f"{out / 'documents'}: incomplete stage directory" in " ".join(err.split()), err
    _ingest(cli, examples, out)  # the same command resumes it
    cli(*build)


def test_status_counts_a_removed_part_as_pending_only(ingested):
    # before: "parts done 3/3, pending 1": the removed part counted as done and as pending, its rows still summed
    from grtool.store.status import status

    out, rows = ingested
    (out / "documents" / "part-00001.parquet").unlink()
    st = status(out / "documents")
    assert st["parts_pending"] == ["part-00001"] and st["parts_done"] + 1 == st["parts_planned"]
    assert st["rows"] < len(rows) and st["complete"] is False
