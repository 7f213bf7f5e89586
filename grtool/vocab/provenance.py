"""The provenance sidecar of an exported file: ``<file>.grtool.json`` beside ``<file>``.

Exports are single files for trainers, not stage directories, so what made them is recorded beside them::

    data/thinkgr_sft.json              the rows (a JSON array or JSON Lines)
    data/thinkgr_sft.json.grtool.json  command line (credentials redacted), grtool version, time, the inputs'
                                       fingerprints, trainer format, row count, bytes and sha256 of the file
                                       (and of the file it replaced),
                                       the dataset_info.json entry that registers it (LLaMA-Factory), and
                                       the questions its rows come from (--split, qids)

`grtool validate` finds the sidecars under a directory and checks each file against its own: present,
unchanged (bytes, sha256), the recorded number of rows, every row in the recorded format's shape, the
dataset_info entry pointing at it, and inputs unchanged since (a re-run upstream stage makes it stale).
Nothing is written for ``--out -``.

The records of a checkpoint `grtool train` writes (``grtool.json``) and of a training run live here too: train
writes them, and retrieve, evaluation and the audit read them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from grtool import __version__
from grtool.invocation import current_command
from grtool.records import Count, FileName, PositiveCount, Seconds, Sha256, check_timestamp, read_record, to_builtins
from grtool.secrets import redact_argv
from grtool.store.empty import allowed
from grtool.store.records import now
from grtool.store.records import atomic_write_bytes, dumps, resolve_stage, sha256_file
from grtool.store.fingerprints import fingerprint
from grtool.store.paths import named

SIDECAR_SUFFIX = ".grtool.json"
SIDECAR_FORMAT = "grtool-export/1"
DATASET_INFO = "dataset_info.json"


def sidecar_path(path: str | Path) -> Path:
    p = named(path)
    return p.with_name(p.name + SIDECAR_SUFFIX)


def is_sidecar(path: str | Path) -> bool:
    return Path(path).name.endswith(SIDECAR_SUFFIX)


def input_fingerprint(path: str | Path, table: str | None = None) -> dict[str, Any]:
    """An input as the sidecar records it: a stage directory (resolved from a run directory when ``table`` is
    given) by its shards' checksums, a file by its content, stdin as stdin."""
    from grtool.store.io import is_stdio  # here: finding sidecars (status, validate) loads no Parquet library

    if is_stdio(path):
        return {"path": "-", "kind": "stdin"}
    target = resolve_stage(path, table, finished=False) if table is not None else Path(path)
    return {**fingerprint(target), **({"table": table} if table else {})}


def questions_record(qids: Iterable[str], **about: Any) -> dict[str, Any]:
    """The questions whose rows an export (or a checkpoint) holds: their qids (sorted), count and digest, plus
    ``about`` (the export's ``--split`` selection; a checkpoint's sources). `train` copies it into its
    checkpoint, and `eval recall` checks scored questions against it (a model scored on questions it trained on)."""
    ordered = sorted(set(qids))
    digest = hashlib.sha256("\n".join(ordered).encode()).hexdigest()
    return {"count": len(ordered), "sha256": digest, **about, "qids": ordered}


