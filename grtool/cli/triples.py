"""`grtool triples` commands."""

from __future__ import annotations

import typer

app = typer.Typer(name="triples", help="Extract knowledge triples (docids) from documents with an LLM.", no_args_is_help=True)
