"""Files and records of a stage directory: written atomically (readers see nothing or the whole file), read with
their fields type-checked (an edited or damaged record is one line naming it, never a TypeError deep inside a command).
The bottom of the store: it imports no module that writes stages."""

from __future__ import annotations

import datetime as _dt
import os
import re
import stat
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
import orjson

from grtool.errors import InputError
from grtool.records import Count, DamagedRecord, FileName, Rate, Seconds, Sha256, check_timestamp, decode_record, field_message, read_record_bytes, refuse_undeclared
from grtool.store.diskfull import writing
from grtool.store.layout import MANIFEST, MAX_PARTS, PART_PATTERN, REJECTS_DIR, SHARDS_DIR, TABLE_NAME_PATTERN, TMP_SUFFIX, known_table, part_name


# --------------------------------------------------------------------------------------------- files


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or the whole file."""
    tmp = path.with_name(path.name + f".{os.getpid()}" + TMP_SUFFIX)
    try:
        with writing(path, len(data)), open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a disk-full write leaves no half file taking the space
        raise
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def commit_file(tmp: Path, final: Path) -> None:
    """fsync a finished temporary file and rename it into place."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(final.parent)


_SHA256: dict[tuple[Any, ...], str] = {}


def sha256_file(path: Path) -> str:
    """The sha256 of a file, computed once per process for an unchanged file: an export's claim checks the old file
    twice (its output check, then the claim) and its record names the bytes it replaces, as file_hash caches BLAKE3."""
    import hashlib  # here: `status` reads records without OpenSSL loaded

    st = os.stat(path)
    key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    digest = _SHA256.get(key)
    if digest is None:
        with open(path, "rb") as f:
            digest = _SHA256[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return digest


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)


# -------------------------------------------------------------------------------------------- reads


# ---- the declarations: every reader of a manifest or a shard record decodes it through these (grtool.records)

T = TypeVar("T")
PartName = Annotated[str, msgspec.Meta(pattern=PART_PATTERN)]
PartCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_PARTS)]
TableName = Annotated[str, msgspec.Meta(pattern=TABLE_NAME_PATTERN)]  # and known_table: Manifest.__post_init__
# A rejects file lives in the stage's _rejects/ folder, named after its part.
RejectsFile = Annotated[str, msgspec.Meta(pattern=rf"^{REJECTS_DIR}/part-[0-9]{{5}}\.jsonl$")]
Text = Annotated[str, msgspec.Meta(max_length=1_000_000)]
# The exit codes a stop records (a process exit status).
ExitCode = Annotated[int, msgspec.Meta(ge=0, le=255)]


