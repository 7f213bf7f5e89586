"""The declared commands of ``grtool``: each command module registers its :class:`Command` here, beside its Typer
function, and ``cli/main.py`` builds the ``grtool`` command from them, as the pipeline learns its stages from them.

A new command is one file: a module in ``grtool/cli/`` that calls :func:`register` (found by :func:`declared`), or
any program that calls :func:`register` before it runs ``grtool.cli.main.run()``.

Declarations are cheap: a command module imports its work inside its functions, and a group's Click commands are
made from the declarations only when looked up (:class:`DeclaredCommands`), so ``grtool --help`` builds the lines it
shows and ``grtool status DIR`` builds one command.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from grtool.errors import InputError
from grtool.pipeline.registry import Command, FilesOutput, PathKind, RunOutput, TableInput, TableOutput, command_name

__all__ = ["Command", "FilesOutput", "Group", "PathKind", "RunOutput", "TableInput", "TableOutput", "click_command", "click_errors", "declared", "group", "register"]


@dataclass(frozen=True)
class Group:
    """A word that gathers commands (``corpus`` for ``corpus ingest``) and its line in ``grtool --help``."""

    name: str
    help: str


_COMMANDS: dict[str, Command] = {}
_GROUPS: dict[str, Group] = {}


def register(declaration: Command | Group) -> Command | Group:
    """Declare a command (or a group of commands); a command's group is registered before it. A command
    registered after ``grtool.cli.main`` was imported joins its app all the same (its groups read the
    declarations when they are looked up)."""
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
    for spec in getattr(declaration, "tables", {}).values():
        if spec.schema is not None:  # a table of the command's own (pyarrow is imported only for one)
            from grtool.store.schemas import register_table

            register_table(spec.name, spec.schema, spec.key, text=spec.text, fields=spec.fields)
    table[key] = declaration
    return declaration


def declared() -> dict[str, Command]:
    """Every command: those of the modules in ``grtool/cli/`` (imported here) and those registered since."""
    _discover()
    return dict(_COMMANDS)


def group(name: str) -> Group:
    """A registered group (its commands register it first)."""
    return _GROUPS[name]


_DISCOVERY: list[bool] = []  # begun: a module found here that asks again waits for it


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
    command = find(run)
    return make_click_command(command) if command is not None else None


def add_command(app: Any, command: Command, name: str) -> None:
    """The one way a declared command becomes a Typer command."""
    settings: dict[str, Any] = {"help": command.help, "hidden": command.hidden}
    if command.cls is not None:
        settings["cls"] = command.cls
    app.command(name, **settings)(claiming_outputs(command))


def claiming_outputs(command: Command) -> Any:
    """The command's function, preceded by the one check of everything it declares it writes against everything it
    declares it reads (grtool.store.outputs.check_outputs): the same refusals for every output option of every
    command, before the command does any work. The command then writes through its claims."""
    if not command.writes and not command.reads and command.report is None:
        return command.function

    @functools.wraps(command.function)
    def checked(*args: Any, **options: Any) -> Any:
        check_declared_outputs(command, options)
        check_input_tables(command, options)
        check_redirected_stdout(command, options)
        _RUNNING.append(command)
        try:
            return command.function(*args, **options)
        finally:
            _RUNNING.pop()

    return checked


_RUNNING: list[Command] = []  # the declared commands running in this process, innermost last (a stage of `pipeline run`)


def running() -> Command | None:
    """The declared command whose function is running (what its ``--json`` report is declared by)."""
    return _RUNNING[-1] if _RUNNING else None


def check_declared_outputs(command: Command, options: dict[str, Any]) -> None:
    """Everything the command declares it writes, given its parsed ``options``, against everything it declares it
    reads and against each other (:func:`grtool.store.outputs.check_outputs`): before the command runs, and for a
    pipeline stage before the first stage runs."""
    if command.writes:
        from grtool.store.outputs import check_outputs

        outputs = [(option_flag(command, name), options.get(name), kind is PathKind.REPORT) for name, kind in command.writes.items()]
        outputs += [(f"{option_flag(command, name)} (the file beside it)", path, True) for name, path in command.files_beside(options)]
        runs = [options.get(name) for name, kind in command.writes.items() if kind is PathKind.RUN]
        raw = [path for name, kind in command.reads.items() if kind is PathKind.FILE for path in input_files(kind, options.get(name))]
        check_outputs(outputs, holders=[path for _, path in declared_inputs(command, options)], runs=runs, raw=raw)


def check_redirected_stdout(command: Command, options: dict[str, Any]) -> None:
    """Standard output redirected to a file (``> FILE``) is written like an output: never into an input, nor inside
    a stage, index or model the command reads (``export gmr run --out - > run/questions/x.jsonl`` would leave a
    stray file in the stage it reads); inside a run directory holding them is fine."""
    import os
    import stat

    try:
        if not stat.S_ISREG(os.fstat(1).st_mode):  # a terminal or a pipe: nothing more to load (`status` stays light)
            return
    except OSError:
        return
    from grtool.store.outputs import input_stage, refuse_output_among_inputs, stdout_file

    redirected = stdout_file()
    if redirected is None:
        return
    from grtool.store.records import is_stage_dir

    stages = [input_stage(path, table) for name, tables in command.input_tables.items()
              for path in input_files(command.reads[name], options.get(name)) for table in tables]  # fmt: skip
    holders = [path for _, path in declared_inputs(command, options)]
    # a run directory read whole (corpus stats RUN): its stage directories are what the command reads
    stages += [entry.path for h in holders if os.path.isdir(h) and not is_stage_dir(h) for entry in os.scandir(h) if entry.is_dir() and is_stage_dir(entry.path)]
    try:
        refuse_output_among_inputs(redirected, inputs=stages, holders=holders, flag="standard output, redirected to")
    except InputError as e:
        raise InputError(f"{e} (the shell made or emptied it before grtool started; grtool wrote nothing there)") from None


def check_input_tables(command: Command, options: dict[str, Any]) -> None:
    """Each stage table a read parameter declares (:class:`TableInput`) is where the command will look, before it
    does any work (loads a model, opens its output): the error resolving it would give later, naming the option.
    Only directories: a path that does not exist, or a file (a JSON Lines file where one is accepted), is the
    command's to judge, in its own words."""
    import os

    from grtool.errors import GrtoolError
    from grtool.store.records import resolve_stage

    for name, tables in command.input_tables.items():
        for path in input_files(command.reads[name], options.get(name)):
            for table in tables if os.path.isdir(path) else ():
                try:
                    resolve_stage(path, table)
                except GrtoolError as e:  # the same error (its type and exit code: a damaged record's too), naming the option
                    e.args = (f"{option_flag(command, name)}: {e}",)
                    raise


