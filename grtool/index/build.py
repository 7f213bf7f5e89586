"""`grtool index build`: triples (or documents) → token sequences → an index directory.

The directory is written under a temporary name and renamed into place when complete, so a killed build
never leaves a half index that looks usable.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from grtool import __version__
from grtool.docid import DOCID_END, DOCID_START, normalize
from grtool.errors import GrtoolError, InputError
from grtool.index.base import FORMAT, META, TOKENIZER
from grtool.index.kinds import KINDS
from grtool.index.tokenizer import DocidTokenizer, load_tokenizer
from grtool.invocation import current_command
from grtool.log import log
from grtool.store.io import InputTable
from grtool.secrets import redact_argv
from grtool.store.stage import dumps, fingerprint, resolve_stage, sha256_file

SOURCES = ("docids", "documents")
TOKENIZE_BATCH = 50_000


def read_docids(path: str | Path) -> tuple[list[str], list[list[int]], list[str]]:
    """Distinct docids (sorted), the documents of each (as indices into the sorted doc ids), the doc ids."""
    table = InputTable.open(path, "triples")
    by_docid: dict[str, set[str]] = {}
    for part in range(table.num_parts):
        where = table.parts[part] or "<stdin>"
        row_no = 0
        for batch in table.iter_part(part, columns=["doc_id", "docid"]):
            for row in batch:
                row_no += 1
                docid, doc_id = row.get("docid"), row.get("doc_id")
                if not isinstance(docid, str) or not docid:
                    raise InputError(f"{where}, row {row_no}: empty docid")
                if not (docid.startswith(DOCID_START) and docid.endswith(DOCID_END)) or len(docid) <= len(DOCID_START) + len(DOCID_END):
                    raise InputError(f"{where}, row {row_no}: docid {docid[:80]!r} is not '{DOCID_START}head, relation, tail{DOCID_END}'")
                if not isinstance(doc_id, str) or not doc_id:
                    raise InputError(f"{where}, row {row_no}: empty doc_id")
                by_docid.setdefault(docid, set()).add(doc_id)
    if not by_docid:
        raise InputError(f"{path}: no triples to index")
    # Spellings of one triple (by the docid key, grtool.docid.normalize) map to the documents of them all, as
    # the filters and recall count them; each spelling stays in the index as written.
    by_key: dict[str, set[str]] = {}
    for docid, docs in by_docid.items():
        by_key.setdefault(normalize(docid[len(DOCID_START) : len(docid) - len(DOCID_END)]), set()).update(docs)
    if len(by_key) < len(by_docid):
        for docid in by_docid:
            by_docid[docid] = by_key[normalize(docid[len(DOCID_START) : len(docid) - len(DOCID_END)])]
    doc_ids = sorted({d for docs in by_docid.values() for d in docs})
    doc_index = {d: i for i, d in enumerate(doc_ids)}
    docids = sorted(by_docid)
    return docids, [sorted(doc_index[d] for d in by_docid[s]) for s in docids], doc_ids


def read_documents(path: str | Path) -> tuple[list[str], list[list[int]], list[str]]:
    """Whole documents (title, newline, text) in doc_id order, one sequence each."""
    table = InputTable.open(path, "documents")
    rows = {}
    for row in table.iter_rows(columns=["doc_id", "title", "text"]):
        if not row.get("doc_id"):
            raise InputError(f"{table.source}: a document without doc_id")
        rows[row["doc_id"]] = f"{row.get('title') or ''}\n{row.get('text') or ''}".strip()
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


def write_index(
    out: Path,
    *,
    kind: str,
    flat: np.ndarray,
    lengths: np.ndarray,
    seq_docs: list[list[int]],
    doc_ids: list[str],
    tokenizer: DocidTokenizer,
    source: str,
    docids: list[str] | None = None,
    inputs: list[dict[str, Any]] | None = None,
    params: dict[str, Any] | None = None,
    overwrite: bool = False,
    command: list[str] | None = None,
) -> dict[str, Any]:
    """Write a complete index directory atomically; returns its metadata."""
    if kind not in KINDS:
        raise GrtoolError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if out.exists() and not overwrite:
        raise GrtoolError(f"{out}: exists; use --overwrite to replace it")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    started = time.perf_counter()
    try:
        (tmp / TOKENIZER).write_text(tokenizer.to_json())
        (tmp / "doc_ids.txt").write_text("".join(f"{d}\n" for d in doc_ids))
        offsets = np.zeros(len(seq_docs) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(d) for d in seq_docs])
        np.save(tmp / "seq_docs_offsets.npy", offsets)
        np.save(tmp / "seq_docs.npy", np.fromiter((d for ds in seq_docs for d in ds), dtype=np.uint32, count=int(offsets[-1])))
        np.save(tmp / "seq_lengths.npy", lengths.astype(np.uint32))
        if docids is not None:
            pq.write_table(pa.table({"docid": docids}), tmp / "docids.parquet", compression="zstd")
        kind_params = KINDS[kind].write(tmp, flat, lengths, **(params or {}))
        seconds = time.perf_counter() - started
        files = {f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in sorted(tmp.iterdir()) if f.is_file()}
        search_bytes = sum(v["bytes"] for k, v in files.items() if k.startswith(("fm_", "trie_", "oracle_")))
        tokens = int(flat.size)
        meta = {
            "format": FORMAT,
            "kind": kind,
            "source": source,
            "grtool_version": __version__,
            "command": redact_argv(command if command is not None else current_command()),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "build_seconds": round(seconds, 3),
            "inputs": inputs or [],
            "tokenizer": {
                "spec": tokenizer.spec,
                "sha256": tokenizer.fingerprint(),
                "vocab_size": tokenizer.vocab_size,
                "docid_start_id": tokenizer.start_id,
                "docid_end_id": tokenizer.end_id,
                "added_markers": tokenizer.added_markers,
            },
            "params": {**(params or {}), **kind_params},
            "sizes": {
                "sequences": len(lengths),
                "documents": len(doc_ids),
                "tokens": tokens,
                "max_sequence_tokens": int(lengths.max()) if len(lengths) else 0,
                "collisions": sum(1 for d in seq_docs if len(d) > 1),
                "index_bytes": search_bytes,
                "bits_per_token": round(8 * search_bytes / max(tokens, 1), 3),
                "total_bytes": sum(v["bytes"] for v in files.values()),
            },
            "files": files,
        }
        (tmp / META).write_bytes(dumps(meta))
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def build_index(
    input_path: str | Path,
    out: str | Path,
    *,
    tokenizer: str,
    kind: str = "fm",
    source: str = "docids",
    sample_rate: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    if source not in SOURCES:
        raise GrtoolError(f"--source must be one of {', '.join(SOURCES)}, got {source!r}")
    tok = load_tokenizer(tokenizer)
    log.info("reading %s", source)
    texts, seq_docs, doc_ids = read_docids(input_path) if source == "docids" else read_documents(input_path)
    log.info("tokenizing %d %s with %s", len(texts), source, tokenizer)
    flat, lengths = tokenize(tok, texts)
    log.info("building %s index over %d tokens", kind, flat.size)
    params = {"sample_rate": sample_rate} if kind == "fm" and sample_rate else {}
    return write_index(
        Path(out), kind=kind, flat=flat, lengths=lengths, seq_docs=seq_docs, doc_ids=doc_ids, tokenizer=tok,
        source=source, docids=texts if source == "docids" else None,
        inputs=[fingerprint(resolve_stage(input_path, "triples" if source == "docids" else "documents"))]
        if str(input_path) != "-"
        else [{"path": "-", "kind": "stdin"}],
        params=params, overwrite=overwrite,
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
        "command": m["command"],
        "tokenizer": m["tokenizer"],
        "params": m["params"],
        **m["sizes"],
    }


def dump_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)