def merge_counters(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The counters of several shard records (or stages) summed, as the manifest holds them."""
    total: dict[str, Any] = {"in": 0, "out": 0, "merged": 0, "rejected": {}}
    rejected: Counter[str] = Counter()
    extra: Counter[str] = Counter()
    for c in items:
        total["in"] += c.get("in", 0)
        total["out"] += c.get("out", 0)
        total["merged"] += c.get("merged", 0)
        rejected.update(c.get("rejected", {}))
        extra.update(c.get("extra", {}))
    total["rejected"] = dict(sorted(rejected.items()))
    if extra:
        total["extra"] = dict(sorted(extra.items()))
    return total


class Counters(msgspec.Struct, forbid_unknown_fields=True):
    """Rows in, out, folded into another row, and dropped by reason (a shard's, or their sum in the manifest)."""

    in_: Count = msgspec.field(name="in", default=0)
    out: Count = 0
    merged: Count = 0
    rejected: dict[Text, Count] = {}
    extra: dict[Text, Count] = {}


class ShardRecord(msgspec.Struct):
    """``_shards/part-NNNNN.json``, a shard's commit point; the manifest's ``shards`` entries are the same
    without ``part``."""

    file: FileName
    rows: Count
    bytes: Count
    sha256: Sha256
    counters: Counters
    part: PartName | None = None
    rejects_file: RejectsFile | None = None
    finished: Text | None = None
    # The part's wall time, from its opening to its commit, and the rows it wrote per second (None where its
    # seconds round to 0); older records have neither. Bounds only: an edited ``rows`` is named as itself by the
    # checks against the part's file, not as a rate that no longer agrees.
    seconds: Seconds | None = None
    rows_per_second: Rate | None = None

    def __post_init__(self) -> None:
        check_timestamp(self.finished, "finished")
        if self.part is not None:
            _names_its_part(self, self.part)
        if self.rejects_file is not None and self.part is not None and self.rejects_file != f"{REJECTS_DIR}/{self.part}.jsonl":
            raise ValueError(f"field rejects_file: {self.rejects_file!r} is not the rejects file of {self.part}")


def _names_its_part(record: ShardRecord, name: str) -> None:
    if record.file != f"{name}.parquet":
        raise ValueError(f"field file: {record.file!r} is not {name}.parquet, the part it records")


class Acceptance(msgspec.Struct):
    by: Text
    when: Text
    command: list[Text] = []
    reason: Text | None = None


class StopRecord(msgspec.Struct):
    """Why a run of the stage stopped (:mod:`grtool.store.stops`), by task in the manifest's ``stops``."""

    task: Annotated[str, msgspec.Meta(pattern=r"^(all|[0-9]{1,9}/[0-9]{1,9})$")]
    kind: Literal["guard", "error"]
    guard: Text | None
    numbers: dict[Text, Any]  # what the guard measured, as it chose to say it (counts, shares, rejects by reason)
    message: Text
    exit_code: ExitCode
    when: Text
    command: list[Text]
    accepted: Acceptance | None

    def __post_init__(self) -> None:
        if (self.kind == "guard") != (self.guard is not None):
            raise ValueError(f"field guard: {self.guard!r} with kind {self.kind!r} (a guard stop names its guard, an error none)")
        if self.task != "all":
            index, count = map(int, self.task.split("/"))
            if not 0 <= index < count:
                raise ValueError(f"field task: {self.task!r} is no task of its array (index below count)")


Digest = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{16,128}$")]


class InputRecord(msgspec.Struct, omit_defaults=True):
    """One input's fingerprint (:func:`grtool.store.fingerprints.fingerprint`; older grtool wrote sampled hashes)."""

    path: Text
    kind: Literal["stdin", "file", "stage", "tree"] | None = None
    size: Count | None = None
    shards: PartCount | None = None
    files: Count | None = None
    blake3: Digest | None = None
    blake2b: Digest | None = None
    sample_blake2b: Digest | None = None


def entries_of(mapping: dict[str, Any], kind: type[T], field: str) -> dict[str, T]:
    """The values of a JSON object decoded as ``kind`` one by one: msgspec names a failing dict entry ``[...]``,
    users need its key (``shards.part-00003.sha256``)."""
    decoded = {}
    for key, value in mapping.items():
        try:
            decoded[key] = msgspec.convert(value, kind)
        except msgspec.ValidationError as e:
            raise ValueError(field_message(e, f"{field}.{key}")) from None
    return decoded


class SchemaField(msgspec.Struct):
    name: Text
    type: Text


class DetectedInput(msgspec.Struct, omit_defaults=True):
    """What an input file (or a directory's files read alike) was read as (``corpus ingest``'s ``detected``)."""

    path: Text
    dataset: Text
    records: Literal["documents", "questions"]
    by: Text
    files: Count | None = None
    split: Text | None = None
    layout: Text | None = None
    unread: list[Text] = []


if TYPE_CHECKING:  # what the fields hold once decoded
    ShardEntries = dict[str, ShardRecord]
    StopEntries = dict[str, StopRecord]
else:  # decoded entry by entry in Manifest.__post_init__: msgspec names a failing entry [...], users need its key
    ShardEntries = dict[PartName, Any]
    StopEntries = dict[Text, Any]


class Manifest(msgspec.Struct):
    """``_manifest.json``: what made the stage and the merged shard records. Every field a grtool writer puts
    there is declared; fields a newer writer adds are ignored on read."""

    table: TableName
    num_parts: PartCount | None
    schema: list[SchemaField] = []
    inputs: list[InputRecord] = []
    params: dict[Text, Any] = {}  # the stage's own parameters
    shards: ShardEntries = {}  # by part name
    counters: Counters = msgspec.field(default_factory=Counters)
    rows: Count | None = None
    complete: bool = False
    stops: StopEntries | None = None  # by task (grtool.store.stops)
    command: list[Text] | None = None
    grtool_version: Text | None = None
    created: Text | None = None
    allow_empty: bool | None = None
    has_questions: bool | None = None  # corpus ingest's documents: whether a questions table was written
    model: Text | None = None  # the model that generated the rows (the LLM stages, retrieve bm25)
    prompt_sha256: Sha256 | None = None  # triples extract's prompt
    empty_inputs: list[Text] = []  # corpus ingest: inputs without a record
    detected: list[DetectedInput] = []  # corpus ingest: what each input was read as

    def __post_init__(self) -> None:
        if not known_table(self.table):  # a command's own table is declared before its records are read
            raise ValueError(f"field table: {self.table!r} is neither a table of grtool nor one a command declared")
        check_timestamp(self.created, "created")
        self.shards = entries_of(self.shards, ShardRecord, "shards")
        self.stops = None if self.stops is None else entries_of(self.stops, StopRecord, "stops")
        for name, entry in self.shards.items():
            if entry.part not in (None, name):
                raise ValueError(f"field shards.{name}.part: {entry.part!r} is listed under {name}")
            _names_its_part(entry, name)
            if self.num_parts is not None and int(name[5:]) >= self.num_parts:
                raise ValueError(f"field shards: {name} is past the {self.num_parts} parts num_parts plans")
        if self.complete and (self.num_parts is None or len(self.shards) != self.num_parts):
            raise ValueError(f"field complete: true, but {len(self.shards)} of {self.num_parts} planned parts are listed in shards")
        if self.rows is not None and self.rows != sum(e.rows for e in self.shards.values()):
            raise ValueError(f"field rows: {self.rows}, the shards it lists hold {sum(e.rows for e in self.shards.values())}")
        for key, stop in (self.stops or {}).items():
            if stop.task != key:
                raise ValueError(f"field stops.{key}.task: {stop.task!r} is recorded under {key!r}")


def write_record(path: Path, record: dict[str, Any], kind: type[T], what: str) -> T:
    """Write a manifest or shard record once it decodes through its declaration, as every reader decodes it: grtool
    never writes a record it would refuse to read back, nor a field its readers would drop (a bug then stops here,
    naming the field). Returns the record as its readers get it."""
    data = dumps(record)
    decoded = decode_record(data, kind, source=path, what=f"{what} about to be written")
    refuse_undeclared(record, decoded, source=path, what=f"{what} about to be written")
    atomic_write_bytes(path, data)
    return decoded


def load_manifest(path: str | Path) -> Manifest:
    """The stage's manifest, decoded through :class:`Manifest` (a damaged one is one :class:`DamagedRecord` line
    naming the field)."""
    p = Path(path) / MANIFEST
    try:
        data = read_record_bytes(p, what="manifest")
    except FileNotFoundError:
        raise InputError(f"{Path(path)}: not a stage directory (no {MANIFEST})") from None
    return decode_record(data, Manifest, source=p, what="manifest")


def read_shard_record(f: Path) -> ShardRecord:
    """One shard record, decoded through :class:`ShardRecord`; it must record the part its file is named after."""
    what = "shard record"
    if not re.match(PART_PATTERN, f.stem):
        raise DamagedRecord(f"{f}: {what}: its name is not part-NNNNN.json (edited or damaged)")
    data = read_record_bytes(f, what=what)
    record = decode_record(data, ShardRecord, source=f, what=what)
    if record.part not in (None, f.stem) or record.file != f"{f.stem}.parquet":
        wrong = "part" if record.part not in (None, f.stem) else "file"
        raise DamagedRecord(f"{f}: {what}: field {wrong}: {getattr(record, wrong)!r} is not {f.stem}, the part it is named after (edited or damaged)")
    return record


def load_shard_records(path: str | Path) -> dict[str, ShardRecord]:
    """Completion records of the committed shards, by part name (each through :func:`read_shard_record`)."""
    d = Path(path) / SHARDS_DIR
    records: dict[str, ShardRecord] = {}
    if d.is_dir():
        for f in sorted(d.glob("part-*.json")):
            records[f.stem] = read_shard_record(f)
    return records


def check_parts_planned(path: str | Path, num_parts: int | None, records: dict[str, ShardRecord]) -> None:
    """Every shard record is a part the manifest plans: one past ``num_parts`` means the manifest or the record was
    edited (:class:`DamagedRecord` naming both)."""
    if num_parts is None:
        return
    past = sorted(name for name in records if int(name[5:]) >= num_parts)
    if past:
        raise DamagedRecord(f"{Path(path) / MANIFEST}: manifest: field num_parts: {num_parts}, but {SHARDS_DIR}/{past[0]}.json records a part past it (edited or damaged)")


def is_stage_dir(path: str | Path) -> bool:
    """Anything named like a manifest marks a stage directory: a FIFO, a directory or a dangling link there is a
    damaged stage for its reader to name, never a directory to pass over as holding no stage."""
    return os.path.lexists(Path(path) / MANIFEST)


def resolve_stage(path: str | Path, table: str, *, finished: bool = True) -> Path:
    """Accept a stage directory of ``table`` or a run directory holding ``<table>/``: the one input resolver of the
    commands. An input must be ``finished`` (every part committed, no failure nobody accepted): a killed or failed
    run's rows are never read as a whole stage; inspecting one (``show``) passes ``finished=False``."""
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():  # a FIFO or a device: named as what it is
        from grtool.userinput import missing_input

        raise missing_input(p)
    for candidate in (p, p / table):
        if is_stage_dir(candidate):
            manifest = load_manifest(candidate)
            got = manifest.table
            if got == table:
                if finished:
                    refuse_unfinished(candidate, manifest)
                return candidate
            if candidate == p and not (p / table).exists():
                raise InputError(f"{p}: a stage directory of table {got!r}, expected {table!r}")
    raise InputError(f"{p}: no {table!r} stage directory here or in {p / table}")


def open_stops(manifest: Manifest) -> list[StopRecord]:
    """The stops nobody accepted (none in a manifest of an older grtool): each fails the stage (grtool.store.stops)."""
    return [s for _, s in sorted((manifest.stops or {}).items()) if s.accepted is None]


def refuse_unfinished(stage: Path, manifest: Manifest) -> None:
    """Exit 2 for a stage a command may not read as its input: planned parts not committed (a run killed or still
    going), or a failed run (a tripped guard, an error) nobody accepted. (A manifest that plans no count of parts,
    written by a program of its own through the store, is read as the parts it records.)"""
    if manifest.num_parts is not None and not manifest.complete:
        raise InputError(f"{stage}: incomplete stage directory (finish or resume the run that writes it first; grtool status {stage} shows its parts)")
    records = load_shard_records(stage)
    # (a lost shard record, or one the manifest does not match, is named by the read, part by part)
    matched = all(name in records and records[name].sha256 == entry.sha256 for name, entry in manifest.shards.items())
    problems = totals_problems(manifest, records) if matched else []
    if problems:  # its counts are what reports and guards use: an edited one is never read as the stage's
        raise DamagedRecord(f"{stage}: {problems[0]} (edited or damaged; grtool validate {stage} lists every problem)")
    stops = open_stops(manifest)
    if stops:
        what = f"guard {stops[0].guard} tripped" if stops[0].kind == "guard" else f"exit {stops[0].exit_code}"
        raise InputError(f"{stage}: the run that wrote it failed ({what} at {stops[0].when}: {stops[0].message[:400]}); run it again, "
                         f"or accept the failure with grtool validate {stage} --accept --reason TEXT")  # fmt: skip


def totals_problems(manifest: Manifest, records: dict[str, ShardRecord]) -> list[str]:
    """The manifest's totals (rows, counters) against the shard records it has merged (a lagging manifest of an
    array run is consistent): each one that is not their sum, edited by hand."""
    merged = [rec for name, rec in records.items() if name in manifest.shards]
    problems = []
    rows = sum(rec.rows for rec in merged)
    if (manifest.rows or 0) != rows:
        problems.append(f"{MANIFEST}: rows is {manifest.rows!r}, its shard records sum to {rows}")
    want = msgspec.convert(merge_counters(msgspec.to_builtins(rec.counters) for rec in merged), Counters)  # summed as JSON
    for f in msgspec.structs.fields(Counters):
        got, summed = getattr(manifest.counters, f.name), getattr(want, f.name)
        if got != summed:
            problems.append(f"{MANIFEST}: counters.{f.encode_name} is {got!r}, its shard records sum to {summed!r}")
    return problems


def now() -> str:
    """The time records carry: UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def part_on_disk(path: str | Path, record: ShardRecord, footer: bool = True) -> bool:
    """The part a shard record names is there as committed: a regular file of the recorded size holding the
    recorded rows (its footer says; a removed, truncated or replaced part is not, so resume redoes it; its bytes
    are hashed by ``validate``, not here). ``footer=False`` checks the file and its size only, without Parquet
    (`grtool status`, which reads JSON records alone)."""
    part = Path(path) / record.file  # a file name alone (FileName)
    try:
        st = part.stat()
        if not (stat.S_ISREG(st.st_mode) and st.st_size == record.bytes):
            return False
    except (OSError, ValueError):  # gone, unreadable, or a name the file system cannot hold
        return False
    if not footer:
        return True
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        from grtool.store.reading import arrow_source  # a directory name that is not UTF-8 too

        return pq.read_metadata(arrow_source(part)).num_rows == record.rows
    except (OSError, ValueError, pa.ArrowException):  # a damaged footer: not the part that was committed
        return False


def parts_not_on_disk(path: str | Path, num_parts: int | None, records: dict[str, ShardRecord], footers: bool = True) -> list[str]:
    """The planned parts of a stage that are not committed on disk: no shard record, or not :func:`part_on_disk`."""
    if num_parts is None:
        return []
    check_parts_planned(path, num_parts, records)
    return [part_name(i) for i in range(num_parts) if part_name(i) not in records or not part_on_disk(path, records[part_name(i)], footers)]
