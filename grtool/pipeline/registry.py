"""The commands a pipeline stage can run: its ``run`` words mapped to the command function, declared here.

The runner asks this registry what a stage's command accepts (``--overwrite``) from the function's own
signature, instead of walking the CLI's command tree. ``tests/test_pipeline.py`` checks that the registry
names every stage command of ``grtool`` and agrees with the options the CLI parses.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

# run words -> (module, function): the functions behind the `grtool` commands a pipeline may run
STAGE_COMMANDS: dict[str, tuple[str, str]] = {
    "corpus ingest": ("grtool.cli.corpus", "ingest_cmd"),
    "corpus merge": ("grtool.cli.corpus", "merge_cmd"),
    "corpus stats": ("grtool.cli.corpus", "stats_cmd"),
    "corpus overlap": ("grtool.cli.corpus_overlap", "overlap_cmd"),
    "triples extract": ("grtool.cli.triples", "extract_command"),
    "triples collisions": ("grtool.cli.triples", "collisions_command"),
    "chains synthesize": ("grtool.cli.chains", "synthesize"),
    "chains gold": ("grtool.cli.chains", "gold_cmd"),
    "filters apply": ("grtool.cli.filters", "apply_cmd"),
    "index build": ("grtool.cli.index", "build_cmd"),
    "index query": ("grtool.cli.index", "query_cmd"),
    "index stats": ("grtool.cli.index", "stats_cmd"),
    "export sft": ("grtool.cli.export", "sft_cmd"),
    "export kto": ("grtool.cli.export", "kto_cmd"),
    "export gmr": ("grtool.cli.export", "gmr_cmd"),
    "eval recall": ("grtool.cli.evaluate", "recall_cmd"),
    "eval compare": ("grtool.cli.evaluate", "compare_cmd"),
    "retrieve": ("grtool.cli.retrieve", "retrieve_cmd"),
    "train sft": ("grtool.cli.train", "sft_cmd"),
    "train kto": ("grtool.cli.train", "kto_cmd"),
    "status": ("grtool.cli.status_validate", "status_cmd"),
    "validate": ("grtool.cli.status_validate", "validate_cmd"),
}


def command_name(run: str) -> str:
    """A stage's ``run`` value with its words normalised ("corpus  ingest" -> "corpus ingest")."""
    return " ".join(run.split())


def stage_function(run: str) -> Callable[..., Any] | None:
    """The function behind a stage's command, or None for a command grtool does not have."""
    entry = STAGE_COMMANDS.get(command_name(run))
    if entry is None:
        return None
    module, name = entry
    return getattr(importlib.import_module(module), name)


def accepts(run: str, parameter: str) -> bool:
    """Whether the stage's command takes ``parameter`` (``"overwrite"`` for ``--overwrite``)."""
    function = stage_function(run)
    return function is not None and parameter in inspect.signature(function).parameters


def is_flag(run: str, key: str) -> bool:
    """Whether option ``key`` (``--key``) of the stage's command is an on/off flag: its value must then be a
    bool, else ``--key VALUE`` would turn the flag on and pass VALUE as an argument (``overwrite = "no"``)."""
    return "--" + key.replace("_", "-") in _flags(command_name(run))


def check_arguments(run: str, arguments: list[str], where: str) -> None:
    """Parse a stage's arguments (after the command words) as the CLI will, without running the command, and make
    the checks of options the command makes before it writes (the LLM options: --backend's options, --base-url,
    --model): a wrong choice, number or option of any stage is an error before the first stage writes anything."""
    from grtool.cli.main import _click_errors
    from grtool.errors import GrtoolError, InputError

    command = _click_command(command_name(run))
    if command is None:
        return
    try:
        ctx = command.make_context(f"grtool {command_name(run)}", list(arguments))
        check = getattr(stage_function(run), "check_options", None)  # what the command checks before it writes
        if check is not None:
            check(ctx.params)
    except _click_errors() as e:
        raise InputError(f"{where}: {e.format_message()}") from None
    except GrtoolError as e:  # an option's own parser refused its value (a missing extra for --plot, an empty --out)
        e.args = (f"{where}: {e}",)  # the same error (its type and exit code), naming the stage
        raise


@functools.cache
def _click_command(run: str) -> Any:
    """The CLI's own command for ``run``, as it parses options (None: not a grtool command)."""
    import typer

    from grtool.cli.main import app

    command: Any = typer.main.get_command(app)
    ctx = command.context_class(command)  # typer's own click
    for word in run.split():
        command = command.get_command(ctx, word) if hasattr(command, "get_command") else None
        if command is None:
            return None
    return command


@functools.cache
def _flags(run: str) -> frozenset[str]:
    """The flag options of a command, as the CLI parses them (the option names, not the function's)."""
    command = _click_command(run)
    if command is None:
        return frozenset()
    return frozenset(o for p in command.params if getattr(p, "is_flag", False) for o in (*p.opts, *p.secondary_opts))
