"""`grtool index build`: triples (or documents) → token sequences → an index directory.

The directory is written under a temporary name and renamed into place when complete, so a killed build
never leaves a half index that looks usable.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import msgspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from grtool import __version__, signals
from grtool.docid import DOCID_END, DOCID_START, SPECIAL, docid_text_problem, normalize, triple_problem
from grtool.errors import GrtoolError, InputError
from grtool.index.base import FORMAT, META, TOKENIZER
from grtool.index.kinds import KINDS, SCRATCH_BYTES
from grtool.store.locks import pid_alive
from grtool.index.record import IndexRecord
from grtool.index.stream import DOCIDS_ROW_GROUP, SyntaxReport, flip_from_parts, inner_text
from grtool.index.tokenizer import DocidTokenizer, check_tokenizer, load_tokenizer
from grtool.invocation import current_command
from grtool.log import log
from grtool.store.io import InputTable
from grtool.secrets import redact_argv
from grtool.store.outputs import INDEX, input_stage, refuse_linked_directory, refuse_output_among_inputs
from grtool.store.paths import empty_directory
from grtool.store.partloop import DirectoryOutput, one_part
from grtool.records import Report, decode_record, refuse_undeclared
from grtool.store.records import now
from grtool.store.records import dumps, resolve_stage, sha256_file
from grtool.store.fingerprints import file_hash, fingerprint

SOURCES = ("docids", "documents")
# What a stopped build (SIGTERM, Ctrl-C) leaves: nothing. An index is built whole, so a new run starts over.
STOPPED_NOTE = "the partial index and its scratch files were removed (an index is built whole)"
STOPPED_HINT = "run the same command again to build it"
TOKENIZE_BATCH = 50_000


@dataclass
class DocidRows:
    """What the triples stage holds for a docid index: each distinct docid string → its documents; with flips each
    docid's tail-first spelling rendered from its stored parts (None: the text is not its parts' rendering)."""

    by_docid: dict[str, set[str]]
    flip_of: dict[str, str | None]
    skipped: SyntaxReport  # not indexed: a part the docid syntax rejects (grtool.docid.triple_problem)


def read_docid_rows(path: str | Path, flips: bool = False) -> DocidRows:
    """Each distinct docid string → the documents holding it (read as written, markers checked).

    A docid the docid syntax rejects (stages written before `triples extract` checked parts) is skipped, counted
    by reason, the first one named: it, or its tail-first spelling, could never be written and read back as one
    docid. One scan of the text decides (:func:`grtool.docid.docid_text_problem`, the same with or without flips);
    with flips the reason names the stored part. ``flips``: the tail-first spelling of each docid, rendered from
    the stored head, relation, tail when the text is their rendering (else none: ``flips_unsplit``); the text is
    never split (a head may hold commas, ``Paris, Texas``)."""
    table = InputTable.open(path, "triples")
    by_docid: dict[str, set[str]] = {}
    flip_of: dict[str, str | None] = {}
    skipped_docids: set[str] = set()
    skipped = SyntaxReport()
    columns = ["doc_id", "head", "relation", "tail", "docid"] if flips else ["doc_id", "docid"]
    for part in range(table.num_parts):
        where = table.parts[part] or "<stdin>"
        row_no = 0
        for batch in table.iter_part(part, columns=columns):
            for row in batch:
                row_no += 1
                docid, doc_id = row.get("docid"), row.get("doc_id")
                if not isinstance(docid, str) or not docid:
                    raise InputError(f"{where}, row {row_no}: empty docid")
                if not (docid.startswith(DOCID_START) and docid.endswith(DOCID_END)) or len(docid) <= len(DOCID_START) + len(DOCID_END):
                    raise InputError(f"{where}, row {row_no}: docid {docid[:80]!r} is not '{DOCID_START}head, relation, tail{DOCID_END}'")
                if not isinstance(doc_id, str) or not doc_id:
                    raise InputError(f"{where}, row {row_no}: empty doc_id")
                docs = by_docid.get(docid)
                if docs is not None:
                    docs.add(doc_id)
                    continue
                if docid in skipped_docids:
                    continue
                problem = docid_text_problem(inner_text(docid))
                if problem is not None:
                    parts = (row.get("head"), row.get("relation"), row.get("tail"))
                    if flips and all(isinstance(p, str) for p in parts) and docid == SPECIAL.render(*parts):  # type: ignore[arg-type]
                        problem = triple_problem(parts) or problem  # type: ignore[arg-type]  # name the part
                    skipped.add(where, row_no, docid, problem)
                    skipped_docids.add(docid)
                    continue
                by_docid[docid] = {doc_id}
                if flips:
                    flip_of[docid] = flip_from_parts(docid, (row.get("head"), row.get("relation"), row.get("tail")))
    if not by_docid:
        raise InputError(f"{path}: no triples to index" + (f" ({skipped.count} docids skipped: {skipped.summary()})" if skipped.count else ""))
    return DocidRows(by_docid, flip_of, skipped)


@dataclass
class Docids:
    """The sequences of a docid index: docid strings (sorted), the documents of each (indices into the sorted
    doc ids), the doc ids, and with flips which strings are a flipped orientation and what flipping skipped."""

    docids: list[str]
    seq_docs: list[list[int]]
    doc_ids: list[str]
    flipped: list[bool] | None = None
    unsplit: int = 0  # forward docids whose text is not the rendering of their stored parts (indexed forward only)
    symmetric: int = 0  # flipped spellings equal to a forward docid (merged into it, no new sequence)
    skipped: SyntaxReport = field(default_factory=SyntaxReport)  # docids the docid syntax rejects: not indexed


def read_docids(path: str | Path, flips: bool = False) -> Docids:
    """Distinct docids (and with ``flips`` their tail-first spellings, from the stored parts) and their documents."""
    rows = read_docid_rows(path, flips=flips)
    by_docid = rows.by_docid
    # Spellings of one triple (by the docid key, grtool.docid.normalize) map to the documents of them all, as
    # the filters and recall count them; each spelling stays in the index as written.
    # A flipped spelling joins this map by its key too, so a symmetric pair (A r B, B r A) maps both
    # orientations to the documents of both triples.
    by_key: dict[str, set[str]] = {}
    for docid, docs in by_docid.items():
        by_key.setdefault(normalize(inner_text(docid)), set()).update(docs)
    flipped: dict[str, None] = {}
    unsplit = symmetric = 0
    if flips:
        forward_docs = {k: set(v) for k, v in by_key.items()}  # before flips add to it: order-independent
        for docid, f in rows.flip_of.items():
            if f is None:
                unsplit += 1
                continue
            by_key.setdefault(normalize(inner_text(f)), set()).update(forward_docs[normalize(inner_text(docid))])
            if f in by_docid:
                symmetric += 1
            else:
                flipped[f] = None
    texts = {**{d: False for d in by_docid}, **{f: True for f in flipped}}
    doc_ids = sorted({d for docs in by_key.values() for d in docs})
    doc_index = {d: i for i, d in enumerate(doc_ids)}
    docids = sorted(texts)
    seq_docs = [sorted(doc_index[d] for d in by_key[normalize(inner_text(s))]) for s in docids]
    flags = [texts[s] for s in docids] if flips else None
    return Docids(docids, seq_docs, doc_ids, flags, unsplit, symmetric, rows.skipped)


def read_documents(path: str | Path) -> tuple[list[str], list[list[int]], list[str]]:
    """Whole documents in doc_id order, one sequence each, rendered as `export gmr` renders them (``title: text``):
    `retrieve --mode gmr` generates exactly these strings."""
    from grtool.vocab.gmr import render_document

    table = InputTable.open(path, "documents")
    rows = {}
    for row in table.iter_rows(columns=["doc_id", "title", "text"]):
        if not row.get("doc_id"):
            raise InputError(f"{table.source}: a document without doc_id")
        rows[row["doc_id"]] = render_document(row.get("title"), row.get("text"))
    if not rows:
        raise InputError(f"{path}: no documents to index")
    doc_ids = sorted(rows)
    return [rows[d] for d in doc_ids], [[i] for i in range(len(doc_ids))], doc_ids


def tokenize(tok: DocidTokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All texts' token ids concatenated, and the length of each."""
    lengths = np.zeros(len(texts), dtype=np.int64)
    chunks: list[np.ndarray] = []
    for lo in range(0, len(texts), TOKENIZE_BATCH):
        batch = tok.encode_batch(texts[lo : lo + TOKENIZE_BATCH])
        lengths[lo : lo + len(batch)] = [len(ids) for ids in batch]
        chunks.append(np.fromiter((t for ids in batch for t in ids), dtype=np.int64, count=int(lengths[lo : lo + len(batch)].sum())))
    flat = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    if (lengths == 0).any():
        raise InputError(f"sequence {int(np.flatnonzero(lengths == 0)[0])} tokenizes to nothing")
    return flat, lengths


