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
    shard_paths,
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
    notes: list[str] = field(default_factory=list)  # worth knowing, not a failure (exit 0)
    checked: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


SHARD_FACTS = ("rows", "bytes", "sha256")


def validate_stage(path: str | Path, *, check_keys: bool = True) -> Report:
    """Check one stage directory on its own: manifest, shard records, shard files, accounting, keys.

    References to sibling tables are checked by :func:`validate_tree`.
    """
    path = Path(path)
    report = Report(str(path))
    try:
        manifest = load_manifest(path)
        records = load_shard_records(path)
    except Exception as e:  # an unreadable manifest is a finding, not a crash
        report.problems.append(str(e))
        return report
    report.table = manifest.get("table")
    _check_manifest(manifest, records, report)
    _check_shards(path, manifest, records, report)
    if check_keys and report.table in TABLES and records and not any("sha256" in p for p in report.problems):
        _check_keys(path, records, report)
    return report


def _check_manifest(manifest: dict[str, Any], records: dict[str, dict[str, Any]], report: Report) -> None:
    """The manifest against the shard completion records (the commit points).

    Concurrency: array tasks commit their records independently and each re-merges the manifest under a lock
    when it finishes, so a manifest may lag behind records committed after its last merge (a task still
    running, or one killed between its commit and its merge). Those shards are verified against their
    records like any other and readers go by the records, so a lagging manifest is a note, not a problem;
    re-running the command (it resumes) re-merges it. What the manifest does list must agree exactly: a
    committed shard is never rewritten in place, so any difference means the manifest was changed or is wrong.
    """
    listed: dict[str, dict[str, Any]] = manifest.get("shards") or {}
    for name, entry in sorted(listed.items()):
        rec = records.get(name)
        if rec is None:
            report.problems.append(f"{MANIFEST}: lists {name} but {SHARDS_DIR}/{name}.json does not exist (shard not committed)")
            continue
        for k in SHARD_FACTS:
            if entry.get(k) != rec.get(k):
                report.problems.append(f"{MANIFEST}: {name} {k} is {entry.get(k)!r}, {SHARDS_DIR}/{name}.json says {rec.get(k)!r}")

    unmerged = sorted(set(records) - set(listed))
    if unmerged:
        report.notes.append(
            f"{MANIFEST} lags behind the shard records: {len(unmerged)} committed shard(s) not merged yet "
            f"({_first(unmerged)}); it is re-merged when a task finishes or the command is re-run"
        )

    # Totals: against the records the manifest has merged, so a lagging manifest stays consistent.
    merged = [rec for name, rec in records.items() if name in listed]
    rows = sum(rec.get("rows", 0) for rec in merged)
    if manifest.get("rows", 0) != rows:
        report.problems.append(f"{MANIFEST}: rows is {manifest.get('rows')!r}, its shard records sum to {rows}")
    want = merge_counters(rec.get("counters", {}) for rec in merged)
    got = manifest.get("counters") or {}
    for k in sorted(set(want) | set(got)):
        if got.get(k) != want.get(k):
            report.problems.append(f"{MANIFEST}: counters.{k} is {got.get(k)!r}, its shard records sum to {want.get(k)!r}")


def _check_shards(path: Path, manifest: dict[str, Any], records: dict[str, dict[str, Any]], report: Report) -> None:
    """Every shard record against its file (size, sha256, Parquet rows, schema) and its own accounting."""
    expected = TABLES.get(report.table, (None, ()))[0]
    on_disk = {p.stem for p in path.glob("part-*.parquet")}
    for name in sorted(on_disk - set(records)):
        report.problems.append(f"{name}.parquet: shard file without a completion record in {SHARDS_DIR}/ (interrupted run, or a task still committing it)")
    n = manifest.get("num_parts")
    if n is not None:
        missing = [part_name(i) for i in range(n) if part_name(i) not in records]
        if missing:
            report.problems.append(f"incomplete: {len(missing)} of {n} parts not done ({_first(missing)})")

    rows_total = 0
    for name, rec in sorted(records.items()):
        f = path / f"{name}.parquet"
        if not f.exists():
            report.problems.append(f"{f.name}: recorded as done in {SHARDS_DIR}/{name}.json but the file is missing")
            continue
        if f.stat().st_size != rec.get("bytes"):
            report.problems.append(f"{f.name}: {f.stat().st_size} bytes, {SHARDS_DIR}/{name}.json says {rec.get('bytes')}")
        if sha256_file(f) != rec.get("sha256"):
            report.problems.append(f"{f.name}: sha256 does not match {SHARDS_DIR}/{name}.json (corrupted or changed)")
            continue
        try:
            meta = pq.ParquetFile(f)
        except Exception as e:
            report.problems.append(f"{f.name}: not readable as Parquet ({e})")
            continue
        if meta.metadata.num_rows != rec.get("rows"):
            report.problems.append(f"{f.name}: {meta.metadata.num_rows} rows, {SHARDS_DIR}/{name}.json says {rec.get('rows')}")
        if expected is not None and not meta.schema_arrow.equals(expected):
            report.problems.append(f"{f.name}: schema differs from the {report.table} table: {_schema_diff(meta.schema_arrow, expected)}")
        rows_total += meta.metadata.num_rows
        _check_accounting(path, f.name, rec, report)
    report.checked["rows"] = rows_total
    report.checked["shards"] = len(records)


