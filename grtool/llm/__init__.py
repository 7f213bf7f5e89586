"""The LLM layer: one interface (:mod:`grtool.llm.base`), three backends, a persistent request cache.

    llm = CachedLLM(make_backend("vllm", "meta-llama/Llama-3.1-8B-Instruct", tensor_parallel_size=4), cache_path)
    generations = llm.generate([[{"role": "user", "content": "..."}]], Sampling(max_tokens=512))

Backends are imported lazily: ``openai`` needs only httpx, ``transformers`` needs torch, ``vllm`` needs vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grtool.errors import GrtoolError

if TYPE_CHECKING:
    from grtool.llm.base import Backend, Generation, Messages, Sampling, TokenLogprobs, request_hash

BACKENDS = ("transformers", "openai", "vllm")
DEFAULT_BACKEND = "transformers"

__all__ = ["BACKENDS", "Backend", "Generation", "Messages", "Sampling", "TokenLogprobs", "make_backend", "request_hash"]
_FROM_BASE = {"Backend", "Generation", "Messages", "Sampling", "TokenLogprobs", "request_hash"}


def __getattr__(name: str) -> Any:
    """The interface's names, from grtool.llm.base when first asked for: the commands' declarations read the
    backends' names here without loading it (``grtool --help`` stays quick)."""
    if name in _FROM_BASE:
        from grtool.llm import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_backend(name: str = DEFAULT_BACKEND, model: str | None = None, **options: Any) -> Backend:
    """A backend by name; ``model=None`` is the embedded default model (SmolLM2-135M-Instruct).

    Options that are ``None`` are ignored, so a CLI can pass every option it has; a set option the chosen backend
    does not use is an error (``--tensor-parallel-size`` with ``--backend openai`` is a mistake worth reporting).
    """
    return backend_class(name)(model, **check_backend_options(name, options))


def backend_class(name: str) -> type[Backend]:
    """The class of a backend by name (importing its module only: the heavy libraries load when it starts)."""
    if name == "transformers":
        from grtool.llm.transformers_backend import TransformersBackend as cls
    elif name == "vllm":
        from grtool.llm.vllm_backend import VLLMBackend as cls
    elif name == "openai":
        from grtool.llm.openai_backend import OpenAIBackend as cls
    else:
        raise GrtoolError(f"unknown LLM backend {name!r} (choose one of: {', '.join(BACKENDS)})")
    return cls


def check_backend_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The set (not None) ``options``; an option the backend does not take, or a value it can never use, is an
    error, raised before a command creates anything."""
    options = {k: v for k, v in options.items() if v is not None}
    cls = backend_class(name)
    unknown = sorted(set(options) - set(cls.OPTIONS))
    if unknown:
        flags = ", ".join("--" + k.replace("_", "-") for k in unknown)
        raise GrtoolError(f"{flags} does not apply to the {name} backend (it takes: {', '.join(sorted(cls.OPTIONS))})")
    check = getattr(cls, "check_options", None)  # a backend's own checks of values (openai: --base-url)
    if check is not None:
        check(options)
    return options
