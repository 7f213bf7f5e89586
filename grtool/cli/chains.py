"""`grtool chains` commands."""

from __future__ import annotations

import typer

app = typer.Typer(name="chains", help="Synthesize thought-retrieval chains from questions and gold triples.", no_args_is_help=True)
