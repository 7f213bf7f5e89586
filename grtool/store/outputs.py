"""Which paths a command may write, and what ``--overwrite`` may delete (DESIGN §8).

Every command that writes an output calls :func:`claim` before it writes anything:

- the output never equals, lies inside or contains one of the command's inputs (symlinks resolved);
- with ``--overwrite``, an existing output must carry the record that grtool wrote *that kind of output*
  there (a stage's ``_manifest.json`` of the same table, an index's ``index.json``, a checkpoint's
  ``grtool.json``, an export's ``<file>.grtool.json``); a non-empty directory without one is refused; an
  export and a report, plot or JSON file (:data:`FILE`) are replaced, with or without ``--overwrite``, only
  while they hold the bytes their record names (``<file>.grtool.json``, the hidden ``.NAME.grtool-file.json``):
  a file edited by hand is the user's (:func:`export_state`, :func:`check_file_output`);
- one writer per output: the claim holds the output's lock (:mod:`grtool.store.locks`) until released;
- :meth:`Claim.clear` deletes only the entries grtool writes there; unknown files beside them stay.

All refusals are exit 2 and say what was found.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import re
import shlex
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from grtool.errors import InputError
from grtool.holds import hold
from grtool.records import DamagedRecord, mode_name, read_json_record, read_record
from grtool.store.layout import FILE_RECORD, LLM_CACHE, LOCK, MANIFEST, REJECTS_DIR, SHARDS_DIR
from grtool.store.locks import BESIDE_LOCK, RunLock, output_lock, pid_alive
from grtool.store.paths import check_name, is_within, named, real, refuse_missing_before_dotdot
from grtool.errors import printable
from grtool.store.records import Text, atomic_write_bytes, commit_file, dumps, now, resolve_stage, sha256_file
from grtool.userinput import refuse_folder_spelling


CLEARING = ".grtool-clearing"  # written before --overwrite deletes anything, removed last: a stopped clear is resumed
SCRATCH_MARK = "grtool-tmp"  # in the name of a single file being written: .NAME.PID.grtool-tmp.EXT
PART = "part-[0-9][0-9][0-9][0-9][0-9]"  # grtool's part names (five digits: grtool.store.layout.part_name)


@dataclass(frozen=True)
class OutputKind:
    """A kind of output: the record that proves grtool wrote it, and the entries grtool writes there."""

    name: str
    what: str  # for messages: "an index directory"
    record: str  # the record file (for an export: the suffix of the record beside the file)
    own: tuple[str, ...]  # fnmatch patterns of the entries grtool writes (the record included)
    started: str | None = None  # a record written when a run starts, before the complete one (a killed run has it)
    keep: tuple[str, ...] = ()  # grtool's entries that --overwrite keeps (a request cache, the run's own locks)
    directory: bool = True
    folders: tuple[str, ...] = ()  # the entries of ``own`` that grtool makes as directories; every other one is a file
    flat: bool = True  # its folders hold only files (a stage's records and rejects); a checkpoint's hold trees


STAGE = OutputKind(
    "stage", "a stage directory", MANIFEST,
    own=(MANIFEST, f"{MANIFEST}.*.tmp", f"{PART}.parquet", f"{PART}.parquet.*.tmp", SHARDS_DIR, REJECTS_DIR, CLEARING),
    keep=(LLM_CACHE, LOCK, "_run.lock", "_run.task-*.lock"), folders=(SHARDS_DIR, REJECTS_DIR),
)  # fmt: skip
INDEX = OutputKind(
    "index", "an index directory", "index.json",
    own=("index.json", "tokenizer.json", "doc_ids.txt", "docids.parquet", "seq_*.npy", "fm_*.npy", "trie_*.npy", "trie_*.marisa", "oracle_*.npy",
         "docid_bytes.bin", "docid_bytes.json", "docid_bytes_*.npy", ".docid_bytes.*", CLEARING),  # bracket decoding files: grtool.index.docid_bytes
)  # fmt: skip
CHECKPOINT = OutputKind(
    "checkpoint", "a checkpoint directory", "grtool.json", started="grtool-run.json",
    own=("grtool.json", "grtool.json.*.tmp", "grtool-run.json", "grtool-run.json.*.tmp", "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
         "pytorch_model*.bin", "training_args.bin", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
         "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
         "checkpoint-[0-9]*", "incomplete-checkpoint", "adapter", "runs", "README.md", "trainer_state.json", "all_results.json", "train_results.json",
         CLEARING),
    folders=("checkpoint-[0-9]*", "incomplete-checkpoint", "adapter", "runs"), flat=False,
)  # fmt: skip
EXPORT = OutputKind("export", "an exported file", ".grtool.json", own=(), directory=False)
FILE = OutputKind("file", "a report, plot or JSON file", FILE_RECORD, own=(), directory=False)


# What grtool writes inside a stage's folders (shard records, rejects, their temporary files): --overwrite empties
# them of these only, so a user's file stays at any depth (and its folder with it).
FOLDER_ENTRIES = {SHARDS_DIR: (f"{PART}.json", f"{PART}.json.*.tmp"), REJECTS_DIR: (f"{PART}.jsonl", f"{PART}.jsonl.*.tmp")}


def export_record(path: Path) -> Path:
    return path.with_name(path.name + EXPORT.record)


# -------------------------------------------------------------------------------- outputs vs inputs


def refuse_output_among_inputs(out: str | Path, inputs: Iterable[str | Path | None] = (), holders: Iterable[str | Path | None] = (), flag: str = "--out") -> None:
    """Exit 2 when ``out`` equals, lies inside or contains an input.

    ``inputs``: what the command reads (files, stage directories, a model directory). ``holders``: directories
    an input is found in (a run directory holding stages, a directory of raw files): an output may lie inside
    one (a run directory holds its stages; what a run writes there is never read as its input) but may not be
    one or contain one. A file, a stage, an index or a model directory given as a holder is an input.
    """
    if str(out) == "-":
        return
    o = real(out)
    strict = [(i, real(i)) for i in inputs if i is not None and str(i) not in ("", "-")]
    loose = []
    for h in holders:
        if h is None or str(h) in ("", "-"):
            continue
        (strict if _is_artefact(Path(h)) else loose).append((h, real(h)))
    for name, r in strict:
        if o == r:
            raise InputError(f"{flag} {printable(out)}: is the input {printable(name)}; write the output somewhere else")
        if is_within(o, r):
            raise InputError(f"{flag} {printable(out)}: lies inside the input {printable(name)}; write the output somewhere else")
    for name, r in strict + loose:
        if is_within(r, o):
            what = "is" if o == r else "contains"
            raise InputError(f"{flag} {printable(out)}: {what} the input {printable(name)}; write the output somewhere else")


def refuse_overlapping_outputs(
    outputs: Iterable[tuple[str, str | Path | None]], *, inputs: Iterable[str | Path | None] = (), holders: Iterable[str | Path | None] = (), by: str = "this command"
) -> None:
    """Exit 2, before anything is written, when two outputs of one command meet: equal (symlinks resolved), or
    one inside the other (``--report f6/_manifest.json`` with ``--out f6``); or when one meets an input (see
    :func:`refuse_output_among_inputs`).

    ``outputs``: ``(flag, path)`` of everything the command writes (a stage, ``--report``, ``--plot``, a ``--json``
    file); ``None``, empty and ``-`` (stdout) are left out. Standard output redirected to a file counts as one more
    output (``stdout``): ``> f6/_manifest.json`` would be written over by the stage, or the other way round.
    ``by``: who writes them, for the message (a pipeline's outputs are its stages').
    """
    inputs, holders = list(inputs), list(holders)
    named = [(flag, path) for flag, path in outputs if path is not None and str(path) not in ("", "-")]
    for flag, path in named:
        refuse_output_among_inputs(path, inputs, holders, flag=flag)
    redirected = stdout_file()
    if redirected is not None and any(str(path) != "-" for _, path in named):
        named.append(("stdout", redirected))
    resolved = [(flag, path, real(path)) for flag, path in named]
    for i, (flag, path, r) in enumerate(resolved):
        for other_flag, other, o in resolved[i + 1 :]:
            if r == o:
                raise InputError(f"{flag} {printable(path)}: is also {other_flag} {printable(other)}, which {by} writes too; give each output its own path")
            if is_within(r, o) or is_within(o, r):
                (inner_flag, inner), (outer_flag, outer) = ((flag, path), (other_flag, other)) if is_within(r, o) else ((other_flag, other), (flag, path))
                raise InputError(f"{inner_flag} {printable(inner)}: lies inside {outer_flag} {printable(outer)}, which {by} also writes; write it somewhere else")


def stdout_file() -> Path | None:
    """The regular file standard output is redirected to (``> file``), else None (a terminal, a pipe)."""
    import stat

    try:
        if not stat.S_ISREG(os.fstat(1).st_mode):
            return None
        return Path(os.readlink("/proc/self/fd/1"))
    except OSError:
        return None


def _is_artefact(p: Path) -> bool:
    """A file, or a directory that is one thing read whole: a stage, an index, a checkpoint or model."""
    return p.is_file() or any((p / record).is_file() for record in (MANIFEST, INDEX.record, CHECKPOINT.record, "config.json"))


def input_stage(path: str | Path | None, table: str) -> Path | str | None:
    """The stage directory a command will read for ``table`` (a run directory resolved), else the path as
    given (its own reading reports what is wrong with it)."""
    if path is None or str(path) == "-":
        return None

    try:
        return resolve_stage(path, table, finished=False)  # which stage it is; reading it judges whether it is finished
    except InputError:
        return path


# ------------------------------------------------------------------------------ what an output holds


def _listing(entries: list[Path], limit: int = 8, base: Path | None = None) -> str:
    names = [(e.relative_to(base).as_posix() if base else e.name) + ("/" if e.is_dir() else "") for e in sorted(entries)]
    shown = ", ".join(printable(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def found_entries(out: Path, kind: OutputKind) -> list[Path]:
    """What a directory holds, without grtool's entries that survive --overwrite (caches, locks)."""
    return [c for c in out.iterdir() if not _matches(c.name, kind.keep)]


