"""A damaged index is refused with one line naming the file (never a crash, never a different answer), and a
build stops promptly on SIGINT/SIGTERM leaving no scratch and no temporary index behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grtool.store.schemas import DOCUMENTS
from grtool.store.stage import StageSpec, StageWriter

HERE = Path(__file__).resolve().parent
BUNDLED = HERE / "data" / "index_triples.jsonl"


# ------------------------------------------------------------------------------ signals during a build


def _slow_documents(path: Path, docs: int = 150, words: int = 1000) -> Path:
    """Documents sharing a long common text: their suffixes sort slowly (long equal local strings)."""
    stage = StageWriter(path, StageSpec("documents", DOCUMENTS))
    common = " ".join(["alpha beta"] * words)
    with stage.shard(0) as sh:
        sh.count_in(docs)
        sh.write_rows([{"doc_id": f"d{i:05d}", "title": f"t{i}", "text": f"{common} end{i}", "datasets": ["test"]} for i in range(docs)])
    stage.finish()
    return path


def _scratch_dirs(parent: Path) -> list[Path]:
    return [d for t in parent.glob(".idx.*.tmp") for d in t.glob(".fm-build-*")]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_the_native_build_promptly_and_cleans_up(tmp_path, sig, code):
    docs = _slow_documents(tmp_path / "docs")
    out = tmp_path / "idx"
    cmd = [sys.executable, "-m", "grtool", "index", "build", str(docs), "--tokenizer", "qwen", "--source", "documents", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _scratch_dirs(tmp_path):  # the native build has started: its scratch directory exists
            assert proc.poll() is None, f"the build ended before it was signalled: {proc.communicate()}"
            assert time.monotonic() < deadline, "the native build never started"
            time.sleep(0.02)
        time.sleep(0.3)  # inside the suffix sorting
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-2000:]
    assert took < 3, f"the build took {took:.1f} s to stop"
    assert "Traceback" not in err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"], "a temporary index or scratch was left behind"


def test_a_rerun_removes_what_a_killed_build_left(tmp_path, cli):
    """SIGKILL runs no cleanup: the next build removes the dead process's temporary index and scratch."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".idx.{dead.pid}.tmp"
    (stale / f".fm-build-{dead.pid}-abc").mkdir(parents=True)
    (stale / f".fm-build-{dead.pid}-abc" / "bwt.suffixes").write_bytes(b"x" * 1000)
    live = tmp_path / f".idx.{os.getpid()}.tmp"  # a build still running (this process) is left alone
    live.mkdir()
    cli("index", "build", "-", "--tokenizer", "qwen", "--out", tmp_path / "idx", input=BUNDLED.read_text())
    assert not stale.exists() and live.exists()
    assert not list((tmp_path / "idx").glob(".fm-build-*"))
