"""Every numeric option and argument of every command is parsed by :func:`grtool.userinput.parse_number`: finite,
an integer where the annotation says ``int``, within the ``min=``/``max=`` the option declares and never past
:data:`grtool.userinput.MAX_INTEGER`. Applied once to the whole command tree (:func:`bound_numbers`), so a command
added later is covered without a line of its own; a wrong value is one usage line naming the option."""

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


def bound_numbers(command: Any) -> Any:
    """Route the numeric parameters of ``command`` and of every command under it through the one parser."""
    if getattr(command, _DONE, False):
        return command
    setattr(command, _DONE, True)
    for param in getattr(command, "params", ()):
        kind = _number_kind(param)
        if kind is not None:
            _bind(param, *kind)
    for sub in getattr(command, "commands", {}).values():
        bound_numbers(sub)
    return command
