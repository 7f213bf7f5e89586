"""The docid: a knowledge triple ``head, relation, tail`` between two markers, and everything about its text.

One home for what every stage needs to know about docids (chains, filters, export, recall, KTO, the index):

- **Markers**: trained models write the special tokens :data:`DOCID_START` / :data:`DOCID_END`
  (:data:`SPECIAL`); off-the-shelf models write square brackets (:data:`BRACKETS`). :class:`Markers` holds
  one pair (configurable, e.g. a model's own special tokens).
- **Render**: :func:`render` writes ``<start>head, relation, tail<end>``.
- **Parse**: :func:`scan` cuts a text at one pair of markers into :class:`Span` s with their positions,
  well-formed or not; :func:`parse` reads model text the way recall and KTO do (special tokens first, then
  square brackets in what is left).
- **Normalize**: :func:`normalize` is *the* rule that decides whether two spellings name the same triple;
  the filters (docid-exists, gold, redundant), recall, KTO and the lookups all use it:

    runs of whitespace (``str.isspace``) become one space, the ends are trimmed, and the spaces next to
    every comma are dropped. Case and every other character stay as written.

  ``"Moza bint Nasser ,  place of birth,Al Khor"`` → ``"Moza bint Nasser,place of birth,Al Khor"``. The
  key of a stored triple is ``normalize(head) + "," + normalize(relation) + "," + normalize(tail)``, which
  equals ``normalize(f"{head}, {relation}, {tail}")`` (:func:`triple_key`); :func:`normalize_expr` is the
  same rule over a polars column (tested equal). `chains synthesize` matches a model's citations to the
  offered triples more loosely (:func:`loose_key`: case folded too), then writes the stored spelling.
- **Flip**: a docid may be written tail-first, ``tail, relation, head``; :func:`flip` turns a triple round
  and :func:`flip_key` gives the key of its tail-first reading.
- **Syntax**: a docid's text is never split back into its parts (a head may hold commas, ``Ana, mon amour``,
  and so may a tail, ``July 31, 2012``): recall, KTO and the filters compare whole keys and the lookup gives the
  stored parts back; every rendering and every flip is made from the stored parts. :func:`triple_problem` says
  whether a triple's parts can live inside a docid, and why not (a reason code), so that the docid and its
  tail-first spelling both read back, in either marker syntax, as one well-formed docid with the triple's key.
- **Lookup**: :mod:`grtool.docid.lookup` resolves docid keys to stored triples and their documents, as
  written or flipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

DOCID_START = "<docid_start>"
DOCID_END = "<docid_end>"
BRACKET_START = "["
BRACKET_END = "]"

Triple = tuple[str, str, str]


@dataclass(frozen=True)
class Markers:
    """The strings around a docid (configurable, e.g. a model's own special tokens)."""

    start: str = DOCID_START
    end: str = DOCID_END

    def render(self, head: str, relation: str, tail: str) -> str:
        return f"{self.start}{head}, {relation}, {tail}{self.end}"

    def wrap(self, inner: str) -> str:
        return f"{self.start}{inner}{self.end}"

    def unwrap(self, docid: str) -> str | None:
        """The text between the markers of a whole docid string, None when it is not wrapped in them."""
        if len(docid) >= len(self.start) + len(self.end) and docid.startswith(self.start) and docid.endswith(self.end):
            return docid[len(self.start) : len(docid) - len(self.end)]
        return None

    def pattern(self) -> re.Pattern[str]:
        """Either marker, captured: ``pattern.split(text)`` alternates text and markers."""
        return re.compile("(" + re.escape(self.start) + "|" + re.escape(self.end) + ")")


def check_markers(markers: Markers) -> Markers:
    """Markers a docid can be read back between: two non-empty strings, neither holding the other (an empty or a
    shared marker would make every text, or no text, a docid)."""
    start, end = markers.start, markers.end
    if not start.strip() or not end.strip() or start in end or end in start:
        from grtool.errors import InputError

        raise InputError(f"--docid-start {start!r} / --docid-end {end!r}: docid markers must be two different non-empty strings, neither inside the other")
    return markers


SPECIAL = Markers(DOCID_START, DOCID_END)
BRACKETS = Markers(BRACKET_START, BRACKET_END)
MARKERS = {"special": SPECIAL, "brackets": BRACKETS}


def render(triple: Triple, markers: Markers = SPECIAL) -> str:
    """The docid string the retrieval model generates for a triple."""
    return markers.render(*triple)


def flip(triple: Triple) -> Triple:
    """The tail-first reading ``tail, relation, head``."""
    return triple[2], triple[1], triple[0]


# --- syntax of the parts ---------------------------------------------------------------------------------

# Reason codes (the rejects of `triples extract`, the index build's skipped docids): why a part cannot be in a docid.
EMPTY_PART = "empty_part"  # empty or whitespace only: the docid is not three parts
DOCID_MARKER_IN_PART = "docid_marker_in_part"  # a marker inside ends or nests the docid's span
BRACKET_IN_PART = "bracket_in_part"  # "[" / "]" end or nest a docid written with square brackets
CONTROL_CHAR_IN_PART = "control_char_in_part"  # newline, CR, tab, NUL, any control or line-separator character
SEPARATOR_IN_PART = "separator_in_part"  # a comma with nothing on one side: the docid or its flip has an empty part
SYNTAX_REASONS = (EMPTY_PART, DOCID_MARKER_IN_PART, BRACKET_IN_PART, CONTROL_CHAR_IN_PART, SEPARATOR_IN_PART)

PART_NAMES = ("head", "relation", "tail")
# Unicode Cc (C0, DEL, C1: newline, CR, tab, NUL, ...) and the line / paragraph separators str.splitlines cuts at.
_CONTROL = r"\x00-\x1f\x7f-\x9f\u2028\u2029"
_FORBIDDEN = re.compile(f"({re.escape(DOCID_START)}|{re.escape(DOCID_END)})|" + r"([\[\]])|" + f"([{_CONTROL}])")
_EMPTY_PIECE = re.compile(r"^\s*,|,\s*,|,\s*$")  # a comma at either end, or two with nothing between


@dataclass(frozen=True)
class PartProblem:
    """Why a triple cannot be a docid: the reason code and a sentence naming the part."""

    reason: str
    detail: str


def text_problem(text: object, name: str = "docid text", markers: tuple[str, ...] = ()) -> PartProblem | None:
    """Why ``text`` cannot stand between a docid's markers, whatever its commas: empty or whitespace only, or it
    holds a docid marker (:data:`DOCID_START`, :data:`DOCID_END`, or ``markers``: a run's own), ``[`` or ``]``,
    or a control character (newline, CR, tab, NUL, ...; U+2028/U+2029)."""
    if not isinstance(text, str) or not text.strip():
        return PartProblem(EMPTY_PART, f"{name} is empty")
    if m := _FORBIDDEN.search(text):
        reason = DOCID_MARKER_IN_PART if m.group(1) else BRACKET_IN_PART if m.group(2) else CONTROL_CHAR_IN_PART
        return PartProblem(reason, f"{name} {text[:80]!r} holds {m.group(0)!r}")
    for marker in markers:
        if marker and marker in text:
            return PartProblem(DOCID_MARKER_IN_PART, f"{name} {text[:80]!r} holds the docid marker {marker!r}")
    return None


def part_problem(part: object, name: str = "head", markers: tuple[str, ...] = ()) -> PartProblem | None:
    """Why one part (``name``: head, relation or tail) cannot live inside a docid, None when it can:
    :func:`text_problem`, and every comma of the part stands between text (``Ana, mon amour``, ``July 31, 2012``),
    never at its start or end or next to another (``Paris,``, ``, Texas``, ``a, , b``): the docid or its
    tail-first spelling would read as having an empty part."""
    if problem := text_problem(part, name, markers):
        return problem
    if "," in part and _EMPTY_PIECE.search(part):  # type: ignore[operator]
        return PartProblem(SEPARATOR_IN_PART, f"{name} {part[:80]!r} has a comma with nothing on one side")
    return None


# What part_problem rejects in any part shows in the rendered text too (a blank part leaves a comma with nothing
# on one side): one scan decides for a whole docid text.
_BAD_IN_TEXT = re.compile(f"{_FORBIDDEN.pattern}|{_EMPTY_PIECE.pattern}")


def docid_text_problem(inner: str) -> PartProblem | None:
    """Why the text between a docid's markers cannot be a docid's: what :func:`part_problem` rejects in any of
    the parts it renders, found in one scan of the text (the index build reads whole stages this way); the
    reason names the text, not the part. Text that is not three parts (``just a title``) is not judged here."""
    if inner.strip() and not _BAD_IN_TEXT.search(inner):
        return None
    if problem := text_problem(inner):
        return problem
    return PartProblem(SEPARATOR_IN_PART, f"docid text {inner[:80]!r} has a comma with nothing on one side")


def triple_problem(triple: Triple, markers: tuple[str, ...] = ()) -> PartProblem | None:
    """The first part of ``(head, relation, tail)`` that cannot live inside a docid (:func:`part_problem`), None
    when the docid and its tail-first spelling both parse, in either marker syntax, as one well-formed docid
    whose key is the triple's (:func:`triple_key`, :func:`flip_key`)."""
    for name, part in zip(PART_NAMES, triple):
        if problem := part_problem(part, name, markers):
            return problem
    return None


# --- normalize -------------------------------------------------------------------------------------------

_SPACED_COMMA = re.compile(" ?, ?")
# str.isspace's whitespace as a Rust regex class: Unicode White_Space plus the four ASCII separators.
_WHITESPACE_EXPR = r"[\s\x1c-\x1f]{2,}|[^\S ]|[\x1c-\x1f]"
_HAS_LETTER = re.compile(r"[^\W\d_]")


def normalize(text: str) -> str:
    """The lookup key of a docid's text (see the module docstring for the rule)."""
    return _SPACED_COMMA.sub(",", " ".join(text.split()))


def triple_key(head: str, relation: str, tail: str) -> str:
    """The key of a stored triple: ``normalize(f"{head}, {relation}, {tail}")``."""
    return f"{normalize(head)},{normalize(relation)},{normalize(tail)}"


def flip_key(head: str, relation: str, tail: str) -> str:
    """The key of a stored triple read tail-first."""
    return triple_key(*flip((head, relation, tail)))


def normalize_expr(column: "pl.Expr") -> "pl.Expr":
    """:func:`normalize` over a polars string column (the same result for every string). The patterns match
    nothing in an already normalized string (a lone space is left, not replaced by itself): most keys are."""
    return column.str.replace_all(_WHITESPACE_EXPR, " ").str.strip_chars(" ").str.replace_all(" , ?|, ", ",")


def loose_key(text: str) -> str:
    """A looser key for matching a model's citation to the triples its prompt offered (`chains synthesize`):
    :func:`normalize`, surrounding quotes dropped, case folded. Never used to decide that a docid exists."""
    return normalize(text.strip().strip("\"'")).casefold()


def is_triple(inner: str) -> bool:
    """Three non-empty parts separated by commas (the tail may hold more commas: 'July 31, 2012')."""
    parts = inner.split(",", 2)
    return len(parts) == 3 and all(p.strip() for p in parts)


def looks_like_triple(inner: str) -> bool:
    """Stricter than :func:`is_triple`, for square brackets in free text: no empty part and letters in a
    middle part, so ``[1, 2, 3]`` or ``[x, 0.5, y]`` are not docids."""
    parts = [p.strip() for p in inner.split(",")]
    if len(parts) < 3 or not all(parts):
        return False
    return any(_HAS_LETTER.search(p) for p in parts[1:-1])


# --- parse -----------------------------------------------------------------------------------------------

NESTED = "nested"  # opened again before it closed (the first opening is the broken span)
UNOPENED = "unopened"  # a closing marker with nothing open
UNCLOSED = "unclosed"  # never closed (often a generation cut off by the length limit)
EMPTY = "empty"  # nothing but whitespace between the markers
NOT_A_TRIPLE = "not-a-triple"  # not three non-empty comma-separated parts


@dataclass(slots=True)
class Span:
    """One marked span of a text: ``text[start:end]`` is the span, markers included (a broken span covers its
    one marker only). ``problem`` is None for a well-formed docid."""

    start: int
    end: int
    inner: str  # the text between the markers as written ("" for a broken span)
    problem: str | None = None
    marker: int = 0  # 1-based number of the marker where the span went wrong (broken spans only)

    @property
    def key(self) -> str:
        return normalize(self.inner)


def scan(text: str, markers: Markers = SPECIAL, pattern: re.Pattern[str] | None = None) -> list[Span]:
    """Every span between balanced ``markers`` in ``text``, in order, with the broken ones: a nested opening,
    a closing marker without an opening one, an opening never closed, an empty span, a span that is not a
    triple (see :func:`is_triple`). ``pattern``: ``markers.pattern()``, compiled once by the caller."""
    spans: list[Span] = []
    start, end = markers.start, markers.end
    if start not in text and end not in text:
        return spans
    parts = (pattern or markers.pattern()).split(text)  # text, marker, text, marker, ..., text
    at = 0  # offset of the piece being read
    open_at = -1  # offset of the open span's start marker, -1 when none is open
    for i in range(1, len(parts), 2):
        at += len(parts[i - 1])
        tag = parts[i]
        if tag == start:
            if open_at >= 0:
                spans.append(Span(open_at, open_at + len(start), "", NESTED, i // 2 + 1))
            open_at = at
        elif open_at < 0:
            spans.append(Span(at, at + len(end), "", UNOPENED, i // 2 + 1))
        else:
            inner = text[open_at + len(start) : at]
            problem = None if is_triple(inner) else (EMPTY if not inner.strip() else NOT_A_TRIPLE)
            spans.append(Span(open_at, at + len(end), inner, problem))
            open_at = -1
        at += len(tag)
    if open_at >= 0:
        spans.append(Span(open_at, open_at + len(start), "", UNCLOSED, len(parts) // 2))
    return spans


BROKEN = (NESTED, UNOPENED, UNCLOSED)  # the problems of the markers themselves, not of a span's text


def cut(text: str, markers: Markers = SPECIAL, pattern: re.Pattern[str] | None = None) -> tuple[list[str], list[str], Span | None]:
    """The text cut at its marked spans, for callers that need no positions (the filters judge every chain):
    ``(outside, inners, None)`` with ``outside[0] inner[0] outside[1] … outside[k]`` when the markers pair up,
    else ``([text], [], first broken span)`` as :func:`scan` finds it. One ``re.split`` in the common case."""
    parts = (pattern or markers.pattern()).split(text)
    tags = parts[1::2]
    opens, closes = tags[0::2], tags[1::2]
    if len(opens) == len(closes) and opens.count(markers.start) == len(opens) and closes.count(markers.end) == len(closes):
        return parts[0::4], parts[2::4], None
    return [text], [], next(s for s in scan(text, markers, pattern) if s.problem in BROKEN)


@dataclass
class Parsed:
    """The docids of a model response: their keys (:func:`normalize` d) in order, and the broken spans."""

    spans: list[Span]
    docids: list[str]
    malformed: int


def parse(text: str, markers: str | None = None) -> Parsed:
    """Read a response the way recall and KTO do: special-token spans first, then square brackets in the text
    outside them (a broken special span leaves its text outside, so brackets inside it are still read).
    Positions of the bracket spans are in ``text`` too (the well-formed special spans are blanked out).

    ``markers`` names the syntax the response was decoded with (`grtool retrieve --markers`), when known: then only
    that syntax's spans are docids. Under ``special`` the decoder constrains the marker spans only, so a bracket
    the model writes is free thought text, not a retrieval; under ``brackets`` the markers are not in play."""
    if markers == "brackets":
        return _parsed(scan(text, BRACKETS))
    special = scan(text, SPECIAL)
    if markers == "special":
        return _parsed(special)
    rest = text
    if special:
        chars = list(text)
        for s in special:  # well-formed and malformed pairs consume their text; a lone marker consumes itself
            chars[s.start : s.end] = " " * (s.end - s.start)
        rest = "".join(chars)
    brackets = scan(rest, BRACKETS) if BRACKET_START in rest or BRACKET_END in rest else []
    return _parsed(special + brackets)


def _parsed(spans: list[Span]) -> Parsed:
    return Parsed(spans, [s.key for s in spans if s.problem is None], sum(s.problem is not None for s in spans))