def _read_record(path: Path) -> dict[str, Any] | None:
    """The record as a JSON object, or None; a damaged one does not stop --overwrite from replacing what grtool
    wrote (its kind was checked), and a FIFO or a huge file in its place is never read (read_record_bytes)."""
    try:
        data = read_json_record(path, what="record")
    except (OSError, DamagedRecord):
        return None
    return data if isinstance(data, dict) else None


def _record_field(record: Path, name: str, flag: str, out: Path, what: str) -> Any:
    """A field of the record of an output --overwrite would replace; a damaged record is named, never read as
    the field missing ("table None")."""
    try:
        data = read_json_record(record, what=record.name)
    except (OSError, DamagedRecord) as e:
        raise InputError(
            f"{flag} {printable(out)}: --overwrite refused: its {record.name} is damaged ({e}), so grtool cannot tell {what}; remove the directory yourself or choose another --out"
        ) from None
    return data.get(name) if isinstance(data, dict) else None


def _option(flag: str) -> str:
    """The option a refusal asks to change: ``--out`` for the label ``--out (the file beside it)``."""
    return flag.split(" (", 1)[0]


def check_replaceable(out: str | Path, kind: OutputKind, *, table: str | None = None, export_kind: str | None = None, flag: str = "--out") -> None:
    """Exit 2 unless ``out`` is absent, empty, or what grtool wrote as ``kind`` (of ``table``) — the record says so."""
    p = Path(out)
    if not kind.directory:
        refuse_foreign_records(p, flag)
    if not p.exists() and not p.is_symlink():
        return
    if not kind.directory:
        record = export_record(p)
        if p.is_dir():
            raise InputError(f"{flag} {printable(p)}: is a directory, not a file grtool exported; name a file")
        meta = _read_record(record)
        if meta is None:
            raise InputError(
                f"{flag} {printable(p)}: exists and there is no {printable(record.name)} saying grtool exported it; "
                "grtool replaces only its own exports: remove the file yourself or choose another --out"
            )
        if export_kind is not None and meta.get("kind") not in (None, export_kind):
            raise InputError(f"{flag} {printable(p)}: is a {meta.get('kind')} export, not {export_kind}; choose another --out")
        if export_state(p, meta) == "changed":
            _refuse_changed(p, record, flag)
        return
    if not p.is_dir():
        raise InputError(f"{flag} {printable(p)}: names an existing file, not {kind.what}")
    entries = found_entries(p, kind)
    if not entries:
        return
    record = p / kind.record
    if not record.is_file() and not (kind.started and (p / kind.started).is_file()) and not (p / CLEARING).is_file():
        raise InputError(
            f"{flag} {printable(p)}: --overwrite refused: it holds {_listing(entries)} and no {kind.record}, so grtool did not "
            f"write {kind.what} there; remove what you do not need yourself or choose another --out"
        )
    if kind is INDEX and record.is_file():  # index.json is a common name: only grtool's own counts as its record
        fmt = _record_field(record, "format", flag, p, "what wrote it")
        if not (isinstance(fmt, str) and fmt.startswith("grtool-index")):
            raise InputError(
                f"{flag} {printable(p)}: --overwrite refused: its index.json is not one grtool wrote (format {fmt!r}) and it "
                f"holds {_listing(entries)}; remove what you do not need yourself or choose another --out"
            )
    refuse_foreign_types(p, own_entries(p, kind)[0], kind, flag)
    if kind is STAGE and table is not None and record.is_file():  # (without it: a clear grtool began, CLEARING)
        got = _record_field(record, "table", flag, p, "which table it holds")
        if got != table:
            raise InputError(f"{flag} {printable(p)}: --overwrite refused: it is a stage directory of table {got!r}, and this command writes {table!r}; choose another --out")


