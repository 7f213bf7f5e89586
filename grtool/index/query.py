"""`grtool index query`: the valid next tokens after a docid prefix, and the documents of a complete docid."""

from __future__ import annotations

from typing import Any

from grtool.docid import DOCID_START
from grtool.errors import InputError
from grtool.index.base import Index


def parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise InputError(f"--ids {text!r}: expected comma-separated token ids like 128256,791,50017") from None


def prefix_ids(index: Index, text: str | None = None, ids: list[int] | None = None) -> list[int]:
    """The token prefix to look up. A docid index anchors every prefix at <docid_start>: text is tokenized
    with the marker in front (as inside a whole docid) and ids get the marker id prepended when missing."""
    docid_mode = index.source == "docids"
    if text is not None:
        if docid_mode and not text.startswith(DOCID_START):
            text = DOCID_START + text
        return index.tokenizer.encode(text) if text else []
    ids = list(ids or [])
    if docid_mode and ids and ids[0] != index.start_id:
        ids = [index.start_id, *ids]
    return ids


def query(index: Index, ids: list[int]) -> dict[str, Any]:
    """{"prefix_ids", "next": [{"id", "text", "count"}], "count", "docs", "flipped"}: ``flipped`` is None unless
    the prefix is a whole docid, then whether it is a tail-first spelling (an index built with --flips)."""
    state = index.walk(ids)
    next_ids, counts = index.next_tokens(state)
    tok = index.tokenizer
    docs, flipped = index.resolve_docid(ids) if ids else ([], None)
    return {
        "prefix_ids": [int(t) for t in ids],
        "next": [{"id": int(t), "text": tok.token_text(int(t)), "count": int(c)} for t, c in zip(next_ids, counts)],
        "count": int(index.count(state)),
        "docs": docs,
        "flipped": flipped,
    }
