"""MkDocs hook: the page holding the marker below gets the command reference rendered from the CLI itself
(grtool.cli.reference), so the reference cannot drift from the commands."""

from __future__ import annotations

MARKER = "<!-- grtool-cli-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' hook signature)
    if MARKER not in markdown:
        return markdown
    from grtool.cli.reference import render_markdown

    return markdown.replace(MARKER, render_markdown())
