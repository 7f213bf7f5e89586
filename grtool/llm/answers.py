"""What a server or the request cache hands back, typed before anything uses it (DESIGN §8: answers from outside are
verified whole and typed before use; a malformed answer is never cached).

- :func:`decode_chat` reads an OpenAI-compatible ``/chat/completions`` answer; :func:`decode_models` a ``/models``
  listing. A body that does not decode raises :class:`MalformedAnswer` naming the field (msgspec's path, e.g.
  ``$.choices[0].message.content``) and what is wrong: a number or a list where text belongs, a count that is
  text, negative, fractional, a boolean or NaN, a ``finish_reason`` that is not text, no choice at all.
- :func:`decode_generation` reads an entry of the request cache the same way: an entry that does not decode (one
  stored by an older grtool that did not type answers, or edited) is a miss, never a traceback or an answer.

Fields a server adds beyond these are ignored (servers differ in what else they send).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from grtool.llm.base import Generation, TokenLogprobs
from grtool.records import Count, PositiveCount

# A log-probability is a finite number at most 0 (servers write -9999.0 for "impossible"; -inf is not JSON).
LogProb = Annotated[float, msgspec.Meta(le=0.0, ge=-1e30)]
Milliseconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e12)]


class MalformedAnswer(ValueError):
    """An answer that does not decode through its type; the message names the field."""


class _Message(msgspec.Struct):
    content: str | None = None  # null: an empty answer (a tool call, a refusal): the text is ""


class _TopLogprob(msgspec.Struct):
    token: str
    logprob: LogProb


class _TokenLogprob(msgspec.Struct):
    token: str
    logprob: LogProb
    top_logprobs: list[_TopLogprob] | None = None


class _Logprobs(msgspec.Struct):
    content: list[_TokenLogprob] | None = None


class _Choice(msgspec.Struct):
    message: _Message
    finish_reason: str | None = None
    logprobs: _Logprobs | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None


class ChatAnswer(msgspec.Struct):
    choices: Annotated[list[_Choice], msgspec.Meta(min_length=1)]
    usage: _Usage | None = None


class ModelEntry(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(min_length=1)]
    max_model_len: PositiveCount | None = None  # vLLM reports the context here


class _ModelList(msgspec.Struct):
    data: list[ModelEntry]


def _decode(body: bytes | str, kind: type, what: str):
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        raise MalformedAnswer(f"{what}: {e}") from None
    except msgspec.DecodeError as e:
        raise MalformedAnswer(f"{what}: not JSON ({e})") from None


def decode_chat(body: bytes | str) -> ChatAnswer:
    return _decode(body, ChatAnswer, "chat completion")


def decode_models(body: bytes | str) -> list[ModelEntry]:
    return _decode(body, _ModelList, "model list").data


def generation_from(answer: ChatAnswer, *, want_logprobs: bool) -> Generation:
    """The first choice as a :class:`Generation` (``logprobs`` left None when the caller asked for none)."""
    choice = answer.choices[0]
    usage = answer.usage or _Usage()
    gen = Generation(
        text=choice.message.content or "",
        finish_reason=choice.finish_reason or "stop",
        prompt_tokens=usage.prompt_tokens or 0,
        completion_tokens=usage.completion_tokens or 0,
    )
    content = choice.logprobs.content if choice.logprobs is not None else None
    if want_logprobs and content:
        gen.logprobs = [TokenLogprobs(t.token, t.logprob, {a.token: a.logprob for a in t.top_logprobs or ()}) for t in content]
    return gen


class _StoredTokenLogprobs(msgspec.Struct):
    token: str
    logprob: LogProb | None  # null: a local backend's -inf (a token the constraint masked), as orjson writes it
    top: dict[str, LogProb | None] = {}


class _StoredGeneration(msgspec.Struct):
    """:meth:`Generation.to_json`'s shape, bounded."""

    text: str
    finish_reason: Annotated[str, msgspec.Meta(min_length=1)]
    prompt_tokens: Count = 0
    completion_tokens: Count = 0
    logprobs: list[_StoredTokenLogprobs] | None = None
    cached: bool = False
    latency_ms: Milliseconds | None = None
    too_long: str | None = None


def decode_generation(blob: bytes | str) -> Generation:
    """A request cache entry as a :class:`Generation`; :class:`MalformedAnswer` when it does not decode."""
    stored = _decode(blob, _StoredGeneration, "cached generation")
    gen = Generation(
        text=stored.text, finish_reason=stored.finish_reason, prompt_tokens=stored.prompt_tokens,
        completion_tokens=stored.completion_tokens, cached=stored.cached, latency_ms=stored.latency_ms, too_long=stored.too_long,
    )  # fmt: skip
    if stored.logprobs is not None:
        gen.logprobs = [TokenLogprobs(t.token, t.logprob, dict(t.top)) for t in stored.logprobs]
    return gen


def check_generation(gen: Generation) -> None:
    """A generation a backend made in this process is one the cache can read back (the same bounds):
    :class:`MalformedAnswer` otherwise, so nothing malformed is ever stored."""
    decode_generation(gen.to_json())
