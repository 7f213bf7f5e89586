"""Run a pipeline file: each stage is its own grtool command, run in this process, skipped when done.

A stage is done when its completion record (``{out}/_pipeline/<stage>.json``, written after the command
succeeded) names the same command line and every output it lists still exists; stage directories among the
outputs must also be complete. Inside a stage, resume is the stage directory's own (finished shards skipped).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grtool.errors import GrtoolError
from grtool.pipeline.config import Pipeline, Stage
from grtool.store.stage import atomic_write_bytes, dumps, merge_counters
from grtool.store.validate import find_stage_dirs, status

RECORDS_DIR = "_pipeline"


@dataclass
class StageState:
    stage: Stage
    state: str  # "done" | "partial" | "to run" | "changed"
    detail: str = ""


def _record_path(pipeline: Pipeline, stage: Stage) -> Path:
    return Path(pipeline.out) / RECORDS_DIR / f"{stage.name}.json"


def _stage_dirs(outputs: list[str]) -> list[Path]:
    dirs: list[Path] = []
    for o in outputs:
        p = Path(o)
        if p.is_dir():
            dirs += find_stage_dirs(p)
    return dirs


def stage_state(pipeline: Pipeline, stage: Stage) -> StageState:
    record = _record_path(pipeline, stage)
    dirs = _stage_dirs(stage.outputs)
    statuses = [status(d) for d in dirs]
    if record.exists():
        saved = json.loads(record.read_text())
        if saved.get("command") != stage.command_line():
            return StageState(stage, "changed", "the command differs from the one that made the outputs")
        missing = [o for o in stage.outputs if not Path(o).exists()]
        if missing:
            return StageState(stage, "to run", f"missing {', '.join(missing)}")
        if all(s["complete"] for s in statuses):
            return StageState(stage, "done")
    if statuses and any(s["parts_done"] for s in statuses):
        done = sum(s["parts_done"] for s in statuses)
        planned = sum(s["parts_planned"] or 0 for s in statuses)
        return StageState(stage, "partial", f"{done}/{planned} parts done")
    return StageState(stage, "to run")


def plan(pipeline: Pipeline, stages: list[Stage]) -> list[StageState]:
    return [stage_state(pipeline, s) for s in stages]


def run_stage(stage: Stage) -> float:
    """Run one stage's command in this process; returns seconds taken. Raises GrtoolError on failure."""
    from grtool.cli.main import app  # the same Typer app as the `grtool` command

    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if stage.stdout:
            Path(stage.stdout).parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(stage.stdout, "w"))))
        try:
            code = app(stage.argv(), standalone_mode=False, prog_name="grtool")
        except GrtoolError as e:
            raise GrtoolError(f"stage {stage.name!r} failed: {e}", e.exit_code) from None
    if isinstance(code, int) and code != 0:
        raise GrtoolError(f"stage {stage.name!r} failed with exit code {code}: {stage.command_line()}", code)
    return time.perf_counter() - start


def mark_done(pipeline: Pipeline, stage: Stage, seconds: float) -> None:
    record = _record_path(pipeline, stage)
    record.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "stage": stage.name,
        "command": stage.command_line(),
        "outputs": stage.outputs,
        "seconds": round(seconds, 3),
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_bytes(record, dumps(payload))


def summarize(stages: list[Stage]) -> list[dict[str, Any]]:
    """Rows and rejects per stage, from the manifests of the stage directories among its outputs."""
    rows = []
    for stage in stages:
        dirs = _stage_dirs(stage.outputs)
        statuses = [status(d) for d in dirs]
        counters = merge_counters(s["counters"] for s in statuses)
        rows.append(
            {
                "stage": stage.name,
                "tables": {str(s["path"]): s["rows"] for s in statuses},
                "rows": sum(s["rows"] for s in statuses),
                "rejected": counters["rejected"],
                "extra": counters.get("extra", {}),
                "outputs": stage.outputs,
            }
        )
    return rows
