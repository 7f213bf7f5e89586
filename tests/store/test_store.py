"""Stage directories: atomic shards, resume, parameter checks, validation, sharding defaults."""

from __future__ import annotations

import json

import pytest

from grtool.errors import GrtoolError
from grtool.store.schemas import DOCUMENTS
from grtool.store.sharding import parts_for_task, resolve_sharding
from grtool.store.stage import StageSpec, StageWriter, iter_rows
from grtool.store.records import load_manifest
from grtool.secrets import redact_argv
from grtool.store.status import status
from grtool.audit.validate import validate_stage


def _docs(n: int, start: int = 0) -> list[dict]:
    return [{"doc_id": f"d{i}", "title": f"T{i}", "text": f"text {i}", "datasets": ["x"]} for i in range(start, start + n)]


def _write(path, parts=2, params=None, overwrite=False):
    stage = StageWriter(path, StageSpec("documents", DOCUMENTS, params=params or {"a": 1}, command=["grtool", "test"]), overwrite=overwrite, num_parts=parts)
    for p in range(parts):
        if stage.done(p):
            continue
        with stage.shard(p) as shard:
            rows = _docs(3, start=10 * p)
            shard.count_in(4)
            shard.write_rows(rows)
            shard.reject({"bad": True}, "missing_field", source="in.json", position=7)
    return stage.finish()


def test_roundtrip_and_validate(tmp_path):
    out = tmp_path / "docs"
    m = _write(out)
    assert m.complete and m.rows == 6
    assert m.counters.rejected == {"missing_field": 2}
    assert [r["doc_id"] for r in iter_rows(out)] == ["d0", "d1", "d2", "d10", "d11", "d12"]
    assert validate_stage(out).ok
    rej = (out / "_rejects" / "part-00000.jsonl").read_text().splitlines()
    assert json.loads(rej[0])["reason"] == "missing_field"
    assert status(out)["parts_done"] == 2


def test_corrupted_shard_fails_validation(tmp_path):
    out = tmp_path / "docs"
    _write(out)
    shard = out / "part-00001.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    report = validate_stage(out)
    assert not report.ok and any("sha256" in p for p in report.problems)


def test_duplicate_keys_fail_validation(tmp_path):
    out = tmp_path / "docs"
    stage = StageWriter(out, StageSpec("documents", DOCUMENTS), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(2)
        shard.write_rows(_docs(1) + _docs(1))
    stage.finish()
    assert any("not unique" in p for p in validate_stage(out).problems)


def test_resume_skips_done_and_refuses_changed_params(tmp_path):
    out = tmp_path / "docs"
    _write(out)
    before = (out / "part-00000.parquet").stat().st_mtime_ns
    _write(out)
    assert (out / "part-00000.parquet").stat().st_mtime_ns == before
    with pytest.raises(GrtoolError, match="parameter a"):
        _write(out, params={"a": 2})
    m = _write(out, params={"a": 2}, overwrite=True)
    assert m.params == {"a": 2}


def test_failed_shard_leaves_nothing_visible(tmp_path):
    out = tmp_path / "docs"
    stage = StageWriter(out, StageSpec("documents", DOCUMENTS), num_parts=1)
    with pytest.raises(RuntimeError):
        with stage.shard(0) as shard:
            shard.write_rows(_docs(2))
            raise RuntimeError("boom")
    assert not list(out.glob("part-*"))
    assert not stage.done(0)
    assert not validate_stage(out).ok  # incomplete


def test_sharding_defaults_follow_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "4")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert resolve_sharding(None, None) == (4, 2)
    assert resolve_sharding(2, 1) == (2, 1)
    assert parts_for_task(10, 4, 2) == [2, 6]
    with pytest.raises(GrtoolError):
        resolve_sharding(2, 5)


def test_command_line_secrets_are_redacted():
    argv = ["grtool", "triples", "extract", "--api-key", "sk-abc", "--token=xyz", "--api-key-env", "MY_KEY"]
    assert redact_argv(argv) == ["grtool", "triples", "extract", "--api-key", "***", "--token=***", "--api-key-env", "MY_KEY"]


def test_manifest_records_command(tmp_path):
    _write(tmp_path / "d")
    m = load_manifest(tmp_path / "d")
    assert m.command == ["grtool", "test"] and m.grtool_version
    assert m.shards["part-00000"].sha256


def test_validate_cli_exit_codes(tmp_path, cli):
    _write(tmp_path / "d")
    cli("validate", tmp_path / "d")
    (tmp_path / "d" / "part-00000.parquet").write_bytes(b"garbage")
    proc = cli("validate", tmp_path / "d", check=1)
    assert "part-00000.parquet" in proc.stdout + proc.stderr
    cli("validate", tmp_path / "nope", check=2)