def declared_inputs(command: Command, options: dict[str, Any]) -> list[tuple[str, str]]:
    """``(flag, path)`` of what the parsed ``options`` name as inputs."""
    return [(option_flag(command, name), path) for name, kind in command.reads.items() for path in input_files(kind, options.get(name))]


def input_files(kind: PathKind, value: Any) -> list[str]:
    """The paths a read parameter's parsed value names, as the command reads them: a LABEL=FILE as its file;
    stdin (``-``) and URLs left out."""
    from pathlib import Path

    found = []
    for item in value if isinstance(value, (list, tuple)) else [value]:
        text = str(item) if item is not None else ""
        if kind is PathKind.LABELLED_FILE and "=" in text and not Path(text).exists():
            text = text.split("=", 1)[1]
        if text and text != "-" and "://" not in text:
            found.append(text)
    return found


def option_flag(command: Command, name: str) -> str:
    """How the command line names parameter ``name``: its longest option, or ``ARGUMENT`` for an argument."""
    from grtool.cli.stage_options import parameters

    return next((p.label for p in parameters(command) if p.name == name), name.upper())


def make_click_command(command: Command) -> Any:
    """The Click command of a declaration, as Typer makes it for a group (numbers through grtool.userinput)."""
    import typer
    import typer.main

    from grtool.cli.typed import bound_numbers, one_file_outputs

    single = typer.Typer(add_completion=False)
    add_command(single, command, command.words.split()[-1])
    made = bound_numbers(typer.main.get_command(single))  # one command: Typer gives it itself
    return _with_help_style(one_file_outputs(made, {name for name, kind in command.writes.items() if kind is PathKind.REPORT}))


