"""`grtool status`: what a stage directory holds, its parts done and pending, and the stops recorded.

The audit of every artifact kind (``grtool validate``) is :mod:`grtool.audit.validate`; the pipeline runner and
the Slurm executor need only this, so it stays with the stage directories.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grtool.store.layout import MANIFEST
import msgspec

from grtool.store.records import ShardRecord, is_stage_dir, load_manifest, load_shard_records, merge_counters, parts_not_on_disk
from grtool.store.records import open_stops


def find_stage_dirs(root: str | Path) -> list[Path]:
    """The stage directory itself, or every stage directory below a run directory."""
    root = Path(root)
    if is_stage_dir(root):
        return [root]
    return sorted(p.parent for p in root.rglob(MANIFEST) if not any(part.startswith("_") for part in p.parent.relative_to(root).parts))


def status(path: str | Path, footers: bool = True) -> dict[str, Any]:
    """Parts done and pending, rows, counters, and the stops recorded (:mod:`grtool.store.stops`): ``complete``
    means every part is committed and no run's failure is left standing (none, or each one accepted).
    ``footers=False``: a committed part is checked by its file and size alone, not its Parquet footer's rows
    (`grtool status` then reads JSON only and starts without pyarrow; resume and validate read the footers)."""
    path = Path(path)
    manifest = load_manifest(path)
    records = load_shard_records(path)
    n = manifest.num_parts
    pending = parts_not_on_disk(path, n, records, footers)  # a record whose part was removed is pending, not done
    records = {name: r for name, r in records.items() if name not in pending}  # the done parts: counted once
    done = sorted(records)
    counters = merge_counters(msgspec.to_builtins(r.counters) for r in records.values())  # summed as JSON counters
    return {
        "path": str(path),
        "table": manifest.table,
        "parts_planned": n,
        "parts_done": len(done),
        "parts_pending": pending,
        "rows": sum(r.rows for r in records.values()),
        "counters": counters,
        **_timing(records),
        "complete": n is not None and not pending and not open_stops(manifest),
        "stops": [stop for _, stop in sorted((manifest.stops or {}).items())],  # StopRecords
    }


def _timing(records: dict[str, ShardRecord]) -> dict[str, float | None]:
    """The parts' seconds summed (time spent working, not the wall time of a run whose array tasks overlap) and the
    rows those parts wrote per second; None where no record has seconds (written by an older grtool)."""
    timed = [r for r in records.values() if r.seconds is not None]
    seconds = round(sum(r.seconds or 0.0 for r in timed), 3)
    rows = sum(r.rows for r in timed)
    return {"seconds": seconds if timed else None, "rows_per_second": round(rows / seconds, 3) if timed and seconds else None}
