"""Any OpenAI-compatible chat server (``vllm serve``, SGLang, llama.cpp server, hosted APIs) over httpx.

- at most ``concurrency`` requests in flight;
- ``timeout`` bounds each attempt as a whole (connecting, sending, waiting and reading the whole answer), not
  each network read: a server that trickles a byte every few seconds times out like a silent one;
- connection errors, timeouts, 429 and 5xx are retried with exponential backoff and full jitter (a
  ``Retry-After`` header is honoured); other 4xx answers fail at once with the server's message;
- a prompt that does not fit the model's context is not a failure of the run: it comes back as a ``too_long``
  generation (the stage rejects that record). The context is ``max_context``, else the ``max_model_len`` the
  server reports in ``/models`` (vLLM does); a prompt certain to exceed it (counting at least one token per
  :data:`MAX_CHARS_PER_TOKEN` characters) is not sent, and a server's own 400 "context length" answer is
  taken the same way;
- a JSON schema goes out as ``response_format: {type: json_schema}`` — never as ``guided_json``, which
  current vLLM servers silently ignore; `chains synthesize --constrain` goes out as vLLM's
  ``structured_outputs: {regex}`` (the offered triples, :func:`grtool.index.constraints.offered_regex`);
- the API key comes from an environment variable (``OPENAI_API_KEY`` or the one named by ``--api-key-env``),
  lives only in the request header, and is scrubbed from every error message;
- credentials written into the URL (``http://user:password@host/v1``) are taken out of it and sent as HTTP Basic
  auth instead of the key (one ``Authorization`` header per request); the URL shown in messages is
  ``http://***@host/v1``, and the password is scrubbed in every encoding (:mod:`grtool.secrets`);
- a server that cannot be reached, or still answers 5xx/429/timeouts after the retries, is a
  :class:`~grtool.errors.TransientError` (exit 75: the same command run later resumes); other answers the
  server gives (401, 404, a bad request) and a key that cannot be sent in a header are errors of the command
  (exit 2, no retry); a --base-url no request could go to (:func:`check_base_url`) is refused with the options,
  before a command creates anything;
- every answer is decoded through its type (:mod:`grtool.llm.answers`) before anything uses it: a 200 answer that
  does not decode (content a number, a token count that is text or NaN, no choice) is retried like a 5xx, counted
  (``malformed_answers``) and named in the final error, and never reaches the request cache;
- when requests fail for good, the call raises :class:`~grtool.llm.base.PartialGenerations` carrying the answers
  that arrived (the cache keeps them); requests not yet sent by then are not sent.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from typing import Any
from urllib.parse import urlsplit

import httpx

from grtool.errors import GrtoolError, TransientError
from grtool.llm.answers import MalformedAnswer, ModelEntry, decode_chat, decode_models, generation_from
from grtool.llm.base import Generation, Messages, OnDone, PartialGenerations, Sampling, context_check, not_generated
from grtool import secrets, signals
from grtool.log import activity, activity_detail, log

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
# No server tokenizer here: a prompt is counted at no fewer tokens than its characters / this (real tokenizers
# average 3-5 characters per token on prose), so only prompts certain not to fit are held back; the server's
# own context-length answer catches the rest.
MAX_CHARS_PER_TOKEN = 8
MODELS_TIMEOUT = 30.0  # seconds for the /models request made at start
# How OpenAI-compatible servers word "the prompt does not fit" (vLLM, OpenAI, SGLang, llama.cpp, TGI).
_CONTEXT_EXCEEDED = re.compile(r"context[ _-]?(?:length|size|window)|maximum context|`inputs` tokens \+ `max_new_tokens`", re.IGNORECASE)
# ... unless it is --max-tokens alone that does not fit: every request would fail the same way.
_MAX_TOKENS_TOO_LARGE = re.compile(r"max_(?:completion_|new_)?tokens'? (?:\S+ )*?is too large", re.IGNORECASE)
_CONTEXT_STATUS = {400, 413, 422}


def check_base_url(url: str) -> None:
    """Refuse a --base-url no request could go to (no http/https scheme, no host, a port out of range, a URL that
    does not parse), before a command creates anything. Whether a server answers there is found out at run time."""
    shown = secrets.redact_url(url)
    bare = secrets.split_url_credentials(url)[0]  # what the requests go to: the user-info may hold anything
    try:
        parts = urlsplit(bare)
        port = parts.port  # a ValueError when out of range or not a number
        httpx.URL(bare)  # the parser the requests use
    except (ValueError, httpx.InvalidURL) as e:
        secrets.register_url(url)
        raise GrtoolError(secrets.scrub(f"--base-url {shown}: not a valid URL ({e})")) from None
    if parts.scheme not in ("http", "https"):
        raise GrtoolError(f"--base-url {shown}: the URL must start with http:// or https:// (the server's address up to /v1)")
    if not parts.hostname or any(c.isspace() for c in parts.hostname):
        raise GrtoolError(f"--base-url {shown}: no valid host name in the URL")
    if port == 0:
        raise GrtoolError(f"--base-url {shown}: port 0 is not a port a server can listen on (1-65535)")


class OpenAIBackend:
    name = "openai"
    OPTIONS = ("base_url", "api_key_env", "concurrency", "timeout", "max_retries", "backoff", "chunk_size", "max_context")

    @staticmethod
    def check_options(options: dict[str, Any]) -> None:
        """What can be checked about the set options without contacting the server."""
        if "base_url" in options:
            check_base_url(options["base_url"])

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 16,
        timeout: float = 600.0,
        max_retries: int = 8,
        backoff: float = 1.0,
        chunk_size: int | None = None,
        max_context: int | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        # Requests go to the URL without its user-info (so no HTTP library prints it), with the credentials as
        # explicit Basic auth; messages show the URL redacted.
        self._url, user, password = secrets.split_url_credentials(self.base_url)
        self._auth = httpx.BasicAuth(user or "", password or "") if user is not None else None
        self._shown = secrets.redact_url(self.base_url)
        secrets.register_url(self.base_url)
        self.concurrency = max(1, concurrency)
        self.chunk_size = chunk_size or max(64, 8 * self.concurrency)
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self._api_key = os.environ.get(api_key_env) or None
        secrets.register(self._api_key)
        if api_key_env != "OPENAI_API_KEY" and self._api_key is None:
            raise GrtoolError(f"--api-key-env {api_key_env}: that environment variable is not set")
        log.info("%s: %s", self._shown, self._credential_used(api_key_env))
        self.requests_sent = 0  # every HTTP attempt, retries included
        self.malformed_answers = 0  # 200 answers that did not decode (retried)
        self._models_cache: list[ModelEntry] | None = None
        self.model = model if model is not None else self._served_model()
        # The context, in tokens: given, else reported by the server for this model, else unknown (None).
        self.context_length = max_context if max_context is not None else self._reported_context()

    # ------------------------------------------------------------------ transport
    def _credential_used(self, api_key_env: str) -> str:
        """Which credential the requests carry (never the credential itself)."""
        if self._auth is not None:
            unused = f"; ${api_key_env} is set but not sent (one Authorization header per request)" if self._api_key else ""
            return f"authenticating with HTTP Basic from the user-info in --base-url{unused}"
        if self._api_key:
            return f"authenticating with the API key from ${api_key_env} (Bearer)"
        return f"no credentials sent (no user-info in --base-url, ${api_key_env} not set)"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key and self._auth is None else {}

    def _scrub(self, text: str) -> str:
        """A message without the key or the URL's credentials, in any encoding, nor any header value."""
        return secrets.scrub(text.replace(self.base_url, self._shown))

    def _served_model(self) -> str:
        """Without --model, use the server's model when it serves exactly one."""
        try:
            ids = [m.id for m in self._models()]
        except (httpx.HTTPError, TimeoutError, MalformedAnswer) as e:
            why = f"no answer within {self._models_timeout:g}s" if isinstance(e, TimeoutError) else str(e)
            if _server_unavailable(e):  # down, unreachable or busy: --model would not help, the server must answer
                raise TransientError(self._scrub(f"{self._shown}: the server is unreachable; cannot list the served models ({why}); start it or check --base-url, then run again")) from None
            # It answered, but not with a model list (no /models route): naming the model skips the question.
            raise GrtoolError(self._scrub(f"{self._shown}/models: cannot list the served models ({why}); pass --model")) from None
        if len(ids) != 1:
            raise GrtoolError(self._scrub(f"{self._shown} serves {len(ids)} models ({', '.join(ids[:5])}); choose one with --model"))
        return ids[0]

    def _reported_context(self) -> int | None:
        """The ``max_model_len`` the server reports for this model in ``/models`` (vLLM does), if any."""
        try:
            entries = [m for m in self._models() if m.id == self.model]
        except MalformedAnswer as e:  # the requests may still work: only the context is unknown
            log.warning("%s/models: %s; the model's context is unknown (give --max-context)", self._shown, self._scrub(str(e)))
            return None
        except (httpx.HTTPError, TimeoutError) as e:
            log.debug("%s/models: no context length reported (%s)", self._shown, self._scrub(f"{type(e).__name__}: {e}"))
            return None
        return entries[0].max_model_len if entries else None

    @property
    def _models_timeout(self) -> float:
        return min(self.timeout, MODELS_TIMEOUT)

    def _models(self) -> list[ModelEntry]:
        """The ``data`` entries of ``GET /models`` (fetched once, typed), under a deadline for the whole request."""
        if self._models_cache is None:

            async def get() -> httpx.Response:
                async with httpx.AsyncClient(headers=self._headers(), auth=self._auth, timeout=self._models_timeout) as client:
                    async with asyncio.timeout(self._models_timeout):
                        return await client.get(f"{self._url}/models")

            r = signals.run_async(get())
            r.raise_for_status()
            self._models_cache = decode_models(r.content)
        return self._models_cache

    def request_body(self, messages: Messages, sampling: Sampling) -> dict[str, Any]:
        regex = _constraint_regex(messages, sampling.constraint)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": sampling.seed,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = sampling.logprobs
        if sampling.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": sampling.json_schema, "strict": True},
            }
        if regex is not None:
            body["structured_outputs"] = {"regex": regex}
        return body

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: list[Messages], sampling: Sampling, on_done: OnDone | None = None) -> list[Generation]:
        with activity(f"{len(prompts)} prompts for {self.model} at {self._shown}"):
            return signals.run_async(self._generate_all(prompts, sampling, on_done))

    async def _generate_all(self, prompts: list[Messages], sampling: Sampling, on_done: OnDone | None = None) -> list[Generation]:
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        gate = asyncio.Semaphore(self.concurrency)
        failed: list[BaseException] = []
        sent = answered_now = 0
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits, headers=self._headers(), auth=self._auth) as client:

            async def one(messages: Messages) -> Generation | None:
                nonlocal sent, answered_now
                async with gate:
                    if failed:  # a request failed for good: a dead or refusing server should not get the rest
                        return None
                    sent += 1
                    activity_detail(f"{sent} sent, {answered_now} answered")
                    try:
                        gen = self._held_back(messages, sampling) or await self._post_with_retries(client, self.request_body(messages, sampling), sampling)
                    except Exception as e:  # the others in flight go on: their answers are worth keeping
                        failed.append(e)
                        return None
                answered_now += 1
                activity_detail(f"{sent} sent, {answered_now} answered")
                if on_done is not None:  # progress per response
                    on_done([gen])
                return gen

            gens = list(await asyncio.gather(*(one(m) for m in prompts)))
        answered = sum(g is not None for g in gens)
        if failed and not answered:
            raise failed[0]
        if failed:
            raise PartialGenerations(
                self._scrub(f"{len(failed)} of {len(prompts)} requests failed, {len(prompts) - answered - len(failed)} not sent after that, {answered} answered; first failure: {failed[0]}"),
                gens,
                exit_code=getattr(failed[0], "exit_code", None),
            ) from failed[0]
        return gens  # type: ignore[return-value]

    def _held_back(self, messages: Messages, sampling: Sampling) -> Generation | None:
        """A ``too_long`` generation for a prompt certain not to fit the known context (not sent), else None."""
        if self.context_length is None:
            return None
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        why = context_check(-(-chars // MAX_CHARS_PER_TOKEN), sampling.max_tokens, self.context_length, estimated=True)
        return not_generated(why) if why is not None else None

    async def _post_with_retries(self, client: httpx.AsyncClient, body: dict[str, Any], sampling: Sampling) -> Generation:
        url = f"{self._url}/chat/completions"
        shown = f"{self._shown}/chat/completions"
        for attempt in range(self.max_retries + 1):
            self.requests_sent += 1
            wait: float | None = None
            try:
                # The whole attempt under one deadline: httpx's own timeouts bound each read, so a server
                # sending a byte now and then would otherwise hold the request forever.
                async with asyncio.timeout(self.timeout):
                    r = await client.post(url, json=body)
            except TimeoutError:
                problem = f"no complete answer within --timeout {self.timeout:g}s"
            except httpx.TransportError as e:  # refused, reset, timed out, protocol errors
                problem = f"{type(e).__name__}: {e}"
                if not _server_unavailable(e):  # the URL or the request itself is wrong: no retry helps
                    raise GrtoolError(self._scrub(f"{shown}: {problem}")) from None
            else:
                if r.status_code == 200:
                    try:
                        return self._parse(r, sampling)
                    except MalformedAnswer as e:  # a server mid-restart or a proxy's page: retried, never cached
                        self.malformed_answers += 1
                        problem = f"malformed answer: {self._scrub(str(e))[:500]}"
                else:
                    problem = f"HTTP {r.status_code}: {self._scrub(r.text)[:500]}"  # scrub first: a cut key would leak its start
                    if r.status_code in _CONTEXT_STATUS and _CONTEXT_EXCEEDED.search(r.text) and not _MAX_TOKENS_TOO_LARGE.search(r.text):
                        return not_generated(f"the server says: {problem}")  # this record's fault, not the server's
                    if r.status_code not in RETRY_STATUS:
                        raise GrtoolError(self._scrub(f"{shown}: {problem}"))
                    wait = _retry_after(r)
            if attempt == self.max_retries:  # unreachable, timing out or busy all along: try again later
                raise TransientError(self._scrub(f"{shown}: giving up after {attempt + 1} attempts; last: {problem}"))
            if wait is None:
                wait = random.uniform(0, min(60.0, self.backoff * 2**attempt))  # exponential backoff, full jitter
            log.debug("%s (attempt %d), retrying in %.2fs", self._scrub(problem), attempt + 1, wait)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    def _parse(self, r: httpx.Response, sampling: Sampling) -> Generation:
        """The answer typed (:class:`MalformedAnswer` when it does not decode), as a :class:`Generation`."""
        answer = decode_chat(r.content)
        gen = generation_from(answer, want_logprobs=bool(sampling.logprobs))
        if sampling.logprobs and gen.logprobs is None:
            if not gen.text and not gen.completion_tokens:  # an empty answer has no tokens to score
                gen.logprobs = []
            else:
                raise GrtoolError(self._scrub(f"{self._shown}: logprobs were requested (top_logprobs={sampling.logprobs}) but the server returned none"))
        return gen


def _server_unavailable(e: BaseException) -> bool:
    """The server is down, unreachable, too slow or answering with a status worth retrying (not a refusal)."""
    if isinstance(e, httpx.HTTPStatusError):
        return e.response.status_code in RETRY_STATUS
    if isinstance(e, (httpx.UnsupportedProtocol, httpx.LocalProtocolError)):  # a typo in --base-url, a bad key value
        return False
    return isinstance(e, (TimeoutError, httpx.TransportError))


def _retry_after(r: httpx.Response) -> float | None:
    value = r.headers.get("retry-after")
    try:
        return min(60.0, max(0.0, float(value))) if value is not None else None
    except ValueError:
        return None


def _constraint_regex(messages: Messages, constraint: dict[str, Any] | None) -> str | None:
    """A constraint to the prompt's offered triples travels as a vLLM server's ``structured_outputs`` regex; an index
    lives on this machine, not on the server, so index constraints are refused."""
    if constraint is None:
        return None
    if constraint.get("source") != "prompt":
        raise GrtoolError("the openai backend cannot constrain docids to an index: use --backend transformers or vllm")
    from grtool.index.constraints import offered_regex

    return offered_regex("\n".join(str(m.get("content") or "") for m in messages), constraint.get("triples") or ())
