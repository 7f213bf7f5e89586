"""grtool.secrets: credentials redacted from recorded command lines and scrubbed, in every encoding, from texts."""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import quote, quote_plus

import pytest

from grtool import secrets

from index_helpers import BUNDLED


@pytest.fixture(autouse=True)
def _fresh_registry():
    secrets.forget_all()
    yield
    secrets.forget_all()


def test_credentials_redacted_option_values_kept():
    argv = ["grtool", "triples", "extract", "--api-key", "sk-abc", "--token=xyz", "--api-key-env", "MY_KEY", "--tokenizer", "llama3",
            "--max-tokens", "256", "--top-logprobs", "5", "--hf-token", "hf_abc", "--password=pw", "--base-url", "http://u:p@h:8000/v1?api_key=k&x=1",
            "sk-positional", "out/run", "--system", "Basic Retriever: answer with triples", "--prompt=Bearer of news", "Bearer abc123XYZ789"]  # fmt: skip
    assert secrets.redact_argv(argv) == [
        "grtool", "triples", "extract", "--api-key", "***", "--token=***", "--api-key-env", "MY_KEY", "--tokenizer", "llama3",
        "--max-tokens", "256", "--top-logprobs", "5", "--hf-token", "***", "--password=***", "--base-url", "http://***@h:8000/v1?api_key=***&x=1",
        "***", "out/run", "--system", "Basic Retriever: answer with triples", "--prompt=Bearer of news", "***",
    ]  # fmt: skip


def test_registered_url_password_scrubbed_in_every_encoding():
    user, password = "alice", "pw^SECRET|with space"
    secrets.register_url(f"http://{user}:{password}@127.0.0.1:8000/v1")
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    for form in (password, quote(password), quote(password, safe=""), quote_plus(password), re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(password)), basic):
        text = secrets.scrub(f"error for url 'http://127.0.0.1/x' -> {form} <- end")
        assert form not in text and "***" in text and text.endswith("<- end"), form
    # An already-encoded password in the URL: its decoded form (what Basic auth sends) is registered too.
    secrets.forget_all()
    secrets.register_url("http://bob:p%5Eq%7Cr%20s@h/v1")
    assert secrets.scrub("p^q|r s / p%5Eq%7Cr%20s / " + base64.b64encode(b"bob:p^q|r s").decode()) == "*** / *** / ***"


def test_header_values_and_url_userinfo_scrubbed_unregistered():
    text = secrets.scrub(
        'HTTP 401: {"error": "bad header Authorization: Basic YWxpY2U6c2VjcmV0", "authorization": "Bearer abc.DEF-123"} see http://carol:hunter2@example.org/v1; Basic authentication is required'
    )
    assert "YWxpY2U6c2VjcmV0" not in text and "abc.DEF-123" not in text and "hunter2" not in text
    assert "http://***@example.org/v1" in text and "Basic authentication is required" in text  # prose is kept


def test_log_records_are_scrubbed(caplog):
    import logging

    secrets.register("tok-0123456789")
    log = logging.getLogger("grtool")
    with caplog.at_level(logging.INFO, logger="grtool"):
        log.addHandler(caplog.handler)
        try:
            log.info("sending %s", "Bearer tok-0123456789 to tok%2D0123456789")
        finally:
            log.removeHandler(caplog.handler)
    assert "tok-0123456789" not in caplog.text and "0123456789" not in caplog.text


def test_index_json_keeps_the_tokenizer_name(cli, tmp_path):
    out = tmp_path / "idx"
    cli("index", "build", "-", "--tokenizer", "qwen", "--out", out, input=BUNDLED.read_text())
    command = json.loads((out / "index.json").read_text())["command"]
    assert command[:3] == ["grtool", "index", "build"] and command[command.index("--tokenizer") + 1] == "qwen"