def _check_accounting(path: Path, shard: str, rec: dict[str, Any], report: Report) -> None:
    c = rec.get("counters", {})
    rejected = sum(c.get("rejected", {}).values())
    if c.get("in", 0) != c.get("out", 0) + c.get("merged", 0) + rejected:
        report.problems.append(
            f"{shard}: accounting broken: in {c.get('in')} != out {c.get('out')} + merged {c.get('merged', 0)} + rejected {rejected}"
        )
    if c.get("out") != rec.get("rows"):
        report.problems.append(f"{shard}: counters say {c.get('out')} rows out, the shard has {rec.get('rows')}")
    rej_file = path / rec["rejects_file"] if rec.get("rejects_file") else None
    if rejected and (rej_file is None or not rej_file.exists()):
        report.problems.append(f"{shard}: {rejected} rejects counted but no rejects file")
    elif rej_file is not None and rej_file.exists():
        with open(rej_file, "rb") as fh:
            lines = sum(1 for _ in fh)
        if lines != rejected:
            report.problems.append(f"{rej_file.relative_to(path)}: {lines} lines, counters say {rejected} rejects")


def _check_keys(path: Path, records: dict[str, dict[str, Any]], report: Report) -> None:
    key = list(TABLES[report.table][1])
    files = [str(f) for f in (path / f"{name}.parquet" for name in sorted(records)) if f.exists()]
    if not files:
        return
    try:
        dup = pl.scan_parquet(files).select(key).group_by(key).agg(pl.len().alias("n")).filter(pl.col("n") > 1).collect()
    except Exception as e:
        report.problems.append(f"key check failed: {e}")
        return
    if dup.height:
        examples = ", ".join(str(r) for r in dup.head(3).rows())
        report.problems.append(f"key {tuple(key)} not unique: {dup.height} duplicated keys (e.g. {examples})")


def _first(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (" …" if len(names) > n else "")


def _schema_diff(got, expected) -> str:
    g = {f.name: str(f.type) for f in got}
    e = {f.name: str(f.type) for f in expected}
    parts = [f"missing {k}" for k in e if k not in g]
    parts += [f"unexpected {k}" for k in g if k not in e]
    parts += [f"{k} is {g[k]}, expected {e[k]}" for k in e if k in g and g[k] != e[k]]
    return "; ".join(parts) or "field order"


def check_gold_references(questions: Path, documents: Path) -> list[str]:
    """Every gold doc id of `questions` exists in `documents` (committed shards of both)."""
    doc_files = [str(f) for f in shard_paths(documents)]
    q = pl.scan_parquet([str(f) for f in shard_paths(questions)]).select(pl.col("qid"), pl.col("gold_doc_ids").alias("doc_id")).explode("doc_id")
    q = q.filter(pl.col("doc_id").is_not_null())
    missing = (q.join(pl.scan_parquet(doc_files).select("doc_id"), on="doc_id", how="anti") if doc_files else q).collect()
    if not missing.height:
        return []
    ex = ", ".join(f"{qid} -> {doc}" for qid, doc in missing.head(3).rows())
    return [f"{missing.height} gold doc ids of {questions} are not in {documents} (e.g. {ex})"]


def sibling_stage(path: Path, table: str) -> Path | None:
    """The stage directory of ``table`` next to ``path`` (same parent), if there is one."""
    path = path.resolve()
    for candidate in sorted(path.parent.iterdir()):
        if candidate != path and is_stage_dir(candidate):
            try:
                if load_manifest(candidate).get("table") == table:
                    return candidate
            except Exception:
                continue
    return None


def validate_tree(root: str | Path) -> list[Report]:
    """Validate a stage directory, or every one under a run directory, and the references between sibling tables.

    References are checked whenever the referenced sibling exists, also when a single stage directory is
    validated; the sibling is then not validated itself, only required to be complete and readable.
    """
    reports = [validate_stage(p) for p in find_stage_dirs(root)]
    by_path = {Path(r.path).resolve(): r for r in reports}
    for q in reports:
        if q.table != "questions" or not q.ok or not q.checked.get("shards"):
            continue
        docs = sibling_stage(Path(q.path), "documents")
        if docs is None:
            continue
        d = by_path.get(docs.resolve())
        if d is not None and not d.ok:
            q.notes.append(f"gold doc ids not checked: {docs} has problems of its own")
            continue
        try:
            if d is None and status(docs)["parts_pending"]:
                q.notes.append(f"gold doc ids not checked: {docs} is not complete")
                continue
            q.problems.extend(check_gold_references(Path(q.path), docs))
        except Exception as e:
            q.problems.append(f"gold doc ids not checked: cannot read {docs} ({e})")
    return reports
