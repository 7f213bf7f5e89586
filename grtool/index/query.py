"""`grtool index query`: the valid next tokens after a docid prefix, and the documents of a complete docid."""

from __future__ import annotations

from typing import Any

from grtool.docid import DOCID_END, DOCID_START, SPECIAL
from grtool.errors import InputError
from grtool.index.base import Index


MAX_TOKEN_ID = 2**31 - 1


def parse_ids(text: str) -> list[int]:
    from grtool.userinput import parse_number, shown

    try:  # a negative id matches nothing (a typo, not a query); ids past 2**31 are no vocabulary's
        return [parse_number(x, integer=True, low=0, high=MAX_TOKEN_ID) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise InputError(f"--ids {shown(text)}: expected comma-separated token ids from 0 to {MAX_TOKEN_ID:,} like 128256,791,50017") from None


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


# How a query's text was read (``read_as`` in the result).
WHOLE_DOCID = "docid"  # a whole docid: its documents
PREFIX = "prefix"  # a docid prefix: the valid next tokens
IDS = "ids"  # token ids given with --ids, looked up as they are


def _bare(text: str) -> tuple[str, bool]:
    """The text between markers typed with it, whitespace around it dropped; and whether it ended with
    <docid_end> (the user said: a whole docid)."""
    inner = text.strip()
    if inner.startswith(DOCID_START):
        inner = inner[len(DOCID_START) :]
    closed = inner.endswith(DOCID_END)
    if closed:
        inner = inner[: -len(DOCID_END)]
    return inner.strip(), closed


def query_text(index: Index, text: str, *, prefix: bool = False) -> dict[str, Any]:
    """:func:`query` for text typed by a person; ``read_as`` says how it was read, ``text`` what was looked up.

    In a docid index the text is first read as a whole docid ``head, relation, tail`` (whitespace around it
    and markers typed with it dropped, the markers put back by :data:`grtool.docid.SPECIAL`): when the index
    holds that docid, the answer is its documents. Otherwise, and always with ``prefix``, it is a prefix of
    docids (a trailing space would be a token of its own that no docid has: the next tokens carry their
    leading space). A text closed with <docid_end> is only ever a whole docid. A documents index (substring
    search) takes the text as it is.
    """
    if index.source != "docids":
        return {**query(index, prefix_ids(index, text)), "read_as": PREFIX, "text": text}
    inner, closed = _bare(text)
    if not prefix or closed:
        whole = SPECIAL.wrap(inner)
        ids = index.tokenizer.encode(whole)
        if closed or index.resolve_docid(ids)[1] is not None:
            return {**query(index, ids), "read_as": WHOLE_DOCID, "text": whole}
    return {**query(index, prefix_ids(index, inner)), "read_as": PREFIX, "text": DOCID_START + inner}


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
