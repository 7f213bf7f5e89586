"""Reading triples out of what models really write.

Handled shapes: a JSON object or array (``{"triples": [[h, r, t], ...]}``, ``[{"head": ..}]``, several JSON
values one after another), ``(head, relation, tail)`` lines, ``head | relation | tail`` lines and Markdown
tables, numbered or bulleted lists, code fences, chatty text before and after, commas inside the tail (split on
the first two separators only), and JSON cut off by the length limit (every complete triple is kept).

A triple whose parts cannot live inside a docid (:func:`grtool.docid.triple_problem`: empty, a docid marker, a square
bracket, a control character, a comma with nothing on one side) is rejected with that reason code.

JSON-shaped output (a JSON value with text decoded, or the first ``[``/``{`` opens real JSON) is never handed to the
line parser: splitting raw JSON on commas gives garbage, so such output without a complete triple is a failure.
"""

from __future__ import annotations

import json
import re

import orjson
from dataclasses import dataclass, field

from grtool.docid import DOCID_END, DOCID_START, EMPTY_PART, Markers, PartProblem, render, triple_problem

Triple = tuple[str, str, str]

_DECODER = json.JSONDecoder()
_JSON_START = re.compile(r"[\[{]")
_JSON_OPEN = re.compile(r"[\[{]\s*[\"\[{\]}]")  # how real JSON opens; "[Paris, capital of, France]" does not
_FENCE = re.compile(r"```[\w+-]*[ \t]*\n?(.*?)(?:```|\Z)", re.S)
# Complete innermost pieces of (possibly truncated) JSON: ["a", "b", 1989] and flat {...} objects.
_STR = r'"(?:[^"\\]|\\.)*"'
_PART = rf"(?:{_STR}|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"  # a string or a number, as complete JSON accepts
_SALVAGE = re.compile(rf"\[\s*{_PART}\s*,\s*{_PART}\s*,\s*{_PART}\s*\]|\{{[^{{}}\[\]]*\}}", re.S)
_BULLET = re.compile(r"^(?:[-*•+·]|\d{1,4}[.):]|\(\d{1,4}\)|#{1,6})\s*")
_LABEL = re.compile(r"^(?:triple|fact)\s*\d*\s*[:.)-]\s*", re.I)
_TABLE_RULE = re.compile(r"^[\s|:+-]+$")
_QUOTED3 = re.compile(rf"^\s*({_STR})\s*,\s*({_STR})\s*,\s*(.+?)\s*$")
_WS = re.compile(r"\s+")
_ABBREV_END = re.compile(r"(?:\b(?:[A-Za-z]\.){2,}|\b(?:Jr|Sr|Inc|Ltd|Co|Corp|St|Dr|Mr|Mrs|Ms|Bros|Jun|Sen|Gen)\.)$")
_CHAT_OPENERS = ("here ", "here's", "sure", "note", "i ", "i'", "these ", "the following", "below", "certainly", "okay", "ok,")

_PROSE_JOINERS = ("and ", "or ", "but ", "which ", "who ", "so ", "as well as ")

_HEAD_KEYS = ("head", "subject", "h", "s", "entity1", "source", "subj")
_REL_KEYS = ("relation", "predicate", "r", "p", "relationship", "rel", "edge")
_TAIL_KEYS = ("tail", "object", "t", "o", "entity2", "target", "obj")
_HEADER_WORDS = {"head", "relation", "tail", "subject", "predicate", "object", "entity", "entity 1", "entity 2"}
_QUOTES = {'"': '"', "'": "'", "“": "”", "‘": "’", "`": "`", "«": "»", "„": "“"}
_TRAILING = frozenset(",;:.\"'”’`»“")
_WRAPS = {"(": ")", "[": "]", "<": ">", "{": "}"}


@dataclass
class Parsed:
    """What one model output gave: triples (normalized, deduplicated, in order) and what went wrong."""

    triples: list[Triple] = field(default_factory=list)
    candidates: int = 0  # triples read before normalization and deduplication
    rejected: list[tuple[Triple, PartProblem]] = field(default_factory=list)  # dropped: a part cannot live in a docid
    duplicates: int = 0  # dropped: the same triple again in this output
    truncated: bool = False  # the output hit the length limit (complete triples were kept)

    @property
    def empty_parts(self) -> list[Triple]:
        """The rejected triples with a part empty after normalization."""
        return [t for t, problem in self.rejected if problem.reason == EMPTY_PART]

    @property
    def failed(self) -> bool:
        """The output had no readable triple at all."""
        return self.candidates == 0