def write_whole_index(out: Path, *, overwrite: bool = False, **given: Any) -> dict[str, Any]:
    """:func:`write_index` as a build of its own, one part: ``out`` claimed, the index written in a temporary
    directory beside it and installed; ``given``: the rest of its parameters."""
    return one_part([index_output(out, overwrite=overwrite)], lambda part: write_index(out, tmp=part.shard.path, **given), overwrite=overwrite)


def write_index(
    out: Path,
    *,
    kind: str,
    flat: np.ndarray,
    lengths: np.ndarray,
    seq_docs: list[list[int]],
    doc_ids: list[str],
    tokenizer: "DocidTokenizer | TokenizerRecord",
    source: str,
    docids: list[str] | None = None,
    inputs: list[dict[str, Any]] | None = None,
    params: dict[str, Any] | None = None,
    command: list[str] | None = None,
    seq_flipped: list[bool] | None = None,
    flip_counts: dict[str, int] | None = None,
    tmp: Path,
    started: float | None = None,
    documents: int | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Write a complete index directory atomically; returns its metadata. ``seq_flipped`` (index built with
    flips): per sequence whether it is a flipped orientation; ``flip_counts`` (what reading the docids skipped,
    flagged or could not flip) go to ``sizes``. ``seq_docs``: a list per sequence, or the CSR arrays (offsets,
    documents). ``tmp``: the temporary directory of the build's part (:func:`index_output`; :func:`write_whole_index`
    claims, runs and installs a build of its own), holding what the caller wrote already (the docid
    tables, :func:`write_docid_tables`; then ``doc_ids`` and ``docids`` are None) and files named ``.scratch*``
    (removed before the listing); ``flat`` may be a memory map of such a file (the build gives its disk back as
    it reads it). ``timings``: the seconds the caller spent before (reading, tokenizing), recorded beside the
    index build's own under ``build``."""
    if kind not in KINDS:
        raise GrtoolError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    started = time.perf_counter() if started is None else started
    (tmp / TOKENIZER).write_text(tokenizer.to_json())
    if doc_ids is not None:
        write_docid_tables(tmp, doc_ids=doc_ids, seq_docs=seq_docs, docids=docids, seq_flipped=seq_flipped)
    np.save(tmp / "seq_lengths.npy", lengths.astype(np.uint32))
    flip_sizes: dict[str, Any] = {}
    if seq_flipped is not None:
        flags = np.asarray(seq_flipped, dtype=np.uint8)
        np.save(tmp / "seq_flipped.npy", flags)
        flipped_tokens = int(lengths[flags.astype(bool)].sum())
        flip_sizes = {
            "flipped_sequences": int(flags.sum()),
            "flipped_tokens": flipped_tokens,
            # the search structures grow with the tokens, so this is also the share of index bytes
            "flips_token_share": round(flipped_tokens / max(int(flat.size), 1), 4),
        }
    offsets = np.load(tmp / "seq_docs_offsets.npy", mmap_mode="r")
    collisions = int((np.diff(offsets) > 1).sum())
    del offsets
    core_started = time.perf_counter()
    scratch_file = isinstance(flat, np.memmap) and flat.filename is not None and Path(flat.filename).parent == tmp and Path(flat.filename).name.startswith(".scratch")
    kind_params = KINDS[kind].write(tmp, flat, lengths, **(params or {}), consume=scratch_file)
    core_seconds = time.perf_counter() - core_started
    scratch_bytes = kind_params.pop(SCRATCH_BYTES, None)
    for f in tmp.glob(".scratch*"):  # the token file the build read
        f.unlink()
    seconds = time.perf_counter() - started
    # sha256 for `validate` and older readers; blake3 is what opening the index verifies (fast, multithreaded)
    files = {f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f), "blake3": file_hash(f)} for f in sorted(tmp.iterdir()) if f.is_file()}
    search_bytes = sum(v["bytes"] for k, v in files.items() if k.startswith(("fm_", "trie_", "oracle_")))
    tokens = int(flat.size)
    meta = {
        "format": FORMAT,
        "kind": kind,
        "source": source,
        "grtool_version": __version__,
        "command": redact_argv(command if command is not None else current_command()),
        "created": now(),
        "build_seconds": round(seconds, 3),
        # where a build's time goes (the FM-index build alone: core_seconds), and its peak of scratch disk
        "build": {
            **{k: round(v, 3) for k, v in (timings or {}).items()},
            "core_seconds": round(core_seconds, 3),
            **({"scratch_bytes": int(scratch_bytes)} if scratch_bytes is not None else {}),
        },
        "inputs": inputs or [],
        "tokenizer": {
            "spec": tokenizer.spec,
            "sha256": tokenizer.fingerprint(),
            "vocab_size": tokenizer.vocab_size,
            "docid_start_id": tokenizer.start_id,
            "docid_end_id": tokenizer.end_id,
            "added_markers": tokenizer.added_markers,
            "source": tokenizer.source,  # what an identical re-run compares without loading the tokenizer
        },
        "params": {**(params or {}), **kind_params, "flips": seq_flipped is not None},
        "sizes": {
            "sequences": len(lengths),
            "documents": len(doc_ids) if doc_ids is not None else documents,
            "tokens": tokens,
            "max_sequence_tokens": int(lengths.max()) if len(lengths) else 0,
            "collisions": collisions,
            "index_bytes": search_bytes,
            "bits_per_token": round(8 * search_bytes / max(tokens, 1), 3),
            "total_bytes": sum(v["bytes"] for v in files.values()),
            **flip_sizes,
            **(flip_counts or {}),
        },
        "files": files,
    }
    data = dumps(meta)
    # never install a record its readers refuse: a writer's bug stops here, naming the field, not at every open
    decoded = decode_record(data, IndexRecord, source=out / META, what="index record about to be written")
    refuse_undeclared(meta, decoded, source=out / META, what="index record about to be written")
    (tmp / META).write_bytes(data)  # the part's end installs it (the record last)
    return meta


