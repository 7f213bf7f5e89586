"""`grtool filters` commands."""

from __future__ import annotations

import typer

app = typer.Typer(name="filters", help="Filter chains (format, existing triples, gold coverage, answers, redundancy).", no_args_is_help=True)
