"""`grtool status` and `grtool validate`: what a stage directory holds, and whether it can be trusted.

`grtool validate DIR` checks everything under DIR that grtool writes:

- stage directories (``_manifest.json``): manifest against shard records and files, accounting, keys, and the
  gold references of a questions table against its sibling documents table;
- folders holding shards (``part-*.parquet``, ``_shards/``) but no manifest: a stage that lost its manifest or
  never wrote one, a problem (its checks, and the gold check of a sibling that needs it, cannot be done);
- index directories (``index.json``): every file's size and sha256, the index opens, sizes agree, a few docids
  looked up return their documents, the input triples unchanged since the build;
- exported files (``<file>.grtool.json`` sidecars, :mod:`grtool.vocab.provenance`) and LLaMA-Factory
  ``dataset_info.json`` files: present, unchanged, parseable, every row in its format's shape, entries
  pointing at existing files (:mod:`grtool.export.check`);
- training checkpoints (``grtool.json`` read through its declaration), and a training run that started
  (``grtool-run.json``) and did not finish, a problem.

A directory holding none of these is a problem too: "nothing to validate" must not pass a CI gate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import polars as pl
import pyarrow.parquet as pq

from grtool.errors import DataProblem, GrtoolError, InputError
from grtool.store.empty import GUARD as EMPTY_GUARD, top_reasons
from grtool.store.fingerprints import check_inputs
from grtool.records import DamagedRecord, file_kind
from grtool.store.reading import arrow_source, scan_shards, schema_diff, short
from grtool.store.records import Manifest, ShardRecord, StopRecord, check_parts_planned, open_stops, totals_problems
from grtool.store.stops import describe as describe_stop, describe_acceptance
from grtool.store.schemas import TABLES
from grtool.store.layout import MANIFEST, SHARDS_DIR, part_name
from grtool.store.records import is_stage_dir, load_manifest, load_shard_records, sha256_file
from grtool.store.stage import shard_paths
from grtool.store.status import find_stage_dirs, status
from grtool.errors import printable

if TYPE_CHECKING:
    from grtool.index.record import Sizes
from grtool.audit.discover import INDEX_META, SHARD_GLOB, discover, is_orphan_dir


def accept_tree(root: str | Path, reason: str | None = None) -> list[tuple[Path, StopRecord]]:
    """Accept every stop nobody accepted yet in the stage directories under ``root`` (``validate --accept``):
    ``(stage, stop)`` for each, each stage claimed (its run lock) while its manifest is updated. Nothing to accept is an error: an ``--accept`` left in a CI script must not
    wave through stops that appear later unnoticed, and fails once there is nothing left to accept."""
    import contextlib

    from grtool.errors import InputError
    from grtool.invocation import current_command
    from grtool.store.outputs import STAGE, claim
    from grtool.store.stops import accept_stops

    root = Path(root)
    if root.is_file():
        raise InputError(f"--accept: {root} is a file; name a stage directory or a run directory")
    accepted = []
    stages = [stage for stage in find_stage_dirs(root) if open_stops(load_manifest(stage))]
    with contextlib.ExitStack() as claims:
        # Every stage is claimed first, as a run of it would be: while a run of any is live, exit 75 accepting nothing.
        for stage in stages:
            claims.enter_context(claim(stage, STAGE, command=current_command(), flag="--accept"))
        for stage in stages:
            try:
                accepted += [(stage, stop) for stop in accept_stops(stage, reason)]
            except OSError as e:  # a read-only checkout: say so, no traceback
                raise InputError(f"--accept: cannot record the acceptance in {stage / MANIFEST} ({e.strerror or e})") from None
    if not accepted:
        raise InputError(f"--accept: no stage directory under {root} has a failed run to accept (see grtool status {root})")
    return accepted


@dataclass
class Report:
    path: str
    table: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # worth knowing, not a failure (exit 0)
    checked: dict[str, Any] = field(default_factory=dict)
    stops: list[StopRecord] = field(default_factory=list)  # a stage's recorded stops, accepted or not
    empty: str | None = None  # the problem its having no row is (grtool.store.empty), until --accept-empty takes it

    @property
    def ok(self) -> bool:
        return not self.problems

    def printable(self) -> dict[str, Any]:
        """The report with every text made printable: a file name that is not UTF-8 (held with surrogate escapes)
        shows its bytes as ``\\xff`` instead of breaking the JSON or the terminal."""
        fields = {k: v for k, v in self.__dict__.items() if k != "empty"}  # that one is among the problems
        return _printable_tree({**fields, "stops": msgspec.to_builtins(self.stops)})  # the stop records as JSON


def _printable_tree(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_printable_tree(k): _printable_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable_tree(v) for v in value]
    return value


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
    try:
        check_parts_planned(path, manifest.num_parts, records)
    except DamagedRecord as e:
        report.problems.append(str(e))
        return report
    report.table = manifest.table
    _check_stops(path, manifest, report)
    _check_manifest(manifest, records, report)
    _check_shards(path, manifest, records, report)
    _check_empty_stage(path, manifest, report)
    _note_leftovers(path, report)
    if check_keys and report.table in TABLES and records and not any("sha256" in p for p in report.problems):
        _check_keys(path, records, report)
    return report


def _check_stops(path: Path, manifest: Manifest, report: Report) -> None:
    """A run of the stage that failed (a guard tripped, an error) fails it until a run succeeds or it is accepted;
    an accepted one is a note."""
    report.stops = [stop for _, stop in sorted((manifest.stops or {}).items())]
    for stop in report.stops:
        if stop.accepted is None:
            report.problems.append(f"stopped: {describe_stop(stop)}; re-run the command (a run that passes clears this) or accept it: grtool validate {path} --accept")
        else:
            report.notes.append(f"stop {describe_acceptance(stop)}")


def _check_empty_stage(path: Path, manifest: Manifest, report: Report) -> None:
    """A complete stage without a row is a problem (the empty-result rule) unless its run was given --allow-empty;
    where the run itself stopped on it, the recorded stop says so already (open: a problem, accepted: a note)."""
    if not manifest.complete or manifest.rows or any(s.guard == EMPTY_GUARD for s in report.stops):
        return
    why = top_reasons(manifest.counters.rejected) or f"{manifest.counters.in_} input rows"
    _judge_empty(report, bool(manifest.allow_empty), f"{why}; re-run with --allow-empty if that is right")


def _judge_empty(report: Report, allowed: bool, why: str) -> None:
    """An empty stage or export: a note when its run allowed it, else a problem --accept-empty can take."""
    if allowed:
        report.notes.append("empty (allowed by --allow-empty)")
        return
    report.empty = f"empty: no rows ({why}), or accept it: grtool validate … --accept-empty {report.path}"
    report.problems.append(report.empty)


def accept_empty(reports: list[Report], root: Path, paths: list[Path]) -> list[Report]:
    """``validate --accept-empty PATH``: the empty stages and exports named (as given, or relative to ``root``)
    pass with a note; a PATH naming no empty one is an error, so a stale acceptance cannot hide a later problem."""
    from grtool.errors import InputError

    by_path = {Path(r.path).resolve(): r for r in reports if r.empty is not None}
    taken = []
    for given in paths:
        found = next((by_path[c] for c in (Path(given).resolve(), (root / given).resolve()) if c in by_path), None)
        if found is None:
            raise InputError(f"--accept-empty {given}: no empty stage directory or export there (under {root}); see grtool validate {root}")
        if found.empty in found.problems:
            found.problems.remove(found.empty)
            found.notes.append("empty (accepted by --accept-empty)")
        taken.append(found)
    return taken


def _check_manifest(manifest: Manifest, records: dict[str, ShardRecord], report: Report) -> None:
    """The manifest against the shard completion records (the commit points).

    Concurrency: array tasks commit their records independently and each re-merges the manifest under a lock
    when it finishes, so a manifest may lag behind records committed after its last merge (a task still
    running, or one killed between its commit and its merge). Those shards are verified against their
    records like any other and readers go by the records, so a lagging manifest is a note, not a problem;
    re-running the command (it resumes) re-merges it. What the manifest does list must agree exactly: a
    committed shard is never rewritten in place, so any difference means the manifest was changed or is wrong.
    """
    listed = manifest.shards
    for name, entry in sorted(listed.items()):
        rec = records.get(name)
        if rec is None:
            report.problems.append(f"{MANIFEST}: lists {name} but {SHARDS_DIR}/{name}.json does not exist (shard not committed)")
            continue
        for k in SHARD_FACTS:
            if getattr(entry, k) != getattr(rec, k):
                report.problems.append(f"{MANIFEST}: {name} {k} is {getattr(entry, k)!r}, {SHARDS_DIR}/{name}.json says {getattr(rec, k)!r}")

    unmerged = sorted(set(records) - set(listed))
    if unmerged:
        report.notes.append(
            f"{MANIFEST} lags behind the shard records: {len(unmerged)} committed shard(s) not merged yet ({_first(unmerged)}); it is re-merged when a task finishes or the command is re-run"
        )

    # Totals: against the records the manifest has merged, so a lagging manifest stays consistent.
    report.problems += totals_problems(manifest, records)


def _check_shards(path: Path, manifest: Manifest, records: dict[str, ShardRecord], report: Report) -> None:
    """Every shard record against its file (size, sha256, Parquet rows, schema) and its own accounting."""
    expected = TABLES.get(report.table, (None, ()))[0]
    on_disk = {p.stem for p in path.glob("part-*.parquet")}
    for name in sorted(on_disk - set(records)):
        report.problems.append(f"{name}.parquet: shard file without a completion record in {SHARDS_DIR}/ (interrupted run, or a task still committing it)")
    n = manifest.num_parts
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
        if not f.is_file():  # never opened: a FIFO would hang the reader
            report.problems.append(f"{f.name}: {file_kind(f) or 'a directory'} in the shard's place, not a file (damaged)")
            continue
        if f.stat().st_size != rec.bytes:
            report.problems.append(f"{f.name}: {f.stat().st_size} bytes, {SHARDS_DIR}/{name}.json says {rec.bytes}")
        if sha256_file(f) != rec.sha256:
            report.problems.append(f"{f.name}: sha256 does not match {SHARDS_DIR}/{name}.json (corrupted or changed)")
            continue
        try:
            meta = pq.ParquetFile(arrow_source(f))
            for _ in meta.iter_batches(batch_size=65_536):  # every page decodes (a shard damaged before its record
                pass  # was written matches it, and the other commands would fail on it)
        except Exception as e:
            report.problems.append(f"{f.name}: not readable as Parquet ({short(e)})")
            continue
        if meta.metadata.num_rows != rec.rows:
            report.problems.append(f"{f.name}: {meta.metadata.num_rows} rows, {SHARDS_DIR}/{name}.json says {rec.rows}")
        if expected is not None and not meta.schema_arrow.equals(expected):
            report.problems.append(f"{f.name}: schema differs from the {report.table} table: {schema_diff(meta.schema_arrow, expected)}")
        rows_total += meta.metadata.num_rows
        _check_accounting(path, f.name, rec, report)
    report.checked["rows"] = rows_total
    report.checked["shards"] = len(records)


def _check_accounting(path: Path, shard: str, rec: ShardRecord, report: Report) -> None:
    c = rec.counters
    rejected = sum(c.rejected.values())
    if c.in_ != c.out + c.merged + rejected:
        report.problems.append(f"{shard}: accounting broken: in {c.in_} != out {c.out} + merged {c.merged} + rejected {rejected}")
    if c.out != rec.rows:
        report.problems.append(f"{shard}: counters say {c.out} rows out, the shard has {rec.rows}")
    rej_file = path / rec.rejects_file if rec.rejects_file else None
    if rejected and (rej_file is None or not rej_file.exists()):
        report.problems.append(f"{shard}: {rejected} rejects counted but no rejects file")
    elif rej_file is not None and rej_file.exists():
        with open(rej_file, "rb") as fh:
            lines = sum(1 for _ in fh)
        if lines != rejected:
            report.problems.append(f"{rej_file.relative_to(path)}: {lines} lines, counters say {rejected} rejects")


def _check_keys(path: Path, records: dict[str, ShardRecord], report: Report) -> None:
    key = list(TABLES[report.table][1])
    files = [f for f in (path / f"{name}.parquet" for name in sorted(records)) if f.is_file()]
    if not files:
        return
    try:
        dup = scan_shards(files).select(key).group_by(key).agg(pl.len().alias("n")).filter(pl.col("n") > 1).collect()
    except Exception as e:
        report.problems.append(f"key check failed: {e}")
        return
    if dup.height:
        examples = "; ".join(" / ".join(str(v) for v in r[:-1]) for r in dup.head(3).rows())  # the key's values, not the count
        report.problems.append(f"key {' + '.join(key)} not unique: {dup.height} duplicated keys (e.g. {examples})")


def _note_leftovers(path: Path, report: Report) -> None:
    """Temporary files a killed run left (not a failure: the next run of the stage removes them)."""
    from grtool.store.stage import leftovers

    found = [str(f.relative_to(path)) for f in leftovers(path)]
    if found:
        report.notes.append(f"{len(found)} temporary file{'s' if len(found) > 1 else ''} left by a killed run: {_first(found)} (the next run of this stage removes them)")


def _note_index_leftovers(path: Path, report: Report) -> None:
    """Temporary directories a killed `index build` of ``path`` left beside it (not a failure: the next build
    of the same --out removes them)."""
    from grtool.index.build import stale_builds

    found = [d.name for d in stale_builds(path)]
    if found:
        report.notes.append(
            f"{len(found)} temporary build director{'ies' if len(found) > 1 else 'y'} left by a killed `index build` beside it: {_first(found)} (the next `index build --out {path.name}` removes them)"
        )


def describe(report: Report) -> str:
    """What was validated, for the one-line summary of a report."""
    c = report.checked
    if report.table == "index":
        return f"index, {c.get('kind') or 'kind unknown'}, {c.get('sequences') or 0} sequences, {c.get('documents') or 0} documents"
    if report.table == "export":
        fmt = f" {c.get('format')}" if c.get("format") not in (None, c.get("kind")) else ""
        return f"export {c.get('kind') or 'of unknown kind'}{fmt}, {c.get('rows', 0)} rows"
    if report.table == "dataset_info":
        return f"dataset_info, {c.get('entries', 0)} entries"
    if report.table == "lookup":
        return "triples lookup"
    if report.table == "checkpoint":
        return f"checkpoint, {c.get('kind') or 'not finished'}, {c.get('steps', 0)} steps"
    if report.table == "file":
        return "a report, plot or JSON file, by its record"
    table = report.table or "table unknown"  # a damaged or missing manifest names none: no "None" in the line
    return f"{table}, {c.get('shards', 0)} shards, {c.get('rows', 0)} rows"


def _first(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (" …" if len(names) > n else "")


def check_gold_references(questions: Path, documents: Path) -> list[str]:
    """Every gold doc id of `questions` exists in `documents` (committed shards of both)."""
    doc_files = shard_paths(documents)
    q = scan_shards(shard_paths(questions)).select(pl.col("qid"), pl.col("gold_doc_ids").alias("doc_id")).explode("doc_id")
    q = q.filter(pl.col("doc_id").is_not_null())
    missing = (q.join(scan_shards(doc_files).select("doc_id"), on="doc_id", how="anti") if doc_files else q).collect()
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
                if load_manifest(candidate).table == table:
                    return candidate
            except Exception:
                continue
    return None


def sibling_unreadable(path: Path) -> Path | None:
    """A stage directory next to ``path`` whose manifest cannot be read (so its table is unknown), if any."""
    path = path.resolve()
    for candidate in sorted(path.parent.iterdir()):
        if candidate != path and is_stage_dir(candidate):
            try:
                load_manifest(candidate)
            except Exception:
                return candidate
    return None


def validate_orphan(path: Path) -> Report:
    """A folder of shards without a manifest: named as a problem, with the table its shards look like."""
    table = _table_by_schema(path)
    report = Report(str(path), table)
    parts = sorted(p.name for p in path.glob(SHARD_GLOB))
    records = sorted((path / SHARDS_DIR).glob("part-*.json"))
    report.checked = {"shards": len(records), "rows": 0}
    report.problems.append(
        f"{MANIFEST} is missing: {len(parts)} {SHARD_GLOB} file(s) and {len(records)} shard record(s) in {SHARDS_DIR}/ but no manifest, "
        "so nothing here can be checked (lost, deleted, or the run never got to write it); re-run the command that writes "
        "this directory (it resumes) or remove the directory"
    )
    return report


def _table_by_schema(path: Path) -> str | None:
    """The table whose schema the first shard has, if any (an orphan has no manifest to say it)."""
    for f in sorted(path.glob(SHARD_GLOB)):
        try:
            schema = pq.read_schema(arrow_source(f))
        except Exception:
            continue
        for name, (expected, _) in TABLES.items():
            if schema.equals(expected):
                return name
        return None
    return None


def sibling_orphan(path: Path, table: str) -> Path | None:
    """A folder next to ``path`` holding ``table`` shards (by schema, or by name) without a manifest."""
    path = path.resolve()
    for candidate in sorted(path.parent.iterdir()):
        if candidate != path and is_orphan_dir(candidate) and (candidate.name == table or _table_by_schema(candidate) == table):
            return candidate
    return None


INDEX_PROBES = 3  # docids looked up in the sanity query: the first, the middle and the last


def validate_index(path: str | Path) -> Report:
    """An index directory: files against index.json (size, sha256), then it opens and answers a few lookups."""
    path = Path(path)
    report = Report(str(path), "index")
    from grtool.index.record import read_index_record

    _note_index_leftovers(path, report)
    try:
        record = read_index_record(path)  # through its declaration: a damaged record is one line naming the field
    except (OSError, GrtoolError) as e:
        report.problems.append(str(e) if isinstance(e, GrtoolError) else f"{INDEX_META}: cannot be read ({e})")
        return report
    files = record.files  # names of files beside the record (FileName), never outside the index
    for name, rec in sorted(files.items()):
        f = path / name
        if not f.is_file():
            report.problems.append(f"{name}: listed in {INDEX_META} but missing")
        elif f.stat().st_size != rec.bytes:
            report.problems.append(f"{name}: {f.stat().st_size} bytes, {INDEX_META} says {rec.bytes}")
        elif sha256_file(f) != rec.sha256:
            report.problems.append(f"{name}: sha256 does not match {INDEX_META} (corrupted or changed)")
    unlisted = sorted(f.name for f in path.iterdir() if f.is_file() and f.name != INDEX_META and f.name not in files)
    if unlisted:
        report.notes.append(f"files not listed in {INDEX_META}: {_first(unlisted)}")
    sizes = record.sizes
    report.checked = {"kind": record.kind, "source": record.source, "sequences": sizes.sequences, "documents": sizes.documents}
    if report.problems:  # never open (memory-map) files that are known to be damaged
        return report
    try:
        _index_sanity(path, sizes, report)
    except GrtoolError as e:  # the record disagrees with the files it describes (grtool.index.record.confirm_files)
        report.problems.append(str(e))
    except Exception as e:
        report.problems.append(f"the index does not open or answer: {type(e).__name__}: {e}")
    from grtool.index.docid_bytes import record_problems

    report.problems += record_problems(path)
    stale, notes = check_inputs(record.inputs, "the index")
    report.problems += stale
    report.notes += notes
    return report


def _index_sanity(path: Path, sizes: Sizes, report: Report) -> None:
    from grtool.index.base import Index

    index = Index.open(path)
    lengths = index.seq_lengths
    if len(lengths) != sizes.sequences:
        report.problems.append(f"seq_lengths.npy: {len(lengths)} sequences, {INDEX_META} says {sizes.sequences}")
    if int(lengths.sum()) != sizes.tokens:
        report.problems.append(f"seq_lengths.npy: {int(lengths.sum())} tokens, {INDEX_META} says {sizes.tokens}")
    if len(index.doc_ids) != sizes.documents:
        report.problems.append(f"doc_ids.txt: {len(index.doc_ids)} documents, {INDEX_META} says {sizes.documents}")
    tok = index.tokenizer
    if (tok.start_id, tok.end_id) != (index.start_id, index.end_id):
        report.problems.append(f"tokenizer.json: docid markers are ids {tok.start_id}/{tok.end_id}, {INDEX_META} says {index.start_id}/{index.end_id}")
    if report.problems:
        return
    n = len(lengths)
    probes = sorted({0, n // 2, n - 1}) if n else []
    if index.source == "docids":
        docids = pq.read_table(arrow_source(path / "docids.parquet"), columns=["docid"]).column("docid")
        if len(docids) != n:
            report.problems.append(f"docids.parquet: {len(docids)} docids, {INDEX_META} says {n} sequences")
            return
        for i in probes:
            docid = docids[i].as_py()
            got, want = index.docs_of(tok.encode(docid)), sorted(index.docs_of_sequence(i))
            if got != want or not got:
                report.problems.append(f"lookup of docid #{i} {docid[:80]!r} returns documents {', '.join(got[:3]) or 'none'}, expected {', '.join(want[:3]) or 'none'}")
    else:
        ids, _ = index.next_tokens(index.start())
        if n and not len(ids):
            report.problems.append("no token can start a sequence: the index answers nothing")
    report.checked["probes"] = len(probes) if index.source == "docids" else 1


def validate_lookup(path: Path) -> Report:
    from grtool.docid.lookup_files import lookup_problems

    return Report(str(path), "lookup", problems=lookup_problems(path))


def validate_pipeline_records(run: Path) -> Report:
    """Each ``_pipeline/<stage>.json`` through its declaration (the records `status` and `pipeline run` trust)."""
    from grtool.pipeline.records import RECORDS_DIR, read_stage_done

    report = Report(str(run / RECORDS_DIR), "pipeline records")
    records = sorted((run / RECORDS_DIR).glob("*.json"))
    for record in records:
        try:
            read_stage_done(record)
        except DamagedRecord as e:
            report.problems.append(str(e))
        except OSError as e:  # a dangling link or a loop in a record's place
            report.problems.append(f"{record}: stage completion record cannot be read ({e.strerror or e})")
    report.checked = {"records": len(records)}
    return report


def validate_export(sidecar: Path) -> Report:
    from grtool.export.check import check_export, load_sidecar

    target, meta, problem = load_sidecar(sidecar)
    report = Report(str(target), "export")
    if problem is not None or meta is None:
        report.problems.append(problem or f"{sidecar.name}: cannot be read")
        return report
    report.checked, report.problems, report.notes = check_export(target, meta)
    if meta.rows == 0:
        _judge_empty(report, meta.allow_empty, "an export of nothing; re-export with --allow-empty if that is right")
    return report


def validate_dataset_info(path: Path, with_sidecar: set[Path]) -> Report:
    from grtool.export.check import check_dataset_info

    report = Report(str(path), "dataset_info")
    report.checked, report.problems, report.notes = check_dataset_info(path, with_sidecar)
    return report


def validate_checkpoint(path: Path) -> Report:
    """A `train` output by its records: a finished checkpoint's ``grtool.json`` read through its declaration, or a
    run that started (its ``grtool-run.json``) and did not finish."""
    from grtool.vocab.provenance import CHECKPOINT_RECORD, read_checkpoint, read_run_record

    report = Report(str(path), "checkpoint")
    try:
        record = read_checkpoint(path)
        if record is None:
            run = read_run_record(path)
            started = f" ({run.started})" if run is not None else ""
            report.problems.append(f"{path}: a training run started here{started} and did not finish: run its command again with --resume, or with --overwrite to start over")
        else:
            report.checked = {"kind": record.kind, "steps": record.global_step}
    except DamagedRecord as e:  # its message names the record
        report.problems.append(str(e) if str(e).startswith(str(path)) else f"{path / CHECKPOINT_RECORD}: {e}")
    return report


def not_shown(root: Path) -> GrtoolError:
    """Why `show` or `status` shows nothing of the directory ``root``: nothing grtool wrote is there (validate's
    verdict, exit 1), or what is there is another command's to show (an index, a folder of exports or runs)."""
    from grtool.audit.discover import discover, is_checkpoint_dir, is_index_dir

    if not root.is_dir():
        return InputError(f"{root}: a file, not a stage or run directory (grtool validate {root} checks an exported file, grtool show {root} shows its rows)")
    if is_index_dir(root):
        return InputError(f"{root}: an index directory, not a stage: grtool index stats {root} shows it")
    if is_checkpoint_dir(root):
        return InputError(f"{root}: a training checkpoint, not a stage: grtool status {root} and grtool validate {root} show it")
    if discover(root).nothing():
        return DataProblem(nothing_found(root).problems[0])
    return InputError(f"{root}: not a stage directory, nor a run directory holding stages; grtool validate {root} lists and checks what grtool wrote below it")


