"""Server answers are typed before use, and a malformed one is never cached (issue #46, item 1).

A real HTTP server on 127.0.0.1 answers from a script the test sets: malformed 200 answers (content a number or a
list of parts, token counts that are text, NaN, negative or booleans, a finish_reason that is a number, no choice,
not JSON), then a healthy one. The backend must retry past them, count them and return the healthy answer; when
they never stop it must fail as transient naming the field; the request cache must hold only answers that decode,
and an entry stored malformed by an older grtool is generated again (and dropped by ``--overwrite``). Hypothesis
draws damaged answers (a value at any path of a healthy answer replaced by one of another type) for the chat and
the ``/models`` routes.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grtool.errors import TransientError
from grtool.llm import Sampling, make_backend
from grtool.llm.answers import MalformedAnswer, decode_chat, decode_generation, decode_models
from grtool.llm.cache import CachedLLM
from grtool.store.stage import read_table
from llm_helpers import AnswerServer, write_documents

HEALTHY = {
    "id": "c", "object": "chat.completion", "model": "toy-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Ada, born in, London"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 5},
}  # fmt: skip
MODELS = {"object": "list", "data": [{"id": "toy-model", "object": "model", "max_model_len": 2048}]}


def _with(path: tuple, value) -> bytes:
    """HEALTHY with the value at ``path`` replaced (``...`` deletes it), as the server's bytes."""
    doc = json.loads(json.dumps(HEALTHY))
    *parents, last = path
    node = doc
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return json.dumps(doc).encode()


