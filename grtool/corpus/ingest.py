"""`grtool corpus ingest`: release files of the four datasets, or files of the generic layout (a researcher's own
questions and documents, see docs/data-formats.md) → ``documents`` and ``questions`` stage directories.

Two phases (see :mod:`grtool.corpus.dedup_spill`): every input is read and checked to its end while rows are
spilled to hash buckets in a work directory beside the output (``OUT/_ingest_work``); only then are the
output shards written. A truncated or malformed file therefore fails the run before any shard exists. A run
killed in phase 1 starts phase 1 again; a run killed in phase 2 reuses the finished spill and writes only
the missing shards, which come out identical because everything is ordered by input sequence.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from grtool.corpus import datasets as ds
from grtool.corpus.columns import Columns, parse_columns, variant_hints
from grtool.corpus.doc_hash import DOC_ID_SCHEME
from grtool.corpus.generic import AMBIGUOUS_TITLE, GenericGold
from grtool.corpus.readers import Stream, input_files, iter_records, open_streams, parse_line
from grtool.corpus.dedup_spill import (
    Spill,
    remove_work,
    SpillPlan,
    buckets_for_bytes,
    load_plan,
    table_parts,
    question_duplicates,
    question_part_writer,
    write_document_part,
)
from grtool.errors import DataProblem, GrtoolError, InputError
from grtool.records import repeated_key_in
from grtool.log import log, progress
from grtool.store.records import open_stops
from grtool.store.empty import allowing
from grtool.store.io import is_stdio
from grtool.store.partloop import Output, PartLoop
from grtool.store.records import load_shard_records, parts_not_on_disk
from grtool.store.schemas import DOCUMENTS, QUESTIONS
from grtool.store.layout import MANIFEST, RUN_LOCK
from grtool.store.stage import MAX_ROWS_PER_SHARD, StageSpec, refuse_stdin_resume
from grtool.store.records import load_manifest
from grtool.store.paths import prepare_out_dir
from grtool.store.locks import run_lock
from grtool.errors import printable
from grtool.records import Report

WORK_DIR = "_ingest_work"
COMPRESSED_RATIO = 4  # decompressed/compressed size guess, only used to size the hash buckets
DEFAULT_SPLIT = {ds.MOREHOPQA: "test"}  # MoreHopQA is a test-only benchmark
PROGRESS_EVERY = 2048  # records
STDIN_ESTIMATE = 4 << 30  # bytes assumed for an input piped in on stdin


@dataclass
class IngestReport:
    out: str
    questions: int = 0
    documents: int = 0  # distinct
    paragraphs: int = 0  # document occurrences read (before deduplication)
    rejected: Counter = field(default_factory=Counter)  # "table: reason" -> n
    questions_by_dataset: Counter = field(default_factory=Counter)
    splits_read_as: Counter = field(default_factory=Counter)  # "'Validation' as dev" -> records whose own split was normalised
    empty_inputs: list[str] = field(default_factory=list)  # inputs (files, archive members) without a record
    detected: list[dict[str, Any]] = field(default_factory=list)  # what each input was read as (group_readings)
    resumed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "out": self.out,
            "questions": self.questions,
            "documents": self.documents,
            "paragraphs": self.paragraphs,
            "rejected": dict(self.rejected),
            "questions_by_dataset": dict(self.questions_by_dataset),
            "splits_read_as": dict(self.splits_read_as),
            "empty_inputs": list(self.empty_inputs),
            "detected": list(self.detected),
            "resumed": self.resumed,
        }


def ingest(
    inputs: list[str | Path],
    out: str | Path,
    *,
    dataset: str = "auto",
    split: str | None = None,
    strict: bool = False,
    overwrite: bool = False,
    rows_per_part: int | None = None,
    allow_empty: bool = False,
    columns: str | None = None,
    allow_rejects: bool = False,
) -> IngestReport:
    """Read the inputs, write ``OUT/documents`` and ``OUT/questions`` (or JSON Lines to stdout for ``-``).

    An input without a single record is an error when every input is empty (``allow_empty`` accepts it);
    beside other inputs it is a warning, listed in the report and the manifests (``empty_inputs``).
    ``columns``: the ``--columns`` mapping (:mod:`grtool.corpus.columns`). Questions whose gold title names several
    documents stop the run before anything is written unless ``allow_rejects`` (then they are rejects).
    """
    mapping = parse_columns(columns)
    if dataset != "auto" and dataset not in ds.DATASETS:
        raise GrtoolError(f"--dataset must be auto or one of {', '.join(ds.DATASETS)}, got {dataset!r}")
    if split is not None and not split.strip():
        raise InputError(f"--split {split!r}: an empty split name (leave --split out to take it from each file name)")
    if not is_stdio(out) and str(out) == "":
        prepare_out_dir(out)  # refuses the empty path
    own = [] if is_stdio(out) else own_outputs(Path(out), WORK_DIR)  # never input, even inside an input directory
    found = [input_files(i, exclude=own) for i in inputs]
    files = [f for fs in found for f in fs]
    # strictness changes the rows (a bad record stops the run instead of being rejected): a parameter; only
    # recorded when on, so outputs of earlier versions stay resumable
    params = {
        "dataset": dataset,
        "split": split,
        "doc_id": DOC_ID_SCHEME,
        **rows_per_part_param(rows_per_part),
        **({"strict": True} if strict else {}),
        **({"columns": mapping.as_param()} if mapping else {}),
    }
    names = [str(i) for i in inputs]
    doc_spec = StageSpec("documents", DOCUMENTS, params, names, exclude=own)
    q_spec = StageSpec("questions", QUESTIONS, params, names, exclude=own)
    report = IngestReport(str(out))
    identity = {"params": params, "inputs": doc_spec.identity()["inputs"]}
    detect_inputs(_probes(inputs, found), dataset, mapping)  # an ambiguous file or a refused --dataset: before OUT exists
    options = ReadOptions(dataset, split, strict, allow_empty, mapping, allow_rejects)
    fill = lambda work: read_inputs(files, work, options, report, identity)  # noqa: E731
    with allowing(allow_empty):  # a caller of this function, not only the command, may allow an empty result
        report.resumed = run_two_phase(out, WORK_DIR, doc_spec, q_spec, identity, fill, strict=strict, overwrite=overwrite)
    return report if is_stdio(out) else _read_back(Path(out), report)


def _probes(inputs: list[str | Path], found: list[list[Path]]) -> list[Path]:
    """The files :func:`detect_inputs` reads first: every file named on the command line, and of the files found
    in a directory the first of each folder. Not all of those: the dump's thousands of small .bz2 files would
    each be decompressed twice (a bzip2 block holds a whole file), and a folder's files are one dataset's."""
    probes: list[Path] = []
    for given, files in zip(inputs, found):
        if is_stdio(given) or not Path(given).is_dir():
            probes += files
            continue
        probes += list({f.parent: f for f in reversed(files)}.values())[::-1]  # the first file of each folder
    return probes


def detect_inputs(files: list[Path], dataset: str, columns: Columns | None = None) -> None:
    """Choose the reading of ``files`` from their first record (cheap: the reader streams) before OUT is
    created, so that an ambiguous file or a --dataset refused for a file fails with nothing written. Phase 1
    chooses again, the same way, for every file. Not read here: stdin (it cannot be read twice) and an archive's
    members after its first one with a record (reaching them means decompressing everything before them); a
    failure there, or in a file :func:`_probes` leaves out, is found in phase 1, and the run then removes the OUT
    it created (:func:`run_two_phase`)."""
    forced = None if dataset == "auto" else dataset
    for path in files:
        if is_stdio(path):
            continue
        with contextlib.closing(open_streams(path)) as streams:
            for stream in streams:
                first = next(iter_records(stream), None)
                if first is None:  # an empty input or member: phase 1 counts it
                    continue
                position, item = first
                record = parse_line(stream.name, position, item) if isinstance(item, bytes) else item
                if columns is not None:
                    record = Columns(columns.targets).apply(record)[0]  # a copy: its seen keys are phase 1's to count
                choose_reading(stream.name, position, record, forced)
                break


def own_outputs(out: Path, work_name: str) -> list[Path]:
    """What a corpus run writes under ``OUT``: left out of input discovery and input fingerprints."""
    return [out / "documents", out / "questions", out / work_name, out / RUN_LOCK]


def rows_per_part_param(rows_per_part: int | None) -> dict[str, int]:
    """Only a non-default part size goes into the parameters (outputs of earlier versions stay resumable)."""
    if rows_per_part is None or rows_per_part == MAX_ROWS_PER_SHARD:
        return {}
    if rows_per_part < 1:
        raise InputError(f"--rows-per-part must be at least 1, got {rows_per_part}")
    return {"rows_per_part": rows_per_part}


def run_two_phase(
    out: str | Path, work_name: str, doc_spec: StageSpec, q_spec: StageSpec, identity: dict[str, Any], fill: Callable[[Path], SpillPlan], *, strict: bool = False, overwrite: bool = False
) -> bool:
    """Phase 1 ``fill(work_dir) -> plan`` unless a finished spill of the same run exists, then phase 2.

    Used by ingest and merge. Returns True when an earlier run's work was reused (resume).
    """
    if is_stdio(out):
        work = Path(tempfile.mkdtemp(prefix="grtool-corpus-"))
        try:
            write_outputs(work, fill(work), None, doc_spec, q_spec, strict)
        finally:
            shutil.rmtree(work, ignore_errors=True)  # a temporary folder of its own
        return False
    out = Path(out)
    work = out / work_name
    _refuse_outputs_early(out, [doc_spec, q_spec], overwrite)
    created = _missing_dirs(out)
    try:
        return _run_locked(out, work, doc_spec, q_spec, identity, fill, strict=strict, overwrite=overwrite)
    except BaseException:
        # A run that failed before writing anything leaves no empty OUT (nor parents it made) behind; rmdir
        # removes a directory only while it is empty, so nothing another run or the user put there goes.
        for d in created:
            try:
                d.rmdir()
            except OSError:
                break
        raise


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _run_locked(out: Path, work: Path, doc_spec: StageSpec, q_spec: StageSpec, identity: dict[str, Any], fill: Callable[[Path], SpillPlan], *, strict: bool, overwrite: bool) -> bool:
    # One run at a time in OUT: a second one would share the work directory (and lose rows) or mix parameters.
    with run_lock(out):
        if overwrite:
            remove_work(work)
        elif _already_complete(out, [doc_spec, q_spec]):
            log.info("%s: already complete, nothing to do (--overwrite redoes it)", out)
            remove_work(work)  # left behind when a run was killed after its last shard
            from grtool.store.stage import remove_leftovers

            for spec in (doc_spec, q_spec):  # this run holds OUT alone: every temporary file there is a killed run's
                remove_leftovers(out / spec.table)
            return True
        plan = None if overwrite else load_plan(work, identity)
        resumed = plan is not None
        if plan is None:
            plan = fill(work)
        else:
            log.info("%s: resuming: the inputs were read completely before, writing the missing shards", out)
        write_outputs(work, plan, out, doc_spec, q_spec, strict, overwrite=overwrite)
        remove_work(work)
    return resumed


def _refuse_outputs_early(out: Path, specs: list[StageSpec], overwrite: bool) -> None:
    """The checks each table's stage writer makes (store/outputs.py), made for both tables before phase 1:
    a refused output must not leave the spill behind (inside an input) nor one table replaced and not the other."""
    from grtool.store.outputs import STAGE, check_replaceable, refuse_output_among_inputs
    from grtool.store.paths import check_name

    check_name(out)
    for spec in specs:
        target = out / spec.table
        refuse_output_among_inputs(target, holders=[i for i in spec.inputs if str(i) != "-"])
        if overwrite:
            check_replaceable(target, STAGE, table=spec.table)


# ------------------------------------------------------------------------------------------ phase 1


@dataclass(frozen=True)
class ReadOptions:
    """How phase 1 reads the inputs (the command's options)."""

    dataset: str = "auto"
    split: str | None = None
    strict: bool = False
    allow_empty: bool = False
    columns: Columns | None = None
    allow_rejects: bool = False


def read_inputs(files: list[Path], work: Path, options: ReadOptions, report: IngestReport, identity: dict[str, Any]) -> SpillPlan:
    """Phase 1: read every file to its end, convert its records, spill rows and rejects; return the plan."""
    k = buckets_for_bytes(_estimated_bytes(files))
    spill = Spill(work, doc_buckets=k, question_buckets=k, identity=identity)
    total = None if any(is_stdio(f) for f in files) else sum(f.stat().st_size for f in files)
    streams = 0
    readings: list[tuple[str, Reading]] = []
    generic = GenericGold(spill.root)
    try:
        with progress() as bar:
            task = bar.add_task("reading inputs", total=total)
            done = 0
            for path in files:
                stream = None
                for stream in open_streams(path):
                    tick = lambda s=stream, base=done: bar.update(task, completed=base + s.raw.tell())  # noqa: E731
                    streams += 1
                    reading = _read_stream(stream, options, spill, report, tick, generic)
                    if reading is None:
                        report.empty_inputs.append(_input_name(stream.name))
                    else:
                        readings.append((_input_name(path), reading))
                if stream is None:  # an archive without a file
                    streams += 1
                    report.empty_inputs.append(_input_name(path))
                done += (stream.raw.tell() if stream else 0) if is_stdio(path) else path.stat().st_size
                bar.update(task, completed=done)
        if options.columns is not None:
            options.columns.check_all_seen()
        _add_generic_questions(generic, spill, report, options)
        _check_empty(report.empty_inputs, streams, options.allow_empty)
        spill.empty_inputs = list(report.empty_inputs)
        report.detected = spill.detected = group_readings(readings)
        return spill.close()
    except BaseException:
        generic.close()
        spill.abort()
        raise


def _add_generic_questions(generic: GenericGold, spill: Spill, report: IngestReport, options: ReadOptions) -> None:
    """The generic questions, now that every generic document is known: gold references become doc_ids, or
    the question is rejected with the reason. Questions naming an ambiguous title stop the run (exit 1, nothing
    written) unless --allow-rejects: each such reject is a question the user meant to keep, and the fix is theirs."""
    ambiguous: list[str] = []
    for entry, gold, problem in generic.resolved():
        question, source, position = entry["question"], entry["source"], entry["position"]
        if problem is not None:
            label = f" (qid {question['qid']!r})"
            if problem.reason == AMBIGUOUS_TITLE and not options.strict:
                ambiguous.append(f"{source}, {position}{label}: {problem.detail}")
            _bad_record(problem, "questions", entry["record"], source, position, options.strict, spill, report, label)
            continue
        spill.add_question({**question, "gold_doc_ids": gold}, source, position)
    if ambiguous and not options.allow_rejects:
        more = f" (and {len(ambiguous) - 1} more question{'s' if len(ambiguous) > 2 else ''})" if len(ambiguous) > 1 else ""
        raise DataProblem(
            f"{ambiguous[0]}{more}; nothing was written. Fix: name these questions' gold documents by gold_doc_ids (the "
            f"ids of the documents file), or give the documents distinct titles; --allow-rejects writes the corpus "
            f"without the {len(ambiguous)} question{'s' if len(ambiguous) > 1 else ''} (kept in questions/_rejects)"
        )


def _bad_record(problem: ds.BadRecord, table: str, record: Any, source: str, position: str, strict: bool, spill: Spill, report: IngestReport, label: str = "") -> None:
    """A record that does not fit: fatal under --strict (naming the file, the record and the problem), else a reject."""
    if strict:
        detail = f" ({problem.detail})" if problem.detail else ""
        raise InputError(f"{source}, {position}{label}: {problem.reason}{detail} [--strict]") from None
    spill.reject(table, record, problem.reason, source, position, problem.detail)
    report.rejected[f"{table}: {problem.reason}"] += 1


def _record_label(record: Any) -> str:
    """`` (qid 'x')`` for a generic question record that has one, for messages."""
    if isinstance(record, dict):
        for key in ("qid", "id"):
            if isinstance(record.get(key), str | int) and not isinstance(record.get(key), bool):
                return f" ({key} {record[key]!r})"
    return ""


def _input_name(name: str | Path) -> str:
    return "<stdin>" if is_stdio(name) else printable(name)


def _check_empty(empty: list[str], streams: int, allow_empty: bool) -> None:
    """No record at all is an error (unless --allow-empty); some empty inputs among others are a warning."""
    if not empty:
        return
    shown = ", ".join(printable(e) for e in empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
    if len(empty) >= streams and not allow_empty:
        what = "is empty" if len(empty) == 1 else "are all empty"
        raise InputError(f"{shown}: {what}: no records (0 bytes, only whitespace or an empty JSON array); nothing to ingest (--allow-empty accepts an empty corpus)")
    for e in empty:
        log.warning("%s: empty input (no records)", printable(e))


def _estimated_bytes(files: list[Path]) -> int:
    total = 0
    for f in files:
        if is_stdio(f):  # unknown size: plan for a large input (more spill buckets cost little)
            total += STDIN_ESTIMATE
            continue
        with open(f, "rb") as fh:
            head = fh.read(6)
        compressed = head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ"))
        total += f.stat().st_size * (COMPRESSED_RATIO if compressed else 1)
    return total


BY_DETECTION = "detected"
BY_OPTION = "--dataset"


@dataclass(frozen=True)
class Reading:
    """How one input stream is read: with which converter, its rows tagged with which dataset, and why."""

    converter: str  # a key of ds.CONVERTERS; ds.HOTPOTQA_WIKI converts {title, text} documents of any corpus,
    # ds.GENERIC_DOCUMENTS those of the generic layout
    dataset: str  # the dataset its documents (and questions) are tagged with
    by: str  # BY_DETECTION or BY_OPTION
    split: str | None = None  # of its questions (None: documents only); "unknown" when neither the name nor --split says
    unread: tuple[str, ...] = ()  # keys of its records that the converter does not read (ds.unread_keys)

    @property
    def documents_only(self) -> bool:
        return self.converter in (ds.HOTPOTQA_WIKI, ds.GENERIC_DOCUMENTS)

    def describe(self) -> dict[str, Any]:
        layout = {"layout": "inline"} if self.converter == ds.INLINE else {}
        unread = {"unread": list(self.unread)} if self.unread else {}
        if self.documents_only:
            return {"dataset": self.dataset, "records": "documents", "by": self.by, **unread}
        return {"dataset": self.dataset, "records": "questions", "split": self.split or "unknown", "by": self.by, **layout, **unread}


def choose_reading(name: str, position: str, record: Any, forced: str | None) -> Reading:
    """The reading of a stream from its first record. Only a shape that one release format has is detected;
    an ambiguous one needs --dataset, and --dataset never relabels records that are another dataset's."""
    shape = ds.detect(record)
    if forced is None:
        if shape is None:
            keys = sorted(record)[:12] if isinstance(record, dict) else type(record).__name__
            mapping = isinstance(record, dict) and record and all(isinstance(v, list) for v in record.values())
            hint = " (an object of lists: a mapping of titles to sentence lists is not a record)" if mapping else ""
            renames = variant_hints(sorted(record)) if isinstance(record, dict) else []
            hint += f" (other key names for what a layout reads: try --columns {','.join(renames)})" if renames else ""
            raise InputError(
                f"{name}, {position}: unknown schema (keys {keys}){hint}; expected a record of HotpotQA, "
                "2WikiMultihopQA, MuSiQue, MoreHopQA, the HotpotQA Wikipedia dump, the generic layout (questions "
                "with qid, question, answer and gold_doc_ids or gold_titles; documents with id or title, and text) or "
                "the inline layout (question, answer, paragraphs: [{title, text, is_supporting}]), described in "
                f"{ds.FORMATS_DOC} (or pass --dataset; other key names: --columns TARGET=SOURCE,...)"
            )
        if shape.dataset is None:
            raise InputError(f"{name}: cannot tell which dataset this is (looks like {shape.looks_like}); pass --dataset {'|'.join(shape.choices)}")
        return Reading(shape.dataset, ds.CORPUS_LABEL.get(shape.dataset, shape.dataset), BY_DETECTION)
    label = ds.CORPUS_LABEL.get(forced, forced)
    if forced == ds.GENERIC and shape is None:  # a generic record lacking a key: a bad record, of which file?
        keys = set(record) if isinstance(record, dict) else set()
        questions = bool(keys & {"question", "qid", "answer", "gold_doc_ids", "gold_titles"})
        return Reading(ds.GENERIC if questions else ds.GENERIC_DOCUMENTS, label, BY_OPTION)
    if shape is not None:
        if shape.dataset is not None:
            # the dump's articles are HotpotQA's corpus: --dataset hotpotqa fits them too
            fits = forced == shape.dataset or (shape.documents and label == ds.CORPUS_LABEL.get(shape.dataset))
            # documents with ids are the generic layout's, or (named so) one dataset's corpus file
            fits = fits or (shape.dataset == ds.GENERIC_DOCUMENTS and forced in ds.QUESTION_DATASETS)
            fits = fits or (shape.dataset == ds.INLINE and forced == ds.GENERIC)  # both are your own data
        else:  # a shape several datasets share: one of those, and questions are not read as dump articles
            fits = label in shape.choices and (shape.documents or forced != ds.HOTPOTQA_WIKI)
        if not fits:
            choices = "" if shape.dataset is not None else f"; pass --dataset {'|'.join(shape.choices)}"
            raise InputError(f"{name}, {position}: these are {shape.looks_like}, not {forced} (--dataset){choices}" + ("; leave --dataset out to detect each file's dataset" if shape.dataset else ""))
    converter = ds.INLINE if shape is not None and shape.dataset == ds.INLINE else forced
    if shape is not None and shape.documents:
        converter = ds.GENERIC_DOCUMENTS if label == ds.GENERIC else ds.HOTPOTQA_WIKI
    return Reading(converter, label, BY_OPTION)


def group_readings(readings: list[tuple[str, Reading]]) -> list[dict[str, Any]]:
    """What each input file was read as, for the summary and the manifests. Files of one directory read the same
    way are one entry (the dump's thousands of files); an entry naming a single file names that file, and an
    archive whose members all read the same way is one file."""
    pairs = list(dict.fromkeys(readings))  # one per (file, reading), in reading order; archive members collapse
    groups: dict[tuple[str, Reading], list[str]] = {}
    for path, reading in pairs:
        groups.setdefault((_parent(path), reading), []).append(path)
    entries = []
    for (parent, reading), paths in groups.items():
        where = {"path": paths[0]} if len(paths) == 1 else {"path": parent, "files": len(paths)}
        entries.append({**where, **reading.describe()})
    return entries


def _parent(path: str) -> str:
    return str(Path(path).parent) if path != "<stdin>" else path


def _read_stream(stream: Stream, options: ReadOptions, spill: Spill, report: IngestReport, tick, generic: GenericGold) -> Reading | None:
    """Read one stream to its end; returns how it was read (None: it held no record).

    Splits: --split, else (own-data layouts) the record's ``split``, else the file name (or a Hugging Face dataset
    folder's split), else the dataset's only split (MoreHopQA: test), else ``unknown`` with a warning."""
    forced = None if options.dataset == "auto" else options.dataset
    split, columns = options.split, options.columns
    reading: Reading | None = None
    line_converter = None
    setting = ds.setting_from_name(stream.name)
    file_split = split
    unread: dict[str, None] = {}  # keys no record of this stream had read (in order of first sight)
    warned = False
    n = 0
    for position, item in iter_records(stream):
        n += 1
        if n % PROGRESS_EVERY == 0:
            tick()
        converted = repeated = None
        if isinstance(item, bytes):  # a JSON line: the dump's fast path decodes only what it needs
            converted = line_converter(item) if line_converter else None
            record = None if converted else parse_line(stream.name, position, item)
            repeated = None if converted else repeated_key_in(item, record)
        else:
            record = item
        twice: list[str] = []
        if columns is not None:
            record, twice = columns.apply(record)
        if reading is None:  # the first record decides how the stream is read
            reading = choose_reading(stream.name, position, record, forced)
            log.debug("%s: %s", stream.name, reading)
            line_converter = None if columns is not None else ds.LINE_CONVERTERS.get(reading.converter)
            convert = ds.CONVERTERS[reading.converter]
            table, label = ("documents" if reading.documents_only else "questions"), [reading.dataset]
            own_splits = reading.converter in (ds.GENERIC, ds.INLINE)  # its records may carry their split
            if file_split is None and not reading.documents_only:
                file_split = ds.split_from_name(Path(stream.name).name) or stream.split or DEFAULT_SPLIT.get(reading.dataset)
                if file_split is None and not own_splits:
                    _warn_no_split(stream.name)
                    file_split = "unknown"
            fallback_split = file_split or "unknown"
        if not reading.documents_only:  # every question record read, kept or rejected: the summary's rows in
            report.questions_by_dataset[reading.dataset] += 1
        if converted is None:
            try:
                if not isinstance(record, dict):
                    raise ds.BadRecord("record is not a JSON object", f"got {type(record).__name__}")
                for key in ds.unread_keys(reading.converter, record):
                    unread.setdefault(key)
                if twice:
                    raise ds.BadRecord("key given twice", f"{', '.join(twice)}: the record's own key and the one --columns maps to it")
                if repeated is not None:
                    raise ds.BadRecord("key given twice", f"{repeated!r}: which of its values is meant is unknown")
                converted = convert(record, fallback_split, setting)
                if reading.converter == ds.GENERIC_DOCUMENTS:
                    generic.add_document(converted)
            except ds.BadRecord as problem:
                record_name = _record_label(record) if own_splits else ""
                _bad_record(problem, table, record, stream.name, position, options.strict, spill, report, record_name)
                continue
        for did, title, text in converted.documents:
            spill.add_document(did, title, text, label)
        report.paragraphs += len(converted.documents)
        if converted.question is None:
            continue
        if own_splits:
            given = record.get("split") if isinstance(record, dict) else None
            if isinstance(given, str) and given != converted.question["split"]:  # said in the summary: no surprise
                report.splits_read_as[f"{given!r} as {converted.question['split']}"] += 1
            if split is not None:  # --split names every question's split
                converted.question["split"] = split
            elif file_split is None and record.get("split") is None and not warned:
                _warn_no_split(stream.name, " and records without a 'split' field")
                warned = True
        if reading.converter != ds.GENERIC:
            spill.add_question(converted.question, stream.name, position)
            continue
        generic.defer(converted, record, stream.name, position)
    if reading is None:
        return None
    reading = replace(reading, unread=tuple(sorted(unread)))
    if reading.documents_only:
        return reading
    return replace(reading, split=file_split or ("per record" if own_splits else None))


def _warn_no_split(name: str, records: str = "") -> None:
    log.warning("%s: no split (train/dev/test) in the file name%s; using 'unknown' (pass --split, or make splits afterwards with grtool corpus split)", name, records)


# ------------------------------------------------------------------------------------------ phase 2


def write_outputs(work: Path, plan: SpillPlan, out: Path | None, doc_spec: StageSpec, q_spec: StageSpec, strict: bool, overwrite: bool = False) -> None:
    """Phase 2: the shards of both tables (``out=None``: JSON Lines on stdout)."""
    has_questions = bool(any(plan.questions.rows) or plan.questions.rejects)
    if strict and has_questions:
        # a repeated qid is fatal under --strict: look for one before any shard is committed
        for dup, first in question_duplicates(work, plan):
            raise InputError(f"{dup['source']}, {dup['position']}: duplicate qid {dup['qid']!r} (first seen in {first['source']}, {first['position']}) [--strict]")
    doc_parts = table_parts(plan, "documents")
    q_parts = table_parts(plan, "questions") if has_questions else []
    target = (lambda t: "-") if out is None else (lambda t: out / t)
    empty: dict[str, Any] = {"empty_inputs": plan.empty_inputs} if plan.empty_inputs else {}
    if plan.detected:  # what each input was read as (ingest)
        empty["detected"] = plan.detected
    # the documents, then the questions: one part loop each (a stream on stdout keeps that order)
    docs = PartLoop([Output(target("documents"), doc_spec, finish={"has_questions": has_questions, **empty}, tag="documents")], len(doc_parts),
                    overwrite=overwrite, num_shards=1, shard_index=0)  # fmt: skip
    with progress() as bar:
        task = bar.add_task("writing shards", total=len(doc_parts) + len(q_parts), completed=len(docs.finished))
        step = lambda i: bar.advance(task)  # noqa: E731  (a part committed)
        docs.run(lambda part: write_document_part(work, plan, doc_parts[part.index], part.shard), after_part=step)
        judged = [(docs, docs.finish(check_empty=False))]
        if has_questions:
            questions = PartLoop([Output(target("questions"), q_spec, finish=empty, tag="questions")], len(q_parts), overwrite=overwrite, num_shards=1, shard_index=0)
            if questions.finished:
                bar.advance(task, len(questions.finished))
            if questions.todo:
                write_question_part = question_part_writer(work, plan)
                questions.run(lambda part: write_question_part(q_parts[part.index], part.shard), after_part=step)
            judged.insert(0, (questions, questions.finish(check_empty=False)))
    # Both tables written, then judged (grtool.store.empty), questions first: a rejected record is counted there.
    for loop, manifests in judged:
        loop.check_empty(manifests)


# ------------------------------------------------------------------------------------------- resume


def _already_complete(out: Path, specs: list[StageSpec]) -> bool:
    """True when a previous identical run finished; an output made differently is refused before any reading."""
    complete = True
    for spec in specs:
        d = out / spec.table
        if not (d / MANIFEST).exists():
            complete = complete and spec.table == "questions" and _documents_say_no_questions(out)
            continue
        old = load_manifest(d)
        refuse_stdin_resume(d, old)
        problem = spec.mismatch(old)
        if problem:
            raise GrtoolError(f"{d}: exists from a different run ({problem}); use --overwrite to start over")
        # the files decide, not the manifest's flag: a part removed since is redone; a table whose run stopped (an
        # empty result, say) is judged again by a run, never skipped as done
        complete = complete and old.complete and not open_stops(old) and not parts_not_on_disk(d, old.num_parts, load_shard_records(d))
    return complete


def _documents_say_no_questions(out: Path) -> bool:
    d = out / "documents"
    return (d / MANIFEST).exists() and load_manifest(d).has_questions is False


def _read_back(out: Path, report: IngestReport) -> IngestReport:
    """Final numbers from the manifests (true also for a resumed run)."""
    report.rejected = Counter()
    for table in ("documents", "questions"):
        d = out / table
        if not (d / MANIFEST).exists():
            continue
        m = load_manifest(d)
        rejected = m.counters.rejected
        for reason, n in rejected.items():
            report.rejected[f"{table}: {reason}"] += n
        if table == "documents":
            report.documents = m.rows or 0
            report.paragraphs = m.counters.in_ - sum(rejected.values())
            report.empty_inputs = list(m.empty_inputs)
            report.detected = msgspec.to_builtins(m.detected)  # the JSON form the summary prints
        else:
            report.questions = m.rows or 0
    return report


class IngestSummary(Report, kw_only=True):
    """``corpus ingest --json``: :meth:`IngestReport.as_dict`."""

    out: str
    questions: int
    documents: int
    paragraphs: int
    rejected: dict[str, int]
    questions_by_dataset: dict[str, int]
    splits_read_as: dict[str, int] = {}
    empty_inputs: list[str]
    detected: list[dict[str, Any]]
    resumed: bool
