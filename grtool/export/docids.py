"""Reading docids back out of model text.

A docid is a knowledge triple ``head, relation, tail`` between markers. Trained models write the special
tokens ``<docid_start>…<docid_end>``; off-the-shelf models write square brackets ``[…]``. Responses are
scanned for both: special-token spans first, then brackets in what is left.

Anything between markers that cannot be a docid is *malformed*, counted, never raised:
an opening marker that is never closed (or opened again before it closes, i.e. nested), a closing marker
without an opening one, an empty span, and a span that is not three non-empty comma-separated parts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SPECIAL_START = "<docid_start>"
SPECIAL_END = "<docid_end>"
BRACKET_START = "["
BRACKET_END = "]"

_SPECIAL = re.compile(re.escape(SPECIAL_START) + "|" + re.escape(SPECIAL_END))
_BRACKET = re.compile(r"[\[\]]")


@dataclass
class ParsedDocids:
    docids: list[str] = field(default_factory=list)  # inner text, whitespace-normalized: "head, relation, tail"
    malformed: int = 0


def normalize_docid(inner: str) -> str:
    """The lookup form of a docid's text: whitespace runs collapsed, ends trimmed, no spaces around commas.

    ``"Moza bint Nasser ,  place of birth,Al Khor"`` → ``"Moza bint Nasser,place of birth,Al Khor"``. Case and
    every other character stay as written: a docid names a stored triple exactly. (Whitespace is what
    ``str.isspace`` says; :mod:`grtool.export.lookup` does the same over Arrow columns.)
    """
    return " ".join(inner.split()).replace(" ,", ",").replace(", ", ",")


def is_triple(inner: str) -> bool:
    """Three non-empty parts separated by commas (the tail may hold more commas: 'July 31, 2012')."""
    parts = inner.split(",", 2)
    return len(parts) == 3 and all(p.strip() for p in parts)


def parse_docids(text: str) -> ParsedDocids:
    """Every docid of ``text`` in order of appearance within each marker kind, and the malformed count."""
    out = ParsedDocids()
    rest = _scan(text, _SPECIAL, SPECIAL_START, out) if SPECIAL_START in text or SPECIAL_END in text else text
    if BRACKET_START in rest or BRACKET_END in rest:
        _scan(rest, _BRACKET, BRACKET_START, out)
    return out


def _scan(text: str, markers: re.Pattern[str], start: str, out: ParsedDocids) -> str:
    """Collect the spans between balanced markers; return the text outside them (markers removed)."""
    outside: list[str] = []
    last = 0  # end of the text already handed to `outside` or consumed by a span
    open_at: int | None = None  # where the inner text of the open span begins
    for m in markers.finditer(text):
        if m.group() == start:
            if open_at is not None:  # opened again before closing: the first opening is broken
                out.malformed += 1  # (its text stays outside, so brackets inside it are still read)
            outside.append(text[last : m.start()])
            open_at = last = m.end()
        elif open_at is None:  # a closing marker with nothing open
            out.malformed += 1
            outside.append(text[last : m.start()])
            last = m.end()
        else:
            inner = normalize_docid(text[open_at : m.start()])
            if inner and is_triple(inner):
                out.docids.append(inner)
            else:
                out.malformed += 1
            open_at = None
            last = m.end()
    if open_at is not None:  # never closed (often a generation cut off by the length limit)
        out.malformed += 1
    outside.append(text[last:])
    return " ".join(outside)
