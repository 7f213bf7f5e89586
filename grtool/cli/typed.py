"""Every numeric option and argument of every command is parsed by :func:`grtool.userinput.parse_number`: finite,
an integer where the annotation says ``int``, within the ``min=``/``max=`` the option declares and never past
:data:`grtool.userinput.MAX_INTEGER`. Applied once to the whole command tree (:func:`bound_numbers`), so a command
added later is covered without a line of its own; a wrong value is one usage line naming the option. Text
parameters that do not name files must be valid UTF-8 (a query typed in another encoding)."""

from __future__ import annotations

from typing import Any

from grtool.errors import InputError
from grtool.userinput import parse_number, shown

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


def _bind(param: Any, integer: bool, low: float | None, high: float | None) -> None:
    original = param.process_value
    label = max(param.opts, key=len) if param.opts and param.opts[0].startswith("-") else (param.name or "").upper()

    def parse(value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        try:
            return parse_number(value, integer=integer, low=low, high=high)
        except ValueError as e:
            raise InputError(f"{label} {shown(value)}: {e}") from None

    def process_value(ctx: Any, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            value = type(value)(parse(v) for v in value)
        else:
            value = parse(value)
        return original(ctx, value)

    param.process_value = process_value


# Text parameters that may name a file or a directory: any name the file system holds is one (grtool reads
# non-UTF-8 names). Every other text parameter (a query, a sentence, a qid) must be valid UTF-8.
MAY_NAME_FILES = frozenset({"baseline", "corpus", "few_shot_from", "model", "overrides", "reports", "rules", "tokenizer", "triples"})


def _is_text(param: Any) -> bool:
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    return (annotation is str or annotation == list[str]) and param.name not in MAY_NAME_FILES


def _bind_text(param: Any) -> None:
    """Command-line bytes that are not UTF-8 reach Python as surrogate escapes, which no encoder (tokenizers,
    JSON, Parquet) takes: refused here, by the option's name."""
    original = param.process_value
    label = max(param.opts, key=len) if param.opts and param.opts[0].startswith("-") else (param.name or "").upper()

    def check(value: Any) -> Any:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InputError(f"{label} {shown(value)}: not valid UTF-8 text (the bytes given are not UTF-8)") from None
        return value

    def process_value(ctx: Any, value: Any) -> Any:
        value = type(value)(check(v) for v in value) if isinstance(value, (list, tuple)) else check(value)
        return original(ctx, value)

    param.process_value = process_value


def bound_numbers(command: Any) -> Any:
    """Route the numeric parameters of ``command`` and of every command under it through the one parser, and check
    that its text parameters are text."""
    if getattr(command, _DONE, False):
        return command
    setattr(command, _DONE, True)
    for param in getattr(command, "params", ()):
        kind = _number_kind(param)
        if kind is not None:
            _bind(param, *kind)
        elif _is_text(param):
            _bind_text(param)
    for sub in getattr(command, "commands", {}).values():
        bound_numbers(sub)
    return command
