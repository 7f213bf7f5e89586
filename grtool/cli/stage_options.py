"""A command's options as one typed, bounded record: a msgspec Struct made from its declaration (the Typer
annotations of its function), field by field: a number with the bounds its option declares (and never past
:data:`grtool.userinput.MAX_INTEGER` or ``MAX_REAL``, so never infinite or NaN), a choice as its Enum, a list where
the option repeats, text and paths as text.

A pipeline stage's options are checked by converting them, as the pipeline file gives them (typed TOML values, its
``args`` for the command's arguments), to that record — not by building the command line and parsing it — and the
command's own checks then read the converted values (:func:`stage_values`). What a wrong value gets is one line
naming the stage and the option as the file and the command line name it. The command line built from the same
values (``Stage.argv``) stays the stage's identity and its Slurm job line; `grtool` parses it with Typer, which
reads the same annotations.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grtool.errors import GrtoolError, InputError
from grtool.pipeline.registry import Command
from grtool.userinput import MAX_INTEGER, MAX_REAL, describe, shown

if TYPE_CHECKING:  # every module of grtool/cli/ is imported to learn the commands: msgspec only when a stage is checked
    import msgspec


@dataclass(frozen=True)
class Parameter:
    """One parameter of a command, as its annotation declares it."""

    name: str  # the function's parameter
    flags: tuple[str, ...]  # its command-line names (--out, -o); () for an argument
    off: tuple[str, ...]  # an on/off flag's off names (--no-cache)
    kind: Any  # bool, int, float, str, Path or an Enum
    many: bool  # repeated (a list)
    required: bool
    default: Any
    low: float | None
    high: float | None
    parser: Callable[[str], Any] | None

    @property
    def argument(self) -> bool:
        return not self.flags

    @property
    def label(self) -> str:
        """How messages name it: its longest option, or its argument's name in capitals."""
        return max(self.flags, key=len) if self.flags else self.name.upper()

    @property
    def keys(self) -> list[str]:
        """Its keys in a pipeline file (``rows_per_part`` for ``--rows-per-part``); arguments are the file's args."""
        return [f[2:].replace("-", "_") for f in (*self.flags, *self.off) if f.startswith("--")]