def own_entries(out: Path, kind: OutputKind) -> tuple[list[Path], list[Path]]:
    """``(grtool's entries, unknown entries)`` of an output directory; the kept ones (caches, locks) in neither."""
    own: list[Path] = []
    unknown: list[Path] = []
    listed: set[str] = set()
    if kind is INDEX:  # the files its record lists, whatever their names
        files = (_read_record(out / kind.record) or {}).get("files")
        listed = {name for name in files if isinstance(name, str)} if isinstance(files, dict) else set()
    for entry in found_entries(out, kind):
        (own if entry.name in listed or _matches(entry.name, kind.own) else unknown).append(entry)
    return sorted(own), sorted(unknown)


def _delete(entry: Path, kind: OutputKind) -> list[Path]:
    """Remove one of grtool's entries, checked by :func:`refuse_foreign_types`: a file or a link is unlinked
    (a link never followed), one of grtool's folders emptied of the files grtool writes there, then removed when
    nothing else is left in it. Returns what was left (a user's entries inside the folder)."""
    if entry.is_symlink() or not entry.is_dir():
        entry.unlink(missing_ok=True)
        return []
    if not kind.flat:
        shutil.rmtree(entry)
        return []
    left = []
    for inner in entry.iterdir():
        if _matches(inner.name, FOLDER_ENTRIES.get(entry.name, ("*",))):
            inner.unlink(missing_ok=True)
        else:
            left.append(inner)
    if not left:
        entry.rmdir()
    return sorted(left)


