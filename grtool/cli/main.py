"""The `grtool` command, built from the declared commands (grtool/cli/commands.py) of the modules beside this file."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

from grtool import signals


def _launched() -> bool:
    """This process is the `grtool` command (the console script or ``python -m grtool``), not a program that imports
    it, nor a worker process that multiprocessing started (its main module is ``__mp_main__``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(main, "__name__", None) != "__main__":
        return False
    return getattr(spec, "name", None) == "grtool.__main__" or os.path.basename(sys.argv[0] if sys.argv else "") == "grtool"


if _launched():  # before the imports below, which take a second or more: SIGTERM meanwhile exits 75 too
    signals.install_early()
    from grtool.errors import InputError
    from grtool.holds import hold

    try:
        hold("starting")  # a test's signal lands here, among the imports, whatever the machine's speed
    except InputError:
        pass  # a malformed GRTOOL_HOLD is reported by the command's own hold points, as one line


import typer
from rich.markup import escape
import typer.core

from grtool import __version__
from grtool.cli import commands
from grtool.cli.shape import help_context, use_metavar_style
from grtool.cli.typed import use_plain_values
from grtool.errors import EXIT_DATA, EXIT_INTERRUPTED, EXIT_USAGE, GrtoolError

use_metavar_style()  # one metavar style in every --help: none on flags, PATH / TEXT / INTEGER / [a|b] on values
use_plain_values()  # a command's plain values converted without importing pydantic

# `grtool --help` lists the commands in the order of the recipe, then the ones that look at its outputs.
RECIPE_ORDER = ("corpus", "triples", "chains", "filters", "index", "export", "train", "retrieve", "eval", "pipeline", "status", "validate", "show", "report")


def recipe_rank(name: str) -> int:
    return RECIPE_ORDER.index(name) if name in RECIPE_ORDER else len(RECIPE_ORDER)


class _RecipeOrder(typer.core.TyperGroup):
    """The ``grtool`` group: its commands are the declared ones (grtool/cli/commands.py), each made into a Click
    command when looked up (every numeric option parsed by grtool.userinput: grtool/cli/typed.py)."""

    context_class = help_context()

    def __init__(self, **settings) -> None:
        super().__init__(**settings)
        self.commands = commands.DeclaredCommands(made=self.commands)

    def list_commands(self, ctx) -> list[str]:
        return sorted(super().list_commands(ctx), key=recipe_rank)


app = typer.Typer(
    name="grtool",
    cls=_RecipeOrder,
    help="Build the data and indexes for chain-of-thought generative retrieval.\n\nExample: grtool corpus ingest hotpot_dev_distractor_v1.json --out out/hotpot",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"grtool {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More log output (stderr).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors; no progress bars.")] = False,
) -> None:
    from grtool.log import configure
    from grtool.userinput import check_environment

    check_environment()  # a wrong environment variable stops every command before it writes anything
    configure(verbose=verbose, quiet=quiet)


def run(ends_process: bool = True) -> None:
    """Entry point: user-facing errors print one clear line on stderr and exit with their code; SIGTERM stops any
    command resumably with the transient code (grtool/signals.py). ``ends_process=False`` (tests calling it in their
    own process): the exit is a ``SystemExit`` raised to the caller instead of the end of the process."""
    from grtool import signals
    from grtool.invocation import set_command

    set_command(["grtool", *sys.argv[1:]])  # what manifests record; the only place grtool reads sys.argv
    with signals.handled(ends_process=ends_process):
        _run()


def _run() -> None:
    from grtool import signals
    from grtool.holds import hold
    from grtool.store.frames import recording

    try:
        try:
            # With standalone_mode off, click returns the code of a typer.Exit instead of exiting. A failure after
            # a stage directory exists is recorded in its manifest (validate fails it until a run succeeds).
            with recording() as outcome:
                code = app(standalone_mode=False)
                outcome.returned(code)  # Ctrl-C comes back as 130: not a success
        finally:
            signals.work_finished()  # whatever came of it: a signal from here on changes only the exit code
        hold("finished")
        if code == EXIT_INTERRUPTED and signals.interrupted():  # Typer hands Ctrl-C back as exit code 130
            _interrupted()
        sys.exit(code if isinstance(code, int) else 0)
    except GrtoolError as e:
        from grtool.secrets import scrub  # the last line of defence: no credential reaches stderr

        from grtool.userinput import escaped  # a newline or a control character in a file name stays on the line

        _error(escaped(scrub(str(e))))
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        _interrupted()
    except commands.click_errors() as e:  # usage errors: missing or unknown options, bad values: one line, as every error
        _error(_usage_line(e))
        sys.exit(EXIT_USAGE)
    except Exception as e:  # a full disk or quota, or a place that refuses writes, wherever met: one line
        from grtool.invocation import current_command
        from grtool.store.diskfull import is_disk_full, message, place_error, quiet_stdout

        place = place_error(e)  # a read-only file system or cache, no write permission: one line, exit 2
        if place is not None:
            from grtool.userinput import escaped

            _error(escaped(place))
            sys.exit(EXIT_USAGE)
        if not is_disk_full(e):
            raise
        text = message(e, current_command())
        quiet_stdout()
        _error(text)
        sys.exit(EXIT_DATA)


def _interrupted() -> None:
    """Ctrl-C: cleaned up and reported as SIGTERM is, but exit 130 (a retry loop on 75 must not start it again)."""
    from grtool.signals import stop_message

    _line("[red]interrupted:[/]", stop_message("SIGINT received"))
    sys.exit(EXIT_INTERRUPTED)


def _error(text: str) -> None:
    _line("[bold red]error:[/]", text)


def _line(label: str, text: str) -> None:
    """One line on stderr, however long: ``label`` (Rich markup) and ``text`` (printed as it is)."""
    from grtool.log import console

    console.print(f"{label} {escape(text)}", highlight=False, soft_wrap=True)


def _usage_line(error: Exception) -> str:
    """A Click usage error on one line, with the command's help option (Click prints usage, hint and error on
    three lines)."""
    from grtool.userinput import escaped

    message = " ".join(error.format_message().split())  # type: ignore[attr-defined]
    ctx = getattr(error, "ctx", None)
    if ctx is not None and getattr(error, "exit_code", 2) == EXIT_USAGE:
        message += f" (see: {ctx.command_path} -h)"
    return escaped(message)
