"""The CLI's side of the pipeline's stage registry: the declared commands (grtool/cli/commands.py) a stage may run.

``grtool.pipeline`` knows stages only through :class:`grtool.pipeline.registry.StageCommands`; this module
implements it from the commands' declarations (what a command accepts is read from its function's signature, how
it parses options from its Click command). ``tests/pipeline/test_pipeline.py`` checks that it names every stage command of
``grtool``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from grtool.cli.commands import click_command, click_errors, declared, find, input_files
from grtool.pipeline.registry import Command, StageCommands, command_name


def stage_function(run: str) -> Callable[..., Any] | None:
    """The function behind a stage's command, or None for a command grtool does not have."""
    command = _stage(run)
    return command.function if command is not None else None


def _stage(run: str) -> Command | None:
    command = find(run)
    return command if command is not None and command.stage else None


class CliCommands(StageCommands):
    """The stage commands; ``invoke`` runs a command line through ``root`` (the ``grtool`` Click command, as
    ``pipeline run`` finds it in its context), which checks and plans need not have."""

    def __init__(self, root: Any = None) -> None:
        self.root = root

    def names(self) -> list[str]:
        return [words for words, command in declared().items() if command.stage]

    def declared(self, run: str) -> Command | None:
        return _stage(run)

    def accepts(self, run: str, parameter: str) -> bool:
        command = _stage(run)
        return command is not None and command.accepts(parameter)

    def is_flag(self, run: str, key: str) -> bool:
        # A flag's value must be a bool, else `--key VALUE` would turn it on and pass VALUE as an argument.
        return self.options(run).get(key.replace("-", "_"), False)

    def options(self, run: str) -> dict[str, bool]:
        return _options(command_name(run))

    def check_arguments(self, run: str, arguments: list[str], where: str) -> None:
        """Parse as the CLI will, without running the command, and make the checks of options the command makes
        before it writes (the LLM options: --backend's options, --base-url, --model)."""
        from grtool.errors import GrtoolError, InputError

        declaration = _stage(run)
        if declaration is None:
            return
        try:
            ctx = _parsed(run, arguments)
            if declaration.check is not None:  # what the command checks before it writes
                declaration.check(ctx.params)
        except click_errors() as e:
            raise InputError(f"{where}: {e.format_message()}") from None
        except GrtoolError as e:  # an option's own parser refused its value (a missing extra for --plot, an empty --out)
            e.args = (f"{where}: {e}",)  # the same error (its type and exit code), naming the stage
            raise

    def extras(self, run: str, arguments: list[str]) -> list[tuple[str, str]]:
        declaration = _stage(run)
        if declaration is None:
            return []
        return declaration.extras(_parsed(run, arguments).params)

    def input_paths(self, run: str, arguments: list[str]) -> list[tuple[str, str]]:
        """The path parameters the command declares it reads, as given on the command line."""
        return [(label, path) for label, _, path in _inputs(run, arguments)]

    def input_tables(self, run: str, arguments: list[str]) -> list[tuple[str, str, tuple[str, ...]]]:
        declaration = _stage(run)
        return [(label, path, declaration.input_tables[name]) for label, name, path in _inputs(run, arguments) if name in declaration.input_tables]

    def invoke(self, argv: list[str]) -> int | None:
        from grtool.errors import InputError

        if self.root is None:
            raise InputError(f"cannot run grtool {' '.join(argv)}: no grtool command to run it through")
        return self.root.main(argv, standalone_mode=False, prog_name="grtool")  # the same command as `grtool`


def _inputs(run: str, arguments: list[str]) -> list[tuple[str, str, str]]:
    """``(label, parameter, path)`` of each path the command line names for a parameter the command reads."""
    declaration = _stage(run)
    if declaration is None:
        return []
    command = click_command(declaration.words)
    ctx = _parsed(run, arguments)
    found = []
    for param in command.params:
        kind = declaration.reads.get(param.name)
        if kind is None or str(ctx.get_parameter_source(param.name)) != "ParameterSource.COMMANDLINE":
            continue
        positional = not param.opts[0].startswith("-")
        label = f"argument {param.name.upper()}" if positional else max(param.opts, key=len)
        found += [(label, param.name, text) for text in input_files(kind, ctx.params.get(param.name))]
    return found


def _parsed(run: str, arguments: list[str]) -> Any:
    """The command line's Click context: its options as the command parses them (defaults included)."""
    return click_command(command_name(run)).make_context(f"grtool {command_name(run)}", list(arguments))


@functools.cache
def _options(run: str) -> dict[str, bool]:
    """A command's options as the CLI parses them, by key (``--no-json`` as ``no_json``), each True for a flag;
    without those that are no part of the command (``--install-completion``: shell completion, not a value)."""
    command = click_command(run) if _stage(run) is not None else None
    if command is None:
        return {}
    return {o[2:].replace("-", "_"): bool(p.is_flag or p.count)
            for p in command.params if p.param_type_name == "option" and p.expose_value
            for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}  # fmt: skip