def temp_dir(out: Path) -> Path:
    """The build's temporary directory beside ``out`` (``.<out>.<pid>.tmp``), new and empty; earlier builds'
    left behind by a process that is gone are removed first."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    remove_stale_builds(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def write_docid_tables(tmp: Path, *, doc_ids: Any, seq_docs: Any, docids: Any = None, seq_flipped: Any = None) -> None:
    """doc_ids.txt, the CSR map sequence → documents and docids.parquet (``docids``: the strings in sequence
    order, a list or an Arrow string array). ``seq_docs``: a list of document indices per sequence, or the CSR
    arrays (offsets, documents) themselves."""
    with open(tmp / "doc_ids.txt", "w") as f:
        for lo in range(0, len(doc_ids), 65_536):
            f.write("".join(f"{d}\n" for d in doc_ids[lo : lo + 65_536]))
    if isinstance(seq_docs, tuple):
        offsets, flat_docs = seq_docs
    else:
        offsets = np.zeros(len(seq_docs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(d) for d in seq_docs])
        flat_docs = np.fromiter((d for ds in seq_docs for d in ds), dtype=np.uint32, count=int(offsets[-1]))
    np.save(tmp / "seq_docs_offsets.npy", np.asarray(offsets, dtype=np.int64))
    np.save(tmp / "seq_docs.npy", np.asarray(flat_docs, dtype=np.uint32))
    if docids is not None:
        column = docids if isinstance(docids, pa.Array) else pa.array(docids, pa.string())
        columns = {"docid": column} if seq_flipped is None else {"docid": column, "flipped": pa.array(np.asarray(seq_flipped, dtype=bool))}
        pq.write_table(pa.table(columns), tmp / "docids.parquet", compression="zstd", row_group_size=DOCIDS_ROW_GROUP)


def index_output(out: Path, *, inputs: list[Path | str | None] = (), holders: list[Path | str | None] = (), overwrite: bool = False) -> DirectoryOutput:
    """``--out`` checked before anything is read or written (never an input; an existing one only with
    --overwrite, which replaces only an index), as the build's one output: its part loop claims and locks it (a
    second build into the same directory is refused, naming this one), builds in :func:`temp_dir` and installs."""
    if str(out) == "-":  # '-' is standard output elsewhere; never a directory named '-'
        raise InputError("--out -: an index is a directory of files and cannot be written to standard output; name a directory")
    refuse_output_among_inputs(out, inputs, holders)
    if out.exists() and not overwrite and not empty_directory(out):
        raise GrtoolError(f"{out}: exists; use --overwrite to replace it")
    return DirectoryOutput(out, INDEX, temp_dir, inputs=inputs, holders=holders)


def stale_builds(out: Path) -> list[Path]:
    """Temporary directories of earlier builds of ``out`` whose process is gone (``.<out>.<pid>.tmp``, with the
    FM build's scratch inside): a killed build leaves them (validate names them, the next build removes them)."""
    if not out.parent.is_dir():
        return []
    found = []
    for d in out.parent.glob(f".{glob.escape(out.name)}.*.tmp"):
        pid = d.name[len(out.name) + 2 : -len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)) and d.is_dir() and not d.is_symlink() and d.stat().st_uid == os.getuid():
            found.append(d)
    return sorted(found)


