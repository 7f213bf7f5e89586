"""The LLM layer's interface: every backend takes chat messages and sampling parameters, returns generations.

Backends (``vllm``, ``openai``, ``transformers``) implement :class:`Backend`; the request cache wraps any
backend. Stages only see this module's types.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import orjson

from grtool import secrets
from grtool.errors import GrtoolError, InputError

Messages = list[dict[str, str]]  # [{"role": "system"|"user"|"assistant", "content": "..."}]


@dataclass(frozen=True)
class Sampling:
    """Every parameter that changes what a model returns; all of them are part of the cache key."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int = 0
    logprobs: int | None = None  # top-k alternatives per generated token, when the caller needs them
    json_schema: dict[str, Any] | None = None  # structured output, when the backend supports it
    stop: tuple[str, ...] = ()
    # Hybrid docid decoding (`grtool retrieve`): {"index", "fingerprint", "markers", "max_docids"}, see
    # grtool.index.decoding.constraint_from_spec; backends without constrained decoding refuse it.
    constraint: dict[str, Any] | None = None
    beams: int = 1  # beam search width (transformers; GMR-style document decoding)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        for name, unset in (("constraint", None), ("beams", 1)):
            if d[name] == unset:
                del d[name]  # keeps the cache keys of requests made before these fields existed
        if d.get("constraint") and "triples" in d["constraint"]:
            # The parts of the offered triples (`chains synthesize --constrain`) are the batch's; a request's
            # prompt lists its own, so they stay out of its cache key.
            d["constraint"] = {k: v for k, v in d["constraint"].items() if k != "triples"}
        return d


@dataclass
class TokenLogprobs:
    """One generated token: its text, its logprob, and the top-k alternatives (token text -> logprob)."""

    token: str
    logprob: float
    top: dict[str, float] = field(default_factory=dict)


@dataclass
class Generation:
    text: str
    finish_reason: str  # "stop" | "length" | ...
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = None
    cached: bool = False
    latency_ms: float | None = None  # wall time until this generation was ready (transformers: its own last token; vLLM: its chunk)
    # Set when nothing was generated because the prompt does not fit the model's context: why (finish_reason
    # is then "too_long"). Stages reject such a record with reason ``too_long``; the cache never keeps it.
    too_long: str | None = None

    def to_json(self) -> bytes:
        d = asdict(self)
        if d["too_long"] is None:
            del d["too_long"]  # the cache's entries stay as they were before this field existed
        return orjson.dumps(d)


class PartialGenerations(GrtoolError):
    """Some requests of a ``generate`` call failed; ``generations`` holds the others by position (None = failed)."""

    def __init__(self, message: str, generations: list[Generation | None], exit_code: int | None = None):
        super().__init__(message, exit_code)
        self.generations = generations


OnDone = Callable[[list["Generation"]], None]


class Backend(Protocol):
    """A model behind one of the backends."""

    name: str  # "vllm" | "openai" | "transformers"
    model: str  # the model name recorded in outputs and cache keys

    def generate(self, prompts: list[Messages], sampling: Sampling, on_done: OnDone | None = None) -> list[Generation]:
        """One generation per prompt, in order.

        ``on_done(generations)``, when given, is called as requests finish (each generation once, in the order
        they finish: transformers after each internal batch, openai per response, vllm per chunk), so progress
        moves per request rather than per call.
        """
        ...


TOO_LONG = "too_long"  # the finish reason and the reject reason of a prompt that does not fit the context


def check_room(max_tokens: int, context: int | None) -> None:
    """Refuse a ``--max-tokens`` that leaves no room for any prompt: the option is wrong, not a record. Commands
    ask it before creating anything when the context is known without loading the model
    (:func:`grtool.llm.models.known_context`); backends ask it again with the loaded model's context."""
    if context is not None and max_tokens >= context:
        raise InputError(f"--max-tokens {max_tokens} leaves no room for a prompt in the model's context of {context} tokens")


def context_check(prompt_tokens: int, max_tokens: int, context: int | None, *, estimated: bool = False) -> str | None:
    """Why a prompt cannot be sent (its tokens and the most it may generate exceed the context), or None.

    Every backend asks this before generating: a model given more than its context either fails the whole batch
    (vLLM) or silently answers from a truncated or out-of-range prompt (transformers).
    """
    if context is None or prompt_tokens + max_tokens <= context:
        return None
    check_room(max_tokens, context)
    counted = "at least " if estimated else ""
    return f"the prompt has {counted}{prompt_tokens} tokens; with --max-tokens {max_tokens} that exceeds the model's context of {context} tokens"


def not_generated(why: str, prompt_tokens: int = 0) -> Generation:
    """The answer for a prompt that was not sent because it does not fit the model's context."""
    return Generation(text="", finish_reason=TOO_LONG, prompt_tokens=prompt_tokens, too_long=why)


def redact_generation(gen: Generation) -> Generation:
    """``gen`` with every known credential (:mod:`grtool.secrets`) masked in its text and its logprobs' tokens, in
    place: whatever a stage stores (rows, ``llm_calls``, the request cache, rejects) comes from these texts.

    A server can echo a key it was sent (an error page, a model repeating its input); such a key must not end up
    in the outputs any more than on stderr. A key spread over several tokens masks every token it touches.
    """
    if not secrets.registered():
        return gen
    gen.text = secrets.redact_known(gen.text)
    if gen.too_long:
        gen.too_long = secrets.redact_known(gen.too_long)
    if gen.logprobs:
        _redact_tokens(gen.logprobs)
    return gen


def _redact_tokens(tokens: list[TokenLogprobs]) -> None:
    joined = "".join(t.token for t in tokens)
    spans = secrets.known_spans(joined)
    alternatives = [alt for t in tokens for alt in t.top]
    if not spans and not any(secrets.redact_known(a) != a for a in alternatives):
        return
    start = 0
    for t in tokens:
        end = start + len(t.token)
        if any(s < end and start < e for s, e in spans):
            best = max(t.top.values(), default=t.logprob)
            t.token, t.top = secrets.MASK, {secrets.MASK: best}  # the alternatives here may hold the key's next piece
        else:
            t.token = secrets.redact_known(t.token)
            t.top = {secrets.redact_known(k): v for k, v in t.top.items()}
        start = end


def request_hash(model: str, messages: Messages, sampling: Sampling) -> str:
    """The cache key: model + messages + every sampling parameter (parsing is deliberately outside it)."""
    payload = orjson.dumps({"model": model, "messages": messages, "sampling": sampling.as_dict()}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(payload).hexdigest()


def require_logprobs(backend: str, generations: list[Generation], sampling: Sampling) -> None:
    """Fail clearly when logprobs were asked for and a backend or server silently left them out."""
    if not sampling.logprobs:
        return
    for g in generations:
        if g.completion_tokens and not g.logprobs:
            raise GrtoolError(
                f"the {backend} backend returned no logprobs although logprobs={sampling.logprobs} was requested "
                "(does the server support 'logprobs'/'top_logprobs'? vLLM servers may need --max-logprobs)"
            )


def logprobs_summary(generation: Generation) -> dict[str, Any] | None:
    """What the llm_calls table keeps of the logprobs: enough to audit confidence, not the whole list."""
    lps = generation.logprobs
    if not lps:
        return None
    values = [t.logprob for t in lps]
    return {"tokens": len(values), "mean_logprob": sum(values) / len(values), "min_logprob": min(values)}


def chunks(items: list, size: int):
    """Consecutive slices of at most ``size`` items."""
    size = max(1, int(size))
    for start in range(0, len(items), size):
        yield items[start : start + size]
