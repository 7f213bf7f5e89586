"""The ``--model`` checks of the model stages' options, which depend on the backend: a model a local backend could
never load is refused before a command creates anything, and the context is known without loading the model
where it can be. Where models come from is :mod:`grtool.models`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grtool.errors import GrtoolError
from grtool.models import DEFAULT_MODEL_NAME, context_length, resolve_model


def check_model(backend: str, model: str | None) -> None:
    """Refuse a --model a local backend (transformers, vllm) could never load, before a command creates anything:
    a .gguf file or a folder that does not exist, a file that is no model. A name shaped like a Hugging Face id
    is left to the backend (whether the hub or the cache has it is found when it loads)."""
    if backend == "openai" or model is None or model == DEFAULT_MODEL_NAME:
        return
    if model.endswith(".gguf"):
        if not Path(model).expanduser().is_file():
            raise GrtoolError(f"--model {model}: no such GGUF file")
        return
    path = Path(model)
    if path.is_dir():
        return
    if path.exists():
        raise GrtoolError(f"--model {model}: a file, not a model (a folder with config.json and the weights, a .gguf file or a Hugging Face id)")
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # the backend's extra is missing: require_backend says so
        return
    try:
        validate_repo_id(model)
    except HFValidationError:
        raise GrtoolError(f"--model {model}: no such model folder, and not a Hugging Face model id (name or owner/name)") from None


def known_context(backend: str, model: str | None, options: dict[str, Any]) -> int | None:
    """The model's context in tokens when it is known without loading the model, else None: ``--max-context``
    (openai), ``--max-model-len`` (vllm), else the model's config file (transformers, vllm; the same attributes the
    transformers backend reads, :func:`~grtool.llm.transformers_backend.context_length`). vLLM stretches a context
    with rope scaling, so a config that has it leaves the check to the loaded engine."""
    if backend == "openai":
        return options.get("max_context")
    if backend == "vllm" and options.get("max_model_len"):
        return int(options["max_model_len"])
    if backend not in ("vllm", "transformers"):
        return None
    try:
        path = resolve_model(model).path if model is None or model == DEFAULT_MODEL_NAME or model.endswith(".gguf") else model
        if backend == "transformers" and (plain := _plain_config_context(path)) is not None:
            return plain  # read from config.json: importing transformers here costs seconds before any refusal
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
    except (GrtoolError, ImportError, OSError, ValueError):  # not a model this way: the backend says why when it loads it
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if backend == "vllm" and getattr(text_config, "rope_scaling", None):
        return None
    return context_length(config, None)


def _plain_config_context(path: str) -> int | None:
    """The context a local folder's config.json states for a text-only model (no nested text config), as the
    loaded config reads it: the first of the attributes :func:`~grtool.models.context_length` reads that is set.
    None where it takes transformers to know (a hub id, a nested config, no such attribute: class defaults)."""
    from types import SimpleNamespace

    from grtool.models import read_config

    config = read_config(path) if Path(path).is_dir() else None
    if config is None or "text_config" in config:
        return None
    return context_length(SimpleNamespace(**config), None)  # the attributes a loaded config would be read for