def remove_stale_builds(out: Path) -> None:
    """Remove :func:`stale_builds` of ``out`` (before a build of it starts)."""
    for d in stale_builds(out):
        log.info("removing %s, left by an interrupted build", d)
        shutil.rmtree(d, ignore_errors=True)


def build_index(
    input_path: str | Path,
    out: str | Path,
    *,
    tokenizer: str,
    kind: str = "fm",
    source: str = "docids",
    sample_rate: int | None = None,
    overwrite: bool = False,
    flips: bool = False,
    memory_limit: str | int | None = None,
) -> dict[str, Any]:
    """Build the index; returns its metadata (index.json). ``flips``: index each docid's tail-first spelling too
    (the chains teach it; filters and recall credit it). ``memory_limit`` (``8G``): the FM build sorts in buckets
    that keep it under the limit, and is refused before it starts when even its fixed part (the packed text, a
    rank per docid) does not fit.

    Without ``overwrite``, an index already at ``out`` built from the same input with the same tokenizer and
    parameters is kept as it is (the metadata returned has ``up_to_date``: True); one built otherwise is an error
    naming what differs."""
    check_build_options(kind=kind, source=source, flips=flips, memory_limit=memory_limit)
    table = "triples" if source == "docids" else "documents"
    if not overwrite:
        kept = existing_build(Path(out), input_path, table, tokenizer=tokenizer, kind=kind, source=source, sample_rate=sample_rate, flips=flips)
        if kept is not None:
            remove_stale_builds(Path(out))  # a killed build's temporary directory, as a build would remove it
            return {**kept, "up_to_date": True}
    if source == "docids":  # loaded once, when the docids are read (a 128K vocabulary is ~150 MB while it loads)
        check_tokenizer(tokenizer)
        tok: list[DocidTokenizer] = []
    else:  # the documents are read whole anyway: loaded now, before anything is read
        tok = [load_tokenizer(tokenizer)]
    # SIGTERM/SIGINT unwind through the claim too (its lock file beside --out goes) before the process ends
    output = index_output(Path(out), inputs=[input_stage(input_path, table)], holders=[input_path], overwrite=overwrite)
    with signals.handled(), signals.noted(STOPPED_NOTE, STOPPED_HINT):
        build = functools.partial(_build, input_path, Path(out), tok, tokenizer=tokenizer, kind=kind, source=source, sample_rate=sample_rate, flips=flips, memory_limit=memory_limit)
        return one_part([output], lambda part: build(part.shard.path), overwrite=overwrite)


