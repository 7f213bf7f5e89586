"""Stage directories: the contract between grtool commands (DESIGN §2).

A stage directory holds one table as zstd Parquet shards plus bookkeeping:

    part-00000.parquet ...     the rows; a shard is visible only once complete (tmp, fsync, rename)
    _rejects/part-00000.jsonl  every dropped record with its reason, written with its shard
    _shards/part-00000.json    the shard's completion record (rows, bytes, sha256, counters): the commit point
    _manifest.json             what made this (command, version, inputs, parameters) and the merged shard records

Each shard owns its own completion record, so several processes (a Slurm array) can fill one directory at
once; the manifest is re-merged from the records under a file lock when a task finishes.

Accounting per shard: ``in == out + merged + sum(rejected.values())``, where ``merged`` counts input rows
folded into another row (deduplication), never dropped.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from grtool import __version__, signals
from grtool.errors import GrtoolError, InputError
from grtool.holds import hold
from grtool.log import log
from grtool.invocation import current_command
from grtool.store import reading
from grtool.store.diskfull import writing
from grtool.secrets import redact_argv
from grtool.store.layout import LOCK, MANIFEST, REJECTS_DIR, SHARDS_DIR, TMP_PATTERNS, TMP_SUFFIX, part_name
from grtool.store.fingerprints import changed_inputs, fingerprint
from grtool.store.outputs import CLEARING, FOLDER_ENTRIES, PART, STAGE, claim
from grtool.store.records import MAX_PARTS, Manifest, ShardRecord, write_record, commit_file, dumps, is_stage_dir, load_manifest, load_shard_records, merge_counters, now, part_on_disk, sha256_file
from grtool.errors import printable

MAX_ROWS_PER_SHARD = 100_000
PARQUET_COMPRESSION = "zstd"


def shard_paths(path: str | Path) -> list[Path]:
    """Committed shard files in part order, each checked against its completion record before anyone reads it
    (present, size, sha256, the table's schema: :func:`grtool.store.reading.verify_shard`); a damaged shard is
    a one-line :class:`~grtool.errors.DataProblem` naming it."""
    from grtool.store.schemas import TABLES

    p = Path(path)
    records = load_shard_records(p)
    manifest = load_manifest(p) if is_stage_dir(p) else None
    listed = manifest.shards if manifest is not None else {}
    for name in sorted(set(listed) - set(records)):  # a lagging manifest lists fewer, never more
        raise reading.damaged(p / f"{name}.parquet", f"{MANIFEST} lists it but its record {SHARDS_DIR}/{name}.json is missing")
    expected = TABLES[manifest.table][0] if manifest is not None else None
    shards = []
    for name, record in sorted(records.items()):
        shard = p / f"{name}.parquet"
        entry = listed.get(name)
        for key in ("sha256", "bytes", "rows"):  # the manifest copies each record: a difference is a record edited or copied from another stage
            if entry is not None and getattr(entry, key) != getattr(record, key):
                raise reading.damaged(shard, f"{MANIFEST} records {key} {getattr(entry, key)!r}, {SHARDS_DIR}/{name}.json records {getattr(record, key)!r}")
        reading.verify_shard(shard, record, expected)
        shards.append(shard)
    return shards


def iter_batches(path: str | Path, columns: list[str] | None = None, batch_size: int = 65_536) -> Iterator[pa.RecordBatch]:
    """Stream a stage directory's rows as Arrow record batches, shard by shard (bounded memory)."""
    for shard in shard_paths(path):
        yield from reading.iter_shard_batches(shard, columns, batch_size)


def iter_rows(path: str | Path, columns: list[str] | None = None) -> Iterator[dict[str, Any]]:
    for batch in iter_batches(path, columns):
        yield from batch.to_pylist()


def read_table(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    shards = shard_paths(path)
    if not shards:
        return pa.table({})
    return pa.concat_tables(reading.read_shard(s, columns) for s in shards)


# ------------------------------------------------------------------------------------------- writes


@dataclass
class StageSpec:
    """What a stage run is: compared against an existing manifest to refuse silent mixes."""

    table: str
    schema: pa.Schema
    params: dict[str, Any] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    command: list[str] | None = None
    exclude: list[str | Path] = field(default_factory=list)  # paths inside input trees that are not input (the output)

    def input_fingerprints(self) -> list[dict[str, Any]]:
        return [fingerprint(i, self.exclude) for i in self.inputs]

    def identity(self) -> dict[str, Any]:
        return {"table": self.table, "params": json.loads(dumps(self.params)), "inputs": self.input_fingerprints()}

    def mismatch(self, old: Manifest) -> str | None:
        """What differs between an existing manifest and this run, or None when this run may resume it."""
        diffs = []
        if old.table != self.table:
            diffs.append(f"table ({old.table!r} vs {self.table!r})")
        op, np_ = old.params, json.loads(dumps(self.params))
        for k in sorted(set(op) | set(np_)):
            if op.get(k) != np_.get(k):
                diffs.append(f"parameter {k} ({op.get(k)!r} before, {np_.get(k)!r} now)")
        changed = changed_inputs(old.inputs, self)
        if changed:
            diffs.append(f"inputs ({', '.join(printable(c) for c in changed)}: path or contents changed)")
        return ", ".join(diffs) or None


def part_timing(rows: int, elapsed: float) -> dict[str, float | None]:
    """A shard record's ``seconds`` (to the millisecond) and ``rows_per_second`` (rows written over those seconds;
    None when they round to 0): where a stage spends its time, per part (datatrove's ``track_time``)."""
    seconds = round(max(elapsed, 0.0), 3)
    return {"seconds": seconds, "rows_per_second": round(rows / seconds, 3) if seconds else None}


class ShardWriter:
    """Writes one shard: rows to Parquet, dropped records to the rejects file, counters to the record.

    Use as a context manager; the shard becomes visible only when the block ends without an exception.
    """

    def __init__(self, stage: "StageWriter", index: int):
        self.stage = stage
        self.index = index
        self.name = part_name(index)
        self.final = stage.path / f"{self.name}.parquet"
        # The writer's own temporary names: two tasks relaunched on one part never write into each other's file.
        owner = _owner()
        self.tmp = stage.path / f"{self.name}.parquet.{owner}{TMP_SUFFIX}"
        self.rejects_final = stage.path / REJECTS_DIR / f"{self.name}.jsonl"
        self.rejects_tmp = stage.path / REJECTS_DIR / f"{self.name}.jsonl.{owner}{TMP_SUFFIX}"
        self._writer: pq.ParquetWriter | None = None
        self._rejects_file = None
        self.started = time.monotonic()  # the part's seconds run from here to its commit
        self.rows_in = 0
        self.rows_out = 0
        self.merged = 0
        self.rejected: Counter[str] = Counter()
        self.extra: Counter[str] = Counter()

    # -- writing
    def count_in(self, n: int = 1) -> None:
        self.rows_in += n

    def count_merged(self, n: int = 1) -> None:
        self.merged += n

    def count(self, key: str, n: int = 1) -> None:
        """A stage-specific counter (empty documents, truncated outputs, ...), merged into the manifest."""
        self.extra[key] += n

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.write_table(pa.Table.from_pylist(rows, schema=self.stage.spec.schema))

    def write_table(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        table = table.select(self.stage.spec.schema.names).cast(self.stage.spec.schema)
        with writing(self.final, table.nbytes):
            if self._writer is None:
                self._writer = pq.ParquetWriter(self.tmp, self.stage.spec.schema, compression=PARQUET_COMPRESSION)
            self._writer.write_table(table)
        self.rows_out += table.num_rows

    def reject(self, record: Any, reason: str, *, source: str | None = None, position: Any = None, detail: str | None = None) -> None:
        """Drop a record, keeping it with why it was dropped."""
        if self._rejects_file is None:
            self.rejects_tmp.parent.mkdir(parents=True, exist_ok=True)
            self._rejects_file = open(self.rejects_tmp, "wb")
        entry = {"reason": reason, "source": source, "position": position, "detail": detail, "record": record}
        with writing(self.rejects_final):
            self._rejects_file.write(orjson.dumps(entry, default=str) + b"\n")
        self.rejected[reason] += 1

    # -- commit
    def counters(self) -> dict[str, Any]:
        c: dict[str, Any] = {"in": self.rows_in, "out": self.rows_out, "merged": self.merged, "rejected": dict(self.rejected)}
        if self.extra:
            c["extra"] = dict(self.extra)
        return c

    def commit(self) -> ShardRecord:
        with writing(self.final):
            if self._writer is None:  # an empty shard is still a shard: downstream sees the schema
                self._writer = pq.ParquetWriter(self.tmp, self.stage.spec.schema, compression=PARQUET_COMPRESSION)
            self._writer.close()
            commit_file(self.tmp, self.final)
        n_rejects = sum(self.rejected.values())
        if self._rejects_file is not None:
            with writing(self.rejects_final):
                self._rejects_file.close()
                commit_file(self.rejects_tmp, self.rejects_final)
        record = {
            "part": self.name,
            "file": self.final.name,
            "rows": self.rows_out,
            "bytes": self.final.stat().st_size,
            "sha256": sha256_file(self.final),
            "rejects_file": f"{REJECTS_DIR}/{self.name}.jsonl" if n_rejects else None,
            "counters": self.counters(),
            "finished": now(),
            **part_timing(self.rows_out, time.monotonic() - self.started),
        }
        written = write_record(self.stage.path / SHARDS_DIR / f"{self.name}.json", record, ShardRecord, "shard record")
        hold("committed")  # tests: a run killed between two parts
        return written

    def abort(self) -> None:
        # Closing may fail again (a full disk fails the footer's write too): the temporary files go regardless,
        # so a failed run never keeps the space it could not finish with.
        for handle in (self._writer, self._rejects_file):
            if handle is not None:
                try:
                    handle.close()
                except OSError:
                    pass
        for f in (self.tmp, self.rejects_tmp):
            f.unlink(missing_ok=True)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.stage.records[self.name] = self.commit()
        else:
            self.abort()
            self.stage.run.release()  # the run is failing: let the next one in (shard() takes it again)


class StageWriter:
    """Opens (or resumes) a stage directory for writing.

    - a new directory gets a manifest describing the run;
    - an existing one is resumed when its identity (table, parameters, input fingerprints) matches, and
      refused otherwise (``--overwrite`` starts over);
    - ``done(i)`` tells whether part ``i`` is already committed; ``shard(i)`` writes it.
    """

    keeps_parts = True  # a stop keeps its committed parts: the stop line says so (grtool.signals)

    def __init__(self, path: str | Path, spec: StageSpec, *, overwrite: bool = False, num_parts: int | None = None, shards: tuple[int, int] | None = None):
        """``shards=(count, index)`` when this run is one array task (``--num-shards/--shard-index``); the
        default is a whole run. The directory is locked for the run (see :class:`RunLock`) until ``finish``."""
        self.path = Path(path)
        self.spec = spec
        if num_parts is not None and num_parts > MAX_PARTS:  # part names have five digits, and records say so
            raise GrtoolError(f"{self.path}: the run plans {num_parts:,} parts, more than {MAX_PARTS:,}; give it larger parts "
                              f"(--rows-per-part) or fewer inputs")  # fmt: skip
        self.num_parts = num_parts
        self.identity = spec.identity()
        self.whole_run = shards is None or shards[0] <= 1
        # The output is never one of the inputs; --overwrite deletes only a stage of this table, and of it only
        # the entries a stage writer makes (store/outputs.py). A run directory or a directory of raw files
        # given as input may hold the output.
        claimed = claim(self.path, STAGE, holders=[i for i in spec.inputs if str(i) != "-"], overwrite=overwrite, table=spec.table, shards=shards, command=spec.command)
        self.run = claimed.lock
        weakref.finalize(self, self.run.release)  # a writer dropped without finish() (an error) lets go too
        try:
            if overwrite:
                claimed.clear()
            elif (self.path / CLEARING).exists():
                raise GrtoolError(f"{self.path}: an --overwrite of it was stopped before it finished deleting; run with --overwrite again")
            elif self.whole_run:
                remove_leftovers(self.path)
            (self.path / SHARDS_DIR).mkdir(exist_ok=True)
            with self._lock():
                self._open_manifest()
            self.records = load_shard_records(self.path)
            # The running command's outcome (a guard tripped, an error, success) goes into this manifest's stops.
            from grtool.store import frames

            frames.opened(self.path, shards, redact_argv(spec.command if spec.command is not None else _argv()))
        except BaseException:
            self.run.release()
            raise
        self.finished = False
        signals.track(self)  # a run stopped by a signal says how far this output got

    def on_stop(self) -> str | None:
        """A signal stopped the run: the lock goes (the process ends without collecting this writer) and the
        report is ``out/triples: 2 of 5 parts done`` (None when this output was finished)."""
        self.run.release()
        if self.finished:
            return None
        records = load_shard_records(self.path)  # every task's, not only this process's
        if self.num_parts is None:
            return f"{self.path}: {len(records)} parts done"
        return f"{self.path}: {sum(part_name(i) in records for i in range(self.num_parts))} of {self.num_parts} parts done"

    def _lock(self) -> FileLock:
        return FileLock(str(self.path / LOCK))

    def _open_manifest(self) -> None:
        mpath = self.path / MANIFEST
        unrecorded = [] if mpath.exists() else _unrecorded(self.path)
        if unrecorded:  # grtool writes the manifest before any part: these are someone else's, never adopted or replaced
            shown = ", ".join(str(f.relative_to(self.path)) for f in unrecorded[:3]) + (f" and {len(unrecorded) - 3} more" if len(unrecorded) > 3 else "")
            raise InputError(f"{self.path}: holds {shown} but no {MANIFEST}, so grtool did not write them; move them away or choose another --out")
        if mpath.exists():
            old = load_manifest(self.path)
            refuse_stdin_resume(self.path, old)
            problem = self.spec.mismatch(old)
            if problem is None and self.num_parts is not None and old.num_parts not in (None, self.num_parts):
                problem = f"planned parts ({old.num_parts} before, {self.num_parts} now)"
            if problem is None:
                return
            if not (self.whole_run and self._nothing_committed(old)):
                raise GrtoolError(f"{self.path}: exists with different {problem}; resume needs the same command, use --overwrite to start over")
            # A run that failed before committing anything (a refused option) left only its manifest: nothing in the
            # directory is described by it, so the corrected command starts the stage afresh (a whole run holds the
            # directory alone: no array task is writing into it).
            log.info("%s: the run that created it committed nothing; starting afresh with the new parameters", self.path)
        manifest = {
            **self.identity,
            "grtool_version": __version__,
            "command": redact_argv(self.spec.command if self.spec.command is not None else _argv()),
            "created": now(),
            "schema": [{"name": f.name, "type": str(f.type)} for f in self.spec.schema],
            "num_parts": self.num_parts,
            "shards": {},
            "counters": merge_counters([]),
            "complete": False,  # every planned part committed (a stop recorded in "stops" still fails the stage)
            "stops": {},  # why runs of it failed, by task (grtool.store.stops)
        }
        write_record(mpath, manifest, Manifest, "manifest")

    def _nothing_committed(self, manifest: Manifest) -> bool:
        """No part, no shard record and no rejects were committed under ``manifest`` (its run failed early): none
        in its record, none on disk by grtool's names (a user's ``notes.parquet`` is none)."""
        return not manifest.shards and not _unrecorded(self.path)

    def done(self, index: int) -> bool:
        name = part_name(index)
        return name in self.records and part_on_disk(self.path, self.records[name])

    def shard(self, index: int) -> ShardWriter:
        self.run.acquire()  # a no-op while held; again after finish() when a run goes on writing
        self.finished = False
        return ShardWriter(self, index)

    def finish(self, *, check_empty: bool = True, **extra: Any) -> Manifest:
        """Merge every committed shard record into the manifest (under the lock) and return it.

        A complete stage without a row is an error unless --allow-empty (:mod:`grtool.store.empty`); the caller
        that judges it later (after another guard) passes ``check_empty=False`` and calls :meth:`check_empty`."""
        from grtool.store import empty

        manifest, self.records = merge_shard_records(self.path, **extra, allow_empty=empty.allowed())
        self.finished = True
        self.run.release()  # the run is over (a run that goes on writing takes the lock again in shard())
        if check_empty:
            self.check_empty(manifest)
        return manifest

    def check_empty(self, manifest: Manifest) -> None:
        from grtool.store import empty

        empty.check_stage(self.path, manifest)


def merge_shard_records(path: str | Path, **extra: Any) -> tuple[Manifest, dict[str, ShardRecord]]:
    """Merge every committed shard record of the stage directory ``path`` into its manifest, under the manifest
    lock; returns the manifest and the records. Each run (an array task too) does it when it finishes; a Slurm
    pipeline does it once more, alone, after the last task of an array ended."""
    path = Path(path)
    with FileLock(str(path / LOCK)):
        # rewritten from the JSON form of what was read (fields a newer grtool added are not kept)
        manifest = msgspec.to_builtins(load_manifest(path))
        records = load_shard_records(path)
        entries = msgspec.to_builtins(records)
        manifest["shards"] = {name: {k: v for k, v in entry.items() if k != "part"} for name, entry in entries.items()}
        manifest["counters"] = merge_counters(entry["counters"] for entry in entries.values())
        manifest["rows"] = sum(r.rows for r in records.values())
        n = manifest["num_parts"]
        manifest["complete"] = n is not None and all(part_name(i) in records for i in range(n))
        manifest.update(extra)
        merged = write_record(path / MANIFEST, manifest, Manifest, "manifest")
        if merged.complete:
            _clean_stale_tmp(path)
    return merged, records


def refuse_stdin_resume(path: Path, old_manifest: Manifest) -> None:
    """Output made from standard input cannot be resumed: nobody can tell whether the same rows come in again."""
    if any(i.kind == "stdin" for i in old_manifest.inputs):
        raise GrtoolError(f"{path}: exists from a run that read standard input, which cannot be resumed; use --overwrite")


def _clean_stale_tmp(path: Path) -> None:
    """Remove what killed runs left behind, once every part is committed.

    Never earlier: another array task may be writing a part right now, however long it pauses.
    """
    for f in leftovers(path):
        if _stale(f):
            f.unlink(missing_ok=True)


def leftovers(path: str | Path) -> list[Path]:
    """The temporary files of the stage directory ``path`` (a part, a rejects file, a record being written): a run
    that is not writing any more (killed by SIGKILL, a node lost) left them."""
    path = Path(path)
    found: set[Path] = set()
    for sub, patterns in TMP_PATTERNS.items():
        folder = path / sub
        if folder.is_dir() and not folder.is_symlink():
            found |= {f for pattern in patterns for f in folder.glob(pattern) if f.is_file() and not f.is_symlink()}
    return sorted(found)


def _unrecorded(path: Path) -> list[Path]:
    """The parts, shard records and rejects files in a stage directory, by grtool's names."""
    found = list(path.glob(f"{PART}.parquet"))
    for folder, patterns in FOLDER_ENTRIES.items():
        found += [f for pattern in patterns[:1] for f in (path / folder).glob(pattern)] if (path / folder).is_dir() else []
    return sorted(found)


def remove_leftovers(path: Path) -> None:
    """A whole run holds the directory alone (its run lock is exclusive): every temporary file there is a killed
    run's, whatever its age; removed before anything is written."""
    for f in leftovers(path):
        log.info("%s: removing %s, left by a run that was killed", path, f.relative_to(path))
        f.unlink(missing_ok=True)


def _owner() -> str:
    """Host and process of this writer (array tasks on several nodes may share one directory)."""
    import socket

    return f"{socket.gethostname()}-{os.getpid()}"


def _stale(f: Path) -> bool:
    # Even in a complete directory, a duplicate task may still be finishing a part: give it a minute.
    try:
        import time

        return time.time() - f.stat().st_mtime > 60
    except FileNotFoundError:
        return False


def _argv() -> list[str]:
    return current_command()  # set by the CLI entry point, or per stage by the pipeline runner
