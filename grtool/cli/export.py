"""`grtool export` commands."""

from __future__ import annotations

import typer

app = typer.Typer(name="export", help="Export training data for SFT, KTO and GMR-style trainers.", no_args_is_help=True)