def check_build_options(*, kind: str, source: str, flips: bool, memory_limit: str | int | None) -> None:
    """The options of a build, checked before anything is read or written."""
    from grtool.index.kinds import parse_bytes

    if source not in SOURCES:
        raise GrtoolError(f"--source must be one of {', '.join(SOURCES)}, got {source!r}")
    if flips and source != "docids":
        raise GrtoolError("--flips indexes the tail-first spelling of docids: it needs --source docids, not --source documents")
    if kind not in KINDS:
        raise GrtoolError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if memory_limit is not None and parse_bytes(memory_limit) <= 0:
        raise InputError(f"--memory-limit {memory_limit!r}: expected a size like 8G or 512M")


def existing_build(out: Path, input_path: str | Path, table: str, *, tokenizer: str, kind: str, source: str, sample_rate: int | None, flips: bool) -> dict[str, Any] | None:
    """The metadata of the index at ``out`` when an identical build made it (the same input fingerprint,
    tokenizer and parameters; ``--memory-limit`` only shapes the build, never the index): a re-run keeps it.
    None when ``out`` does not exist; an error naming what differs otherwise. Nothing is tokenized: the tokenizer
    is compared by the file it is read from, and loaded only when that does not settle it."""
    from grtool.index.base import Index

    refuse_output_among_inputs(out, [input_stage(input_path, table)], [input_path])
    if not out.exists() or empty_directory(out):  # an empty folder made for it holds nothing to replace
        return None
    if str(input_path) == "-" or not (out / META).is_file():
        refuse_linked_directory(out)  # said before "use --overwrite", which would not mend it
        raise GrtoolError(f"{out}: exists; use --overwrite to replace it" + (" (an index read from standard input cannot be compared with its input)" if str(input_path) == "-" else ""))
    try:
        index = Index.open(out)
    except InputError as e:
        raise InputError(f"{e} (use --overwrite to rebuild it)") from None
    meta = index.meta
    params = meta.get("params") or {}
    diffs = [
        f"{flag} ({before!r} before, {now!r} now)"
        for flag, before, now in (("--kind", meta.get("kind"), kind), ("--source", meta.get("source", "docids"), source),
                                  ("--flips", bool(params.get("flips")), flips))
        if before != now
    ]  # fmt: skip
    if kind == "fm" and meta.get("kind") == "fm":
        from grtool.index.kinds import DEFAULT_SAMPLE_RATE

        wanted = sample_rate or DEFAULT_SAMPLE_RATE
        if params.get("sample_rate") != wanted:
            diffs.append(f"--sample-rate ({params.get('sample_rate')!r} before, {wanted!r} now)")
    if meta.get("inputs") != [fingerprint(resolve_stage(input_path, table))]:
        diffs.append(f"input ({input_path}: path or contents changed)")
    if not diffs and not _same_tokenizer(meta.get("tokenizer") or {}, tokenizer):
        diffs.append(f"--tokenizer ({(meta.get('tokenizer') or {}).get('spec')!r} before, {tokenizer!r} now: another vocabulary)")
    if diffs:
        refuse_linked_directory(out)  # (an identical index behind a link is kept: a re-run through it does nothing)
        raise GrtoolError(f"{out}: exists, built with a different {', '.join(diffs)}; use --overwrite to replace it")
    return meta


