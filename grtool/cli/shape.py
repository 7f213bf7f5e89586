"""One shape for every command line: how inputs are given, and how --help names the values options take.

The input rule (docs/reference/cli.md says the same): **a command's main input, the one it reads row by row, is its
positional argument; every other stage, run or index it reads is a named option (--corpus, --triples, --index).**

A spelling that breaks the rule keeps working for one release: :func:`moved_to_options` gives a command a Click
command class that takes the old extra positional argument as the named option and prints one warning naming the
new spelling.

--help shows one metavar style, the classic upper-case one (``PATH``, ``TEXT``, ``INTEGER``, ``[a|b]``) and none
on flags: :func:`use_metavar_style` sets it on the Typer releases that print ``<bool>``, ``<str>``, ``{name}``.
The commands' context (:func:`help_context`) lets the terminal wrap a docstring's paragraphs (those releases keep
its line breaks, which then print ragged) when it draws a help page, and only then loads Typer's help renderer.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import typer.core

INPUT_RULE = "A command's main input, the one it reads row by row, is its positional argument; every other stage, run or index it reads is a named option (--corpus, --triples, --index)."

_warned: set[str] = set()  # a pipeline parses a stage's line to check it, then runs it: one warning each


def _deprecated(command: str, option: str, value: str) -> None:
    from grtool.log import log

    text = (f"`grtool {command}` with {value} as a positional argument is deprecated: write {option} {value} "
            "(the old spelling works until the next release)")  # fmt: skip
    if text not in _warned:
        _warned.add(text)
        log.warning("%s", text)


def _command_words(ctx: Any) -> str:
    """``chains gold``, whether the command was reached from `grtool` (or ``python -m grtool``) or made alone (a
    pipeline checks a stage's line on the command itself, named ``grtool chains gold``)."""
    root = ctx.find_root()
    path = ctx.command_path[len(root.command_path) :] if root is not ctx else ctx.command_path
    return path.strip().removeprefix("grtool ").strip()


def moved_to_options(*options: str) -> type:
    """A command class for a command whose inputs ``options`` (``"--triples"``, in order) were once positional
    arguments after its main input: extra positional arguments fill those options when they are not given, each
    with one deprecation warning."""

    class MovedToOptions(typer.core.TyperCommand):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            # Click's own parse_args, with the leftover positionals moved into their options before the values
            # are processed (required options and type checks then see them as given).
            if not args and self.no_args_is_help and not ctx.resilient_parsing:
                return super().parse_args(ctx, args)
            parser = self.make_parser(ctx)
            opts, rest, order = parser.parse_args(args=list(args))
            by_option = {o: p for p in self.get_params(ctx) for o in getattr(p, "opts", [])}
            for option in options:
                param = by_option[option]
                if not rest or opts.get(param.name) is not None:
                    break
                value = rest.pop(0)
                opts[param.name] = value
                order.append(param)
                _deprecated(_command_words(ctx), option, value)
            core = inspect.getmodule(typer.core.TyperCommand.__mro__[1])  # click's core, vendored by Typer or not
            for param in core.iter_params_for_processing(order, self.get_params(ctx)):  # type: ignore[union-attr]
                _, rest = param.handle_parse_result(ctx, opts, rest)
            if rest and not ctx.allow_extra_args and not ctx.resilient_parsing:
                ctx.fail(f"Got unexpected extra argument(s) ({' '.join(rest)})")
            ctx.args = rest
            ctx._opt_prefixes.update(parser._opt_prefixes)
            return rest

    MovedToOptions.moved = options  # read by a pipeline's check of a stage's args (grtool/cli/stage_options.py)
    return MovedToOptions


# Typer's type labels (``<str>``, ``<int range>``) in the classic names
_TYPE_NAMES = {"str": "TEXT", "path": "PATH", "file": "PATH", "directory": "DIR", "int": "INTEGER", "float": "FLOAT",
               "int range": "INTEGER", "float range": "FLOAT", "bool": "BOOLEAN"}  # fmt: skip


def classic_type(label: str | None) -> str | None:
    """``<str>`` -> ``TEXT``, ``<a|b>`` -> ``[a|b]``, ``<list[str]>`` -> ``TEXT`` (repeatable options say so)."""
    if not label:
        return label
    inner = label[1:-1] if label.startswith("<") and label.endswith(">") else label
    if inner.startswith("list[") and inner.endswith("]"):
        inner = inner[5:-1]
    if inner in _TYPE_NAMES:
        return _TYPE_NAMES[inner]
    if "|" in inner:
        return f"[{inner}]"
    return inner.upper()


def use_metavar_style() -> None:
    """Patch the Typer releases that show ``<bool>`` on flags and ``{name}`` in usage lines to the classic style.
    Older releases already print it (Click's own help), and have none of these methods: nothing to do."""
    param_class = getattr(typer.core, "_TyperParameter", None)
    argument_class = typer.core.TyperArgument
    if param_class is None or not hasattr(param_class, "display_type_rich"):
        return
    if getattr(param_class, "_grtool_style", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) or getattr(self, "count", False):
            return None  # a flag takes no value
        if self.metavar is not None and not isinstance(self, argument_class):
            return self.metavar
        label = classic_type(self.display_type(ctx))
        return f"{label}..." if label and self.nargs != 1 and not isinstance(self, argument_class) else label

    param_class.display_type_rich = display_type_rich
    typer.core.TyperOption.display_type_rich = display_type_rich
    param_class._grtool_style = True
    if hasattr(argument_class, "_rich_display_name"):
        argument_class._rich_display_name = lambda self: self.display_name_raw.upper() + ("..." if self.nargs != 1 else "")
    if hasattr(argument_class, "_usage_display_name"):

        def usage_name(self: Any) -> str:
            name = self.display_name_raw.upper()
            name = name if self.required else f"[{name}]"
            return name + ("..." if self.nargs != 1 else "")

        argument_class._usage_display_name = usage_name


@functools.cache
def help_context() -> type:
    """The Click context class of grtool's commands: when it draws a help page, it first sets up Typer's help
    renderer (loaded only then: a command that prints no help never imports it) in grtool's style."""

    class HelpContext(typer.core.TyperGroup.context_class):  # type: ignore[name-defined,misc]
        def make_formatter(self) -> Any:
            _help_renderer_style()
            return super().make_formatter()

    return HelpContext


@functools.cache
def _help_renderer_style() -> None:
    import sys

    _import_help_renderer()
    import typer.rich_utils

    from grtool.userinput import log_width

    if typer.rich_utils.MAX_WIDTH is None:  # TERMINAL_WIDTH unset: --help piped or logged is not cut to 80 columns
        typer.rich_utils.MAX_WIDTH = log_width(sys.stdout)
    _rewrap_help_paragraphs()


class _Markdown:
    """Stands for rich.markdown.Markdown in Typer's help renderer, which draws with it only in markdown mode (grtool's
    help is in rich mode): the real class loads on first use."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from rich.markdown import Markdown

        return Markdown(*args, **kwargs)


class _Traceback:
    """Stands for rich.traceback.Traceback, which the renderer uses only for Typer's pretty exceptions (off in grtool)."""

    @classmethod
    def from_exception(cls, *args: Any, **kwargs: Any) -> Any:
        from rich.traceback import Traceback

        return Traceback.from_exception(*args, **kwargs)


def _import_help_renderer() -> None:
    """Import typer.rich_utils without rich.markdown and rich.traceback (markdown-it, pygments, rich.pretty: twice what
    the rest of the renderer costs, and --help uses neither): stand-ins take their names while it imports, then leave
    sys.modules, so that any later import of those modules gets the real ones."""
    import sys
    import types

    if "typer.rich_utils" in sys.modules:
        return
    stand_ins = {}
    for name, attribute, cls in (("rich.markdown", "Markdown", _Markdown), ("rich.traceback", "Traceback", _Traceback)):
        if name not in sys.modules:
            module = types.ModuleType(name, "grtool's stand-in while typer.rich_utils imports")
            setattr(module, attribute, cls)
            stand_ins[name] = sys.modules[name] = module
    try:
        import typer.rich_utils  # noqa: F401
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def _join_lines(paragraph: str) -> str:
    """A docstring paragraph as one flowing text (the terminal wraps it), list items kept on their own lines;
    a paragraph starting with Click's \\b marker is kept as written."""
    if paragraph.startswith("\b"):
        return paragraph
    lines = paragraph.split("\n")
    text = lines[0]
    for line in lines[1:]:
        text += ("\n" + line) if line.lstrip().startswith(("- ", "* ", "• ")) else (" " + line.strip())
    return text


def _rewrap_help_paragraphs() -> None:
    """The Typer releases that keep a docstring's line breaks in --help print ragged lines once the terminal
    wraps them again (``... the dataset's own`` / ``gold`` / ``triples ...``): join them, as older releases did."""
    import typer.rich_utils

    if not hasattr(typer.rich_utils, "_fix_linebreaks"):
        return

    def fix_linebreaks(paragraphs: list[str], markup_mode: Any) -> str:
        if markup_mode == getattr(typer.rich_utils, "MARKUP_MODE_MARKDOWN", "markdown"):
            return "\n\n".join(paragraphs)
        return "\n\n".join(_join_lines(p) for p in paragraphs)

    typer.rich_utils._fix_linebreaks = fix_linebreaks


def counts_text(counts: dict[str, Any] | None, empty: str = "none") -> str:
    """``{'too long': 2, 'no gold': 1}`` as a message writes it: ``too long 2, no gold 1`` (never a Python repr)."""
    if not counts:
        return empty
    return ", ".join(f"{name} {value}" for name, value in counts.items())


def pretty_value(value: Any, indent: str = "") -> str:
    """A record's value for a table cell: numbers with separators, a mapping one ``key: value`` per line (nested
    ones indented), a list comma-separated, None as ``-``; never a Python repr."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            if isinstance(v, dict) and v:
                lines.append(f"{indent}{k}:")
                lines.append(pretty_value(v, indent + "  "))
            else:
                lines.append(f"{indent}{k}: {pretty_value(v)}")
        return "\n".join(lines) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(pretty_value(v) for v in value) or "-"
    return str(value)