def _foreign_type(entry: Path, kind: OutputKind) -> str | None:
    """Why ``entry``, named like one of grtool's, is not what grtool writes there (None: it is)."""
    import stat

    mode = entry.lstat().st_mode
    if stat.S_ISLNK(mode):
        return None  # the link goes, never what it points to
    folder = _matches(entry.name, kind.folders)
    if folder and stat.S_ISDIR(mode):
        if not kind.flat:
            return None
        for inner in entry.iterdir():
            if _matches(inner.name, FOLDER_ENTRIES.get(entry.name, ("*",))) and not (inner.is_symlink() or inner.is_file()):
                return f"{printable(inner)} is {file_kind_name(inner)}, and grtool writes only files in {printable(entry.name)}"
        return None
    if not folder and stat.S_ISREG(mode):
        return None
    wanted = "a directory" if folder else "a file"
    return f"{printable(entry)} is {file_kind_name(entry)}, and grtool writes {wanted} by that name"


def file_kind_name(path: Path) -> str:
    """What ``path`` itself is (a link named as one), for messages."""
    return mode_name(path.lstat().st_mode)


def refuse_foreign_types(out: Path, own: list[Path], kind: OutputKind, flag: str = "--out") -> None:
    """Exit 2, before anything is deleted, when an entry named like grtool's is of another type (a directory
    ``part-00000.parquet``, a FIFO): --overwrite removes files and links grtool writes, never a user's directory."""
    for entry in own:
        why = _foreign_type(entry, kind)
        if why is not None:
            raise InputError(f"{flag} {printable(out)}: --overwrite refused: {why}; nothing was deleted; move it away yourself or choose another --out")


def _say_left(out: Path, unknown: list[Path]) -> None:
    if unknown:
        from grtool.log import log

        log.warning("%s: --overwrite left %d entr%s grtool did not write: %s", printable(out), len(unknown), "y" if len(unknown) == 1 else "ies", _listing(unknown, base=out))


# ------------------------------------------------------------------------------------------ the claim


@dataclass
class Claim:
    """The right to write one output: checked, locked; :meth:`clear` and :meth:`install` replace grtool's entries."""

    out: Path
    kind: OutputKind
    lock: RunLock
    left: list[Path] = field(default_factory=list)

    def clear(self, *, keep_marker: bool = False) -> list[Path]:
        """Delete the entries grtool writes in the output directory (the record first, so a half-deleted
        output never looks whole); unknown entries stay (and are named in a warning). Returns those left.

        A marker (:data:`CLEARING`) is there from before the first deletion to after the last: a clear stopped
        half-way is neither resumed as the old output nor taken for a directory grtool did not write; the next
        ``--overwrite`` finishes it. ``keep_marker``: the caller removes it once the new output is in place."""
        if not self.out.is_dir():
            return []
        own, self.left = own_entries(self.out, self.kind)
        refuse_foreign_types(self.out, own, self.kind)
        if own:
            atomic_write_bytes(self.out / CLEARING, dumps({"kind": self.kind.name, "started": now()}))
        own.sort(key=lambda e: e.name not in (self.kind.record, self.kind.started))
        for entry in own:
            if entry.name != CLEARING:
                self.left += _delete(entry, self.kind)
        if not keep_marker:
            (self.out / CLEARING).unlink(missing_ok=True)
        _say_left(self.out, self.left)
        return self.left

    def mark_started(self) -> None:
        """Record in the output that grtool started writing it (a killed run can then be overwritten)."""
        from grtool.invocation import current_command
        from grtool.secrets import redact_argv

        if self.kind.started:
            self.out.mkdir(parents=True, exist_ok=True)
            info = {"kind": self.kind.name, "started": now(), "command": redact_argv(self.lock.command or current_command())}
            atomic_write_bytes(self.out / self.kind.started, dumps(info))

    def install(self, tmp: Path) -> None:
        """Put a complete output built in the directory ``tmp`` in place of ``out``: a rename when nothing of the
        user's is there, else grtool's entries replaced one by one, the record last (readers see it complete)."""
        if self.out.is_dir():
            self.clear(keep_marker=True)  # until the new record is in: a stop in between is finished by --overwrite
            if not any(e.name != CLEARING for e in self.out.iterdir()):
                (self.out / CLEARING).unlink(missing_ok=True)
                self.out.rmdir()
        if not self.out.exists():
            self.out.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, self.out)
            return
        names = sorted(os.listdir(tmp), key=lambda n: n == self.kind.record)
        for name in names:
            os.replace(tmp / name, self.out / name)
        (self.out / CLEARING).unlink(missing_ok=True)
        tmp.rmdir()

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def refuse_linked_directory(out: str | Path, flag: str = "--out") -> None:
    """An index or a checkpoint is installed by renames into place, which would replace a link at ``out``."""
    if os.path.islink(out):
        raise InputError(f"{flag} {printable(out)}: is a symbolic link (to {printable(os.readlink(out))}); name the directory itself")


