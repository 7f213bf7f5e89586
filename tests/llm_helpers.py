"""Helpers for the LLM and triples tests: small documents stage directories from the real dataset samples."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

from grtool.store.schemas import DOCUMENTS
from grtool.store.stage import StageSpec, StageWriter


def hotpot_paragraphs(shared_data: Path, n: int) -> list[dict]:
    """The first ``n`` distinct context paragraphs of the HotpotQA dev sample, as documents rows."""
    records = json.loads((shared_data / "hotpotqa" / "hotpot_dev_distractor_v1.sample.json").read_text())
    rows: dict[str, dict] = {}
    for rec in records:
        for title, sentences in rec["context"]:
            text = "".join(sentences).strip()
            doc_id = hashlib.blake2b(f"{title}\n{text}".encode(), digest_size=8).hexdigest()
            rows.setdefault(doc_id, {"doc_id": doc_id, "title": title, "text": text, "datasets": ["hotpotqa"]})
            if len(rows) == n:
                return list(rows.values())
    return list(rows.values())


def write_documents(path: Path, rows: list[dict], num_parts: int = 1) -> Path:
    """A documents stage directory with ``rows`` split over ``num_parts`` parts (what `corpus ingest` writes)."""
    stage = StageWriter(path, StageSpec("documents", DOCUMENTS, {"test": True}, []), overwrite=True, num_parts=num_parts)
    for i in range(num_parts):
        part = rows[i * len(rows) // num_parts : (i + 1) * len(rows) // num_parts]
        with stage.shard(i) as shard:
            shard.count_in(len(part))
            shard.write_rows(part)
    stage.finish()
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def all_text_under(path: Path) -> str:
    """Every byte under a directory, decoded leniently: for asserting that a secret appears nowhere."""
    return "\n".join(f.read_bytes().decode("utf-8", "replace") for f in sorted(Path(path).rglob("*")) if f.is_file())