# ------------------------------------------------------------------------------------------ normalize


def normalize(part: object) -> str:
    """Collapse whitespace, remove wrapping quotes and trailing punctuation (not an abbreviation's dot)."""
    s = part if isinstance(part, str) else str(part)
    if "  " in s or "\n" in s or "\t" in s or "\r" in s:
        s = _WS.sub(" ", s)
    s = s.strip()
    if s and s[0] not in _QUOTES and s[-1] not in _TRAILING:  # the common case: nothing to strip
        return s
    while s:
        before = s
        if len(s) >= 2 and _QUOTES.get(s[0]) == s[-1]:
            s = s[1:-1].strip()
        while s and (s[-1] in ",;:" or (s[-1] == "." and not _ABBREV_END.search(s))):
            s = s[:-1].rstrip()
        if s == before:
            break
    return s


# ----------------------------------------------------------------------------------------- JSON paths


def _pick(d: dict, keys: tuple[str, ...]) -> object | None:
    for k in keys:
        if k in d:
            return d[k]
    return None


_SCALARS = (str, int, float)


def _walk(obj: object, out: list[Triple]) -> None:
    """Collect triples from any nesting of lists and objects."""
    if isinstance(obj, list):
        if len(obj) == 3 and ((type(obj[0]) is str and type(obj[1]) is str and type(obj[2]) is str) or all(type(x) in _SCALARS for x in obj)):
            out.append((str(obj[0]), str(obj[1]), str(obj[2])))
            return
        for item in obj:
            _walk(item, out)
    elif isinstance(obj, dict):
        lowered = {str(k).lower(): v for k, v in obj.items()}
        h, r, t = _pick(lowered, _HEAD_KEYS), _pick(lowered, _REL_KEYS), _pick(lowered, _TAIL_KEYS)
        if h is not None and r is not None and t is not None and not any(isinstance(x, (list, dict)) for x in (h, r, t)):
            out.append((str(h), str(r), str(t)))
            return
        for v in obj.values():
            _walk(v, out)
    elif isinstance(obj, str):
        triple = parse_line(obj)  # ["Paris | capital of | France", ...]
        if triple is not None:
            out.append(triple)


def _has_text(obj: object) -> bool:
    """A decoded value that is data, not a bracketed number in prose such as a "[1]" citation."""
    return isinstance(obj, dict) or (isinstance(obj, list) and any(isinstance(x, (str, list, dict)) for x in obj))


def _from_json(body: str) -> tuple[list[Triple], bool]:
    """Triples from every JSON value in ``body``; a value that does not decode is salvaged piece by piece.

    Returns the triples and whether the body is JSON-shaped (then the line parser must not read it).
    """
    out: list[Triple] = []
    m = _JSON_START.search(body)
    if m is None:
        return out, False
    shaped = _JSON_OPEN.match(body, m.start()) is not None
    try:  # the common case, everything from here on is one JSON value: orjson is fastest
        obj = orjson.loads(body[m.start() :])
    except orjson.JSONDecodeError:
        pass
    else:
        _walk(obj, out)
        return out, shaped or _has_text(obj)
    while m is not None:
        try:
            obj, pos = _DECODER.raw_decode(body, m.start())
        except json.JSONDecodeError:
            pieces = _SALVAGE.findall(body, m.start())
            try:  # one decode for all pieces; piece by piece only when one of them is bad
                _walk(orjson.loads("[" + ",".join(pieces) + "]"), out)
            except orjson.JSONDecodeError:
                for piece in pieces:
                    try:
                        _walk(json.loads(piece), out)
                    except json.JSONDecodeError:
                        continue
            break
        shaped = shaped or _has_text(obj)
        _walk(obj, out)
        m = _JSON_START.search(body, pos)
    return out, shaped


# --------------------------------------------------------------------------------------- line paths


