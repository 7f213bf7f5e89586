"""`grtool corpus overlap`: registered on the `corpus` sub-app (kept in its own file)."""

from __future__ import annotations

from grtool.cli.corpus import app  # noqa: F401  (commands defined here attach to `grtool corpus`)
