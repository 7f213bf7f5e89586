"""Docids inside generated chains: find them, match them to the offered triples, rewrite them with markers.

Off-the-shelf models cite a triple as ``[head, relation, tail]``; trained models write
``<docid_start>head, relation, tail<docid_end>``. Both forms are found. A bracket counts as a docid when
its text matches one of the triples the prompt offered (as written or flipped tail-to-head) or at least
looks like a triple (three comma-separated parts with letters in the relation); anything else in square
brackets (``[1]``, ``[citation needed]``, ``[a, b]``) is left alone.

Matching forgives case, spacing and spacing around commas, so a model that writes ``[moza bint nasser ,
place of birth, Al Khor]`` is credited with the stored triple; the normalized docid then carries the stored
spelling, in the orientation the model wrote.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

DOCID_START = "<docid_start>"
DOCID_END = "<docid_end>"


@dataclass(frozen=True)
class Markers:
    """The strings around a docid in normalized chains (configurable, e.g. a model's own special tokens)."""

    start: str = DOCID_START
    end: str = DOCID_END

    def render(self, head: str, relation: str, tail: str) -> str:
        return f"{self.start}{head}, {relation}, {tail}{self.end}"

    def wrap(self, inner: str) -> str:
        return f"{self.start}{inner}{self.end}"

    def pattern(self) -> re.Pattern[str]:
        """Either marker, captured: ``pattern.split(text)`` alternates text and markers."""
        return re.compile("(" + re.escape(self.start) + "|" + re.escape(self.end) + ")")


@dataclass(frozen=True)
class Triple:
    doc_id: str
    idx: int
    head: str
    relation: str
    tail: str

    def text(self) -> str:
        return f"{self.head}, {self.relation}, {self.tail}"


_SPACES = re.compile(r"\s+")
_SPACED_COMMA = re.compile(r"\s*,\s*")
_HAS_LETTER = re.compile(r"[^\W\d_]")


def match_key(text: str) -> str:
    """What two spellings of one triple have in common: case, runs of spaces and spaces at commas dropped."""
    text = _SPACES.sub(" ", text.strip().strip("\"'")).casefold()
    return _SPACED_COMMA.sub(",", text)


def looks_like_triple(inner: str) -> bool:
    parts = [p.strip() for p in inner.split(",")]
    if len(parts) < 3 or not all(parts):
        return False
    # A relation is a phrase: "[1, 2, 3]" or "[x, 0.5, y]" are not docids.
    return any(_HAS_LETTER.search(p) for p in parts[1:-1])


@dataclass
class OfferedTriples:
    """The triples one prompt offered, looked up by their match key in both orientations."""

    forward: dict[str, Triple] = field(default_factory=dict)
    flipped: dict[str, Triple] = field(default_factory=dict)

    @classmethod
    def of(cls, triples: Iterable[Triple]) -> "OfferedTriples":
        offered = cls()
        for t in triples:
            offered.forward.setdefault(match_key(t.text()), t)
            offered.flipped.setdefault(match_key(f"{t.tail}, {t.relation}, {t.head}"), t)
        return offered

    def lookup(self, inner: str) -> tuple[Triple | None, bool]:
        """The offered triple a citation names, and whether it was written flipped (forward wins a tie)."""
        key = match_key(inner)
        if key in self.forward:
            return self.forward[key], False
        if key in self.flipped:
            return self.flipped[key], True
        return None, False


@dataclass
class NormalizedChain:
    text: str  # the chain with every docid between the markers
    docids: list[str]  # in order of appearance, markers included
    flipped: list[bool]  # per docid: written tail-to-head against the offered triple
    sources: list[Triple | None]  # per docid: the offered triple it names, None when it names none

    @property
    def unmatched(self) -> int:
        return sum(s is None for s in self.sources)


def citation_pattern(markers: Markers) -> re.Pattern[str]:
    """Square-bracket citations without nested brackets, or text already between the markers."""
    return re.compile(r"\[([^\[\]\n]+)\]|" + re.escape(markers.start) + r"(.*?)" + re.escape(markers.end), re.DOTALL)


def normalize_chain(text: str, offered: OfferedTriples, markers: Markers = Markers(), pattern: re.Pattern[str] | None = None) -> NormalizedChain:
    """Rewrite the citations in ``text`` as marked docids and list them in order."""
    pattern = pattern or citation_pattern(markers)
    docids: list[str] = []
    flipped: list[bool] = []
    sources: list[Triple | None] = []

    def replace(m: re.Match[str]) -> str:
        bracketed = m.group(1) is not None
        inner = m.group(1) if bracketed else m.group(2)
        triple, was_flipped = offered.lookup(inner)
        if triple is None and bracketed and not looks_like_triple(inner):
            return m.group(0)
        if triple is None:
            docid = markers.wrap(_SPACES.sub(" ", inner.strip()))
        elif was_flipped:
            docid = markers.render(triple.tail, triple.relation, triple.head)
        else:
            docid = markers.render(triple.head, triple.relation, triple.tail)
        docids.append(docid)
        flipped.append(was_flipped)
        sources.append(triple)
        return docid

    return NormalizedChain(pattern.sub(replace, text), docids, flipped, sources)
