"""Safety of the LLM layer against real HTTP servers on 127.0.0.1 and the embedded model (issue #25, items 12-14).

- ``--timeout`` bounds a whole request attempt: a server that sends its headers and then a byte every second
  fails each attempt after ``--timeout`` seconds, and the run gives up like with a dead server.
- A prompt longer than the model's context is never sent truncated: the record is rejected ``too_long`` (the
  server's own 400, ``--max-context``, the ``max_model_len`` a server reports, the transformers model's config).
- A key a server echoes in a 200 answer is masked in everything stored: rows, ``llm_calls``, rejects, the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grtool import secrets
from grtool.errors import GrtoolError
from grtool.llm import Sampling, make_backend
from grtool.llm.base import Generation, TokenLogprobs
from grtool.store.records import Counters, load_manifest
from grtool.store.stage import read_table
from llm_helpers import AnswerServer, chat_reply, write_documents

SECRET = "sk-test-0123456789abcdefSECRET"
LONG_CHARS = 50_000
ANSWER = '{"triples": [["Alpha", "is a", "letter"]]}'
# What vLLM's server answers for a prompt that does not fit (vllm/renderers/params.py).
VLLM_TOO_LONG = (
    "This model's maximum context length is 4096 tokens. However, your prompt contains 12510 input tokens, which exceeds "
    "this limit even without any output tokens. Please reduce the length of the input prompt."
)


def documents(tmp_path: Path, long_text: bool = True) -> tuple[list[dict], Path]:
    """Two ordinary documents and (``long_text``) one of 50K characters between them."""
    docs = [
        {"doc_id": "d-alpha", "title": "Alpha", "text": "Alpha is the first letter of the Greek alphabet.", "datasets": ["t"]},
        {"doc_id": "d-beta", "title": "Beta", "text": "Beta is the second letter of the Greek alphabet.", "datasets": ["t"]},
    ]
    if long_text:
        words = " ".join(f"word{i % 997}" for i in range(LONG_CHARS // 7))
        docs.insert(1, {"doc_id": "d-long", "title": "Long", "text": words[:LONG_CHARS], "datasets": ["t"]})
    return docs, write_documents(tmp_path / "corpus" / "documents", docs)


def is_long(body: dict) -> bool:
    return sum(len(m["content"]) for m in body["messages"]) > LONG_CHARS


def rejects(stage: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((stage / "_rejects").glob("*.jsonl")) for line in f.read_text().splitlines()]


def assert_accounting(stage: Path) -> Counters:
    c = load_manifest(stage).counters
    assert c.in_ == c.out + c.merged + sum(c.rejected.values()), c
    return c


# ------------------------------------------------------------------------------------------- 12: timeout


def test_a_trickling_server_times_out_per_request_not_per_read(tmp_path):
    server = AnswerServer(lambda body: "trickle")
    docs, corpus = documents(tmp_path, long_text=False)
    cmd = [sys.executable, "-m", "grtool", "triples", "extract", str(corpus), "--out", str(tmp_path / "out"), "--limit", "1",
           "--backend", "openai", "--base-url", server.url, "--model", "toy-model", "--timeout", "2", "--max-retries", "1"]  # fmt: skip
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "10000"})
    finally:
        server.close()
    elapsed = time.monotonic() - started
    # Two attempts of 2 s, a backoff under 1 s, and the interpreter's start; before, every byte reset the clock.
    assert proc.returncode == 75, proc.stderr  # a server too slow after the retries: transient, try again later
    assert "giving up after 2 attempts" in proc.stderr and "no complete answer within --timeout 2s" in proc.stderr, proc.stderr
    assert len(server.posts) == 2
    assert elapsed < 20, elapsed


def test_listing_the_models_has_a_deadline_too():
    server = AnswerServer(lambda body: chat_reply(body, ANSWER), trickle_models=True)
    started = time.monotonic()
    try:
        with pytest.raises(GrtoolError, match="cannot list the served models .no answer within 1s"):
            make_backend("openai", base_url=server.url, timeout=1)
    finally:
        server.close()
    assert time.monotonic() - started < 8


# ------------------------------------------------------------------------------------ 13: over-long inputs


def test_the_servers_context_length_error_rejects_only_that_document(tmp_path, cli):
    server = AnswerServer(lambda body: (400, {"object": "error", "message": VLLM_TOO_LONG, "code": 400}) if is_long(body) else chat_reply(body, ANSWER))
    docs, corpus = documents(tmp_path)
    out = tmp_path / "out"
    try:
        cli("triples", "extract", corpus, "--out", out, "--backend", "openai", "--base-url", server.url, "--grounding", "off", "--max-retries", "0")
        assert sum(is_long(p) for p in server.posts) == 1  # sent once: the server is the judge here
    finally:
        server.close()
    c = assert_accounting(out / "triples")
    assert c.rejected == {"too_long": 1} and c.extra["documents"] == 2 and c.extra["documents_too_long"] == 1
    (reject,) = rejects(out / "triples")
    assert reject["record"]["doc_id"] == "d-long" and "maximum context length is 4096" in reject["detail"]
    assert sorted(read_table(out / "llm_calls")["row_key"].to_pylist()) == ["d-alpha", "d-beta"]
    assert sorted(set(read_table(out / "triples")["doc_id"].to_pylist())) == ["d-alpha", "d-beta"]


@pytest.mark.parametrize("how", ["--max-context", "/models"])
def test_a_known_context_keeps_the_long_document_from_being_sent(tmp_path, cli, how):
    server = AnswerServer(lambda body: chat_reply(body, ANSWER), max_model_len=4096 if how == "/models" else None)
    docs, corpus = documents(tmp_path)
    out = tmp_path / "out"
    args = ["triples", "extract", corpus, "--out", out, "--backend", "openai", "--base-url", server.url, "--grounding", "off", "--max-tokens", "256"]
    try:
        cli(*args, *(["--max-context", "4096"] if how == "--max-context" else []))
        assert len(server.posts) == 2 and not any(is_long(p) for p in server.posts)
        # --max-tokens alone over the context: every request would fail, so the command does, before writing rows.
        context = ["--max-context", "4096"] if how == "--max-context" else []
        bad = cli(*args[:4], tmp_path / "o2", *args[5:], "--max-tokens", "5000", *context, check=2)
        assert "--max-tokens 5000 leaves no room for a prompt" in " ".join(bad.stderr.split())
        if how == "--max-context":  # known without the model: refused before anything is created
            assert not (tmp_path / "o2").exists() and len(server.posts) == 2
        # the corrected command runs without --overwrite: the refused run left nothing recording its parameters
        cli(*args[:4], tmp_path / "o2", *args[5:], *context)
        assert load_manifest(tmp_path / "o2" / "triples").complete
    finally:
        server.close()
    c = assert_accounting(out / "triples")
    assert c.rejected == {"too_long": 1} and c.extra["documents"] == 2
    (reject,) = rejects(out / "triples")
    assert reject["record"] == {"doc_id": "d-long", "title": "Long", "chars": LONG_CHARS}
    assert "at least" in reject["detail"] and "context of 4096 tokens" in reject["detail"]


def test_max_tokens_past_the_models_configured_context_is_refused_before_loading_it(tmp_path, cli):
    """The embedded model's config says 8192 tokens: the option is refused from it, before any output exists."""
    docs, corpus = documents(tmp_path, long_text=False)
    bad = cli("triples", "extract", corpus, "--out", tmp_path / "out", "--max-tokens", "9000", check=2)
    assert "--max-tokens 9000 leaves no room for a prompt in the model's context of 8192 tokens" in " ".join(bad.stderr.split())
    assert not (tmp_path / "out").exists()


