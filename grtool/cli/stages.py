"""The CLI's side of the pipeline's stage registry: the declared commands (grtool/cli/commands.py) a stage may run.

``grtool.pipeline`` knows stages only through :class:`grtool.pipeline.registry.StageCommands`; this module
implements it from the commands' declarations: what a command accepts, and a stage's options converted to the
command's options Struct (grtool/cli/stage_options.py), are read from its function's signature. ``tests/pipeline/test_pipeline.py`` checks that it names every stage command of
``grtool``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from grtool.cli.commands import check_declared_outputs, declared, find, input_files
from grtool.cli.stage_options import args_without, option_keys, parameters, stage_values
from grtool.errors import GrtoolError
from grtool.pipeline.registry import Command, StageCommands


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
        command = _stage(run)
        return option_keys(command) if command is not None else {}

    def check_arguments(self, run: str, args: list[Any], options: dict[str, Any], where: str) -> None:
        """Convert the stage's options to the command's options Struct and make the checks of them the command
        makes before it writes: its outputs against each other and its inputs, the LLM options (--backend's
        options, --base-url, --model)."""
        declaration = _stage(run)
        if declaration is None:
            return
        values = stage_values(declaration, args, options, where).values
        try:
            check_declared_outputs(declaration, values)  # its outputs against each other and what it reads
            if declaration.check is not None:  # what the command checks before it writes
                declaration.check(values)
        except GrtoolError as e:  # the same error (its type and exit code), naming the stage
            e.args = (f"{where}: {e}",)
            raise

    def extras(self, run: str, args: list[Any], options: dict[str, Any]) -> list[tuple[str, str]]:
        declaration = _stage(run)
        if declaration is None:
            return []
        return declaration.extras(stage_values(declaration, args, options, run).values)

    def args_without(self, run: str, args: list[Any], key: str) -> list[Any]:
        declaration = _stage(run)
        return args_without(declaration, args, key) if declaration is not None else args

    def values(self, run: str, args: list[Any], options: dict[str, Any]) -> dict[str, Any]:
        declaration = _stage(run)
        if declaration is None:
            return options
        try:
            converted = stage_values(declaration, args, options, run)
        except GrtoolError:  # refused, naming the stage, by the check of its options (check_arguments)
            return options
        return {name: _text(value) for name, value in converted.values.items() if name in converted.given}

    def input_paths(self, run: str, args: list[Any], options: dict[str, Any]) -> list[tuple[str, str]]:
        """The path parameters the command declares it reads, as the stage names them."""
        return [(label, path) for label, _, path in _inputs(run, args, options)]

    def input_tables(self, run: str, args: list[Any], options: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
        declaration = _stage(run)
        return [(label, path, declaration.input_tables[name]) for label, name, path in _inputs(run, args, options) if name in declaration.input_tables]

    def invoke(self, argv: list[str]) -> int | None:
        from grtool.errors import InputError

        if self.root is None:
            raise InputError(f"cannot run grtool {' '.join(argv)}: no grtool command to run it through")
        return self.root.main(argv, standalone_mode=False, prog_name="grtool")  # the same command as `grtool`


def _text(value: Any) -> Any:
    """A converted value with its paths as text (as a pipeline file holds them)."""
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    return str(value) if isinstance(value, PurePath) else value


def _inputs(run: str, args: list[Any], options: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(label, parameter, path)`` of each path the stage names for a parameter the command reads."""
    declaration = _stage(run)
    if declaration is None:
        return []
    converted = stage_values(declaration, args, options, run)
    found = []
    for p in parameters(declaration):
        kind = declaration.reads.get(p.name)
        if kind is not None and p.name in converted.given:
            label = f"argument {p.label}" if p.argument else p.label
            found += [(label, p.name, text) for text in input_files(kind, converted.values[p.name])]
    return found