def _same_tokenizer(recorded: dict[str, Any], spec: str) -> bool:
    """Whether ``spec`` is the tokenizer an index records: its file unchanged, else the loaded tokenizer's hash."""
    from grtool.index.tokenizer import source_fingerprint

    found = recorded.get("source")
    if found is not None and found == source_fingerprint(spec):
        return True
    return load_tokenizer(spec).fingerprint() == recorded.get("sha256")


def _build(
    input_path: str | Path,
    out: Path,
    held: list[DocidTokenizer],
    tmp: Path,
    *,
    tokenizer: str,
    kind: str,
    source: str,
    sample_rate: int | None,
    flips: bool,
    memory_limit: str | int | None,
) -> dict[str, Any]:
    """The index built in ``tmp``, the temporary directory of its part, which installs it at ``out``."""
    params: dict[str, Any] = {"sample_rate": sample_rate} if kind == "fm" and sample_rate else {}
    if kind == "fm" and memory_limit is not None:
        params["memory_limit"] = memory_limit
    table = "triples" if source == "docids" else "documents"
    inputs = [fingerprint(resolve_stage(input_path, table))] if str(input_path) != "-" else [{"path": "-", "kind": "stdin"}]
    log.info("reading %s", source)
    if source == "documents":
        tok = held.pop()
        texts, seq_docs, doc_ids = read_documents(input_path)
        log.info("tokenizing %d %s with %s", len(texts), source, tokenizer)
        flat, lengths = tokenize(tok, texts)
        log.info("building %s index over %d tokens", kind, flat.size)
        return write_index(Path(out), kind=kind, flat=flat, lengths=lengths, seq_docs=seq_docs, doc_ids=doc_ids, tokenizer=tok, source=source,
                           inputs=inputs, params=params, tmp=tmp)  # fmt: skip
    return _build_docids(input_path, out, tmp, tokenizer=tokenizer, kind=kind, flips=flips, params=params, inputs=inputs)