def _info(annotation: Any) -> tuple[Any, Any]:
    """(the annotated type, its Typer OptionInfo/ArgumentInfo) of ``Annotated[T, typer.Option(...)]``."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        info = next((e for e in extras if type(e).__name__ in ("OptionInfo", "ArgumentInfo")), None)
        return base, info
    return annotation, None


def _unwrapped(base: Any) -> tuple[Any, bool]:
    """(the value type, repeated) of ``T``, ``Optional[T]``, ``list[T]``, ``Optional[list[T]]``."""
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        (base,) = [a for a in typing.get_args(base) if a is not type(None)]
    if typing.get_origin(base) in (list, tuple):
        return typing.get_args(base)[0], True
    return base, False


def _parameter(name: str, signature_parameter: inspect.Parameter, annotation: Any) -> Parameter | None:
    base, info = _info(annotation)
    if info is None:
        return None  # not a command-line parameter (none of grtool's commands has one)
    kind, many = _unwrapped(base)
    default = signature_parameter.default
    argument = type(info).__name__ == "ArgumentInfo"
    decls = [d for d in (getattr(info, "default", None), *(getattr(info, "param_decls", None) or ())) if isinstance(d, str) and d.startswith("-")]
    flags: list[str] = []
    off: list[str] = []
    for decl in decls:
        on, _, negative = decl.partition("/")
        flags += [on] if on else []
        off += [negative] if negative else []
    if not argument and not flags:  # Typer's default names: --name, and --no-name for an on/off flag
        flags = [f"--{name.replace('_', '-')}"]
        off = [f"--no-{name.replace('_', '-')}"] if kind is bool else []
    required = default is inspect.Parameter.empty
    return Parameter(name, () if argument else tuple(flags), tuple(off), kind, many, required, None if required else default,
                     getattr(info, "min", None), getattr(info, "max", None), getattr(info, "parser", None))  # fmt: skip


def parameters(command: Command) -> tuple[Parameter, ...]:
    """The command's parameters, in the order of its function's signature."""
    return _parameters(command.function)


@functools.cache
def _parameters(function: Callable[..., Any]) -> tuple[Parameter, ...]:
    hints = typing.get_type_hints(function, include_extras=True)
    found = []
    for name, p in inspect.signature(function).parameters.items():
        parameter = _parameter(name, p, hints.get(name, p.annotation))
        if parameter is not None:
            found.append(parameter)
    return tuple(found)


def _field_type(p: Parameter) -> Any:
    import msgspec

    if p.parser is not None:
        kind: Any = str  # the text its parser takes
    elif p.kind in (int, float):
        integer = p.kind is int
        top = MAX_INTEGER if integer else MAX_REAL
        low = max(p.low, -top) if p.low is not None else -top
        high = min(p.high, top) if p.high is not None else top
        kind = typing.Annotated[p.kind, msgspec.Meta(ge=low, le=high)]
    elif p.kind is Path:
        kind = str
    else:
        kind = p.kind  # bool, str, an Enum (by its value)
    return list[kind] if p.many else kind


def options_type(command: Command) -> type[msgspec.Struct]:
    """The command's options as one Struct: a field per parameter, required where the command requires it; a field
    not given is UNSET (the command's default then applies)."""
    return _options_type(command.words, command.function)


@functools.cache
def _options_type(words: str, function: Callable[..., Any]) -> type[msgspec.Struct]:
    import msgspec

    fields = [(p.name, _field_type(p)) if p.required else (p.name, _field_type(p) | msgspec.UnsetType, msgspec.UNSET) for p in _parameters(function)]
    name = "".join(word.title() for word in words.split()) + "Options"
    return msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=True)


@dataclass
class StageValues:
    """A stage's options converted: ``values`` by parameter name, as the command receives them (defaults filled,
    paths as Path, choices as their Enum, parsers applied); ``given`` the parameters the stage names."""

    values: dict[str, Any]
    given: set[str]


def option_keys(command: Command) -> dict[str, bool]:
    """A command's options by their key in a pipeline file, each True for an on/off flag."""
    return {key: p.kind is bool for p in parameters(command) if not p.argument for key in p.keys}


