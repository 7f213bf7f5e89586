"""`grtool pipeline` commands."""

from __future__ import annotations

import typer

app = typer.Typer(name="pipeline", help="Run several stages from one TOML file.", no_args_is_help=True)
