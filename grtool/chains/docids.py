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

from grtool.docid import BROKEN, BRACKETS, DOCID_END, DOCID_START, Markers, Span, loose_key, looks_like_triple, scan

__all__ = ["DOCID_END", "DOCID_START", "Markers", "NormalizedChain", "OfferedTriples", "Triple", "citation_pattern", "looks_like_triple", "normalize_chain"]


@dataclass(frozen=True)
class Triple:
    doc_id: str
    idx: int
    head: str
    relation: str
    tail: str

    def text(self) -> str:
        return f"{self.head}, {self.relation}, {self.tail}"


@dataclass
class OfferedTriples:
    """The triples one prompt offered, looked up by their match key in both orientations."""

    forward: dict[str, Triple] = field(default_factory=dict)
    flipped: dict[str, Triple] = field(default_factory=dict)

    @classmethod
    def of(cls, triples: Iterable[Triple]) -> "OfferedTriples":
        offered = cls()
        for t in triples:
            offered.forward.setdefault(loose_key(t.text()), t)
            offered.flipped.setdefault(loose_key(f"{t.tail}, {t.relation}, {t.head}"), t)
        return offered

    def lookup(self, inner: str) -> tuple[Triple | None, bool]:
        """The offered triple a citation names, and whether it was written flipped (forward wins a tie)."""
        key = loose_key(inner)
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
    """The pattern :func:`citations` scans ``markers`` with (compile it once per run)."""
    return markers.pattern()


def citations(text: str, markers: Markers, pattern: re.Pattern[str] | None = None) -> list[tuple[Span, bool]]:
    """(span, bracketed) in order of appearance: text between the markers (a closed pair, whatever it holds),
    then square-bracket citations on one line in the text left (both cut by :func:`grtool.docid.scan`)."""
    spans = [(s, False) for s in scan(text, markers, pattern) if s.problem not in BROKEN]
    rest = text
    if spans:
        chars = list(text)
        for s, _ in spans:
            chars[s.start : s.end] = "\n" * (s.end - s.start)  # a bracket cannot reach across a marked span
        rest = "".join(chars)
    if "[" in rest:
        spans += [(s, True) for s in scan(rest, BRACKETS) if s.problem not in BROKEN and "\n" not in s.inner]
    return sorted(spans, key=lambda sb: sb[0].start)


def normalize_chain(text: str, offered: OfferedTriples, markers: Markers = Markers(), pattern: re.Pattern[str] | None = None) -> NormalizedChain:
    """Rewrite the citations in ``text`` as marked docids and list them in order."""
    docids: list[str] = []
    flipped: list[bool] = []
    sources: list[Triple | None] = []
    pieces: list[str] = []
    last = 0
    for span, bracketed in citations(text, markers, pattern):
        inner = span.inner
        triple, was_flipped = offered.lookup(inner)
        if triple is None and bracketed and not looks_like_triple(inner):
            continue
        if triple is None:
            docid = markers.wrap(" ".join(inner.split()))
        elif was_flipped:
            docid = markers.render(triple.tail, triple.relation, triple.head)
        else:
            docid = markers.render(triple.head, triple.relation, triple.tail)
        pieces.append(text[last : span.start])
        pieces.append(docid)
        last = span.end
        docids.append(docid)
        flipped.append(was_flipped)
        sources.append(triple)
    pieces.append(text[last:])
    return NormalizedChain("".join(pieces), docids, flipped, sources)
