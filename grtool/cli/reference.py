"""The command reference, read from the CLI itself: docs/reference/cli.md is generated from it (and a docs test
fails when the committed page differs from what the CLI makes now), and the docs test checks every `grtool …` line
of the documentation against it, so neither can drift from the commands.

    python -m grtool.cli.reference > docs/reference/cli.md
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

GLOBAL_OPTIONS = {"-v", "--verbose", "-q", "--quiet", "--version", "-h", "--help"}
REGENERATE = "python -m grtool.cli.reference > docs/reference/cli.md"

# The page's opening (the input rule as grtool.cli.shape.INPUT_RULE states it; tests/cli/test_cli_shape.py checks it).
PAGE_HEAD = """\
<!-- Generated from the CLI by `{regenerate}`: do not edit (tests/project/test_docs.py checks it is current). -->
# Command reference

Every command, its arguments and options, read from the CLI (`grtool COMMAND --help` prints the same). Exit
codes: [Exit codes](exit-codes.md).

## How commands take their inputs

One rule for every command: **a command's main input, the one it reads row by row, is its positional argument;
every other stage, run or index it reads is a named option (`--corpus`, `--triples`, `--index`).** Options are
otherwise settings, and `--out` names what the command writes: a stage directory, a run directory (`corpus ingest`
and `corpus merge` write `documents/` and `questions/` under it), an index directory, a checkpoint directory or a
file, as its help says.

```bash
grtool chains synthesize out/corpus --triples out/run --split train --out out/run/chains
grtool filters apply out/run/chains --corpus out/corpus --triples out/run --split train --out out/run/filtered
grtool retrieve out/corpus --index out/run/index --out out/run/responses
```

Deprecated spellings still work until the next release, with one warning line on stderr naming the new one:

| deprecated | write instead |
|---|---|
| `grtool chains synthesize CORPUS TRIPLES` | `grtool chains synthesize CORPUS --triples TRIPLES` |
| `grtool chains gold CORPUS TRIPLES` | `grtool chains gold CORPUS --triples TRIPLES` |

In `--help`, a value's kind is written in capitals (`DIR`, `FILE`, `PATH`, `TEXT`, `INTEGER`, `FLOAT`), a choice as
`[a|b]`, and a flag, which takes no value, has none.

"""


def root_command() -> Any:
    import typer.main

    from grtool.cli.main import app

    return typer.main.get_command(app)


def commands(root: Any | None = None) -> Iterator[tuple[list[str], Any]]:
    """Every leaf command as (its words after `grtool`, the command), in registration order."""

    def walk(cmd: Any, words: list[str]) -> Iterator[tuple[list[str], Any]]:
        subs = getattr(cmd, "commands", None)
        if subs:
            from grtool.cli.main import recipe_rank

            for name in sorted(subs, key=recipe_rank) if not words else subs:  # the top level in the recipe's order
                yield from walk(subs[name], [*words, name])
        else:
            yield words, cmd

    yield from walk(root if root is not None else root_command(), [])


def _cell(text: Any) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _usage(words: list[str], cmd: Any) -> str:
    parts = ["grtool", *words]
    if any(type(p).__name__.endswith("Option") for p in cmd.params):
        parts.append("[OPTIONS]")
    for p in cmd.params:
        if type(p).__name__.endswith("Argument"):
            name = p.name.upper() + ("..." if p.nargs == -1 else "")
            parts.append(name if p.required else f"[{name}]")
    return " ".join(parts)


def _default(p: Any) -> str:
    if getattr(p, "is_flag", False) and not p.secondary_opts:
        return ""
    value = p.default
    if value is None or callable(value) or value == () or value == []:
        return ""
    return f"`{value}`"


def render_markdown() -> str:
    """Markdown for every command: its help, usage and a table of its arguments and options."""
    out = []
    for words, cmd in commands():
        out += [f"## grtool {' '.join(words)}", "", (cmd.help or "").strip(), "", f"```\n{_usage(words, cmd)}\n```", ""]
        rows = []
        for p in cmd.params:
            if type(p).__name__.endswith("Argument"):
                rows.append(f"| `{p.name.upper()}` | argument{'' if p.required else ' (optional)'} | | {_cell(getattr(p, 'help', ''))} |")
            elif "--help" not in p.opts:
                names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
                kind = "flag" if getattr(p, "is_flag", False) else ("repeatable" if getattr(p, "multiple", False) else "value")
                rows.append(f"| {names} | {kind} | {_default(p)} | {_cell(p.help)} |")
        if rows:
            out += ["| argument / option | kind | default | what it does |", "|---|---|---|---|", *rows, ""]
        out += _report_fields(words)
    return "\n".join(out)


def _report_fields(words: list[str]) -> list[str]:
    """The fields of the command's ``--json`` report, as its declaration names them (``Command(report=...)``)."""
    import msgspec

    from grtool.cli.commands import declared

    command = declared().get(" ".join(words))
    kind = command.report_type() if command is not None else None
    if kind is None:
        return []
    fields = ", ".join(f"`{f.encode_name}`" + ("" if f.required else " (optional)") for f in msgspec.structs.fields(kind))
    return [f"`--json` prints one object ({kind.__module__}.{kind.__name__}): {fields}.", ""]


def render_page() -> str:
    """docs/reference/cli.md as the CLI makes it now."""
    return PAGE_HEAD.format(regenerate=REGENERATE) + render_markdown()


def check_command_line(line: str, root: Any | None = None) -> str | None:
    """None when ``line`` (``grtool …`` as written in the docs) names a command and options it has, else what is
    wrong. Placeholders (``DIR``, ``…``) are taken as values; only command words and option names are checked."""
    root = root if root is not None else root_command()
    tokens = shlex.split(line, comments=True)
    if not tokens or not tokens[0].endswith("grtool"):
        return f"not a grtool command: {line}"
    tokens = [t for t in tokens[1:] if t not in GLOBAL_OPTIONS]
    cmd, words = root, []
    while getattr(cmd, "commands", None):
        if not tokens or tokens[0].startswith("-"):
            return None if "--help" in line or "-h" in line.split() else f"`grtool {' '.join(words)}` needs a command: {line}"
        name = tokens.pop(0)
        if name not in cmd.commands:
            return f"no command `grtool {' '.join([*words, name])}` (have: {', '.join(cmd.commands)}): {line}"
        cmd, words = cmd.commands[name], [*words, name]
    known = {o: p for p in cmd.params for o in [*p.opts, *p.secondary_opts]} | {"--help": None, "-h": None}
    for token in tokens:
        if token == "--":
            break
        if token.startswith("-") and len(token) > 1 and not token[1].isdigit():
            name = token.split("=", 1)[0]
            if name not in known:
                return f"`grtool {' '.join(words)}` has no option {name}: {line}"
    return None


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_page())
