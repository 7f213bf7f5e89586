"""Several array tasks fill one stage directory at the same time: no shard or manifest is lost."""

from __future__ import annotations

import multiprocessing as mp

from grtool.store.schemas import DOCUMENTS
from grtool.store.sharding import parts_for_task
from grtool.store.stage import StageSpec, StageWriter
from grtool.store.records import load_manifest
from grtool.audit.validate import validate_stage

PARTS = 24
TASKS = 4


def _task(path: str, index: int) -> None:
    spec = StageSpec("documents", DOCUMENTS, params={"p": 1}, command=["grtool", "t"])
    stage = StageWriter(path, spec, num_parts=PARTS, shards=(TASKS, index))  # an array task: shares the directory
    for part in parts_for_task(PARTS, TASKS, index):
        with stage.shard(part) as shard:
            rows = [{"doc_id": f"{part}-{i}", "title": "t", "text": "x" * i, "datasets": ["d"]} for i in range(50)]
            shard.count_in(len(rows))
            shard.write_rows(rows)
        stage.finish()  # every task re-merges the manifest under the lock after each shard


def test_parallel_tasks_write_one_stage(tmp_path):
    out = str(tmp_path / "docs")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_task, args=(out, i)) for i in range(TASKS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    report = validate_stage(out)
    assert report.ok, report.problems
    manifest = load_manifest(out)
    assert manifest.complete and len(manifest.shards) == PARTS
    assert manifest.rows == PARTS * 50


def test_a_long_pause_in_one_task_survives_another_task_starting(tmp_path):
    """A task that writes nothing for minutes (a slow generation chunk) keeps its temporary shard."""
    import os

    spec = StageSpec("documents", DOCUMENTS, params={"p": 1}, command=["grtool", "t"])
    slow = StageWriter(tmp_path / "docs", spec, num_parts=2, shards=(2, 0))  # array task 0 of 2
    shard = slow.shard(0)
    shard.write_rows([{"doc_id": "a", "title": "t", "text": "x", "datasets": ["d"]}])
    shard.count_in(1)
    os.utime(shard.tmp, (0, 0))  # looks an hour old to anyone checking its age
    other = StageWriter(tmp_path / "docs", spec, num_parts=2, shards=(2, 1))  # array task 1 starts meanwhile
    with other.shard(1) as s1:
        s1.count_in(0)
    other.finish()
    assert shard.tmp.exists()
    with shard:
        pass  # commits
    manifest = slow.finish()
    assert manifest.complete and manifest.rows == 1
    assert not list((tmp_path / "docs").glob("*.tmp"))
    assert validate_stage(tmp_path / "docs").ok
