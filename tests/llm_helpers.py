"""Helpers for the LLM and triples tests: small documents stage directories from the real dataset samples."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class TitleTripleServer(ThreadingHTTPServer):
    """A small OpenAI-compatible server on 127.0.0.1: every chat completion is answered, after ``delay`` seconds,
    with one triple ``[title, relation, tail]`` naming the document's title (the prompt's first line), or with
    none for a title in ``empty`` (the empty-output guard counts those). ``titles`` lists what was asked."""

    daemon_threads = True

    def __init__(self, delay: float = 0.0, relation: str = "is a", tail: str = "document", hold_after: int | None = None):
        """``hold_after=N``: the requests after the first N wait until :meth:`release` (or the server closes), and
        ``holding`` is set once one waits: a test then signals a client whose next part is known to be in flight."""
        super().__init__(("127.0.0.1", 0), _TitleTripleHandler)
        self.delay, self.relation, self.tail = delay, relation, tail
        self.titles: list[str] = []
        self.empty: set[str] = set()
        self.lock = threading.Lock()
        self.hold_after = hold_after
        self.holding = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    @property
    def posts(self) -> int:
        return len(self.titles)

    def __enter__(self) -> "TitleTripleServer":
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.shutdown()
        self.server_close()


class _TitleTripleHandler(BaseHTTPRequestHandler):
    server: TitleTripleServer

    def log_message(self, *args) -> None:
        pass

    def _json(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except BrokenPipeError:  # the client was stopped while it waited (SIGTERM, scancel)
            pass

    def do_GET(self) -> None:
        self._json({"object": "list", "data": [{"id": "toy-model", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        title = body["messages"][-1]["content"].split("\n", 1)[0].removeprefix("Title: ")
        with self.server.lock:
            self.server.titles.append(title)
            held = self.server.hold_after is not None and len(self.server.titles) > self.server.hold_after
        if held:
            self.server.holding.set()
            self.server.released.wait()
        time.sleep(self.server.delay)
        triples = [] if title in self.server.empty else [[title, self.server.relation, self.server.tail]]
        choice = {"index": 0, "message": {"role": "assistant", "content": json.dumps({"triples": triples})}, "finish_reason": "stop"}
        self._json({"id": "c", "object": "chat.completion", "model": body["model"], "choices": [choice], "usage": {"prompt_tokens": 5, "completion_tokens": 5}})