def nothing_found(root: Path) -> Report:
    started = _stopped_run(root)
    if started is not None:  # a run killed before its first stage directory left its lock (and its work folder)
        return Report(str(root), None, problems=[f"{root}: a grtool run started here ({started}) and stopped before it wrote its first stage directory; run that command again"])
    return Report(
        str(root),
        None,
        problems=[f"{root}: no stage directory ({MANIFEST}, {SHARD_GLOB}), no index ({INDEX_META}) and no export (*.grtool.json, dataset_info.json) under it: nothing grtool wrote is here"],
    )


def _stopped_run(root: Path) -> str | None:
    """What the run lock left in ``root`` says of the run that took it (its command and start), or None."""
    import shlex

    from grtool.store.layout import RUN_LOCK
    from grtool.store.locks import read_holder

    holder = read_holder(root / RUN_LOCK) if (root / RUN_LOCK).is_file() else None
    if holder is None or not holder.command:
        return None
    return f"{shlex.join(holder.command)}, started {holder.started}"


def validate_file(path: Path) -> Report:
    """A single file: an export (by its sidecar, or the sidecar itself), a report, plot or JSON file (by its record)
    or a dataset_info.json."""
    from grtool.store.outputs import file_problem, file_record
    from grtool.vocab.provenance import DATASET_INFO, is_sidecar, sidecar_path

    if is_sidecar(path):
        return validate_export(path)
    if sidecar_path(path).is_file():
        return validate_export(sidecar_path(path))
    if os.path.lexists(file_record(path)):
        problem = file_problem(path)
        return Report(str(path), "file", problems=[f"{printable(path)}: {problem}"] if problem else [])
    if path.name == DATASET_INFO:
        return validate_dataset_info(path, set())
    return Report(str(path), None, problems=[f"{path}: a file grtool cannot validate (no {sidecar_path(path).name} beside it, nor "
                                             f"{file_record(path).name}; not a {DATASET_INFO})"])  # fmt: skip


