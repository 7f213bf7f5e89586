"""What each stage of a pipeline needs installed, from its command line alone: a pipeline checks every stage's
extras before the first one runs (the commands check the same again themselves)."""

from __future__ import annotations

from typing import Any

from grtool.extras import BACKEND_EXTRAS
from grtool.llm.models import DEFAULT_MODEL_NAME

# the commands that generate with an LLM backend (option --backend, default transformers)
_GENERATING = ("triples extract", "chains synthesize", "retrieve")


def command_extras(run: str, options: dict[str, Any]) -> list[tuple[str, str]]:
    """(extra, feature) pairs a command line needs, from its words and options (option names with underscores),
    for a pipeline to check every stage before the first one runs. The commands check the same themselves."""
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
