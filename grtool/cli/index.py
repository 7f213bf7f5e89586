"""`grtool index` commands."""

from __future__ import annotations

import typer

app = typer.Typer(name="index", help="Build and query the docid index for constrained decoding.", no_args_is_help=True)