def claim(
    out: str | Path,
    kind: OutputKind,
    *,
    inputs: Iterable[str | Path | None] = (),
    holders: Iterable[str | Path | None] = (),
    overwrite: bool = False,
    table: str | None = None,
    export_kind: str | None = None,
    shards: tuple[int, int] | None = None,
    command: list[str] | None = None,
    flag: str = "--out",
) -> Claim:
    """Check ``out`` against the inputs and (with ``overwrite``) against its record, then lock it.

    Nothing is created before every check passed. An export is replaced without ``--overwrite``, so its record
    (its kind, and the bytes it names) is checked with or without it. The caller deletes with :meth:`Claim.clear` or :meth:`Claim.install` once it is
    ready to write, and releases the claim (``with claim(...):``) when done. A stage directory takes its run
    lock inside (``shards`` for array tasks); other outputs lock a file beside them.
    """
    p = Path(out)
    if str(p) == "":
        raise InputError(f"{flag} is empty: name an output")
    check_name(p)
    refuse_missing_before_dotdot(p, flag)
    refuse_dangling_link(p, flag)
    if kind in (INDEX, CHECKPOINT):
        refuse_linked_directory(p, flag)
    refuse_record_path(p, flag)
    refuse_overlapping_outputs([(flag, p)], inputs=inputs, holders=holders)
    if kind is FILE:
        check_file_output(p, flag, inputs=inputs, holders=holders)
        refuse_export(p, flag)
    elif overwrite or not kind.directory:
        check_replaceable(p, kind, table=table, export_kind=export_kind, flag=flag)
    lock = RunLock(p, shards, command) if kind is STAGE else output_lock(p, command)
    lock.acquire()
    return Claim(p, kind, lock)


# ------------------------------------------------------------------ single files, and what no output may name

PIPELINE_RECORDS = "_pipeline"  # a pipeline's stage records inside its out directory
# The records by which grtool knows its outputs: an output written under one of these names replaces the record of
# another output (`report --out index/index.json`), so none is ever a command's output.
RECORD_NAMES = (MANIFEST, INDEX.record, CHECKPOINT.record, CHECKPOINT.started)
RECORD_PATTERNS = ("*" + EXPORT.record, ".*" + FILE_RECORD)
# The files grtool keeps beside an output while it writes it: its lock, its temporary file, the marker of a clear.
# Each is removed (or replaced) by a later run, so none is ever a command's output either.
WORK_PATTERNS = (BESIDE_LOCK.format(name="*"), f".*.{SCRATCH_MARK}*", CLEARING)


def file_record(path: Path) -> Path:
    """Where grtool records that it wrote the single file ``path`` (hidden beside it)."""
    p = named(path)
    return p.with_name("." + p.name + FILE_RECORD)


def _output_at(directory: Path) -> str | None:
    """What grtool wrote at ``directory`` as one whole output (a stage, an index, a checkpoint), else None."""
    if (directory / MANIFEST).is_file():
        return STAGE.what
    if (directory / CHECKPOINT.record).is_file() or (directory / CHECKPOINT.started).is_file():
        return CHECKPOINT.what
    if (directory / INDEX.record).is_file():
        fmt = (_read_record(directory / INDEX.record) or {}).get("format")
        return INDEX.what if isinstance(fmt, str) and fmt.startswith("grtool-index") else None
    return None


def refuse_foreign_directory(out: str | Path, flag: str) -> None:
    """Exit 2 when the directory ``out`` holds anything and nothing grtool wrote there as one whole output (an index,
    a checkpoint): the command writing one there would refuse it, with or without --overwrite. A pipeline's dry run
    asks it of the index and checkpoint directories its stages will write, before any stage runs."""
    p = Path(out)
    if not p.is_dir() or _output_at(p) is not None or (p / CLEARING).is_file():
        return
    kept = (*STAGE.keep, *INDEX.keep, *CHECKPOINT.keep, BESIDE_LOCK.format(name="*"))
    entries = [c for c in p.iterdir() if not _matches(c.name, kept)]
    if entries:
        raise InputError(
            f"{flag} {printable(p)}: holds {_listing(entries)} and nothing grtool wrote there (no {MANIFEST}, {INDEX.record} or "
            f"{CHECKPOINT.record}), so its stage would refuse it, with or without --overwrite; remove what you do not need yourself or choose another out"
        )


