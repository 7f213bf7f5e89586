"""`grtool eval` commands."""

from __future__ import annotations

import typer

app = typer.Typer(name="eval", help="Score model responses (retrieval recall).", no_args_is_help=True)