@dataclass
class TokenizerRecord:
    """What an index records of its tokenizer (:func:`write_index` reads these), without the tokenizer itself."""

    json: str
    spec: str
    sha256: str
    vocab_size: int
    start_id: int
    end_id: int
    added_markers: bool
    source: dict[str, Any] | None

    @classmethod
    def of(cls, tok: DocidTokenizer) -> "TokenizerRecord":
        return cls(tok.to_json(), tok.spec, tok.fingerprint(), tok.vocab_size, tok.start_id, tok.end_id, tok.added_markers, tok.source)

    def to_json(self) -> str:
        return self.json

    def fingerprint(self) -> str:
        return self.sha256


TOKENS_FILE = ".scratch-tokens.u32"  # the token ids the build reads, in its temporary directory (removed before the listing)


def _build_docids(input_path: str | Path, out: Path, tmp: Path, *, tokenizer: str, kind: str, flips: bool, params: dict[str, Any], inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """The docid index, streamed (:mod:`grtool.index.stream`): columns instead of a Python object per docid, the
    token ids in a file on disk; the docid tables are written and their columns freed before the index is built."""
    from grtool.docid.lookup import release_build_memory, use_trimmable_arrow_pool
    from grtool.index.stream import read_sequences, tokenize_to_file

    # The tokenizer is loaded once, after the stage is read (--tokenizer was checked without loading it): not
    # held on top of the read's own peak.
    use_trimmable_arrow_pool()  # the read's decompressed batches, handed back between buckets
    release_build_memory()
    # tmp: the read's buckets and sorted runs go there (files named .scratch*), and docids.parquet
    read_started = time.perf_counter()
    seqs = read_sequences(input_path, flips=flips, workdir=tmp)
    timings = {"read_seconds": time.perf_counter() - read_started}
    release_build_memory()  # what the read freed, before the tokenizer is loaded again
    if seqs.skipped.count:
        log.warning("%d docids skipped, a part cannot live inside a docid (%s); the first: %s", seqs.skipped.count, seqs.skipped.summary(), seqs.skipped.first)
    if flips and seqs.unsplit:
        log.warning("%d docids are not the rendering of their own head, relation, tail: indexed forward only", seqs.unsplit)
    counts = {"docids_skipped": seqs.skipped.count}
    if flips:
        counts |= {"flips_unsplit": seqs.unsplit, "flips_symmetric": seqs.symmetric}
    log.info("tokenizing %d docids with %s", seqs.count, tokenizer)
    tokenize_started = time.perf_counter()
    tok = load_tokenizer(tokenizer)
    release_build_memory()  # what parsing its JSON freed (~100 MB for a 128K vocabulary), kept by malloc else
    record = TokenizerRecord.of(tok)
    flat, lengths = tokenize_to_file(tok, seqs, tmp / TOKENS_FILE)
    started = time.perf_counter()  # build_seconds: from here, as when the tokens were handed to write_index
    timings["tokenize_seconds"] = started - tokenize_started
    flags = seqs.flipped.astype(np.uint8) if flips else None
    documents = len(seqs.doc_ids)
    seqs.seq_file.unlink()
    write_docid_tables(tmp, doc_ids=seqs.doc_ids, seq_docs=(seqs.offsets, seqs.docs))  # docids.parquet: written by the read
    del seqs, tok  # the tokenizer (~50 MB for a 128K vocabulary): not held while the index is built
    release_build_memory()  # and the pages their allocators kept
    log.info("building %s index over %d tokens", kind, flat.size)
    return write_index(
        Path(out), kind=kind, flat=flat, lengths=lengths, seq_docs=None, doc_ids=None, tokenizer=record, source="docids",
        inputs=inputs, params=params, seq_flipped=flags, flip_counts=counts, tmp=tmp, started=started,
        documents=documents, timings=timings,
    )  # fmt: skip


def stats(index) -> dict[str, Any]:
    """What `grtool index stats` reports."""
    m = index.meta
    return {
        "path": str(index.path),
        "kind": m["kind"],
        "source": m["source"],
        "grtool_version": m["grtool_version"],
        "created": m["created"],
        "build_seconds": m["build_seconds"],
        "build": m.get("build", {}),  # indexes built before it hold none
        "command": m["command"],
        "tokenizer": m["tokenizer"],
        "params": m["params"],
        **m["sizes"],
        # indexes built before --flips existed hold none
        "flipped_sequences": m["sizes"].get("flipped_sequences", 0),
        "flips_token_share": m["sizes"].get("flips_token_share", 0.0),
        # each search array's bytes and share of the bits per token (where an index's size goes)
        "arrays": {
            name.removesuffix(".npy"): {"bytes": f["bytes"], "bits_per_token": round(8 * f["bytes"] / max(int(m["sizes"]["tokens"]), 1), 3)}
            for name, f in m.get("files", {}).items()
            if name.startswith(("fm_", "trie_", "oracle_"))
        },
    }


def dump_json(obj: Any) -> str:
    """JSON for --json: a non-finite number (a ratio over an empty index) is null, never the invalid NaN/Infinity."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY, default=_plain).decode()


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    if isinstance(value, (Path, tuple, set, frozenset)):
        return str(value) if isinstance(value, Path) else list(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


_Unset = msgspec.UnsetType


class IndexReport(Report, kw_only=True):
    """``index build --json`` and ``index stats --json``: :func:`stats` (its sizes as the index record holds them:
    one an older index lacks is left out), ``up_to_date`` (build) and ``coverage`` (stats ``--corpus``)."""

    path: str
    kind: str
    source: str
    grtool_version: str
    created: str
    build_seconds: float
    build: dict[str, Any]
    command: list[str] | str
    tokenizer: dict[str, Any]
    params: dict[str, Any]
    sequences: int
    tokens: int
    documents: int | None | _Unset = msgspec.UNSET
    max_sequence_tokens: int | _Unset = msgspec.UNSET
    collisions: int | _Unset = msgspec.UNSET
    index_bytes: int | _Unset = msgspec.UNSET
    bits_per_token: float | None | _Unset = msgspec.UNSET
    total_bytes: int | None | _Unset = msgspec.UNSET
    flipped_sequences: int
    flipped_tokens: int | _Unset = msgspec.UNSET
    flips_token_share: float | None
    docids_skipped: int | _Unset = msgspec.UNSET
    flips_unsplit: int | _Unset = msgspec.UNSET
    flips_symmetric: int | _Unset = msgspec.UNSET
    arrays: dict[str, dict[str, Any]]
    up_to_date: bool | _Unset = msgspec.UNSET
    coverage: dict[str, Any] | _Unset = msgspec.UNSET