def refuse_record_path(out: str | Path, flag: str = "--out", *, within: Iterable[str | Path] = ()) -> None:
    """Exit 2 when ``out`` names a record of an output (``_manifest.json``, ``index.json``, ``grtool.json``,
    ``*.grtool.json``), lies in a pipeline's ``_pipeline/`` records, or lies inside a stage, index or checkpoint
    directory grtool wrote (its writer owns every name there). ``within``: the command's own other outputs, inside
    which it may write (a request cache inside its stage directory)."""
    p = Path(out)
    if p.name in RECORD_NAMES or _matches(p.name, RECORD_PATTERNS):
        raise InputError(f"{flag} {printable(out)}: {printable(p.name)} is the name of the record grtool keeps of an output; name the file otherwise")
    if _matches(p.name, WORK_PATTERNS):
        raise InputError(f"{flag} {printable(out)}: {printable(p.name)} is named like a file grtool keeps while it writes (a lock, a temporary file), which a later run removes; name it otherwise")
    resolved = real(p)
    for directory in [resolved, *resolved.parents]:
        if directory.name == PIPELINE_RECORDS:
            raise InputError(f"{flag} {printable(out)}: lies in {printable(directory)}, where a pipeline keeps its stage records; write it somewhere else")
    own = [real(o) for o in within if o is not None and str(o) not in ("", "-")]
    for directory in resolved.parents:
        if any(is_within(directory, o) for o in own):
            continue
        what = _output_at(directory)
        if what is not None:
            raise InputError(f"{flag} {printable(out)}: lies inside {printable(directory)}, {what} grtool wrote; write it somewhere else")


def refuse_dangling_link(p: Path, flag: str) -> None:
    if p.is_symlink() and not p.exists():  # dangling or a loop: found only when the finished output is moved in
        raise InputError(f"{flag} {printable(p)}: is a symbolic link to {printable(os.readlink(p))}, which does not exist; name an existing directory or a new path")


class FileBytes(msgspec.Struct, forbid_unknown_fields=True):
    """Which bytes a single file held: its size, and their BLAKE3 digest."""

    size: Annotated[int, msgspec.Meta(ge=0)]
    blake3: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class FileRecord(msgspec.Struct):
    """The record beside a report, plot or JSON file grtool wrote (:func:`write_file_record`). ``file``: the bytes
    it wrote; ``replaces``: those of the file it replaced. Both are absent in an older grtool's records. ``stdout``:
    the file holds ``command``'s standard output (a pipeline stage's ``stdout``), so running it again is
    ``command > file``."""

    format: Literal["grtool-file"]
    command: list[Text]
    written: Text
    file: FileBytes | None = None
    replaces: FileBytes | None = None
    stdout: bool = False


def _bytes_of(path: Path) -> FileBytes:
    from grtool.store.fingerprints import file_hash

    return FileBytes(size=path.stat().st_size, blake3=file_hash(path))


def _file_record(path: Path) -> FileRecord | None:
    try:
        return read_record(file_record(path), FileRecord, what="file record")
    except (OSError, DamagedRecord):
        return None


def _holds(path: Path, known: FileBytes) -> bool:
    return path.stat().st_size == known.size and _bytes_of(path).blake3 == known.blake3


def _bytes_state(path: Path, record: FileRecord) -> str:
    """How the single file ``path`` stands to its record: ``written`` (the bytes it names, or a record of an older
    grtool, which names none), ``replaced`` (the bytes it replaced: a run stopped before the rename), ``missing``,
    or ``changed`` (neither: edited by hand, or a user's file put where a stopped first write left its record)."""
    if record.file is None:
        return "written"
    if not path.is_file():
        return "missing"
    if _holds(path, record.file):
        return "written"
    return "replaced" if record.replaces is not None and _holds(path, record.replaces) else "changed"


def file_problem(path: Path) -> str | None:
    """What is wrong with the single file ``path`` beside its record (``validate``), None when it holds the bytes
    its record names (or a record of an older grtool names none)."""
    record_path = file_record(path)
    if os.path.islink(record_path):  # as the writer refuses it (refuse_foreign_records)
        return f"{printable(record_path)}: a symbolic link where grtool keeps the file's record (grtool never writes one)"
    try:
        record = read_record(record_path, FileRecord, what="file record")
    except DamagedRecord as e:
        return str(e)
    except OSError as e:
        return f"{printable(record_path)}: cannot be read ({e.strerror or e})"
    if os.path.lexists(path) and not path.is_file():
        return f"{file_kind_name(path)} stands where {printable(record_path.name)} records the file grtool wrote"
    again = f"run {shlex.join(record.command)}{f' > {shlex.quote(str(path))}' if record.stdout else ''} again"
    return {
        "written": None,
        "missing": f"missing, but {printable(record_path.name)} records it (removed, or a run stopped before its file was in place: {again})",
        "replaced": f"a run stopped before its new file was in place, {printable(record_path.name)} records the new one: {again}",
        "changed": f"changed since grtool wrote it ({printable(record_path.name)} records other bytes): it is yours now, and no run of grtool replaces it",
    }[_bytes_state(path, record)]


