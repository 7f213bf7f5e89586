"""`grtool status` and `grtool validate`: what a stage directory holds, and whether it can be trusted."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from grtool.store.schemas import TABLES
from grtool.store.stage import (
    MANIFEST,
    SHARDS_DIR,
    is_stage_dir,
    load_manifest,
    load_shard_records,
    merge_counters,
    part_name,
    sha256_file,
)


def find_stage_dirs(root: str | Path) -> list[Path]:
    """The stage directory itself, or every stage directory below a run directory."""
    root = Path(root)
    if is_stage_dir(root):
        return [root]
    return sorted(p.parent for p in root.rglob(MANIFEST) if not any(part.startswith("_") for part in p.parent.relative_to(root).parts))


def status(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    manifest = load_manifest(path)
    records = load_shard_records(path)
    n = manifest.get("num_parts")
    done = sorted(records)
    pending = [part_name(i) for i in range(n) if part_name(i) not in records] if n is not None else []
    counters = merge_counters(r["counters"] for r in records.values())
    return {
        "path": str(path),
        "table": manifest.get("table"),
        "parts_planned": n,
        "parts_done": len(done),
        "parts_pending": pending,
        "rows": sum(r["rows"] for r in records.values()),
        "counters": counters,
        "complete": n is not None and not pending,
    }


@dataclass
class Report:
    path: str
    table: str | None = None
    problems: list[str] = field(default_factory=list)
    checked: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def validate_stage(path: str | Path, *, check_keys: bool = True) -> Report:
    path = Path(path)
    report = Report(str(path))
    try:
        manifest = load_manifest(path)
        records = load_shard_records(path)
    except Exception as e:  # an unreadable manifest is a finding, not a crash
        report.problems.append(str(e))
        return report
    table = manifest.get("table")
    report.table = table
    expected = TABLES.get(table, (None, ()))[0]

    committed = set(records)
    on_disk = {p.stem for p in path.glob("part-*.parquet")}
    for name in sorted(on_disk - committed):
        report.problems.append(f"{name}.parquet: shard file without a completion record in {SHARDS_DIR}/ (interrupted run?)")
    n = manifest.get("num_parts")
    if n is not None:
        missing = [part_name(i) for i in range(n) if part_name(i) not in committed]
        if missing:
            report.problems.append(f"incomplete: {len(missing)} of {n} parts not done ({', '.join(missing[:5])}{' …' if len(missing) > 5 else ''})")

    rows_total = 0
    for name, rec in sorted(records.items()):
        f = path / f"{name}.parquet"
        if not f.exists():
            report.problems.append(f"{f.name}: recorded as done but missing")
            continue
        if f.stat().st_size != rec.get("bytes"):
            report.problems.append(f"{f.name}: {f.stat().st_size} bytes, the record says {rec.get('bytes')}")
        if sha256_file(f) != rec.get("sha256"):
            report.problems.append(f"{f.name}: sha256 does not match its record (corrupted or changed)")
            continue
        try:
            meta = pq.ParquetFile(f)
        except Exception as e:
            report.problems.append(f"{f.name}: not readable as Parquet ({e})")
            continue
        if meta.metadata.num_rows != rec.get("rows"):
            report.problems.append(f"{f.name}: {meta.metadata.num_rows} rows, the record says {rec.get('rows')}")
        if expected is not None and not meta.schema_arrow.equals(expected):
            report.problems.append(f"{f.name}: schema differs from the {table} table: {_schema_diff(meta.schema_arrow, expected)}")
        rows_total += meta.metadata.num_rows
        c = rec.get("counters", {})
        rejected = sum(c.get("rejected", {}).values())
        if c.get("in", 0) != c.get("out", 0) + c.get("merged", 0) + rejected:
            report.problems.append(
                f"{f.name}: accounting broken: in {c.get('in')} != out {c.get('out')} + merged {c.get('merged', 0)} + rejected {rejected}"
            )
        if c.get("out") != rec.get("rows"):
            report.problems.append(f"{f.name}: counters say {c.get('out')} rows out, the shard has {rec.get('rows')}")
        rej_file = path / rec["rejects_file"] if rec.get("rejects_file") else None
        if rejected and (rej_file is None or not rej_file.exists()):
            report.problems.append(f"{f.name}: {rejected} rejects counted but no rejects file")
        elif rej_file is not None and rej_file.exists():
            with open(rej_file, "rb") as fh:
                lines = sum(1 for _ in fh)
            if lines != rejected:
                report.problems.append(f"{rej_file.relative_to(path)}: {lines} lines, counters say {rejected} rejects")
    report.checked["rows"] = rows_total
    report.checked["shards"] = len(records)

    if check_keys and table in TABLES and records and not any("sha256" in p for p in report.problems):
        key = list(TABLES[table][1])
        files = [str(path / f"{name}.parquet") for name in sorted(records)]
        try:
            dup = (
                pl.scan_parquet(files)
                .select(key)
                .group_by(key)
                .agg(pl.len().alias("n"))
                .filter(pl.col("n") > 1)
                .collect()
            )
        except Exception as e:
            report.problems.append(f"key check failed: {e}")
        else:
            if dup.height:
                examples = ", ".join(str(r) for r in dup.head(3).rows())
                report.problems.append(f"key {tuple(key)} not unique: {dup.height} duplicated keys (e.g. {examples})")
    return report


def _schema_diff(got, expected) -> str:
    g = {f.name: str(f.type) for f in got}
    e = {f.name: str(f.type) for f in expected}
    parts = [f"missing {k}" for k in e if k not in g]
    parts += [f"unexpected {k}" for k in g if k not in e]
    parts += [f"{k} is {g[k]}, expected {e[k]}" for k in e if k in g and g[k] != e[k]]
    return "; ".join(parts) or "field order"


def check_gold_references(questions: Path, documents: Path) -> list[str]:
    """Every gold doc id of `questions` exists in `documents`."""
    q = pl.scan_parquet(str(questions / "part-*.parquet")).select(pl.col("qid"), pl.col("gold_doc_ids").alias("doc_id")).explode("doc_id")
    d = pl.scan_parquet(str(documents / "part-*.parquet")).select("doc_id")
    missing = q.filter(pl.col("doc_id").is_not_null()).join(d, on="doc_id", how="anti").collect()
    if not missing.height:
        return []
    ex = ", ".join(f"{qid} -> {doc}" for qid, doc in missing.head(3).rows())
    return [f"{missing.height} gold doc ids of {questions} are not in {documents} (e.g. {ex})"]


def validate_tree(root: str | Path) -> list[Report]:
    """Validate every stage directory under ``root`` and the references between sibling tables."""
    reports = [validate_stage(p) for p in find_stage_dirs(root)]
    by_parent: dict[Path, dict[str, Report]] = {}
    for r in reports:
        if r.table:
            by_parent.setdefault(Path(r.path).parent, {})[r.table] = r
    for parent, tables in by_parent.items():
        q, d = tables.get("questions"), tables.get("documents")
        if q and d and q.ok and d.ok and q.checked.get("shards") and d.checked.get("shards"):
            q.problems.extend(check_gold_references(Path(q.path), Path(d.path)))
    return reports