def test_max_tokens_too_large_for_the_server_stays_an_error():
    # vLLM's 400 for --max-tokens alone past the context names the context too: it must not pass for one long record.
    message = "'max_tokens' or 'max_completion_tokens' is too large: 9000. This model's maximum context length is 4096 tokens."
    server = AnswerServer(lambda body: (400, {"object": "error", "message": message}))
    try:
        backend = make_backend("openai", base_url=server.url, model="toy-model", max_retries=0)
        with pytest.raises(GrtoolError, match="HTTP 400.*too large"):
            backend.generate([[{"role": "user", "content": "hi"}]], Sampling(max_tokens=9000))
    finally:
        server.close()


def test_chains_question_too_long_for_the_context_is_rejected(tmp_path, cli):
    from chains_helpers import build_inputs, llm_args, load_2wiki, start_server

    records = [dict(r) for r in load_2wiki()[:4]]
    records[1]["question"] = "Which one? " + "very " * (LONG_CHARS // 5)
    corpus, triples, _ = build_inputs(records, tmp_path)
    server = start_server(records)
    out = tmp_path / "chains"
    try:
        cli("chains", "synthesize", corpus, "--triples", triples, "--out", out, *llm_args(server), "--candidates", "2", "--max-context", "4096")
    finally:
        server.close()
    c = assert_accounting(out)
    assert c.rejected == {"too_long": 1} and c.extra["questions_too_long"] == 1 and c.out == 2 * 3
    (reject,) = rejects(out)
    assert reject["record"]["qid"] == records[1]["_id"] and reject["position"] == 0 and "context of 4096 tokens" in reject["detail"]


@pytest.mark.slow
def test_transformers_rejects_a_document_longer_than_the_models_context(tmp_path, cli):
    docs, corpus = documents(tmp_path)
    out = tmp_path / "out"
    # 4 tokens give no triple: the stage is empty on purpose (--allow-empty), the test is about the long document
    cli("triples", "extract", corpus, "--out", out, "--max-tokens", "4", "--batch-size", "2", "--max-empty-share", "1", "--grounding", "off", "--allow-empty")
    c = assert_accounting(out / "triples")
    assert c.rejected.get("too_long") == 1 and c.extra["documents"] == 2 and c.extra["completion_tokens"] > 0
    (reject,) = [r for r in rejects(out / "triples") if r["reason"] == "too_long"]
    assert reject["record"]["doc_id"] == "d-long" and "context of 8192 tokens" in reject["detail"]  # SmolLM2's config
    assert sorted(read_table(out / "llm_calls")["row_key"].to_pylist()) == ["d-alpha", "d-beta"]


# -------------------------------------------------------------------------------- 14: secrets in stored data


def string_cells(path: Path) -> list[str]:
    """Every string in a Parquet file (list columns included), decompressed by reading it."""
    table = pq.read_table(path)
    out: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    for column in table.columns:
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_nested(column.type):
            for value in column.to_pylist():
                walk(value)
    return out


def files_holding(root: Path, secret: str) -> list[str]:
    """Files under ``root`` holding ``secret``: Parquet read cell by cell, every other file byte by byte."""
    found = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        if f.suffix == ".parquet":
            if any(secret in s for s in string_cells(f)):
                found.append(str(f))
        elif secret.encode() in f.read_bytes():
            found.append(str(f))
    return found


def test_a_key_echoed_in_a_200_answer_is_stored_nowhere(tmp_path, cli):
    def answer(body: dict) -> tuple[int, dict]:
        if "Title: Alpha" in body["messages"][-1]["content"]:
            return chat_reply(body, '{"triples": [["Alpha", "was sent the key", "%s"]]}' % SECRET)
        return chat_reply(body, f"I cannot find triples. Your request carried the key {SECRET}.")

    server = AnswerServer(answer)
    docs, corpus = documents(tmp_path, long_text=False)
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ("triples", "extract", corpus, "--out", out, "--cache-dir", cache, "--backend", "openai", "--base-url", server.url,
            "--grounding", "off", "--max-empty-share", "1")  # fmt: skip
    try:
        first = cli(*args, env={"OPENAI_API_KEY": SECRET})
        again = cli(*args, "--overwrite", env={"OPENAI_API_KEY": SECRET})  # re-parsed from the cache
        assert len(server.posts) == 2
    finally:
        server.close()
    assert list(cache.glob("*.sqlite")) and (out / "triples" / "_rejects").is_dir()
    assert files_holding(out, SECRET) == [] and files_holding(cache, SECRET) == []
    assert SECRET not in first.stderr + first.stdout + again.stderr + again.stdout
    # What was stored is the answer with the key masked, not nothing.
    (row,) = read_table(out / "triples").to_pylist()
    assert row["tail"] == secrets.MASK and row["docid"].endswith(f"was sent the key, {secrets.MASK}<docid_end>")
    assert any(f"the key {secrets.MASK}." in (r["record"].get("output") or "") for r in rejects(out / "triples"))
    assert all(SECRET not in o for o in read_table(out / "llm_calls")["output"].to_pylist())


def test_a_key_spread_over_logprob_tokens_is_masked_token_by_token():
    from grtool.llm.base import redact_generation

    secrets.forget_all()
    secrets.register(SECRET)
    try:
        pieces = ["The key: ", SECRET[:7], SECRET[7:19], SECRET[19:], " end"]
        gen = Generation(
            text="".join(pieces), finish_reason="stop",
            logprobs=[TokenLogprobs(p, -0.1, {p: -0.1, SECRET[:3]: -2.0}) for p in pieces],
        )  # fmt: skip
        redact_generation(gen)
        assert gen.text == f"The key: {secrets.MASK} end"
        assert [t.token for t in gen.logprobs] == ["The key: ", secrets.MASK, secrets.MASK, secrets.MASK, " end"]
        assert all(SECRET not in "".join(t.top) for t in gen.logprobs) and gen.logprobs[0].top["The key: "] == -0.1
    finally:
        secrets.forget_all()