def _split3(inner: str, sep: str) -> list[str] | None:
    parts = inner.split(sep, 2)  # the tail keeps any further separators ("July 31, 2012")
    return parts if len(parts) == 3 else None


def parse_line(line: str) -> Triple | None:
    """One triple from one line of text, or None when the line is not a triple."""
    s = line.strip()
    if not s or s.endswith(":"):
        return None
    marked = False
    if m := _BULLET.match(s):
        s, marked = s[m.end() :], True
    if m := _LABEL.match(s):
        s, marked = s[m.end() :], True
    s = s.strip()
    trimmed = s.rstrip(".,;")  # "(a, b, c)." ends a sentence; "U.S." keeps its dot (see normalize)
    if trimmed and trimmed[-1] in ")]>}":
        s = trimmed
    if not s:
        return None
    if s.startswith("|"):  # Markdown table row
        if _TABLE_RULE.match(s):
            return None
        cells = [c.strip() for c in s.strip("|").split("|")]
        if len(cells) < 3 or cells[0].lower().strip("* ") in _HEADER_WORDS:
            return None
        return (cells[0], cells[1], "|".join(cells[2:]))
    close = _WRAPS.get(s[0])
    if close is not None and s.endswith(close):
        s, marked = s[1:-1].strip(), True
    parts = None
    if "|" in s:
        parts = _split3(s, "|")
    elif "\t" in s:
        parts = _split3(s, "\t")
    elif "->" in s or "→" in s:
        parts = _split3(s.replace("→", "->"), "->")
    elif ";" in s and s.count(";") >= 2:
        parts = _split3(s, ";")
    elif "," in s:
        if s[0] in _QUOTES and (m := _QUOTED3.match(s)):
            parts = [m.group(1), m.group(2), m.group(3)]
        else:
            parts = _split3(s, ",")
        if parts is not None and not marked:
            # A bare comma line may be prose: accept it only when it looks like a triple.
            low = s.lower()
            if (
                low.startswith(_CHAT_OPENERS)
                or len(parts[0].split()) > 10
                or len(parts[1].split()) > 8
                or parts[1].lstrip().lower().startswith(_PROSE_JOINERS)
                or parts[2].lstrip().lower().startswith(_PROSE_JOINERS)
            ):
                return None
    if parts is None:
        return None
    return (parts[0], parts[1], parts[2])


def _strip_fences(text: str) -> str:
    if "```" not in text:
        return text
    blocks = _FENCE.findall(text)
    return "\n".join(blocks) if any(b.strip() for b in blocks) else text


# ---------------------------------------------------------------------------------------------- api


def parse_output(text: str, finish_reason: str | None = "stop", markers: tuple[str, ...] = ()) -> Parsed:
    """Triples from one model output, normalized and deduplicated (case-insensitively) in order. A triple whose
    parts cannot live inside a docid (:func:`grtool.docid.triple_problem`; ``markers``: the run's own docid
    markers, besides the standard ones) is rejected with the reason code."""
    result = Parsed(truncated=finish_reason == "length")
    body = _strip_fences(text or "")
    raw, shaped = _from_json(body) if ("{" in body or "[" in body) else ([], False)
    if not raw and not shaped:
        lines = body.splitlines()
        if result.truncated and lines and not body.endswith(("\n", "\r")):
            lines.pop()  # the length limit cut the last line mid-way: its tail is missing
        raw = [t for t in map(parse_line, lines) if t is not None]
    result.candidates = len(raw)
    seen: set[tuple[str, str, str]] = set()
    for h, r, t in raw:
        triple = (normalize(h), normalize(r), normalize(t))
        if problem := triple_problem(triple, markers):
            result.rejected.append((triple, problem))
            continue
        key = (triple[0].casefold(), triple[1].casefold(), triple[2].casefold())
        if key in seen:
            result.duplicates += 1
            continue
        seen.add(key)
        result.triples.append(triple)
    return result


def render_docid(triple: Triple, start: str = DOCID_START, end: str = DOCID_END) -> str:
    """The docid string the retrieval model generates for a triple (:func:`grtool.docid.render`)."""
    return render(triple, Markers(start, end))
