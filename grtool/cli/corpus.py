"""`grtool corpus` commands."""

from __future__ import annotations

import typer

app = typer.Typer(name="corpus", help="Ingest, merge and describe the question/document corpora.", no_args_is_help=True)
