"""Every numeric option and argument of every command is parsed by :func:`grtool.userinput.parse_number`: finite,
an integer where the annotation says ``int``, within the ``min=``/``max=`` the option declares and never past
:data:`grtool.userinput.MAX_INTEGER`. Applied once to the whole command tree (:func:`bound_numbers`), so a command
added later is covered without a line of its own; a wrong value is one usage line naming the option. Text
parameters that do not name files must be valid UTF-8 (a query typed in another encoding).

Typer releases that convert values through pydantic build a TypeAdapter for a parameter when it first gets a value,
and importing pydantic costs a command as much again as Typer itself (bench/startup.py). The values grtool's
commands take need none: :class:`PlainValues` converts a text, a path, a choice and a number grtool has parsed
as Typer's adapters do, with Typer's own functions, and hands anything else (and any value they refuse, for
Typer's own message) to the adapter Typer would have used."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import typer.core as typer_core

from grtool.errors import InputError
from grtool.userinput import parse_number, shown

try:  # Typer's runtime conversion (0.2x releases that use pydantic); older releases convert with Click's types
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_choice, coerce_cli_path
except ImportError:
    RuntimeParam = None

_DONE = "_grtool_numbers_bound"


def _number_kind(param: Any) -> tuple[bool, float | None, float | None] | None:
    """(integer, low, high) of a numeric parameter, None for any other. Reads Typer's annotation and bounds, or
    Click's range type where Typer builds one."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None:
        annotation, info = descriptor.annotation, descriptor.parameter_info
        if annotation in (int, float):
            return annotation is int, info.min, info.max
        return None
    kind = type(getattr(param, "type", None)).__name__
    if kind in ("IntParamType", "IntRange", "FloatParamType", "FloatRange"):
        return kind.startswith("Int"), getattr(param.type, "min", None), getattr(param.type, "max", None)
    return None


def _each_value(param: Any, check: Any) -> None:
    """``check(value)`` (which returns the value, parsed or as given) applied to each value the parameter gets,
    before Click's own processing."""
    original = param.process_value

    def process_value(ctx: Any, value: Any) -> Any:
        value = type(value)(check(v) for v in value) if isinstance(value, (list, tuple)) else check(value)
        return original(ctx, value)

    param.process_value = process_value


def _label(param: Any) -> str:
    return max(param.opts, key=len) if param.opts and param.opts[0].startswith("-") else (param.name or "").upper()


