"""The LLM layer's interface: every backend takes chat messages and sampling parameters, returns generations.

Backends (``vllm``, ``openai``, ``transformers``) implement :class:`Backend`; the request cache wraps any
backend. Stages only see this module's types.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import orjson

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

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
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

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes | str) -> "Generation":
        d = orjson.loads(data)
        lps = d.pop("logprobs", None)
        g = cls(**d)
        if lps is not None:
            g.logprobs = [TokenLogprobs(**t) for t in lps]
        return g


class Backend(Protocol):
    """A model behind one of the backends."""

    name: str  # "vllm" | "openai" | "transformers"
    model: str  # the model name recorded in outputs and cache keys

    def generate(self, prompts: list[Messages], sampling: Sampling) -> list[Generation]:
        """One generation per prompt, in order."""
        ...


def request_hash(model: str, messages: Messages, sampling: Sampling) -> str:
    """The cache key: model + messages + every sampling parameter (parsing is deliberately outside it)."""
    payload = orjson.dumps({"model": model, "messages": messages, "sampling": sampling.as_dict()}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(payload).hexdigest()
