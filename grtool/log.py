"""Logs and progress go to stderr; stdout is reserved for data (``--out -``) and ``--json`` reports."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)
stage_summary = Console(stderr=True)  # what a stage did (counts, where files went): silent under --quiet, unlike reports
log = logging.getLogger("grtool")
_state = {"quiet": False}


def configure(verbose: bool = False, quiet: bool = False) -> None:
    _state["quiet"] = quiet
    stage_summary.quiet = quiet
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    log.handlers.clear()
    log.addHandler(RichHandler(console=console, show_path=False, show_time=False, markup=False))
    log.setLevel(level)
    log.propagate = False


def is_quiet() -> bool:
    return _state["quiet"]


def progress(*extra_columns) -> Progress:
    """A Rich progress bar on stderr with rate columns and ETA; silent under --quiet."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra_columns,
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        disable=_state["quiet"],
        transient=False,
    )


configure()