def _bind(param: Any, integer: bool, low: float | None, high: float | None) -> None:
    label = _label(param)

    def parse(value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        try:
            return parse_number(value, integer=integer, low=low, high=high)
        except ValueError as e:
            raise InputError(f"{label} {shown(value)}: {e}") from None

    _each_value(param, parse)


# Text parameters that may name a file or a directory: any name the file system holds is one (grtool reads
# non-UTF-8 names). Every other text parameter (a query, a sentence, a qid) must be valid UTF-8.
MAY_NAME_FILES = frozenset({"baseline", "corpus", "few_shot_from", "model", "overrides", "reports", "rules", "tokenizer", "triples"})


def _is_path(param: Any) -> bool:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return annotation is Path or annotation == list[Path]


def _bind_path(param: Any) -> None:
    """A path given empty is refused: ``Path("")`` is ``.``, so a command would read or write the current directory
    no one named."""
    label = _label(param)

    def check(value: Any) -> Any:
        if value == "":
            raise InputError(f"{label} is empty: name a path ('.' is the current directory)")
        return value

    _each_value(param, check)


def one_file_outputs(command: Any, names: set[str]) -> Any:
    """The parameters ``names`` of the Click ``command`` write one file each (a report, a plot): a path ending in
    ``/`` names a directory, of which ``Path`` would drop the slash and write a file by the directory's name."""
    from grtool.userinput import refuse_folder_spelling

    for param in command.params:
        if param.name in names and _is_path(param):
            label = _label(param)
            _each_value(param, lambda value, label=label: refuse_folder_spelling(value, label))
    return command


def _is_text(param: Any) -> bool:
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    return (annotation is str or annotation == list[str]) and param.name not in MAY_NAME_FILES


def _bind_text(param: Any) -> None:
    """Command-line bytes that are not UTF-8 reach Python as surrogate escapes, which no encoder (tokenizers,
    JSON, Parquet) takes: refused here, by the option's name."""
    label = _label(param)

    def check(value: Any) -> Any:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(f"{label} {shown(value)}: not valid UTF-8 text (the bytes given are not UTF-8)") from None
        return value

    _each_value(param, check)


if RuntimeParam is not None:

    class PlainValues(RuntimeParam):
        """Typer's conversion of one parameter's values, without pydantic for the plain ones."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            annotation, info = self.annotation, self.parameter_info
            if annotation is str and isinstance(value, str):
                return value  # what Typer's str adapter gives back for text
            if annotation is Path and isinstance(value, (str, Path)):
                # Typer's path adapter: pydantic's Path(text), then Typer's checks (exists=, dir_okay= ...)
                return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
            if annotation in (int, float, bool) and type(value) is annotation and not info.clamp and _within(value, info.min, info.max):
                return value  # a number grtool.userinput parsed (or a default): pydantic would return it as it is
            if isinstance(annotation, type) and issubclass(annotation, Enum):
                try:
                    return coerce_cli_choice(value, choices=list(annotation), case_sensitive=info.case_sensitive, ctx=ctx)
                except ValueError:
                    pass  # Typer's adapter words the error
            return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)


def _within(value: Any, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def use_plain_values() -> None:
    """Make every Typer parameter convert its values with :class:`PlainValues` (a parameter with a parser of its
    own, a path_type or a file type keeps Typer's conversion)."""
    core = getattr(typer_core, "_TyperParameter", None)
    if RuntimeParam is None or core is None or not hasattr(core, "get_runtime_param") or getattr(core, "_grtool_plain", False):
        return

    def get_runtime_param(self: Any) -> Any:
        if self._runtime_param is None:
            descriptor = self.type_descriptor
            info = descriptor.parameter_info
            if info.parser is None and info.path_type is None and descriptor.file_annotation is None:
                self._runtime_param = PlainValues(annotation=descriptor.annotation, parameter_info=info)
            else:
                self._runtime_param = build_runtime_param(descriptor)
        return self._runtime_param

    core.get_runtime_param = get_runtime_param
    core._grtool_plain = True


def one_value_per_option(command: Any) -> None:
    """An option that takes one value, given twice (``--out a --out b``), and an on/off flag given both ways
    (``--packing --no-packing``): the last one is used, as Click, argparse and git use it (a base command line with
    an override after it is a common way to call a tool), and a warning line names both, so it is never silent.
    Values of options are skipped (``--system --no-x`` gives --system the text). A pipeline stage, whose file has
    no such idiom, refuses both (:func:`grtool.cli.stage_options.stage_values`)."""
    params = [p for p in getattr(command, "params", ()) if getattr(p, "param_type_name", "") == "option"]
    single = {o: p for p in params if not p.multiple and not p.count for o in (*p.opts, *p.secondary_opts)}
    if not single or not hasattr(command, "parse_args"):
        return
    parse_args = command.parse_args

    def options_given(args: list[str], help_names: list[str]) -> Iterator[tuple[Any, str, str]]:
        """``(parameter, as written, value)`` of each one-value option or flag the args give (values skipped)."""
        tokens = iter(args)
        for token in tokens:
            if token == "--":
                return
            name, eq, value = token.partition("=")
            if token[:1] == "-" and token[1:2] != "-" and len(token) > 2 and token[:2] in single and not single[token[:2]].is_flag:
                name, eq, value = token[:2], "=", token[2:]  # a short option with its value attached (-oDIR)
            p = single.get(name) if token.startswith("-") else None
            if p is not None:
                yield p, name, value if p.is_flag or eq else next(tokens, "")
            elif token in help_names:
                yield None, token, ""

    def checked(ctx: Any, args: list[str]) -> Any:
        said_all = [] if ctx.resilient_parsing else list(options_given(args, ctx.help_option_names))  # completion: half-typed lines
        if any(p is None for p, _, _ in said_all):  # --help (not an option's value): the help, whatever else is given
            return parse_args(ctx, args)
        given: dict[Any, list[str]] = {}
        for p, name, value in said_all:
            given.setdefault(p, []).append(name if p.is_flag else f"{name} {shown(value)}")
        from grtool.log import log  # configured by the root command before a command's arguments are parsed

        for p, said in given.items():
            if p.is_flag and len({s in p.opts for s in said}) == 2:
                log.warning("%s are both given: the last one, %s, is used", " and ".join(dict.fromkeys(said)), said[-1])
            elif not p.is_flag and len(said) > 1:
                log.warning("%s is given %d times (%s): the last one is used", max(p.opts, key=len), len(said), ", ".join(said))
        return parse_args(ctx, args)

    command.parse_args = checked


def bound_numbers(command: Any) -> Any:
    """Route the numeric parameters of ``command`` and of every command under it through the one parser, check
    that its text parameters are text, its paths not empty, and that a one-value option or on/off flag given twice is
    said."""
    if getattr(command, _DONE, False):
        return command
    setattr(command, _DONE, True)
    for param in getattr(command, "params", ()):
        kind = _number_kind(param)
        if kind is not None:
            _bind(param, *kind)
        elif _is_text(param):
            _bind_text(param)
        elif _is_path(param):
            _bind_path(param)
    one_value_per_option(command)
    for sub in getattr(command, "commands", {}).values():
        bound_numbers(sub)
    return command
