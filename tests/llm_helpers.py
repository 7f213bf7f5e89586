"""Helpers for the LLM and triples tests: small documents stage directories from the bundled example data, and
small OpenAI-compatible servers on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from conftest import EXAMPLES
from grtool.store.schemas import DOCUMENTS
from grtool.store.stage import StageSpec, StageWriter


def hotpot_paragraphs(n: int) -> list[dict]:
    """The first ``n`` distinct context paragraphs of the bundled HotpotQA dev example (at most 10), as documents rows."""
    records = json.loads((EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_text())
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


class AnswerServer(ThreadingHTTPServer):
    """An OpenAI-compatible server on 127.0.0.1 whose answers a test decides: ``answer(body)`` returns
    ``(status, payload)`` (a dict sent as JSON), raw ``bytes`` (sent with status 200 as they are: a damaged answer),
    or ``"trickle"``: headers, then one byte a second for ``trickle_seconds`` (never the whole body). GET /models
    lists ``model`` (with ``max_model_len`` when given), or sends ``models`` as they are, or trickles
    (``trickle_models``). Every request body is kept in ``posts``; the server runs from construction until
    :meth:`close` (or the end of a ``with`` block)."""

    daemon_threads = True
    request_queue_size = 128  # a client opens up to --concurrency connections at once

    def __init__(self, answer, *, model: str = "toy-model", models: bytes | None = None, max_model_len: int | None = None, trickle_models: bool = False, trickle_seconds: int = 30):
        super().__init__(("127.0.0.1", 0), _AnswerHandler)
        self.answer = answer
        self.model, self.models, self.max_model_len = model, models, max_model_len
        self.trickle_models, self.trickle_seconds = trickle_models, trickle_seconds
        self.lock = threading.Lock()
        self.posts: list[dict] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    def __enter__(self) -> "AnswerServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def chat_reply(body: dict, text: str, *, finish_reason: str = "stop", logprobs: dict | None = None, prompt_tokens: int = 100) -> tuple[int, dict]:
    """A 200 chat completion of ``text`` for the request ``body`` (an :class:`AnswerServer` answer)."""
    choice: dict = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    completion = len(text.split())
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
    return 200, {"id": "c", "object": "chat.completion", "model": body["model"], "choices": [choice], "usage": usage}


class _AnswerHandler(BaseHTTPRequestHandler):
    server: AnswerServer

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except BrokenPipeError:  # the client gave up (a timeout, a signal)
            pass

    def _trickle(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(self.server.trickle_seconds):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1)
        except OSError:  # the client gave up: what the test wants
            pass
        self.close_connection = True

    def do_GET(self) -> None:
        if self.server.trickle_models:
            return self._trickle()
        if self.server.models is not None:
            return self._send(200, self.server.models)
        model = {"id": self.server.model, "object": "model"}
        if self.server.max_model_len is not None:
            model["max_model_len"] = self.server.max_model_len
        self._send(200, json.dumps({"object": "list", "data": [model]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.posts.append(body)
        result = self.server.answer(body)
        if result == "trickle":
            return self._trickle()
        if isinstance(result, bytes):
            return self._send(200, result)
        status, payload = result
        self._send(status, json.dumps(payload).encode())


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


# (answer text, finish_reason, triples the parser must recover)
ANSWERS = [
    ('{"triples": [["A", "is a", "B"], ["A", "founded in", "1990"]]}', "stop", [("A", "is a", "B"), ("A", "founded in", "1990")]),
    ('[{"head": "C", "relation": "located in", "tail": "D"}]', "stop", [("C", "located in", "D")]),
    ("(E, born on, July 31, 2012)\n(E, plays for, F).", "stop", [("E", "born on", "July 31, 2012"), ("E", "plays for", "F")]),
    ("G | member of | H\nG | associated with | H", "stop", [("G", "member of", "H"), ("G", "associated with", "H")]),
    ("Here are the triples:\n1. I, directed, J\n2. I, released in, 2011\nHope this helps!", "stop", [("I", "directed", "J"), ("I", "released in", "2011")]),
    ("- K, part of, L\n- K, part of, L\n* \"M\", located in, 'N'.", "stop", [("K", "part of", "L"), ("M", "located in", "N")]),
    ('Sure.\n```json\n{"triples": [["O", "won", "P"]]}\n```\nAnything else?', "stop", [("O", "won", "P")]),
    ('{"triples": [["Q", "capital of", "R"], ["Q", "has population", "2,100,000"], ["Q", "has mayor", "S T', "length", [("Q", "capital of", "R"), ("Q", "has population", "2,100,000")]),
]


FAILURES = ["503", "429", "drop", "timeout", "500"]


class FlakyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        answers_by_title: dict[str, tuple[str, str]],
        *,
        echo_auth_401: bool = False,
        pad_401: int = 0,
        logprobs: bool = False,
        flaky: bool = True,
        broken_titles: set[str] | None = None,
        echo_auth_models: bool = False,
    ):
        super().__init__(("127.0.0.1", 0), _FlakyHandler)
        self.answers_by_title = answers_by_title
        self.echo_auth_401 = echo_auth_401
        self.pad_401 = pad_401  # characters before the echoed header in the 401 message
        self.logprobs = logprobs
        self.flaky = flaky  # fail the first attempt of every request
        self.broken_titles = broken_titles or set()  # documents whose every attempt gets a 500
        self.broken_status = 500  # (or another status, e.g. 400: a bad request, which is no transient failure)
        self.echo_auth_models = echo_auth_models  # GET /models answers 401 quoting the Authorization header
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.posts: list[dict] = []
        self.auth: set[str | None] = set()
        self.failures_sent = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _FlakyHandler(BaseHTTPRequestHandler):
    server: FlakyServer

    def log_message(self, *args) -> None:
        pass

    def _json(self, code: int, payload: dict, headers: dict | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.server.echo_auth_models:
            with self.server.lock:
                self.server.auth.add(self.headers.get("Authorization"))
            return self._json(401, {"error": f"bad credentials in header Authorization: {self.headers.get('Authorization')}"})
        self._json(200, {"object": "list", "data": [{"id": "toy-model", "object": "model"}]})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        srv = self.server
        key = hashlib.sha256(raw).hexdigest()
        title = body["messages"][-1]["content"].split("\n", 1)[0].removeprefix("Title: ")
        with srv.lock:
            srv.posts.append(body)
            srv.auth.add(self.headers.get("Authorization"))
            first = key not in srv.seen and srv.flaky
            srv.seen.add(key)
            failure = FAILURES[srv.failures_sent % len(FAILURES)] if first else None
            srv.failures_sent += first
        if srv.echo_auth_401:
            return self._json(401, {"error": f"{'x' * srv.pad_401}invalid key in header {self.headers.get('Authorization')}"})
        if title in srv.broken_titles:
            return self._json(srv.broken_status, {"error": "this document always fails"})
        if failure == "drop":
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if failure == "timeout":
            time.sleep(2.5)  # the client's --timeout is 1 s
            return self._json(503, {"error": "too late"})
        if failure == "429":
            return self._json(429, {"error": "slow down"}, {"Retry-After": "0"})
        if failure is not None:
            return self._json(int(failure), {"error": "temporary"})
        text, finish = srv.answers_by_title[title]
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        if srv.logprobs and body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": "x", "logprob": -0.5, "top_logprobs": [{"token": "x", "logprob": -0.5}]}]}
        self._json(200, {"id": "c", "object": "chat.completion", "model": body["model"], "choices": [choice], "usage": {"prompt_tokens": 10, "completion_tokens": 7}})


def serve(server: ThreadingHTTPServer) -> threading.Thread:
    """Serve ``server`` on a daemon thread."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


# (answer, finish_reason, why the document gives no triple or None): four of five documents give none.
GUARD_ANSWERS = [
    ('{"triples": [["Palais Garnier", "designed by", "Charles Garnier"]]}', "stop", None),  # grounded in the first document
    ("I could not find any triples in this document.", "stop", "no readable triple"),
    ('{"triples": [], "note": "none", "count": 0}', "stop", "no readable triple"),
    ('{"triples": [["Paris", "capital of", "Fr', "length", "truncated before the first triple"),
    ("", "stop", "empty output"),
]