def export_state(path: Path, meta: Mapping[str, Any]) -> str:
    """How the exported file ``path`` stands to its record ``meta`` (``<file>.grtool.json``), in the words of
    :func:`_bytes_state`: ``written``, ``replaced`` (a run stopped between its record and its rename), ``missing`` or
    ``changed`` (edited by hand: the user's now). The size is compared first, so a changed file is rarely hashed."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    digest = functools.cache(lambda: sha256_file(path))

    def holds(known: Any) -> bool:
        return isinstance(known, Mapping) and known.get("bytes") == size and known.get("sha256") == digest()

    if holds({"bytes": meta.get("bytes"), "sha256": meta.get("sha256")}):
        return "written"
    if "replaces" not in meta:  # an older grtool's record: an edit and a stop before the rename look alike
        return "replaced"
    return "replaced" if holds(meta.get("replaces")) else "changed"


def written_by_grtool(path: Path) -> bool:
    """Whether the existing single file ``path`` is one grtool wrote: the record of an export, or of a report, plot
    or JSON file, names these bytes (as written, or as those the write replaced when it was
    stopped before the rename). A file changed since (edited by hand, put there by a user after a stopped first
    write) is the user's now."""
    if export_record(path).is_file():
        meta = _read_record(export_record(path))
        return meta is not None and export_state(path, meta) != "changed"
    record = _file_record(path)
    return record is not None and _bytes_state(path, record) != "changed"


def check_file_output(out: str | Path | None, flag: str = "--out", *, inputs: Iterable[str | Path | None] = (), holders: Iterable[str | Path | None] = ()) -> None:
    """Exit 2 unless grtool may write the single file ``out`` (``None`` and ``-``, standard output, always): not a
    directory, not a record (:func:`refuse_record_path`), not an input (:func:`refuse_output_among_inputs`), and
    absent or a file grtool wrote (:func:`written_by_grtool`); grtool never replaces a file it did not write."""
    if out is None or str(out) == "-":
        return
    if str(out) == "":
        raise InputError(f"{flag} is empty: name a file ('-' writes to standard output where the option takes it)")
    refuse_folder_spelling(out, flag)  # a pipeline file's text keeps the slash that Path drops on the command line
    p = Path(out)
    check_name(p)
    refuse_missing_before_dotdot(p, flag)  # (a pipeline stage's stdout too)
    if p.is_dir():
        raise InputError(f"{flag} {printable(out)}: is a directory; name a file")
    refuse_output_among_inputs(p, inputs, holders, flag=flag)
    refuse_record_path(p, flag)
    refuse_foreign_records(p, flag)
    record = file_record(p)
    if not os.path.lexists(p) or written_by_grtool(p):
        return
    found = [r for r in (record, export_record(p)) if os.path.lexists(r)]
    if found and (_file_record(p) is not None or _read_record(export_record(p)) is not None):
        _refuse_changed(p, found[0], flag)
    if found:
        raise InputError(
            f"{flag} {printable(out)}: its record {printable(found[0].name)} is damaged or not grtool's, so grtool cannot tell that it "
            f"wrote the file: remove both yourself or choose another {_option(flag)}"
        )
    raise InputError(
        f"{flag} {printable(out)}: exists and grtool did not write it (no {printable(file_record(p).name)} beside it, nor an export's "
        f"{printable(export_record(p).name)}); "
        f"grtool replaces only files it wrote: remove it yourself or choose another {_option(flag)}"
    )


def refuse_foreign_records(p: Path, flag: str) -> None:
    """Where grtool keeps the record of the single file ``p`` (its hidden ``.NAME.grtool-file.json``, an export's
    ``NAME.grtool.json``) there is either nothing or such a record, which the next write replaces: a link, a
    folder, a FIFO, or a file that is not a record of grtool's there is refused before any work, by name."""
    for record, kind in ((file_record(p), "grtool-file"), (export_record(p), "grtool-export/")):
        if not os.path.lexists(record):
            continue
        if os.path.islink(record) or not record.is_file():
            raise InputError(f"{flag} {printable(p)}: {printable(record)} is {file_kind_name(record)} where grtool keeps the file's record: move it away, then run again")
        meta = _read_record(record)
        if meta is None or not str(meta.get("format", "")).startswith(kind):
            raise InputError(f"{flag} {printable(p)}: {printable(record)}, where grtool keeps the file's record, is damaged or not a record grtool wrote: move it away, then run again")


def _refuse_changed(out: Path, record: Path, flag: str) -> None:
    raise InputError(
        f"{flag} {printable(out)}: was changed since grtool wrote it (its {printable(record.name)} records other bytes), so it is "
        f"yours now and grtool does not replace it: remove it yourself or choose another {_option(flag)}"
    )


def refuse_export(out: str | Path | None, flag: str) -> None:
    """A report, plot or JSON file never replaces an export grtool wrote (its ``.grtool.json`` says so): only
    another export of its kind does."""
    if out is not None and str(out) != "-" and export_record(Path(out)).is_file():
        raise InputError(
            f"{flag} {printable(out)}: is an export grtool wrote ({printable(export_record(Path(out)).name)} beside it); {flag} writes another kind of file: choose another {_option(flag)}"
        )