def write_sidecar(
    path: str | Path,
    *,
    kind: str,
    fmt: str,
    rows: int,
    json_array: bool,
    inputs: list[dict[str, Any]],
    split: str | None = None,
    dataset_info_entry: str | None = None,
    command: list[str] | None = None,
    params: dict[str, Any] | None = None,
    questions: dict[str, Any] | None = None,
    content: Path | None = None,
) -> Path | None:
    """Record what made ``path`` (an export just written; its bytes at ``content`` when they are not yet renamed
    into place) in ``<path>.grtool.json``; nothing for stdout."""
    from grtool.store.io import is_stdio

    if is_stdio(path):
        return None
    p = Path(path)
    replaces = {"bytes": p.stat().st_size, "sha256": sha256_file(p)} if content is not None and p.is_file() else None
    meta = {
        "format": SIDECAR_FORMAT,
        "kind": kind,  # sft | kto | gmr
        "trainer_format": fmt,
        "file": p.name,
        "json_array": json_array,
        "split": split,
        "rows": rows,
        "bytes": (content or p).stat().st_size,
        "sha256": sha256_file(content or p),
        "replaces": replaces,  # a stop before the rename leaves these in place: still grtool's (null: a first export)
        "dataset_info": {"file": DATASET_INFO, "entry": dataset_info_entry} if dataset_info_entry else None,
        "grtool_version": __version__,
        "command": redact_argv(command if command is not None else current_command()),
        "created": now(),
        "inputs": inputs,
        **({"params": params} if params else {}),  # settings that shaped the rows (e.g. cannot_answer)
        **({"questions": questions} if questions is not None else {}),  # questions_record: what a model trained on it saw
        **({"allow_empty": True} if allowed() else {}),  # --allow-empty: validate takes an empty file as meant
    }
    out = sidecar_path(p)
    atomic_write_bytes(out, dumps(meta))
    return out


# The trainer formats each export kind writes (grtool.export.formats; export/check.py holds each one's row shape).
TRAINER_FORMATS = {
    "sft": ("llamafactory-alpaca", "llamafactory-sharegpt", "trl-messages"),
    "kto": ("llamafactory", "trl"),
    "gmr": ("gmr",),
}


class DatasetInfoRef(msgspec.Struct):
    file: FileName
    entry: Annotated[str, msgspec.Meta(min_length=1)]


class QuestionsRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """:func:`questions_record`, in an export's sidecar and a checkpoint's record: the questions whose rows it holds
    (`eval recall` refuses to score a model on them), and what its ``about`` keys say of them. Defaults are left
    out of its JSON form, as :func:`questions_record` leaves out what it is not given."""

    count: Count
    sha256: Sha256
    qids: list[str]
    complete: bool = True
    splits: list[str] | None = None  # an export's --split selection
    sources: list[dict[str, Any]] | None = None  # a checkpoint's: the data and the base checkpoint it trained on

    def __post_init__(self) -> None:
        if self.count != len(self.qids):
            raise ValueError(f"questions.count: {self.count}, but {len(self.qids)} qids are listed")
        if self.sha256 != hashlib.sha256("\n".join(sorted(set(self.qids))).encode()).hexdigest():
            raise ValueError("questions.sha256: not the digest of the qids listed")


class ExportBytes(msgspec.Struct, forbid_unknown_fields=True):
    """The bytes an export replaced: its size and sha256."""

    bytes: Count
    sha256: Sha256


class ExportRecord(msgspec.Struct):
    """``<file>.grtool.json``, declared once: what :func:`write_sidecar` writes and every reader decodes."""

    format: Literal["grtool-export/1"]
    kind: Literal["sft", "kto", "gmr"]
    trainer_format: str
    file: FileName
    rows: Count
    bytes: Count
    sha256: Sha256
    # the file it replaced (None: a first export); unset in an older grtool's record, which cannot tell an edit by
    # hand from a stop before the rename, so the file it stands beside is replaced as that grtool replaced it
    replaces: ExportBytes | None | msgspec.UnsetType = msgspec.UNSET
    json_array: bool = False
    split: str | None = None
    dataset_info: DatasetInfoRef | None = None
    grtool_version: str = "?"
    command: list[str] = msgspec.field(default_factory=list)
    created: str = ""
    inputs: list[dict[str, Any]] = msgspec.field(default_factory=list)
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    questions: QuestionsRecord | None = None
    allow_empty: bool = False

    def __post_init__(self) -> None:
        check_timestamp(self.created, "created")
        if self.trainer_format not in TRAINER_FORMATS[self.kind]:
            raise ValueError(f"trainer_format: {self.trainer_format!r} is not a format of `export {self.kind}` ({', '.join(TRAINER_FORMATS[self.kind])})")
        if self.rows and self.bytes < 2 * self.rows:  # each row is an object and a separator at least
            raise ValueError(f"rows: {self.rows:,} rows cannot fit in {self.bytes:,} bytes")


