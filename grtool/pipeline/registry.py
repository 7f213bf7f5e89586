"""What the pipeline knows of the commands its stages run: one small interface, filled in by the CLI.

A command is declared once, as a :class:`Command` beside its Typer function (``grtool/cli/<stage>.py``): its
words, its function (options typed in its signature), which extras it needs, what it reads and writes, its early
checks. The CLI registers the Typer command from it, and the pipeline learns from it what a stage needs.

The pipeline (its plan, its executors) never imports the CLI. Whoever runs a pipeline hands it a
:class:`StageCommands`: the ``grtool`` command passes its own (``grtool.cli.stages.CliCommands``), built from the
declared commands. It is the only thing the local and the Slurm executor share: the local one asks
it to run a stage's command line in this process, the Slurm one writes that command line into a batch script;
both ask it what a stage's command accepts (``--overwrite``, array sharding) and check every stage's options
before the first stage runs.
"""

from __future__ import annotations

import inspect
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any


class PathKind(str, Enum):
    """What a path parameter of a command names."""

    STAGE = "stage directory"  # one stage directory (grtool/store), or a run directory holding the one meant
    RUN = "run directory"  # a directory of stage directories, which later stages may write inside too
    FILE = "file"  # a file the user gives (a raw dataset, a prompt, a config)
    LABELLED_FILE = "LABEL=FILE"  # a file, optionally preceded by a label and "="
    DIRECTORY = "directory"  # a directory that is not a stage (a cache, a checkpoint, an index)
    REPORT = "report"  # a file written with a command's results (JSON, a chart, an export)


@dataclass(frozen=True)
class TableOutput:
    """An output parameter that writes a stage directory of table ``name`` (``writes={"out": TableOutput(...)}``).
    For a table grtool does not have, its Arrow ``schema``, its ``key`` and how `grtool show` prints a row (``text``,
    ``fields``): registered with the command (:func:`grtool.store.schemas.register_table`), so that a new stage is
    its package plus this one declaration."""

    name: str
    schema: Any = None  # a pyarrow.Schema; None: one of grtool's tables, or one declared elsewhere
    key: tuple[str, ...] = ()
    text: str | None = None
    fields: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.schema is None and (self.key or self.text is not None or self.fields is not None):
            raise TypeError(f"table {self.name!r}: a key, text or fields are declared with the table's schema")


@dataclass(frozen=True, init=False)
class RunOutput:
    """An output parameter that writes a run directory holding a stage directory of each of ``tables``
    (``OUT/<table>``): ``writes={"out": RunOutput("documents", "questions")}``. Its kind is a run directory."""

    tables: tuple[str, ...]

    def __init__(self, *tables: str) -> None:
        object.__setattr__(self, "tables", tables)


@dataclass(frozen=True)
class FilesOutput:
    """An output parameter that writes a file and, by the command's other options, files beside it:
    ``writes={"out": FilesOutput(beside=dev_file)}`` (``export sft --dev-share`` writes ``NAME_dev.EXT`` too).
    ``beside(path, options)`` names them, from the option values as given (the command line's or a pipeline
    file's); they are checked as the command's outputs, before it runs and at a pipeline's dry run. Its kind is a
    report (a file)."""

    beside: Callable[[str, Mapping[str, Any]], list[str]]


@dataclass(frozen=True, init=False)
class TableInput:
    """A read parameter that names stage directories of ``tables``, each at the path itself or in ``PATH/<table>``
    (a run directory holding it), as :func:`grtool.store.records.resolve_stage` finds them:
    ``reads={"chains": TableInput("chains")}``; ``kind`` is the path's kind (a stage directory, or a run directory
    for a command that reads several of its tables). Only tables the command reads whatever its other options:
    they are checked before it runs, and by a pipeline's dry run against what a stage before it writes there."""

    tables: tuple[str, ...]
    kind: PathKind

    def __init__(self, *tables: str, kind: PathKind = PathKind.STAGE) -> None:
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "kind", kind)


Extras = Callable[[Mapping[str, Any]], list[tuple[str, str]]]