def scratch_path(path: Path, pid: int | str) -> Path:
    """Where process ``pid`` writes the single file ``path`` before it is complete (hidden, marked as grtool's, its
    suffix kept: a chart's format follows it)."""
    return path.with_name(f".{path.stem}.{pid}.{SCRATCH_MARK}{path.suffix}")


@contextlib.contextmanager
def replacing(path: Path, record: Callable[[Path], object]) -> Iterator[Path]:
    """A temporary path beside the single file ``path`` to write; when the block ends, ``record(tmp)`` writes its
    record from the finished bytes, and then the file is renamed into place: a reader never sees half a file, a
    file in place always has its record, and a stop between the two leaves a record the file does not match (which
    `validate` names), never a file grtool would refuse to replace. An exception before the record leaves both as
    they were; one after it (a failed rename) leaves the new record beside the old file, as a stop there does.
    A file put in place or changed by someone else while the record is written is kept (and the record, which
    names other bytes, then says it is theirs): only the moment between the last look and the rename is open."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch_path(path, os.getpid())
    try:
        yield tmp
        seen = _file_identity(path)
        record(tmp)
        hold("recorded")  # tests: the record written, the file not yet in place
        now = _file_identity(path)
        if now is not None and now != seen:  # (one removed meanwhile left nothing to keep)
            raise changed_meanwhile(path)
        commit_file(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _file_identity(path: Path) -> tuple[int, ...] | None:
    """What tells one state of a file from another without reading it (an edit changes its mtime and ctime)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def changed_meanwhile(path: Path) -> InputError:
    return InputError(f"{printable(path)}: was put there or changed while this run wrote it, so it is not the file grtool wrote; it is left as it is: move it away and run again")


def remove_killed_scratch(path: Path, holders: Iterable[str | Path | None] = ()) -> None:
    """Temporary files of the single file ``path`` that killed runs left (:func:`scratch_path`): named by a process
    no longer running, and not one of the command's inputs (``holders``)."""
    pattern = re.compile(re.escape(f".{path.stem}.") + r"([0-9]+)" + re.escape(f".{SCRATCH_MARK}{path.suffix}"))
    read = {real(h) for h in holders if h is not None and str(h) not in ("", "-")}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(path.parent):
            m = pattern.fullmatch(entry.name)
            if m and int(m[1]) != os.getpid() and not pid_alive(int(m[1])) and entry.is_file(follow_symlinks=False) and real(entry.path) not in read:
                Path(entry.path).unlink(missing_ok=True)


def write_file_record(path: Path, command: list[str], content: Path | None = None, stdout: bool = False) -> None:
    """The record that says grtool wrote the single file ``path`` (by ``command``; ``stdout``: its standard output),
    so a later run may replace it: with the bytes at ``content`` (its finished temporary file; None: the file in
    place), and those of the file they replace."""
    replaces = _bytes_of(path) if content is not None and path.is_file() else None
    record = FileRecord("grtool-file", command, now(), _bytes_of(content if content is not None else path), replaces, stdout)
    atomic_write_bytes(file_record(path), dumps(msgspec.to_builtins(record)))


def check_outputs(
    outputs: Iterable[tuple[str, str | Path | None, bool]], *, holders: Iterable[str | Path | None] = (), runs: Iterable[str | Path | None] = (), raw: Iterable[str | Path | None] = ()
) -> None:
    """Every output of one command checked before it does anything. ``outputs``: ``(flag, path, is a single
    file)``. No two meet, none meets what the command reads (``holders``: every path it reads; files, stages,
    indexes and models among them count whole), none is a record or lies inside another output, a file output is
    absent or grtool's (:func:`check_file_output`), a directory output is not an existing file of the user's.
    ``runs``: the outputs that are run directories; one may be a folder of raw files the command reads (``raw``:
    `corpus ingest data --out data`), since it writes only its stage directories inside."""
    outputs = list(outputs)
    run_dirs = {real(r) for r in runs if r is not None and str(r) not in ("", "-")}
    folders = {real(f) for f in raw if f is not None and Path(f).is_dir() and not _is_artefact(Path(f))} & run_dirs
    holders = [h for h in holders if h is None or real(h) not in folders]
    refuse_overlapping_outputs([(flag, path) for flag, path, _ in outputs], holders=holders)
    directories = [path for _, path, single in outputs if not single]
    for flag, path, single in outputs:
        if single:
            check_file_output(path, flag, holders=holders)
            continue
        if path is None or str(path) == "-":
            continue
        if str(path) == "":
            raise InputError(f"{flag} is empty: name an output directory")
        check_name(path)
        refuse_missing_before_dotdot(path, flag)
        refuse_dangling_link(Path(path), flag)
        refuse_record_path(path, flag, within=[o for o in directories if o is not path])
        if os.path.lexists(path) and not Path(path).is_dir() and not written_by_grtool(Path(path)):  # train --format llamafactory-yaml writes a file there
            raise InputError(f"{flag} {printable(path)}: names an existing file grtool did not write; choose another {_option(flag)}")
