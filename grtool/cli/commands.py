"""The declared commands of ``grtool``: each command module registers its :class:`Command` here, beside its Typer
function, and ``cli/main.py`` builds the ``grtool`` command from them, as the pipeline learns its stages from them.

A new command is one file: a module in ``grtool/cli/`` that calls :func:`register` (found by :func:`declared`), or
any program that calls :func:`register` before it runs ``grtool.cli.main.run()``.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grtool.pipeline.registry import Command, PathKind, command_name

__all__ = ["Command", "Group", "PathKind", "click_command", "click_errors", "declared", "group", "register"]


@dataclass(frozen=True)
class Group:
    """A word that gathers commands (``corpus`` for ``corpus ingest``) and its line in ``grtool --help``."""

    name: str
    help: str


_COMMANDS: dict[str, Command] = {}
_GROUPS: dict[str, Group] = {}
_LISTENERS: list[Callable[[Command | Group], None]] = []


def register(declaration: Command | Group) -> Command | Group:
    """Declare a command (or a group of commands); a command's group is registered before it. A command
    registered after ``grtool.cli.main`` was imported joins its app all the same."""
    if isinstance(declaration, Group):
        table: dict[str, Any] = _GROUPS
        key = declaration.name
    else:
        table, key = _COMMANDS, declaration.words
        group = key.split()[0]
        if " " in key and group not in _GROUPS:
            raise ValueError(f"command {key!r}: register its group {group!r} first")
    if key in table:
        if table[key] is declaration:
            return declaration
        raise ValueError(f"{key!r} is declared twice")
    table[key] = declaration
    for listener in _LISTENERS:
        listener(declaration)
    return declaration


def declared() -> dict[str, Command]:
    """Every command: those of the modules in ``grtool/cli/`` (imported here) and those registered since."""
    _discover()
    return dict(_COMMANDS)


def group(name: str) -> Group:
    """A registered group (its commands register it first)."""
    return _GROUPS[name]


def on_register(listener: Callable[[Command | Group], None]) -> None:
    """Call ``listener`` with every declaration registered from now on."""
    _LISTENERS.append(listener)


_DISCOVERY: list[bool] = []  # begun: a module found here that asks again (through a listener) waits for it


def _discover() -> None:
    import grtool.cli

    if _DISCOVERY:
        return
    _DISCOVERY.append(True)
    for module in pkgutil.iter_modules(grtool.cli.__path__):  # alphabetical: a group's file before its extensions
        importlib.import_module(f"grtool.cli.{module.name}")


def find(run: str) -> Command | None:
    return declared().get(command_name(run))


@functools.cache
def click_command(run: str) -> Any:
    """The Click command of ``run`` as ``grtool`` parses it (numbers through grtool.userinput), without the root
    app; None for a command not declared."""
    import typer
    import typer.main

    from grtool.cli.typed import bound_numbers

    command = find(run)
    if command is None:
        return None
    single = typer.Typer()
    add_command(single, command, command.words.split()[-1])
    return bound_numbers(typer.main.get_command(single))  # one command, no callback: Typer gives the command itself


def add_command(app: Any, command: Command, name: str) -> None:
    """The one way a declared command becomes a Typer command."""
    settings: dict[str, Any] = {"help": command.help, "hidden": command.hidden}
    if command.cls is not None:
        settings["cls"] = command.cls
    app.command(name, **settings)(command.function)


def click_errors() -> tuple[type[Exception], ...]:
    """Click's exception class, from click itself and from the copy that newer Typer releases vendor."""
    found = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(name).ClickException)
        except ImportError:
            continue
    return tuple(found)