def stage_values(command: Command, args: list[Any], options: dict[str, Any], where: str) -> StageValues:
    """The stage's ``args`` and ``options`` (from its pipeline file) converted to the command's options Struct and
    on to what the command receives; an InputError naming ``where`` and the option for anything the command refuses.
    Leftover ``args`` fill the options a command once took as arguments (``moved_to_options``), as its command line does."""
    import difflib

    import msgspec

    params = parameters(command)
    by_key = {key: (p, key in [f[2:].replace("-", "_") for f in p.off]) for p in params if not p.argument for key in p.keys}
    rest, named = _options_among(args, _by_flag(params), where)
    data: dict[str, Any] = {}
    arguments = [p for p in params if p.argument]
    for p in arguments:
        if p.many and (rest or not p.required):  # a required one with nothing given stays missing, as on the command line
            data[p.name], rest = rest, []
        elif rest:
            data[p.name] = rest.pop(0)
    for flag in getattr(command.cls, "moved", ()):
        p = next(p for p in params if flag in p.flags)
        if rest and not any(key in options for key in p.keys) and p.name not in {q.name for q, _, _ in named}:
            data[p.name] = rest.pop(0)
    if rest:
        raise InputError(f"{where}: {len(args)} arguments, but {command.words} takes {len(arguments)} ({', '.join(p.label for p in arguments)}): "
                         f"{', '.join(shown(a) for a in rest)} left over")  # fmt: skip
    for key, value in options.items():
        found = by_key.get(key.replace("-", "_"))
        if found is None:
            close = difflib.get_close_matches(key.replace("-", "_"), list(by_key), n=3)
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            raise InputError(f"{where}: {command.words} has no option {key!r}{hint}; its options: {', '.join(by_key)}")
        p, negative = found
        if p.kind is bool and value is False and not p.off and not negative:  # the command line would say --no-KEY, which it lacks
            raise InputError(f"{where}, option {key!r}: false, but {p.label} is an on/off flag without an off form; leave the key out")
        named.append((p, negative, value))
    for p in {p.name: p for p, _, _ in named if not p.many}.values():  # said twice, or both ways: which is meant?
        said = [(negative, value) for q, negative, value in named if q is p]
        if p.kind is bool and len({(value is not False) != negative for negative, value in said}) == 2:  # on and off
            raise InputError(f"{where}: {p.label} is given both on and off (as {', '.join(_said(p, n, v) for n, v in said)}); give it once")
        if p.kind is not bool and len(said) > 1:
            raise InputError(f"{where}: {p.label} takes one value, and is given {len(said)} ({', '.join(shown(v) for _, v in said)}; args and options together); give one")
        if p.kind is not bool and isinstance(said[0][1], list):
            raise InputError(f"{where}: {p.label} takes one value, not a list ({len(said[0][1])} given)")
    for p, negative, value in named:  # in command-line order: args first; a repeated option gathers its values
        if p.kind is bool and isinstance(value, bool):
            value = value != negative
        items = [_text(p, v) for v in (value if isinstance(value, list) else [value])]
        data[p.name] = [*data.get(p.name, []), *items] if p.many else items[-1]
    try:
        struct = msgspec.convert(data, options_type(command), strict=False)
    except msgspec.ValidationError as e:
        raise InputError(f"{where}: {_refusal(e, params, data)}") from None
    values: dict[str, Any] = {}
    for p in params:
        value = getattr(struct, p.name)
        if value is not msgspec.UNSET:
            values[p.name] = _received(p, value, where)
        else:  # as Typer hands it over: a repeated option not given is an empty tuple
            values[p.name] = tuple(p.default or ()) if p.many else p.default
    return StageValues(values, {p.name for p in params if p.name in data})


def _said(p: Parameter, negative: bool, value: Any) -> str:
    """How a stage gave an on/off flag, as a key of its file (a flag in its args is ``KEY = true``)."""
    key = (p.off if negative else p.flags)[0][2:].replace("-", "_")
    return f"{key} = {str(value).lower() if isinstance(value, bool) else shown(value)}"


_NO_VALUE = object()  # an option that takes a value, last in the args with none after it


def _by_flag(params: tuple[Parameter, ...]) -> dict[str, tuple[Parameter, bool]]:
    """Each flag a command takes (``--out``, ``-o``, ``--no-json``): its parameter, and whether it is the off form."""
    return {flag: (p, flag in p.off) for p in params for flag in (*p.flags, *p.off)}


def _split_args(args: list[Any], by_flag: dict[str, tuple[Parameter, bool]]) -> Iterator[tuple[list[Any], str | None, Any, Any]]:
    """A stage's ``args`` split as its command line splits them: ``(words, flag, found, value)`` for each argument
    (flag None, value the argument), each option (``--out DIR``, ``--out=DIR``, ``-oDIR``, ``--json``: found its
    ``by_flag`` entry or None for a flag the command lacks, value True for an on/off flag) and a ``--`` (flag
    ``--``), after which every word is an argument; ``words`` are the args it took, as written."""
    items = iter(args)
    for item in items:
        text = str(item)
        if text == "--":
            yield [item], "--", None, None
            yield from (([rest], None, None, rest) for rest in items)
            return
        if not text.startswith("-") or text == "-":
            yield [item], None, None, item
            continue
        flag, eq, value = text.partition("=") if text.startswith("--") else (text, "", "")
        short = by_flag.get(text[:2]) if not text.startswith("--") and flag not in by_flag else None
        if short is not None and short[0].kind is not bool:  # -oDIR
            flag, eq, value = text[:2], "=", text[2:]
        found = by_flag.get(flag)
        if found is None or found[0].kind is bool:
            yield [item], flag, found, True
        elif eq:
            yield [item], flag, found, value
        else:
            value = next(items, _NO_VALUE)
            yield [item] if value is _NO_VALUE else [item, value], flag, found, value


