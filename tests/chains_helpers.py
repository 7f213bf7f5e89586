"""The chains tests' inputs and their OpenAI-compatible server: questions and triples stages built from the tests' own
2WikiMultihopQA records (their `evidences` as the gold paragraphs' triples), and a chat server on 127.0.0.1 that answers each question
with candidate chains of those triples and per-token logprobs."""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from conftest import TEST_DATA
from grtool.store.schemas import QUESTIONS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter

S, E = "<docid_start>", "<docid_end>"
TWO_WIKI = TEST_DATA / "2wikimultihopqa" / "data_ids_dev.tests.json"


def doc_id(title: str) -> str:
    return "d" + hashlib.sha1(title.encode()).hexdigest()[:12]


def load_2wiki() -> list[dict]:
    """The tests' own 2WikiMultihopQA records (tests/data): 14 questions of the three kinds."""
    return json.loads(TWO_WIKI.read_text())


def build_inputs(records: list[dict], root: Path, *, parts: int = 2) -> tuple[Path, Path, dict[str, dict]]:
    """A corpus run directory (questions/) and a triples stage; returns them and the questions by text."""
    questions, triples = [], []
    for rec in records:
        gold_titles = list(dict.fromkeys(t for t, _ in rec["supporting_facts"]))
        gold = [doc_id(t) for t in gold_titles]
        for i, (h, r, t) in enumerate(rec["evidences"]):
            d = gold[min(i, len(gold) - 1)]
            triples.append({"doc_id": d, "idx": i, "head": h, "relation": r, "tail": t, "docid": f"{S}{h}, {r}, {t}{E}"})
        questions.append(
            {
                "qid": rec["_id"], "dataset": "2wikimultihopqa", "split": "dev", "question": rec["question"],
                "answer": rec["answer"], "answer_aliases": [], "gold_doc_ids": gold, "type": rec["type"],
                "answerable": True, "meta": "{}",
            }
        )  # fmt: skip
    qdir = root / "corpus" / "questions"
    qw = StageWriter(qdir, StageSpec("questions", QUESTIONS), num_parts=parts)
    for p in range(parts):
        with qw.shard(p) as sh:
            rows = questions[p::parts]
            sh.count_in(len(rows))
            sh.write_rows(rows)
    qw.finish()
    tw = StageWriter(root / "triples", StageSpec("triples", TRIPLES), num_parts=1)
    with tw.shard(0) as sh:
        sh.count_in(len(triples))
        sh.write_rows(triples)
    tw.finish()
    return root / "corpus", root / "triples", {q["question"]: q for q in questions}


SURE_TOP = [0.97, 0.02, 0.01]


UNSURE_TOP = [0.4, 0.35, 0.25]


WINNER = 2  # the candidate the server is sure about (not the greedy one, so `first` and `entropy` differ)


def candidate_text(candidate: int, evidences: list[list[str]], answer: str) -> str:
    """What the fake model writes for one candidate: bracketed citations, in four styles."""
    cites = [f"[{h}, {r}, {t}]" for h, r, t in evidences]
    if candidate == 1:  # sloppy spacing and case
        cites = [f"[ {h.lower()} ,{r},  {t} ]" for h, r, t in evidences]
    if candidate == WINNER:  # the first hop read from known to unknown
        h, r, t = evidences[0]
        cites[0] = f"[{t}, {r}, {h}]"
    text = " ".join(f"Step {i}: {c}." for i, c in enumerate(cites, 1))
    if candidate == 3:  # a footnote and a triple nobody offered
        text += " See [1]. Also [Wikipedia, founded in, 2001]."
    return f"{text} So the answer is {answer}."


class FakeChatServer(ThreadingHTTPServer):
    """An OpenAI-compatible chat-completions server that answers from a table, with token logprobs."""

    daemon_threads = True
    request_queue_size = 128  # the client opens up to --concurrency connections at once

    def __init__(self, answers: dict[str, tuple[list[list[str]], str]], *, with_logprobs: bool = True, empty: set[int] | None = None):
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.answers = answers
        self.with_logprobs = with_logprobs
        self.empty = empty or set()  # candidates answered with an empty completion (no tokens)
        self.requests: list[dict] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


def token_logprobs(text: str, sure: bool, k: int) -> list[dict]:
    dist = SURE_TOP if sure else UNSURE_TOP
    out = []
    for tok in re.findall(r"\s*[\w\-'.]+|\s*[^\w\s]", text):
        alts = [tok] + [f"<alt{i}>" for i in range(1, len(dist))]
        top = [{"token": a, "logprob": math.log(p), "bytes": list(a.encode())} for a, p in zip(alts, dist)][:k]
        out.append({"token": tok, "logprob": math.log(dist[0]), "bytes": list(tok.encode()), "top_logprobs": top})
    return out


class ChatHandler(BaseHTTPRequestHandler):
    server: FakeChatServer

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _send(self, obj: dict, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": "fake-70b", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.requests.append(body)
        question = re.search(r"^Question: (.*)$", body["messages"][-1]["content"], re.M).group(1)
        evidences, answer = self.server.answers[question]
        candidate = body["seed"] if body["temperature"] > 0 else 0
        text = "" if candidate in self.server.empty else candidate_text(candidate, evidences, answer)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        if body.get("logprobs") and self.server.with_logprobs:
            choice["logprobs"] = {"content": token_logprobs(text, candidate == WINNER, body["top_logprobs"])}
        usage = {"prompt_tokens": 100, "completion_tokens": len(text.split()), "total_tokens": 100 + len(text.split())}
        if not text:  # what vLLM sends for an immediate end of sequence
            choice["logprobs"] = {"content": []} if body.get("logprobs") else None
            usage = {"prompt_tokens": 100, "completion_tokens": 0, "total_tokens": 100}
        self._send({"id": "c", "object": "chat.completion", "model": body["model"], "choices": [choice], "usage": usage})


def start_server(records, **kw) -> FakeChatServer:
    server = FakeChatServer({r["question"].strip(): (r["evidences"], r["answer"]) for r in records}, **kw)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def llm_args(server: FakeChatServer) -> list[str]:
    return ["--backend", "openai", "--base-url", server.url, "--model", "fake-70b", "--max-retries", "0"]
