"""`chains synthesize --unanswerable keep|skip` on real MuSiQue-full unanswerable records, then `filters apply`.

The corpus is the real `corpus ingest` of the MuSiQue-full sample; the triples stage holds one triple per
decomposition step (in its paragraph) and one per context paragraph. The model is an OpenAI-compatible HTTP
server on 127.0.0.1 with canned replies: candidate 0 cites an offered triple and ends in the recipe's
cannot-answer sentence, candidate 1 cites the same triple and claims the dataset's answer.
"""

from __future__ import annotations

import json
import re

import pytest

from grtool.vocab.text import CANNOT_ANSWER_SENTENCE
from grtool.corpus.doc_hash import doc_id
from grtool.store.io import InputTable
from grtool.store.schemas import TRIPLES
from grtool.store.stage import StageSpec, StageWriter, iter_rows
from grtool.store.records import load_manifest
from conftest import TEST_DATA
from llm_helpers import AnswerServer, chat_reply

S, E = "<docid_start>", "<docid_end>"
_OFFERED = re.compile(r"^\d+\. \[(.*)\]$", re.M)


def canned(candidate: int, offered: list[str], answer: str) -> str:
    cite = f"[{offered[0]}]"
    if candidate == 0:
        return f"The question needs more than {cite}. No triple gives the next hop. {CANNOT_ANSWER_SENTENCE}"
    return f"The question needs more than {cite}. So the answer is {answer}."


def canned_answers(answers: dict[str, str]):
    """An :class:`AnswerServer` answer: the question's candidate (its seed; 0 when greedy) cites the first triple
    offered, then says it cannot answer (candidate 0) or claims ``answers[question]`` (the others)."""

    def answer(body: dict) -> tuple[int, dict]:
        turn = body["messages"][-1]["content"]
        question = re.search(r"^Question: (.*)$", turn, re.M).group(1)
        candidate = body["seed"] if body["temperature"] > 0 else 0
        return chat_reply(body, canned(candidate, _OFFERED.findall(turn), answers[question]))

    return answer


