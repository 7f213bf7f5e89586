"""Stage inputs and outputs, with ``-`` meaning JSON Lines on stdin/stdout (shell pipelines).

Stage code reads its input through :class:`InputTable` and writes through :func:`open_output`, so it never
needs to know whether it is in a pipeline or writing a stage directory.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from grtool import signals
from grtool.errors import InputError
from grtool.log import log
from grtool.store.diskfull import writing
from grtool.store.reading import iter_shard_batches
from grtool.store.stage import StageSpec, StageWriter, shard_paths
from grtool.store.records import Counters, Manifest, load_manifest, resolve_stage

STDIO = "-"


def is_stdio(path: str | Path | None) -> bool:
    return path is not None and str(path) == STDIO


@dataclass
class InputTable:
    """A table to read: a stage directory (one part per shard) or JSON Lines on stdin (one streamed part).

    Rows on stdin may carry a ``_table`` field (``corpus ingest --out -`` writes documents and questions in
    one stream); rows of other tables are skipped.
    """

    source: str
    table: str
    parts: list[Path | None]  # None = stdin

    @classmethod
    def open(cls, path: str | Path, table: str) -> "InputTable":
        if is_stdio(path):
            return cls(STDIO, table, [None])
        stage = resolve_stage(path, table)
        return cls(str(stage), table, list(shard_paths(stage)))

    @property
    def num_parts(self) -> int:
        return len(self.parts)

    @property
    def manifest(self) -> Manifest | None:
        """The stage's manifest (None: rows on stdin have none)."""
        return None if self.source == STDIO else load_manifest(self.source)

    def iter_part(self, index: int, columns: list[str] | None = None, batch_size: int = 8192) -> Iterator[list[dict[str, Any]]]:
        """Row batches of one part."""
        part = self.parts[index]
        if part is None:
            yield from _stdin_batches(self.table, batch_size)
            return
        for batch in iter_shard_batches(part, columns, batch_size):
            yield batch.to_pylist()

    def iter_rows(self, columns: list[str] | None = None) -> Iterator[dict[str, Any]]:
        for i in range(self.num_parts):
            for batch in self.iter_part(i, columns):
                yield from batch


def stdin_rows(default_table: str) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """``(table, line number, row)`` for every JSON Lines row on stdin; ``_table`` names the table (else the default)."""
    for lineno, line in enumerate(sys.stdin.buffer, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise InputError(f"<stdin>, line {lineno}: not JSON ({e})") from None
        if not isinstance(row, dict):
            raise InputError(f"<stdin>, line {lineno}: expected a JSON object per line")
        yield row.pop("_table", default_table), lineno, row


def _stdin_batches(table: str, batch_size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for tag, _, row in stdin_rows(table):
        if tag != table:
            continue
        batch.append(row)
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


class _JsonlShard:
    """A shard writer that streams rows to stdout as JSON Lines and reports rejects on stderr."""

    def __init__(self, stage: "JsonlOutput", index: int):
        self.stage = stage
        self.index = index
        self.rows_in = self.rows_out = self.merged = 0
        self.rejected: dict[str, int] = {}

    def count_in(self, n: int = 1) -> None:
        self.rows_in += n

    def count_merged(self, n: int = 1) -> None:
        self.merged += n

    def count(self, key: str, n: int = 1) -> None:
        pass

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        out = sys.stdout.buffer
        tag = self.stage.tag
        with writing(STDIO):
            for row in rows:
                if tag:
                    row = {"_table": tag, **row}
                out.write(orjson.dumps(row, default=str, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
                self.stage.rows += 1  # row by row: a stop in the middle of a batch counts what went out
        self.rows_out += len(rows)

    def write_table(self, table: pa.Table) -> None:
        self.write_rows(table.to_pylist())

    def reject(self, record: Any, reason: str, *, source: str | None = None, position: Any = None, detail: str | None = None) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        entry = {"reject": reason, "source": source, "position": position, "detail": detail}
        sys.stderr.write(orjson.dumps(entry, default=str).decode() + "\n")

    def __enter__(self) -> "_JsonlShard":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        with writing(STDIO):
            sys.stdout.buffer.flush()
        if exc_type is None:
            self.stage.rows_in += self.rows_in
            self.stage.merged += self.merged
            for reason, n in self.rejected.items():
                self.stage.rejected[reason] = self.stage.rejected.get(reason, 0) + n


class JsonlOutput:
    """Same surface as :class:`StageWriter` for ``--out -``: nothing is ever 'done', nothing is resumed."""

    def __init__(self, spec: StageSpec, tag: str | None = None):
        self.spec = spec
        self.tag = tag
        self.path = Path(STDIO)
        self.rows = 0  # written so far
        self.rows_in = self.merged = 0  # of finished parts, for the empty-result rule
        self.rejected: dict[str, int] = {}
        signals.track(self)

    def on_stop(self) -> str | None:
        """A signal stopped the run: the rows streamed so far are the reader's; nothing is kept to resume from."""
        signals.note(None, STREAM_HINT)
        return f"{self.rows:,} {self.spec.table} rows written to standard output (a stream is not resumed)"

    def done(self, index: int) -> bool:
        return False

    def shard(self, index: int) -> _JsonlShard:
        return _JsonlShard(self, index)

    def finish(self, *, check_empty: bool = True, **extra: Any) -> None:
        """The stream ends; it has no manifest (callers' ``None``: the rows went to stdout)."""
        with writing(STDIO):
            sys.stdout.buffer.flush()
        if check_empty:
            self.check_empty(None)

    def check_empty(self, manifest: None) -> None:
        """The stream is judged as a stage directory is (grtool.store.empty), from its parts' counts."""
        from grtool.store import empty

        counters = Counters(in_=self.rows_in, merged=self.merged, rejected=self.rejected)
        empty.check_counted(f"{self.spec.table} rows on standard output", counters, self.rows, [str(i) for i in self.spec.inputs])


STREAM_HINT = "run the same command again to start over (a reader of the stream must start over too)"


def open_output(out: str | Path, spec: StageSpec, *, overwrite: bool = False, num_parts: int | None = None, tag: str | None = None, shards: tuple[int, int] | None = None):
    """A :class:`StageWriter` for a directory, or a JSON Lines writer for ``-``.

    ``tag`` adds ``"_table": tag`` to every stdout row, for commands that stream more than one table.
    ``shards=(count, index)``: this run is one array task (else a whole run, which locks the directory).
    """
    if is_stdio(out):
        log.debug("writing %s rows as JSON Lines to stdout", spec.table)
        return JsonlOutput(spec, tag)
    return StageWriter(out, spec, overwrite=overwrite, num_parts=num_parts, shards=shards)