def validate_tree(root: str | Path, accept_empty_paths: list[Path] | None = None) -> list[Report]:
    """Validate everything grtool wrote under ``root`` (see the module docstring), or ``root`` itself.

    References are checked whenever the referenced sibling exists, also when a single stage directory is
    validated; the sibling is then not validated itself, only required to be complete and readable.
    """
    from grtool.store.outputs import file_record

    root = Path(root)
    # missing, a FIFO in its place, or a directory holding nothing grtool wrote: judged by the file's record
    by_record = os.path.lexists(file_record(root)) and (not root.is_dir() or discover(root).nothing())
    reports = [validate_file(root)] if root.is_file() or by_record else _validate_dir(root)
    if accept_empty_paths:
        accept_empty(reports, root if root.is_dir() else root.parent, accept_empty_paths)
    return reports


def _validate_dir(root: Path) -> list[Report]:
    found = discover(root)
    reports = [validate_stage(p) for p in found.stages]
    orphans = [validate_orphan(p) for p in found.orphans]
    _check_references(reports, {Path(r.path).resolve() for r in orphans})
    _check_gold_coverage(reports)
    reports += orphans
    reports += [validate_index(p) for p in found.indexes]
    reports += [validate_lookup(p) for p in found.lookups]
    reports += [validate_pipeline_records(p) for p in found.pipeline_runs]
    reports += [validate_checkpoint(p) for p in found.checkpoints]
    exports = [validate_export(p) for p in found.sidecars]
    reports += exports
    reports += [validate_file(p) for p in found.files]  # reports, plots, JSON files: by the bytes their records name
    with_sidecar = {Path(r.path).resolve() for r in exports}
    reports += [validate_dataset_info(p, with_sidecar) for p in found.dataset_infos]
    return reports or [nothing_found(root)]  # reports is empty exactly when found.nothing()