@pytest.fixture
def musique_full(tmp_path, cli):
    """The ingested MuSiQue-full records (the tests' own: an unanswerable question and another, answerable one; the
    unanswerable one's answerable twin is left out, as it asks the same text) and a triples stage over every context
    paragraph of its records."""
    lines = (TEST_DATA / "musique" / "musique_full_v1.0_dev.tests.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if r["id"] != "2hop__910001_910002" or not r["answerable"]]
    path = tmp_path / "musique_full_v1.0_dev.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    cli("-q", "corpus", "ingest", path, "--out", tmp_path / "corpus")
    triples, seen = [], set()

    def add(doc, h, r, t):
        if (doc, h, r, t) not in seen:
            seen.add((doc, h, r, t))
            triples.append({"doc_id": doc, "idx": len(triples), "head": h, "relation": r, "tail": t, "docid": f"{S}{h}, {r}, {t}{E}"})

    for rec in records:
        paragraphs = rec["paragraphs"]
        for step in rec["question_decomposition"]:
            if step.get("paragraph_support_idx") is not None:
                p = paragraphs[step["paragraph_support_idx"]]
                add(doc_id(p["title"], p["paragraph_text"]), p["title"], step["question"].rstrip(" ?").replace(",", " "), step["answer"])
        for p in paragraphs:
            add(doc_id(p["title"], p["paragraph_text"]), p["title"], "is the title of", "a Wikipedia paragraph")
    w = StageWriter(tmp_path / "triples", StageSpec("triples", TRIPLES), num_parts=1)
    with w.shard(0) as sh:
        sh.count_in(len(triples))
        sh.write_rows(triples)
    w.finish()
    questions = {q["qid"]: q for q in InputTable.open(tmp_path / "corpus", "questions").iter_rows()}
    with AnswerServer(canned_answers({q["question"].strip(): q["answer"] for q in questions.values()}), model="fake-70b") as server:
        yield {"corpus": tmp_path / "corpus", "triples": tmp_path / "triples", "questions": questions, "server": server, "all_triples": triples}


def _synthesize(cli, world, out, *args):
    server = world["server"]
    cli(
        "chains", "synthesize", world["corpus"], "--triples", world["triples"], "--out", out, "--candidates", "2", "--select", "first",
        "--backend", "openai", "--base-url", server.url, "--model", "fake-70b", "--max-retries", "0", *args,
    )  # fmt: skip
    return load_manifest(out)


def _rejects(out):
    return {json.loads(line)["record"]["qid"]: json.loads(line) for f in sorted((out / "_rejects").glob("*.jsonl")) for line in f.read_text().splitlines()}


def test_an_unanswerable_question_gets_a_cannot_answer_chain_that_passes_the_filters(cli, tmp_path, musique_full):
    world = musique_full
    unanswerable = {qid: q for qid, q in world["questions"].items() if not q["answerable"]}
    assert unanswerable and all(qid.endswith("__unanswerable") and not q["gold_doc_ids"] for qid, q in unanswerable.items())
    qid, q = next(iter(unanswerable.items()))
    meta = json.loads(q["meta"])
    assert meta["musique_id"] == qid.removesuffix("__unanswerable") and len(meta["context_doc_ids"]) == 3  # the record's paragraphs

    out = tmp_path / "chains"
    manifest = _synthesize(cli, world, out)
    assert manifest.params["unanswerable"] == "keep"
    extra = manifest.counters.extra
    assert extra["questions_unanswerable"] == len(unanswerable) and extra["questions_chained"] == len(world["questions"])
    # Its prompt offered its own context paragraphs' triples (there is no gold), nothing else.
    context = set(meta["context_doc_ids"])
    offered = {f"{t['head']}, {t['relation']}, {t['tail']}" for t in world["all_triples"] if t["doc_id"] in context}
    turn = next(r["messages"][-1]["content"] for r in world["server"].posts if q["question"].strip() in r["messages"][-1]["content"])
    assert set(_OFFERED.findall(turn)) == offered

    rows = {(r["qid"], r["candidate"]): r for r in iter_rows(out)}
    cannot, claims = rows[(qid, 0)], rows[(qid, 1)]
    assert cannot["text"].endswith(CANNOT_ANSWER_SENTENCE) and len(cannot["docids"]) == 1
    assert f"So the answer is {q['answer']}." in claims["text"]

    filtered = tmp_path / "filtered"
    report = json.loads(cli("filters", "apply", out, "--corpus", world["corpus"], "--triples", world["triples"], "--out", filtered, "--json").stdout)
    kept = {(r["qid"], r["candidate"]): r for r in iter_rows(filtered)}
    assert (qid, 0) in kept and kept[(qid, 0)]["selected"] and (qid, 1) not in kept
    rejects = [json.loads(line) for f in sorted((filtered / "_rejects").glob("*.jsonl")) for line in f.read_text().splitlines()]
    reasons = {(e["record"]["qid"], e["record"]["candidate"]): e["record"]["reasons"] for e in rejects}
    assert reasons[(qid, 1)] == ["answer-unanswerable"]
    # Every unanswerable question keeps its cannot-answer chain; no answerable one keeps one.
    assert {k[0] for k in kept if k[1] == 0} >= set(unanswerable)
    assert all("answer-cannot-answer" in reasons[(a, 0)] for a, x in world["questions"].items() if x["answerable"])
    assert report["datasets"]["musique"]["kept"] >= len(unanswerable)


def test_skip_rejects_unanswerable_questions_before_synthesis(cli, tmp_path, musique_full):
    world = musique_full
    unanswerable = {qid for qid, q in world["questions"].items() if not q["answerable"]}
    out = tmp_path / "chains"
    manifest = _synthesize(cli, world, out, "--unanswerable", "skip")
    assert manifest.counters.rejected == {"not answerable": len(unanswerable)}
    assert {qid: e["reason"] for qid, e in _rejects(out).items()} == dict.fromkeys(unanswerable, "not answerable")
    asked = {re.search(r"^Question: (.*)$", r["messages"][-1]["content"], re.M).group(1) for r in world["server"].posts}
    assert asked.isdisjoint(world["questions"][u]["question"].strip() for u in unanswerable)
