"""What `grtool show` is pointed at, and the corpus and triples behind it.

A stage directory's ``_manifest.json`` names its inputs; an exported file's ``<file>.grtool.json`` names its own.
The corpus (the questions stage and its sibling documents stage) and the triples stage are found by following
those inputs back a few steps (filtered → chains → corpus and triples; responses → index → triples); ``--corpus``
and ``--triples`` replace what is found.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grtool.errors import InputError
from grtool.records import DamagedRecord
from grtool.store.schemas import schema_of
from grtool.store.records import InputRecord, Manifest, is_stage_dir, load_manifest, resolve_stage
from grtool.userinput import require_input

if TYPE_CHECKING:
    from grtool.vocab.provenance import ExportRecord

# The stage tables whose rows hold docids, shown with a verdict for each; a chains stage written by `filters apply`
# is shown as "filtered". Every other declared table is shown by its view (grtool.store.schemas.TableView).
DOCID_TABLES = ("chains", "responses", "triples")
DOCID_KINDS = ("chains", "filtered", "responses", "triples", "export")
FOLLOW_DEPTH = 4  # inputs followed back from the shown stage (filtered → chains → corpus is 2)


@dataclass
class Source:
    path: Path
    kind: str  # chains | filtered | responses | triples | export, or the name of another table (shown by its view)
    manifest: Manifest | ExportRecord  # the stage's manifest or the export's sidecar record
    questions: Path | None = None  # the questions stage
    documents: Path | None = None  # the documents stage
    triples: Path | None = None  # the triples stage
    notes: list[str] = field(default_factory=list)  # what could not be found (shown, never fatal)

    @property
    def by_question(self) -> bool:
        """Whether its rows belong to questions: every kind with docids, and a table with a ``qid`` column."""
        return self.kind in DOCID_KINDS or "qid" in schema_of(self.kind).names

    @property
    def command(self) -> str:
        return " ".join(self.manifest.command or [])


def open_source(path: Path, corpus: Path | None = None, triples: Path | None = None) -> Source:
    """The thing at ``path`` with its corpus and triples (given ones first, else followed from its records)."""
    require_input(path)
    if path.is_file():
        source = _export_source(path)
    else:
        source = _stage_source(path)
    if source.kind == "questions":  # a corpus's questions, with their gold documents (--corpus: the documents)
        source.questions = source.path
        source.documents = resolve_stage(corpus, "documents", finished=False) if corpus is not None else _documents_beside(source.path)
    elif corpus is not None:
        source.questions = resolve_stage(corpus, "questions", finished=False)
        source.documents = _documents_beside(source.questions)
    if triples is not None:
        source.triples = resolve_stage(triples, "triples", finished=False)
    if source.kind == "triples" and source.triples is None:
        source.triples = source.path
    if source.kind == "documents" and source.documents is None:
        source.documents = source.path
    found = _follow(_input_paths(source.manifest.inputs), FOLLOW_DEPTH)
    if source.questions is None and found.get("questions"):
        source.questions = found["questions"]
        source.documents = _documents_beside(source.questions)
    if source.documents is None and found.get("documents"):
        source.documents = found["documents"]
    if source.triples is None and found.get("triples"):
        source.triples = found["triples"]
    needed = (("questions", source.questions, "--corpus"), ("documents", source.documents, "--corpus"), ("triples", source.triples, "--triples"))
    if source.kind not in DOCID_KINDS:  # a table shown by its view: its rows' questions, when they have any
        needed = needed[:2] if source.by_question else ()
    for what, got, flag in needed:
        if got is None:
            source.notes.append(f"no {what} stage found from {path}'s record; give {flag}")
    return source


def documents_of(path: Path, corpus: Path | None = None) -> Path | None:
    """The documents stage behind an artefact (an index, a stage): ``corpus``'s when given, else followed from its
    records; None when none is found."""
    if corpus is not None:
        return resolve_stage(corpus, "documents", finished=False)
    return _follow([path], FOLLOW_DEPTH + 1).get("documents")


def _stage_source(path: Path) -> Source:
    if not is_stage_dir(path):
        for table in (*DOCID_TABLES, "questions", "documents"):  # a run directory holding one, e.g. out/demo/triples, a corpus
            if is_stage_dir(path / table):
                return _stage_source(path / table)
        from grtool.audit.validate import not_shown

        raise not_shown(path)
    manifest = load_manifest(path)
    table = manifest.table
    kind = "filtered" if table == "chains" and "filters" in (manifest.command or [])[:4] else table
    return Source(path, kind, manifest)


def _export_source(path: Path) -> Source:
    from grtool.vocab.provenance import decode_sidecar, is_sidecar, sidecar_path

    if is_sidecar(path):
        path = path.with_name(path.name[: -len(".grtool.json")])
    record = sidecar_path(path)
    if not record.is_file():
        raise InputError(f"{path}: not an exported file of grtool (no {record.name} beside it)")
    try:
        meta = decode_sidecar(record)
    except ValueError as e:  # also JSON that does not parse
        raise InputError(f"{record}: {e}") from None
    return Source(path, "export", meta)


def _input_paths(inputs: list[InputRecord] | list[dict[str, Any]]) -> list[Path]:
    """The input paths a record names: a manifest's are declared, an index's and an export's plain JSON objects."""
    paths = []
    for entry in inputs:
        p = entry.path if isinstance(entry, InputRecord) else entry.get("path") if isinstance(entry, dict) else None
        if isinstance(p, str) and p not in ("", "-"):
            paths.append(Path(p))
    return paths


def _follow(paths: list[Path], depth: int) -> dict[str, Path]:
    """The first questions, documents and triples stages among ``paths`` and their own inputs, nearest first."""
    found: dict[str, Path] = {}
    seen: set[Path] = set()
    level = paths
    for _ in range(depth):
        nxt: list[Path] = []
        for p in level:
            if p in seen or not p.exists():
                continue
            seen.add(p)
            for table, stage, inputs in _describe(p):
                if table in ("questions", "documents", "triples"):
                    found.setdefault(table, stage)
                nxt.extend(inputs)
        if len(found) == 3:
            break
        level = nxt
    return found


def _describe(p: Path) -> Iterator[tuple[str | None, Path, list[Path]]]:
    """(table, stage, its inputs) for a stage, the stages of a run directory, or an index directory."""
    if is_stage_dir(p):
        try:
            manifest = load_manifest(p)
        except (InputError, DamagedRecord):
            return
        yield manifest.table, p, _input_paths(manifest.inputs)
        return
    if (p / "index.json").is_file():  # an index: index.json names the triples it was built from
        from grtool.index.record import read_index_record

        try:
            record = read_index_record(p)  # a damaged record: one line naming its field (DamagedRecord)
        except OSError:
            return
        yield None, p, _input_paths(record.inputs)
        return
    for table in ("questions", "documents", "triples"):  # a corpus run directory (questions/, documents/)
        if is_stage_dir(p / table):
            yield table, p / table, []


def _documents_beside(questions: Path) -> Path | None:
    """The documents stage of the corpus whose questions stage is given (its sibling)."""
    sibling = questions.parent / "documents"
    return sibling if is_stage_dir(sibling) else None