def args_without(command: Command, args: list[Any], key: str) -> list[Any]:
    """``args`` without the option ``key`` of ``command`` (its flag or its off flag, with its value) where they
    give it; every other option keeps its value, however it looks (``--system --out`` gives --system the text)."""
    params = parameters(command)
    dropped = next((p for p in params if not p.argument and key.replace("-", "_") in p.keys), None)
    return [word for words, _, found, _ in _split_args(args, _by_flag(params)) if found is None or found[0] is not dropped for word in words]


def _options_among(args: list[Any], by_flag: dict[str, tuple[Parameter, bool]], where: str) -> tuple[list[Any], list[tuple[Parameter, bool, Any]]]:
    """A stage's ``args`` split as its command line would split them: the arguments, and the options written among
    them with their values."""
    rest: list[Any] = []
    named: list[tuple[Parameter, bool, Any]] = []
    for words, flag, found, value in _split_args(args, by_flag):
        if flag is None:
            rest.append(value)
        elif flag == "--":
            continue
        elif found is None:
            raise InputError(f"{where}: args: {shown(words[0])} is not an option of the command")
        elif value is _NO_VALUE:
            raise InputError(f"{where}: args: {flag} needs a value after it")
        else:
            named.append((*found, value))
    return rest, named


def _text(p: Parameter, value: Any) -> Any:
    """A number in the file where the option takes text (a path, a choice, a name) is that text, as on the command
    line; anything else goes to the Struct as the file gives it."""
    if p.kind not in (bool, int, float) and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)  # (nan and inf are TOML's words for no number: refused as text)
    return value


def _received(p: Parameter, value: Any, where: str) -> Any:
    """A converted field as the command receives it."""

    def one(item: Any) -> Any:
        if p.parser is not None:
            try:  # grtool's parsers refuse with a GrtoolError naming the option
                return p.parser(item)
            except GrtoolError as e:  # the same error (a missing extra's too), naming the stage
                e.args = (f"{where}: {e}",)
                raise
        return Path(item) if p.kind is Path else item

    return [one(v) for v in value] if p.many else one(value)


def _refusal(error: msgspec.ValidationError, params: tuple[Parameter, ...], data: dict[str, Any]) -> str:
    """msgspec's words for a value the Struct refused, in the command's terms: the option, the value, what it takes."""
    message = str(error)
    if message.startswith("Object missing required field"):
        name = message.split("`")[1]
        p = next(p for p in params if p.name == name)
        return f"{p.label} is missing ({'give it in args' if p.argument else 'the command requires it'})"
    detail, _, path = message.rpartition(" - at `$.")
    name = path.rstrip("`").split("[")[0]
    p = next((p for p in params if p.name == name), None)
    if p is None:
        return message
    value = data.get(name)
    if "[" in path and isinstance(value, list):
        value = value[int(path.split("[")[1].split("]")[0])]
    if isinstance(p.kind, type) and issubclass(p.kind, Enum):
        return f"{p.label}: {shown(value)} is not one of {', '.join(repr(m.value) for m in p.kind)}"
    if p.kind in (int, float):
        return f"{p.label} {shown(value)}: expected {describe(integer=p.kind is int, low=p.low, high=p.high)}"
    wanted = {bool: "true or false", str: "text", Path: "a path"}.get(p.kind, detail)
    return f"{p.label} {shown(value)}: expected {wanted}{' (a list of them)' if p.many else ''}"