def _no_extras(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    return []


def _frozen(mapping: Mapping[str, PathKind]) -> Mapping[str, PathKind]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Command:
    """One ``grtool`` command, declared once.

    ``words``: how it is called ("filters apply"; one word for a top-level command). ``function``: the Typer
    function it runs, its options typed in its signature (``Annotated[..., typer.Option(...)]``). ``help``: the
    help text, by default the function's docstring. ``extras``: the (extra, feature) pairs it needs installed, from
    its parsed options (parameter names as in the function). ``reads`` / ``writes``: its path parameters and what
    they name (an output that is a stage of a table of the command's own: a :class:`TableOutput`, kept in
    ``tables``, its kind a stage directory; a run directory of stages: a :class:`RunOutput`); the stage tables a read
    parameter names: a :class:`TableInput` (kept in ``input_tables``, its kind as it says). A pipeline checks what a
    stage reads exists, and holds the tables it reads, before the first stage runs. ``check``: what it checks of its parsed options before it writes (default: the function's
    ``check_options``, which ``llm_options`` adds). ``report``: where the Struct its ``--json`` prints is declared
    (``"grtool.filters.report:FiltersReport"``; :func:`grtool.cli.options.print_report`). ``stage``: a pipeline stage may run it. ``hidden``, ``cls``: as Typer's ``command()`` takes them.
    """

    words: str
    function: Callable[..., Any]
    help: str | None = None
    extras: Extras = _no_extras
    reads: Mapping[str, PathKind | TableInput] = field(default_factory=dict)  # after init: PathKind (tables in ``input_tables``)
    writes: Mapping[str, PathKind | TableOutput | RunOutput | FilesOutput] = field(default_factory=dict)  # after init: PathKind (specs in ``tables``, ``run_tables``, ``beside``)
    check: Callable[[dict[str, Any]], None] | None = None
    report: str | None = None  # "module:Name" of the Struct its --json prints (grtool.records.Report), imported when printed
    stage: bool = True
    hidden: bool = False
    cls: type | None = None
    tables: Mapping[str, TableOutput] = field(init=False, default_factory=dict)
    run_tables: Mapping[str, tuple[str, ...]] = field(init=False, default_factory=dict)
    input_tables: Mapping[str, tuple[str, ...]] = field(init=False, default_factory=dict)
    beside: Mapping[str, Callable[[str, Mapping[str, Any]], list[str]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", command_name(self.words))
        object.__setattr__(self, "input_tables", MappingProxyType({name: spec.tables for name, spec in self.reads.items() if isinstance(spec, TableInput)}))
        object.__setattr__(self, "reads", _frozen({name: spec.kind if isinstance(spec, TableInput) else spec for name, spec in self.reads.items()}))
        object.__setattr__(self, "tables", MappingProxyType({name: spec for name, spec in self.writes.items() if isinstance(spec, TableOutput)}))
        object.__setattr__(self, "run_tables", MappingProxyType({name: spec.tables for name, spec in self.writes.items() if isinstance(spec, RunOutput)}))
        object.__setattr__(self, "beside", MappingProxyType({name: spec.beside for name, spec in self.writes.items() if isinstance(spec, FilesOutput)}))
        kinds = {**{name: PathKind.STAGE for name in self.tables}, **{name: PathKind.RUN for name in self.run_tables}, **{name: PathKind.REPORT for name in self.beside}}
        object.__setattr__(self, "writes", _frozen({name: kinds.get(name, kind) for name, kind in self.writes.items()}))
        if self.check is None:
            object.__setattr__(self, "check", getattr(self.function, "check_options", None))
        parameters = parameter_names(self.function)
        unknown = [name for name in (*self.reads, *self.writes) if name not in parameters]
        if unknown:
            raise TypeError(f"command {self.words!r}: {', '.join(unknown)} is not a parameter of {self.function.__name__}")

    def report_type(self) -> type | None:
        """The declared type of the command's ``--json`` report (``report``), None where it declares none."""
        if self.report is None:
            return None
        import importlib

        module, _, name = self.report.partition(":")
        return getattr(importlib.import_module(module), name)

    def accepts(self, parameter: str) -> bool:
        return parameter in parameter_names(self.function)

    def written_tables(self, name: str, path: str) -> list[tuple[str, str]]:
        """``(stage directory, table)`` for each stage directory output parameter ``name`` writes given ``path``
        (none for an output whose tables are not declared)."""
        if name in self.tables:
            return [(path, self.tables[name].name)]
        return [(os.path.join(path, table), table) for table in self.run_tables.get(name, ())]

    def single_files(self, options: Mapping[str, Any]) -> list[str]:
        """The report, plot and TREC files the command writes given ``options`` (its ``--out`` aside)."""
        return [value for name, kind in self.writes.items() if kind is PathKind.REPORT and name != "out"
                for value in [options.get(name)] if isinstance(value, str) and value not in ("", "-")]  # fmt: skip

    def files_beside(self, options: Mapping[str, Any]) -> list[tuple[str, str]]:
        """``(parameter, path)`` of each file written beside a declared file output (:class:`FilesOutput`), given the
        command's ``options``."""
        found = []
        for name, beside in self.beside.items():
            value = options.get(name)
            if isinstance(value, (str, os.PathLike)) and str(value) not in ("", "-"):
                found += [(name, path) for path in beside(str(value), options)]
        return found

    @property
    def shards(self) -> bool:
        """Whether it runs one shard of its input (``--num-shards`` / ``--shard-index``): a Slurm array's task."""
        return self.accepts("num_shards")

    @property
    def writes_run_directory(self) -> bool:
        """Whether its output is a run directory, inside which later stages write theirs."""
        return PathKind.RUN in self.writes.values()


def parameter_names(function: Callable[..., Any]) -> list[str]:
    """The names of a command function's parameters. A function whose signature is made when first asked for (one
    with parameters added: grtool/cli/options.py) names them without making it."""
    names = getattr(function, "parameter_names", None)
    return list(names) if names is not None else list(inspect.signature(function).parameters)


def command_name(run: str) -> str:
    """A stage's ``run`` value with its words normalised ("corpus  ingest" -> "corpus ingest")."""
    return " ".join(run.split())


class StageCommands(ABC):
    """The commands a pipeline stage may run (``run = "corpus ingest"``), as the program that runs them knows them."""

    @abstractmethod
    def names(self) -> list[str]:
        """Every command a stage may run ("corpus ingest", "triples extract", ...)."""

    @abstractmethod
    def accepts(self, run: str, parameter: str) -> bool:
        """Whether the stage's command takes ``parameter`` (``"overwrite"``, ``"num_shards"``); False for a
        command that does not exist."""

    @abstractmethod
    def is_flag(self, run: str, key: str) -> bool:
        """Whether option ``key`` (``--key``) of the command is an on/off flag."""

    @abstractmethod
    def check_arguments(self, run: str, args: list[Any], options: dict[str, Any], where: str) -> None:
        """Convert a stage's ``args`` and ``options`` (as its pipeline file gives them) to the command's typed
        options and make the checks the command makes before it writes anything; raise
        :class:`grtool.errors.GrtoolError` naming ``where``."""

    @abstractmethod
    def invoke(self, argv: list[str]) -> int | None:
        """Run ``grtool ARGV`` in this process; returns its exit code (None or 0: success) or raises its error."""

    def options(self, run: str) -> dict[str, bool]:
        """The command's options by their key in a pipeline file (``rows_per_part`` for ``--rows-per-part``), each
        True for an on/off flag, False for an option that takes a value; empty for a command not known."""
        return {}

    def declared(self, run: str) -> Command | None:
        """The declaration of the stage's command (None: unknown, or not a command a stage may run)."""
        return None

    def extras(self, run: str, args: list[Any], options: dict[str, Any]) -> list[tuple[str, str]]:
        """(extra, feature) pairs the stage needs installed, from its options as the command converts them."""
        return []

    def args_without(self, run: str, args: list[Any], key: str) -> list[Any]:
        """A stage's ``args`` without the option ``key`` (``out`` for ``--out DIR``, ``--out=DIR``, ``-o DIR``) where
        they give it: what ``--set stage.key=value`` overrides. By default the args as they are."""
        return args

    def values(self, run: str, args: list[Any], options: dict[str, Any]) -> Mapping[str, Any]:
        """The stage's options as its command receives them, ``args`` and ``options`` together (``--plot X`` written
        among the args is the ``plot`` option), paths as text: what says which files the stage writes. Options the
        command refuses are given back as they are (:meth:`check_arguments` refuses them, naming the stage), as
        they are by default."""
        return options

    def shards(self, run: str) -> bool:
        declared = self.declared(run)
        return declared is not None and declared.shards

    def writes_run_directory(self, run: str) -> bool:
        declared = self.declared(run)
        return declared is not None and declared.writes_run_directory

    def input_paths(self, run: str, args: list[Any], options: dict[str, Any]) -> list[tuple[str, str]]:
        """(parameter, path) pairs: the files and directories the stage names for its command to read (its path
        arguments and options, outputs excepted), as the command would convert them; none by default."""
        return []

    def input_tables(self, run: str, args: list[Any], options: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
        """``(parameter, path, tables)``: the paths the stage names for parameters that read stage
        tables (:class:`TableInput`), with those tables; none by default."""
        return []

    def known(self, run: str) -> bool:
        return command_name(run) in self.names()


class NoCommands(StageCommands):
    """No command known: a pipeline file read only for its structure (its schema, placeholders, --set)."""

    def names(self) -> list[str]:
        return []

    def accepts(self, run: str, parameter: str) -> bool:
        return False

    def is_flag(self, run: str, key: str) -> bool:
        return False

    def check_arguments(self, run: str, args: list[Any], options: dict[str, Any], where: str) -> None:
        return None

    def invoke(self, argv: list[str]) -> int | None:
        from grtool.errors import InputError

        raise InputError(f"cannot run grtool {' '.join(argv)}: no commands were given to the pipeline")
