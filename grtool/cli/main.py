"""The `grtool` command: one Typer sub-app per stage, registered here; the commands live beside this file."""

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
import typer.rich_utils

from grtool import __version__
from grtool.cli.shape import use_metavar_style
from grtool.errors import EXIT_DATA, EXIT_INTERRUPTED, EXIT_USAGE, GrtoolError
from grtool.log import configure, console, log_width

if typer.rich_utils.MAX_WIDTH is None:  # TERMINAL_WIDTH unset: --help piped or logged is not cut to 80 columns
    typer.rich_utils.MAX_WIDTH = log_width(sys.stdout)
use_metavar_style()  # one metavar style in every --help: none on flags, PATH / TEXT / INTEGER / [a|b] on values

# `grtool --help` lists the commands in the order of the recipe, then the ones that look at its outputs.
RECIPE_ORDER = ("corpus", "triples", "chains", "filters", "index", "export", "train", "retrieve", "eval", "pipeline",
                "status", "validate", "show", "report")


def recipe_rank(name: str) -> int:
    return RECIPE_ORDER.index(name) if name in RECIPE_ORDER else len(RECIPE_ORDER)


class _RecipeOrder(typer.core.TyperGroup):
    def list_commands(self, ctx) -> list[str]:
        return sorted(super().list_commands(ctx), key=recipe_rank)


app = typer.Typer(
    name="grtool",
    cls=_RecipeOrder,
    help="Build the data and indexes for chain-of-thought generative retrieval.\n\n"
    "Example: grtool corpus ingest hotpot_dev_distractor_v1.json --out out/hotpot",
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
    version: Annotated[
        Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More log output (stderr).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors; no progress bars.")] = False,
) -> None:
    configure(verbose=verbose, quiet=quiet)


def _register() -> None:
    # Imported here so that `grtool --help` stays fast and each stage's imports stay in its own module.
    from grtool.cli import chains, corpus, corpus_overlap, evaluate, export, filters, index, pipeline, retrieve, show_report, status_validate, train, triples

    del corpus_overlap  # it only attaches commands to `corpus`

    status_validate.register(app)
    show_report.register(app)
    retrieve.register(app)
    for module in (corpus, triples, chains, filters, index, export, train, evaluate, pipeline):
        if module.app.registered_commands or module.app.registered_groups:
            app.add_typer(module.app)


_register()


def run() -> None:
    """Entry point: user-facing errors print one clear line on stderr and exit with their code; SIGTERM stops any
    command resumably with the transient code (grtool/signals.py)."""
    from grtool import signals
    from grtool.invocation import set_command

    set_command(["grtool", *sys.argv[1:]])  # what manifests record; the only place grtool reads sys.argv
    with signals.handled(ends_process=True):
        _run()


def _run() -> None:
    from grtool import signals
    from grtool.holds import hold
    from grtool.store.stops import recording

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

        console.print(f"[bold red]error:[/] {escape(scrub(str(e)))}", highlight=False, soft_wrap=True)  # one line, however long
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        _interrupted()
    except _click_errors() as e:  # usage errors: missing or unknown options, bad values
        e.show()
        sys.exit(EXIT_USAGE)
    except Exception as e:  # a full disk or quota, wherever it is met: one line, exit 1 (the output stays resumable)
        from grtool.invocation import current_command
        from grtool.store.diskfull import is_disk_full, message, quiet_stdout

        if not is_disk_full(e):
            raise
        text = message(e, current_command())
        quiet_stdout()
        console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)
        sys.exit(EXIT_DATA)


def _interrupted() -> None:
    """Ctrl-C: cleaned up and reported as SIGTERM is, but exit 130 (a retry loop on 75 must not start it again)."""
    from grtool.signals import stop_message

    console.print(f"[red]interrupted:[/] {escape(stop_message('SIGINT received'))}", highlight=False, soft_wrap=True)
    sys.exit(EXIT_INTERRUPTED)


def _click_errors() -> tuple[type[Exception], ...]:
    """Click's exception class, from click itself and from the copy that newer Typer releases vendor."""
    import importlib

    found = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(name).ClickException)
        except ImportError:
            continue
    return tuple(found)
