"""Options shared by stage commands, so every stage spells them the same way."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from collections.abc import Mapping
from typing import Annotated, Any, Optional

import typer


def out_path(value: str | Path) -> Path:
    """``--out``: an empty value would silently mean the current directory; refuse it."""
    if isinstance(value, Path):
        return value
    if value == "":
        from grtool.errors import InputError

        raise InputError("--out is empty: name an output directory")
    return Path(value)


Out = Annotated[Path, typer.Option("--out", "-o", parser=out_path, metavar="DIR", help="Stage directory to write ('-' = JSON Lines on stdout).")]


def MaxEmptyShare(empty: str) -> Any:
    """``--max-empty-share`` of a model stage, whose guard counts ``empty`` outputs per part."""
    return Annotated[float, typer.Option("--max-empty-share", min=0.0, max=1.0, help=f"Exit 1 when a part has a larger share of {empty}.")]


# corpus ingest and merge write two stages, documents/ and questions/, under the directory they are given
RunOut = Annotated[
    Path,
    typer.Option("--out", "-o", parser=out_path, metavar="DIR", help="Run directory to write: its documents/ and questions/ stages ('-' = JSON Lines on stdout)."),
]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Delete existing output and start over (default: resume).")]
NumShards = Annotated[
    Optional[int],
    typer.Option("--num-shards", help="Split the work into N tasks (default: $SLURM_ARRAY_TASK_COUNT or 1).", min=1),
]
ShardIndex = Annotated[
    Optional[int],
    typer.Option("--shard-index", help="Which task this is, 0-based (default: $SLURM_ARRAY_TASK_ID or 0).", min=0),
]
Strict = Annotated[bool, typer.Option("--strict", help="Fail on the first bad record instead of rejecting it.")]
Json = Annotated[bool, typer.Option("--json", help="Print a JSON object on stdout instead of tables.")]
Split = Annotated[
    Optional[list[str]],
    typer.Option("--split", help="Only questions of this split, e.g. train (repeatable; default: every question); recorded in the manifest."),
]


def print_report(report: Any, *, indent: bool = False, kind: type | None = None) -> None:
    """Print the running command's ``--json`` report: converted through the report type its declaration names
    (``Command(report=...)``; ``kind`` for a command with a second report), so what is printed is what is
    declared, field by field and in its order. A field the declaration lacks, or a value of another type, is a
    bug of grtool's, said as one."""
    import msgspec
    import orjson

    from grtool.cli.commands import running

    command = running()
    kind = kind or (command.report_type() if command is not None else None)
    if kind is None:
        raise RuntimeError(f"{command.words if command else 'a command'}: prints a --json report but declares no report type (a bug of grtool)")
    try:
        typed = msgspec.convert(report, kind)
    except msgspec.ValidationError as e:
        raise RuntimeError(f"the --json report does not match its declaration {kind.__module__}.{kind.__name__}: {e} (a bug of grtool)") from None
    typer.echo(orjson.dumps(msgspec.to_builtins(typed), option=orjson.OPT_INDENT_2 if indent else 0).decode())


def refuse_json_with_stdout(as_json: bool, out: str | Path) -> None:
    """--json prints the summary on stdout, which ``--out -`` fills with rows: refused before anything runs."""
    if as_json and str(out) == "-":
        from grtool.errors import InputError

        raise InputError("--json prints the summary on stdout, where --out - writes the rows: give one of them")


def _plot_path(value: str | Path) -> Path:
    """``--plot``: matplotlib comes with the extra grtool[plot]; without it the command stops before it runs."""
    from grtool.extras import require

    require("plot", "--plot")
    return Path(value)


Plot = Annotated[Optional[Path], typer.Option("--plot", parser=_plot_path, metavar="PATH", help="Write a PNG chart to this file.")]


def plot_extras(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The extras of a command whose only optional need is --plot (matplotlib)."""
    return [("plot", "--plot")] if options.get("plot") not in (None, False) else []


RowsPerPart = Annotated[
    Optional[int],
    typer.Option(
        "--rows-per-part",
        min=1,
        help="Rows per output part (default 100000). Parts are the unit of --num-shards and Slurm arrays: smaller parts spread a small corpus over more array tasks.",
    ),
]

# The sentence a chain ends with when the triples do not answer the question. The same option and meaning in
# `chains synthesize` (written into the prompt), `filters apply` (accepted besides grtool's and the paper's
# wording), `export sft|kto` and `retrieve` (named in the instruction the model is trained and queried with).
CannotAnswer = Annotated[
    Optional[str],
    typer.Option(
        "--cannot-answer",
        metavar="TEXT",
        help="Sentence ending a chain whose triples do not answer the question (default: grtool's own; the filters also accept the paper's wording).",
    ),
]


def check_cannot_answer(text: str | None) -> str | None:
    """--cannot-answer as given (stripped), None when not given; a blank one or one on several lines is a usage error."""
    if text is None:
        return None
    from grtool.errors import InputError

    if not text.strip() or "\n" in text.strip():
        raise InputError("--cannot-answer: give one non-empty sentence on one line")
    return text.strip()


_ALLOW_EMPTY_HELP = "Accept an empty result: without it, writing no row is an error (exit 1) naming why the rows were rejected."


class AddedParameters:
    """A command function with keyword parameters added to its own (``allows_empty``, ``llm_options``): Typer sees
    both in its signature, and ``call(function, *args, **kwargs)`` hands the command what it takes of them.

    The signature evaluates the command's annotations (each builds its typer.Option): it is made the first time it
    is asked for, by Typer making the Click command, never by declaring the command, so ``grtool --help`` and
    ``grtool status`` evaluate no other command's. ``parameter_names`` names the parameters meanwhile."""

    def __init__(self, function: Any, added: Any, names: list[str], call: Any, dropped: tuple[str, ...] = ()) -> None:
        from grtool.pipeline.registry import parameter_names

        self.function, self._added, self._call, self._dropped = function, added, call, dropped
        self.__name__, self.__qualname__ = function.__name__, function.__qualname__
        self.__module__, self.__doc__ = function.__module__, function.__doc__
        own = [name for name in parameter_names(function) if name not in dropped]
        self.parameter_names = own + [name for name in names if name not in own]
        if hasattr(function, "check_options"):
            self.check_options = function.check_options

    @functools.cached_property
    def __signature__(self) -> inspect.Signature:
        sig = inspect.signature(self.function, eval_str=True)
        own = [p for p in sig.parameters.values() if p.name not in self._dropped]
        return sig.replace(parameters=own + [p for p in self._added() if p.name not in sig.parameters])

    @property
    def __annotations__(self) -> dict[str, Any]:  # evaluated: Typer reads them here, not in the command's module
        return {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(self.function, *args, **kwargs)


def allows_empty(command):
    """Give a command ``--allow-empty`` (the empty-result rule, grtool/store/empty.py): the rule holds while the
    command runs unless the flag is given. A command that declares ``allow_empty`` itself gets the value too."""
    from grtool.pipeline.registry import parameter_names

    declared = "allow_empty" in parameter_names(command)

    def added() -> list[inspect.Parameter]:
        option = Annotated[bool, typer.Option("--allow-empty", help=_ALLOW_EMPTY_HELP)]
        return [inspect.Parameter("allow_empty", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=option)]

    def call(function, *args, **kwargs):
        from grtool.store.empty import allowing

        allow = bool(kwargs.get("allow_empty", False))
        if not declared:
            kwargs.pop("allow_empty", None)
        with allowing(allow):
            return function(*args, **kwargs)

    return AddedParameters(command, added, ["allow_empty"], call)