def _check_references(reports: list[Report], orphans: set[Path]) -> None:
    """Gold doc ids of every questions table against its sibling documents table."""
    by_path = {Path(r.path).resolve(): r for r in reports}
    for q in reports:
        if q.table != "questions" or not q.ok or not q.checked.get("shards"):
            continue
        docs = sibling_stage(Path(q.path), "documents")
        unreadable = sibling_unreadable(Path(q.path)) if docs is None else None
        if unreadable is not None:  # a manifest edited or damaged: it may be the documents; never a silent pass
            why = f"gold doc ids not checked: {unreadable} has a manifest that cannot be read"
            d = by_path.get(unreadable.resolve())
            (q.notes if d is not None and not d.ok else q.problems).append(why)
            continue
        if docs is None:
            lost = sibling_orphan(Path(q.path), "documents")
            if lost is not None:  # the check is due and cannot be done: never a silent pass
                why = f"gold doc ids not checked: {lost} holds documents shards but no {MANIFEST}"
                # Validated together, the orphan is reported as a problem of its own; alone, the questions carry it.
                (q.notes if lost.resolve() in orphans else q.problems).append(why)
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


def _check_gold_coverage(reports: list[Report]) -> None:
    """The gold coverage of every questions table whose run holds triples (:mod:`grtool.evaluation.gold_coverage`):
    a note below 100%; a problem when no gold document of a dataset and split holds a docid and a responses stage
    validated with it answered that split (its recall is 0 by construction)."""
    from grtool.evaluation.gold_coverage import FIX, coverage_warning, gold_coverage, triples_of_corpus

    by_path = {Path(r.path).resolve(): r for r in reports}
    answered = [_selection(Path(r.path)) for r in reports if r.table == "responses" and r.ok]
    for q in reports:
        if q.table != "questions" or not q.ok or not q.checked.get("shards"):
            continue
        triples = triples_of_corpus(q.path)
        if triples is None:
            continue
        t = by_path.get(triples.resolve())
        try:
            if (t is not None and not t.ok) or (t is None and status(triples)["parts_pending"]):
                q.notes.append(f"gold coverage not counted: {triples} is not complete or has problems of its own")
                continue
            coverage = gold_coverage(q.path, triples)
        except GrtoolError as e:
            q.problems.append(f"gold coverage not counted: {e}")
            continue
        q.checked["gold_coverage"] = coverage["share"]
        if warning := coverage_warning(coverage):
            q.notes.append(warning)
        for s in coverage["splits"]:
            scored_by = [path for path, datasets, splits in answered if (not datasets or s["dataset"] in datasets) and (not splits or s["split"] in splits)]
            if s["gold_documents"] and not s["reachable"] and scored_by:
                q.problems.append(
                    f"gold coverage 0%: none of the {s['gold_documents']} gold documents of {s['dataset']} {s['split']} holds a docid in "
                    f"{triples}, and {scored_by[0]} answers its questions (recall 0 by construction); {FIX}"
                )


def _selection(responses: Path) -> tuple[Path, list[str], list[str]]:
    """(a responses stage, the datasets and splits its questions were selected by: empty = all)."""
    params = load_manifest(responses).params
    return responses, list(params.get("datasets") or []), list(params.get("splits") or [])
