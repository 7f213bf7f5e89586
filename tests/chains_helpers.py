"""The chains tests' inputs and their OpenAI-compatible server: questions and triples stages built from the tests' own
2WikiMultihopQA records (their `evidences` as the gold paragraphs' triples), and a chat server on 127.0.0.1 that answers each question
with candidate chains of those triples and per-token logprobs."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from conftest import TEST_DATA
from llm_helpers import AnswerServer, chat_reply
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


def token_logprobs(text: str, sure: bool, k: int) -> list[dict]:
    dist = SURE_TOP if sure else UNSURE_TOP
    out = []
    for tok in re.findall(r"\s*[\w\-'.]+|\s*[^\w\s]", text):
        alts = [tok] + [f"<alt{i}>" for i in range(1, len(dist))]
        top = [{"token": a, "logprob": math.log(p), "bytes": list(a.encode())} for a, p in zip(alts, dist)][:k]
        out.append({"token": tok, "logprob": math.log(dist[0]), "bytes": list(tok.encode()), "top_logprobs": top})
    return out


def start_server(records, *, with_logprobs: bool = True, empty: set[int] | None = None) -> AnswerServer:
    """A chat server answering each question of ``records`` with candidate chains of its evidences (candidate = the
    request's seed; 0 when greedy), token logprobs when asked (unless ``with_logprobs`` is off), and an empty
    completion (no tokens, as vLLM sends an immediate end of sequence) for the candidates in ``empty``."""
    answers = {r["question"].strip(): (r["evidences"], r["answer"]) for r in records}

    def answer(body: dict) -> tuple[int, dict]:
        question = re.search(r"^Question: (.*)$", body["messages"][-1]["content"], re.M).group(1)
        evidences, final = answers[question]
        candidate = body["seed"] if body["temperature"] > 0 else 0
        text = "" if candidate in (empty or set()) else candidate_text(candidate, evidences, final)
        logprobs = None
        if body.get("logprobs") and (with_logprobs or not text):
            logprobs = {"content": token_logprobs(text, candidate == WINNER, body["top_logprobs"]) if text else []}
        return chat_reply(body, text, logprobs=logprobs)

    return AnswerServer(answer, model="fake-70b")


def llm_args(server: AnswerServer) -> list[str]:
    return ["--backend", "openai", "--base-url", server.url, "--model", "fake-70b", "--max-retries", "0"]
