"""``grtool pipeline status``: where each stage of a pipeline stands, from its records and, for a run submitted to
Slurm, its jobs' states and the log of every job or array task that failed (as datatrove's ``jobs_status`` and
``failed_logs`` report a run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grtool.pipeline.config import Pipeline
from grtool.pipeline.records import StageDone, read_stage_done
from grtool.pipeline.runner import RECORDS_DIR, stage_state
from grtool.pipeline.slurm import JOBS_DIR, columns, job_label, slurm_jobs


def _read(path: Path) -> StageDone | None:
    """A stage's completion record; none yet is None, a damaged one is one line (exit 1)."""
    try:
        return read_stage_done(path)
    except FileNotFoundError:
        return None


def pipeline_status(pipeline: Pipeline) -> list[dict[str, Any]]:
    """One row per stage of the file: its state (as ``pipeline run --dry-run`` plans it), when it finished, its jobs."""
    jobs = {row["stage"]: row for row in slurm_jobs(pipeline.out)}
    rows = []
    for stage in pipeline.stages:
        state = stage_state(pipeline, stage)
        record = _read(Path(pipeline.out) / RECORDS_DIR / f"{stage.name}.json")
        rows.append({"stage": stage.name, "state": state.state, "detail": state.detail, "finished": record.finished if record else None,
                     "seconds": record.seconds if record else None, "outputs": stage.outputs, "slurm": jobs.get(stage.name)})  # fmt: skip
    return rows


def run_status(out: Path, slurm: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The same rows from a run directory alone (no pipeline file): a stage is done when its completion record is
    there (its inputs are not checked, which needs the file's command lines). ``slurm``: :func:`slurm_jobs` of it,
    where the caller has asked Slurm already (each question can wait out Slurm's timeout)."""
    jobs = {row["stage"]: row for row in (slurm_jobs(out) if slurm is None else slurm)}
    records = {p.stem: record for p in sorted((out / RECORDS_DIR).glob("*.json")) if (record := _read(p)) is not None}
    names = sorted(set(records) | set(jobs), key=lambda n: ((records[n].finished if n in records else "") or "~", n))
    return [{"stage": n, "state": "done" if n in records else "not done", "detail": "", "finished": records[n].finished if n in records else None,
             "seconds": records[n].seconds if n in records else None, "outputs": records[n].outputs if n in records else [], "slurm": jobs.get(n)}
            for n in names]  # fmt: skip


def has_records(out: Path) -> bool:
    return (out / RECORDS_DIR).is_dir() and any((out / RECORDS_DIR).glob("*.json")) or (out / RECORDS_DIR / JOBS_DIR).is_dir()


def status_lines(rows: list[dict[str, Any]], width: int | None = None) -> list[str]:
    """The rows as aligned text, then one line per failed job or task naming its log. When the table is wider than
    ``width`` (a terminal's columns), each stage is a block of ``field: value`` lines instead."""
    header = ["stage", "state", "finished", "seconds", "slurm jobs", "slurm states"]
    table = []
    for r in rows:
        slurm = r["slurm"] or {}
        jobs = slurm.get("jobs", {})
        job = job_label(jobs)
        table.append([r["stage"], r["state"], r["finished"] or "-", f"{r['seconds']:g}" if r["seconds"] is not None else "-",
                      job if slurm else "-", slurm.get("summary", "-")])  # fmt: skip
    lines = columns(header, table)
    if width is not None and max(map(len, lines)) > width:
        lines = [line for row in table for line in (row[0], *(f"  {h}: {v}" for h, v in zip(header[1:], row[1:]) if v != "-"))]
    for r in rows:
        if r["detail"] and r["state"] != "done":
            lines.append(f"{r['stage']}: {r['detail']}")
        for f in (r["slurm"] or {}).get("failed", []):
            exit_ = f" (exit {f['exit']})" if f.get("exit") not in (None, "0:0") else ""
            where = f"log {f['log']}" if Path(f["log"]).exists() else "no log (it did not start)"  # cancelled on a failed dependency
            lines.append(f"{r['stage']}: job {f['job']} {f['state']}{exit_}, {where}")
    return lines
