"""The CLI's side of the pipeline's stage registry: the functions behind the commands a stage may run.

``grtool.pipeline`` knows stages only through :class:`grtool.pipeline.registry.StageCommands`; this module
implements it from the Typer app (what a command accepts is read from its function's signature, how it parses
options from its Click command). ``tests/test_pipeline.py`` checks that it names every stage command of ``grtool``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grtool.pipeline.registry import StageCommands, command_name

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
    "show": ("grtool.cli.show_report", "show_cmd"),
    "report": ("grtool.cli.show_report", "report_cmd"),
}


def stage_function(run: str) -> Callable[..., Any] | None:
    """The function behind a stage's command, or None for a command grtool does not have."""
    entry = STAGE_COMMANDS.get(command_name(run))
    if entry is None:
        return None
    module, name = entry
    return getattr(importlib.import_module(module), name)


class CliCommands(StageCommands):
    def names(self) -> list[str]:
        return list(STAGE_COMMANDS)

    def accepts(self, run: str, parameter: str) -> bool:
        function = stage_function(run)
        return function is not None and parameter in inspect.signature(function).parameters

    def is_flag(self, run: str, key: str) -> bool:
        # A flag's value must be a bool, else `--key VALUE` would turn it on and pass VALUE as an argument.
        return "--" + key.replace("_", "-") in _flags(command_name(run))

    def check_arguments(self, run: str, arguments: list[str], where: str) -> None:
        """Parse as the CLI will, without running the command, and make the checks of options the command makes
        before it writes (the LLM options: --backend's options, --base-url, --model)."""
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

    def input_paths(self, run: str, arguments: list[str]) -> list[tuple[str, str]]:
        """The path parameters given on the command line (typed ``Path`` in the command's function, and its
        positional arguments, which name what it reads), less those it writes (``--out``, ``--report``, ...)."""
        command, function = _click_command(command_name(run)), stage_function(run)
        if command is None or function is None:
            return []
        hints = typing.get_type_hints(function)
        ctx = command.make_context(f"grtool {command_name(run)}", list(arguments))
        found = []
        for param in command.params:
            positional = not param.opts[0].startswith("-")
            if param.name in _WRITTEN or param.name in _NOT_PATHS or str(ctx.get_parameter_source(param.name)) != "ParameterSource.COMMANDLINE":
                continue
            if not (positional or _names_a_path(hints.get(param.name))):
                continue
            value = ctx.params.get(param.name)
            label = f"argument {param.name.upper()}" if positional else max(param.opts, key=len)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                text = str(item) if item is not None else ""
                if param.name in _LABELLED and "=" in text and not Path(text).exists():
                    text = text.split("=", 1)[1]  # LABEL=FILE, read as the command reads it
                if text and text != "-" and "://" not in text:  # stdin and URLs are not files
                    found.append((label, text))
        return found

    def invoke(self, argv: list[str]) -> int | None:
        from grtool.cli.main import app  # the same Typer app as the `grtool` command

        return app(argv, standalone_mode=False, prog_name="grtool")


COMMANDS = CliCommands()

_WRITTEN = frozenset({"out", "report", "plot", "cache_dir"})  # path parameters a command writes, not reads
_NOT_PATHS = frozenset({"text"})  # positional arguments that are not files (index query's query text)
_LABELLED = frozenset({"reports"})  # positional arguments given as LABEL=FILE (eval compare)


def _names_a_path(hint: Any) -> bool:
    """``Path``, ``Optional[Path]``, ``list[Path]``."""
    return hint is Path or any(_names_a_path(a) for a in typing.get_args(hint))


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