def decode_sidecar(path: str | Path) -> ExportRecord:
    """``<file>.grtool.json`` through its declaration; :class:`DamagedRecord` naming the field otherwise."""
    return read_record(path, ExportRecord, what="export record")


CHECKPOINT_RECORD = "grtool.json"  # what `train` writes into a checkpoint: its command, data, questions, flips
RUN_RECORD = "grtool-run.json"  # what `train` writes into --out when it starts: what --resume must continue


class TrainedOn(msgspec.Struct, kw_only=True):
    """What a training run reads, as its checkpoint records it: the data and the base model."""

    source: str
    format: str
    rows: Count
    sha256: Sha256 | None = None  # of the data file (None: a stage directory, see the fingerprint)
    fingerprint: dict[str, Any] = {}
    desirable: Count | None = None  # KTO
    undesirable: Count | None = None


class BaseModel(msgspec.Struct):
    name: str
    path: str


class LossPoint(msgspec.Struct):
    step: Count
    loss: float


TRAIN_KINDS = ("train sft", "train kto")


class CheckpointRecord(msgspec.Struct, kw_only=True):
    """``grtool.json`` of a finished checkpoint (:func:`grtool.train.run.provenance` writes it)."""

    kind: Annotated[str, msgspec.Meta(pattern="^train (sft|kto)$")]
    command: list[str]
    versions: dict[str, str | None] = {}
    finished: str
    data: TrainedOn
    base_model: BaseModel
    questions: QuestionsRecord | None = None
    flips: bool | None = None
    hyperparameters: dict[str, Any]
    processes: PositiveCount = 1
    effective_batch_size: PositiveCount
    global_step: Count
    resumed_from: str | None = None
    train_loss: float | None = None
    first_loss: float | None = None
    final_loss: float | None = None
    losses: list[LossPoint] = []
    markers: dict[str, int] = {}
    adapter: str | None = None
    seconds: Seconds = 0.0

    def __post_init__(self) -> None:
        check_timestamp(self.finished, "finished")


class RunIdentity(msgspec.Struct, kw_only=True):
    """What a training run is, for --resume: resuming with another model, data or setting would mix two runs."""

    kind: Annotated[str, msgspec.Meta(pattern="^train (sft|kto)$")]
    data: str
    data_sha256: Sha256 | None = None
    data_fingerprint: dict[str, Any] = {}
    model: str  # the model's name as recorded (a local folder: PATH@weights-digest)
    model_path: str
    hyperparameters: dict[str, Any]


class RunRecord(msgspec.Struct, kw_only=True):
    """``grtool-run.json``: written when a run starts into --out (a killed run leaves it behind)."""

    kind: str
    started: str
    command: list[str] = []
    train: RunIdentity | None = None  # absent in a record of grtool before 0.x: --resume then cannot compare


def read_checkpoint(path: str | Path | None) -> CheckpointRecord | None:
    """The ``grtool.json`` of a grtool checkpoint folder (None: not one). A damaged record is
    :class:`~grtool.records.DamagedRecord` (exit 1), never taken for "not a checkpoint"."""
    if not path:
        return None
    record = Path(path) / CHECKPOINT_RECORD
    if not record.exists() and not record.is_symlink():
        return None
    return read_record(record, CheckpointRecord, what="the checkpoint record")


def read_run_record(out: str | Path) -> RunRecord | None:
    """``out``'s ``grtool-run.json`` (None: none there)."""
    record = Path(out) / RUN_RECORD
    if not record.exists() and not record.is_symlink():
        return None
    return read_record(record, RunRecord, what="the training run record")


def checkpoint_value(path: str | Path | None, key: str) -> Any:
    """``key`` of a grtool checkpoint's ``grtool.json``, as plain JSON values (None: not a grtool checkpoint,
    or not recorded)."""
    record = read_checkpoint(path)
    return None if record is None else to_builtins(getattr(record, key, None))


def checkpoint_flips(path: str | Path | None) -> bool | None:
    """What a grtool checkpoint's ``grtool.json`` says of flips (None: not a grtool checkpoint, or not recorded)."""
    value = checkpoint_value(path, "flips")
    return value if isinstance(value, bool) else None