def make_group(name: str) -> Any:
    """The Click group of a registered group word, its commands made when looked up."""
    import typer
    import typer.main

    group = typer.main.get_group(typer.Typer(name=name, help=_GROUPS[name].help, no_args_is_help=True))
    group.commands = DeclaredCommands(name)
    return _with_help_style(group)


class DeclaredCommands(MutableMapping):
    """The commands under one group word (``None``: the top level, whose entries are groups and one-word
    commands), read from the declarations whenever listed; each becomes a Click command when first looked up.

    A Typer group keeps its commands in such a mapping: listing them (``--help``, a usage error's suggestion) makes
    nothing, and running ``grtool corpus ingest`` makes the ``corpus`` group and that one command. Commands a
    program adds to a group directly (``add_command``) are kept as given."""

    def __init__(self, group: str | None = None, made: dict[str, Any] | None = None) -> None:
        from grtool.cli.typed import bound_numbers

        self.group = group
        self.made: dict[str, Any] = {name: bound_numbers(command) for name, command in (made or {}).items()}

    def _names(self) -> list[str]:
        names = dict.fromkeys(self.made)
        for words in declared():
            first, *rest = words.split()
            if self.group is None:
                names[first] = None
            elif first == self.group and rest:
                names[rest[0]] = None
        return list(names)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __getitem__(self, name: str) -> Any:
        if name not in self.made:
            if name not in self._names():
                raise KeyError(name)
            command = declared().get(name if self.group is None else f"{self.group} {name}")
            self.made[name] = ListedCommand(command, name) if command is not None else make_group(name)
        return self.made[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self.made[name] = command

    def __delitem__(self, name: str) -> None:
        del self.made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


class ListedCommand:
    """A declared command as its group's help lists it: its name, its help and whether it is hidden, all that
    Typer's help renderer reads of each command it lists. Anything else asked of it (its parameters, parsing,
    running) is asked of its Click command, made from the declaration then, once: a group's --help reads no
    command's signature."""

    short_help = None  # as Typer makes a declared command (add_command sets neither)
    deprecated = False
    rich_help_panel = None

    def __init__(self, command: Command, name: str) -> None:
        self.declaration = command
        self.name = name
        self.hidden = command.hidden
        self.help = inspect.cleandoc(command.help) if command.help is not None else inspect.getdoc(command.function)  # as Typer reads it

    @functools.cached_property
    def made(self) -> Any:
        return make_click_command(self.declaration)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.made, attribute)


def _with_help_style(command: Any) -> Any:
    """A command whose --help (and a group's help without a command) is drawn in grtool's style: set up when help
    is drawn, so a command that draws none never loads the help renderer."""
    from grtool.cli.shape import help_context

    command.context_class = help_context()
    return command


def click_errors() -> tuple[type[Exception], ...]:
    """Click's exception class, from click itself and from the copy that newer Typer releases vendor: those of the
    copies loaded (an exception of one never loaded cannot have been raised; importing it would cost a run that
    ends with ``sys.exit`` a whole Click)."""
    import sys

    found = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        module = sys.modules.get(name)
        if module is not None:
            found.append(module.ClickException)
    return tuple(found)