MALFORMED = {
    "content a number": (_with(("choices", 0, "message", "content"), 5), "$.choices[0].message.content"),
    "content a list of parts": (_with(("choices", 0, "message", "content"), [{"type": "text", "text": "x"}]), "$.choices[0].message.content"),
    "prompt_tokens text": (_with(("usage", "prompt_tokens"), "abc"), "$.usage.prompt_tokens"),
    "prompt_tokens NaN": (_with(("usage", "prompt_tokens"), 1.0).replace(b"1.0", b"NaN"), "not JSON"),
    "completion_tokens negative": (_with(("usage", "completion_tokens"), -3), "$.usage.completion_tokens"),
    "completion_tokens a boolean": (_with(("usage", "completion_tokens"), True), "$.usage.completion_tokens"),
    "finish_reason a number": (_with(("choices", 0, "finish_reason"), 7), "$.choices[0].finish_reason"),
    "no choice": (_with(("choices",), []), "$.choices"),
    "no message": (_with(("choices", 0, "message"), ...), "message"),
    "an HTML page": (b"<html>502 Bad Gateway</html>", "not JSON"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_chat_answer_names_its_field(name):
    body, field = MALFORMED[name]
    with pytest.raises(MalformedAnswer, match="chat completion") as caught:
        decode_chat(body)
    assert field in str(caught.value)


def test_a_healthy_answer_decodes_and_content_null_is_empty_text():
    answer = decode_chat(json.dumps(HEALTHY))
    assert answer.choices[0].message.content == "Ada, born in, London" and answer.usage.prompt_tokens == 12
    assert decode_chat(_with(("choices", 0, "message", "content"), None)).choices[0].message.content is None


@pytest.mark.parametrize("value", [True, 0, -1, "4096", 1.5])
def test_models_max_model_len_is_a_positive_count(value):
    with pytest.raises(MalformedAnswer, match=r"\$\.data\[0\]\.max_model_len"):
        decode_models(json.dumps({"data": [{"id": "m", "max_model_len": value}]}))


# ------------------------------------------------------------------------------------------------ a real server


def scripted(script: list[bytes]):
    """An :class:`AnswerServer` answer sending ``script``'s bytes, one per request in order (the last one repeats)."""
    left, lock = list(script), threading.Lock()

    def answer(body: dict) -> bytes:
        with lock:  # requests come on several connections at once
            return left.pop(0) if len(left) > 1 else left[0]

    return answer


@pytest.fixture
def serve():
    servers: list[AnswerServer] = []

    def start(script: list[bytes], models: bytes = json.dumps(MODELS).encode()) -> AnswerServer:
        servers.append(AnswerServer(scripted(script), models=models))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _backend(url: str, retries: int):
    return make_backend("openai", None, base_url=url, max_retries=retries, backoff=0.0, timeout=30.0)


def _entries(cache: Path) -> list[bytes]:
    with sqlite3.connect(cache) as db:
        return [blob for (blob,) in db.execute("SELECT generation FROM generations")]


def test_malformed_answers_are_retried_counted_and_never_cached(serve, tmp_path):
    bad = [MALFORMED["content a number"][0], MALFORMED["prompt_tokens text"][0], MALFORMED["finish_reason a number"][0]]
    server = serve([*bad, json.dumps(HEALTHY).encode()])
    backend = _backend(server.url, retries=5)
    llm = CachedLLM(backend, tmp_path / "cache.sqlite")
    try:
        [gen] = llm.generate([[{"role": "user", "content": "Who?"}]], Sampling(max_tokens=20))
    finally:
        llm.close()
    assert (gen.text, gen.finish_reason, gen.prompt_tokens, gen.completion_tokens) == ("Ada, born in, London", "stop", 12, 5)
    assert backend.malformed_answers == 3 and len(server.posts) == 4
    [entry] = _entries(tmp_path / "cache.sqlite")
    assert decode_generation(entry).text == "Ada, born in, London"


def test_a_server_that_only_answers_malformed_fails_as_transient_naming_the_field(serve, tmp_path):
    server = serve([MALFORMED["content a number"][0]])
    llm = CachedLLM(_backend(server.url, retries=2), tmp_path / "cache.sqlite")
    try:
        with pytest.raises(TransientError, match=r"giving up after 3 attempts; last: malformed answer: chat completion: .*\$\.choices\[0\]\.message\.content"):
            llm.generate([[{"role": "user", "content": "Who?"}]], Sampling(max_tokens=20))
    finally:
        llm.close()
    assert _entries(tmp_path / "cache.sqlite") == []


def test_models_reporting_a_boolean_context_is_unknown_not_true(serve):
    server = serve([json.dumps(HEALTHY).encode()], models=json.dumps({"data": [{"id": "toy-model", "max_model_len": True}]}).encode())
    backend = make_backend("openai", "toy-model", base_url=server.url)
    assert backend.context_length is None


# A healthy answer with one value replaced by another type (or removed): the backend returns the healthy answer that
# follows it, or the typed one when the replacement is still a valid answer; the cache never holds a malformed entry.
_PATHS = [
    ("choices",), ("choices", 0), ("choices", 0, "message"), ("choices", 0, "message", "content"), ("choices", 0, "finish_reason"),
    ("usage",), ("usage", "prompt_tokens"), ("usage", "completion_tokens"),
]  # fmt: skip
_VALUES = st.one_of(
    st.just(...), st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip


@settings(max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(_PATHS), value=_VALUES)
def test_fuzzed_chat_answers_through_a_real_server(path, value, tmp_path_factory):
    damaged = _with(path, value)
    try:
        decode_chat(damaged)
        valid = True
    except MalformedAnswer:
        valid = False
    server = AnswerServer(scripted([damaged, json.dumps(HEALTHY).encode()]), models=json.dumps(MODELS).encode())
    cache = tmp_path_factory.mktemp("fuzz") / "cache.sqlite"
    backend = _backend(server.url, retries=1)
    llm = CachedLLM(backend, cache)
    try:
        [gen] = llm.generate([[{"role": "user", "content": "Who?"}]], Sampling(max_tokens=20))
    finally:
        llm.close()
        server.close()
    assert backend.malformed_answers == (0 if valid else 1)
    assert isinstance(gen.text, str) and isinstance(gen.finish_reason, str)
    assert type(gen.prompt_tokens) is int and gen.prompt_tokens >= 0 and type(gen.completion_tokens) is int
    if not valid:
        assert gen.text == "Ada, born in, London"
    for entry in _entries(cache):
        decode_generation(entry)  # raises on a malformed entry


@settings(max_examples=30, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(key=st.sampled_from(["id", "max_model_len", "data"]), value=_VALUES)
def test_fuzzed_models_answers_through_a_real_server(key, value):
    listing = json.loads(json.dumps(MODELS))
    node = listing if key == "data" else listing["data"][0]
    if value is ...:
        del node[key]
    else:
        node[key] = value
    server = AnswerServer(scripted([json.dumps(HEALTHY).encode()]), models=json.dumps(listing).encode())
    try:
        backend = make_backend("openai", "toy-model", base_url=server.url)
    finally:
        server.close()
    assert backend.context_length is None or (type(backend.context_length) is int and backend.context_length > 0)


# ------------------------------------------------------------------------------------------------ through the CLI

DOCUMENTS = [
    {"doc_id": "d1", "title": "Ada Quill", "text": "Ada Quill was a cartographer born in Lowmere in 1841.", "datasets": ["own"]},
    {"doc_id": "d2", "title": "Lowmere", "text": "Lowmere is a river town known for its paper mills.", "datasets": ["own"]},
]


def _extract(cli, documents: Path, out: Path, url: str, *extra: str, check=True):
    return cli("triples", "extract", "--grounding", "off", documents.parent, "--out", out, "--backend", "openai", "--base-url", url,
               "--max-retries", "1", "--max-tokens", "50", *extra, check=check)  # fmt: skip


def test_extract_against_a_malformed_server_then_a_healthy_one(serve, tmp_path, cli):
    documents = write_documents(tmp_path / "corpus" / "documents", DOCUMENTS)
    out = tmp_path / "out"
    broken = serve([MALFORMED["content a number"][0]])
    failed = _extract(cli, documents, out, broken.url, check=75)
    assert "Traceback" not in failed.stderr
    assert "malformed answer" in failed.stderr and "$.choices[0].message.content" in failed.stderr
    caches = list(out.rglob("*.sqlite"))
    assert all(_entries(c) == [] for c in caches)  # nothing malformed was kept

    healthy = serve([json.dumps(HEALTHY).encode()])
    _extract(cli, documents, out, healthy.url)
    assert len(healthy.posts) == len(DOCUMENTS)
    assert {r["head"] for r in read_table(out / "triples").to_pylist()} == {"Ada"}


def test_an_entry_an_older_grtool_cached_malformed_is_generated_again_and_dropped_by_overwrite(serve, tmp_path, cli):
    documents = write_documents(tmp_path / "corpus" / "documents", DOCUMENTS)
    out = tmp_path / "out"
    server = serve([json.dumps(HEALTHY).encode()])
    _extract(cli, documents, out, server.url)
    [cache] = list(out.rglob("*.sqlite"))
    with sqlite3.connect(cache) as db:  # what grtool before typed answers stored for a `content: 5` answer
        db.execute("UPDATE generations SET generation = ?", (b'{"text": 5, "finish_reason": 7, "prompt_tokens": "abc"}',))
        db.execute("INSERT INTO generations VALUES ('stale', 'toy-model', '{\"text\": [1]}', 0)")
    rerun = _extract(cli, documents, out, server.url, "--overwrite")
    assert "Traceback" not in rerun.stderr
    assert len(server.posts) == 2 * len(DOCUMENTS)  # both generated again
    entries = _entries(cache)
    assert len(entries) == len(DOCUMENTS) and all(decode_generation(e).text == "Ada, born in, London" for e in entries)
