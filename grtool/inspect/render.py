"""`grtool show`'s output: one block of labelled lines per row.

On a terminal the docids are coloured by verdict (in the text and in the list below it); off a terminal the same
lines are written as plain text, the verdict spelled out in brackets, never wrapped (one line per fact, easy to
grep). Document ids are always followed by their titles. Every text from the data goes in through :func:`_text`,
which escapes its control characters (an ANSI code or a carriage return in a title), on a terminal and off one.
"""

from __future__ import annotations

from collections.abc import Iterator

from rich.text import Text

from grtool.inspect.sources import DOCID_KINDS
from grtool.inspect.rows import GOLD, HALLUCINATED, MALFORMED, NON_GOLD, UNCHECKED, Doc, Row
from grtool.userinput import escaped

STYLES = {GOLD: "bold green", NON_GOLD: "bold yellow", HALLUCINATED: "bold red", UNCHECKED: "bold cyan", MALFORMED: "bold magenta"}
LABEL_WIDTH = 13


def row_lines(row: Row, number: int, of: int) -> Iterator[Text]:
    """The lines of one row, styled (``Text.plain`` is the plain-text form)."""
    yield _text(f"── {number}/{of} {row.kind} " + " ".join(f"{k} {v}" for k, v in row.key.items() if v is not None and k != "title"), style="bold")
    if row.kind == "triples" and row.key.get("doc_id"):
        yield _labelled("document", _text(_doc_text(Doc(row.key["doc_id"], row.key.get("title")))))
    q = row.question
    if q is not None:
        where = ", ".join(x for x in (q.dataset, q.split) if x)
        yield _labelled("question", _text(q.question + (f"  [{where}]" if where else "")))
        if q.answer:
            yield _labelled("answer", _text(q.answer))
        yield _labelled("gold", _text("; ".join(_doc_text(d) for d in q.gold) or "(none)"))
    elif row.key.get("qid") is not None:
        yield _labelled("question", _text(f"(qid {row.key['qid']} not found in the corpus)", style="dim"))
    elif row.kind == "export":
        yield _labelled("question", _text("(the prompt's question is not in the corpus)", style="dim"))
    for name, value in row.fields.items():
        if value is not None:
            yield _labelled(name.replace("_", " "), _text(_value(value)))
    if row.rejected is not None:
        yield _labelled("rejected", _text(", ".join(row.rejected["reasons"]), style="bold red"))
        if row.rejected.get("detail"):
            yield _labelled("", _text(row.rejected["detail"]))
    if row.kind != "triples" and row.text is not None:
        yield _labelled("text", _highlighted(row))
    for d in row.docids:
        line = Text()
        line.append(f"[{d.verdict}]", style=STYLES[d.verdict])
        line.append(" ")
        line.append(escaped(d.text), style=STYLES[d.verdict])
        if d.flipped:
            line.append(" (tail-first)")
        if d.documents:
            line.append(escaped(" → " + "; ".join(_doc_text(doc) for doc in d.documents)))
        yield _labelled("docid", line)
    if row.retrieved is not None:
        yield _labelled("retrieved", _text("; ".join(_doc_text(d, mark=True) for d in row.retrieved) or "(nothing)"))


def _labelled(label: str, body: Text) -> Text:
    line = Text(f"  {label:<{LABEL_WIDTH}} ", style="dim")
    line.append_text(body)
    return line


def _text(value: str, style: str = "") -> Text:
    """Text from the data: its control characters escaped (Rich would write an ESC as is and drop a CR)."""
    return Text(escaped(value), style=style)


def _highlighted(row: Row) -> Text:
    """The row's text with each docid span in its verdict's colour (pieces escaped one by one: the spans stay put)."""
    text, at = Text(), 0
    for d in sorted((d for d in row.docids if d.start >= 0), key=lambda d: d.start):
        if d.start < at:  # overlapping spans: the first one is coloured
            continue
        text.append(escaped(row.text[at : d.start]))
        text.append(escaped(row.text[d.start : d.end]), style=STYLES[d.verdict])
        at = d.end
    text.append(escaped(row.text[at:]))
    return text


def _doc_text(doc: Doc, mark: bool = False) -> str:
    title = doc.title if doc.title is not None else "(title unknown)"
    return f"{title} ({doc.doc_id})" + (" [gold]" if mark and doc.gold else " [non-gold]" if mark else "")


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "; ".join(_value(v) for v in value) or "(none)"
    return str(value)


def summary_line(rows: list[Row]) -> Text:
    """Counts of the verdicts over everything shown (only the count of rows for a table that holds no docids)."""
    if not any(r.kind in DOCID_KINDS for r in rows):
        return Text(f"{len(rows)} row{'s' if len(rows) != 1 else ''}")
    counts = {v: 0 for v in STYLES}
    for r in rows:
        for d in r.docids:
            counts[d.verdict] += 1
    line = Text(f"{len(rows)} row{'s' if len(rows) != 1 else ''}; docids: ")
    shown = [(v, n) for v, n in counts.items() if n or v not in (UNCHECKED, MALFORMED)]
    for i, (verdict, n) in enumerate(shown):
        line.append(f"{n} {verdict}", style=STYLES[verdict])
        if i < len(shown) - 1:
            line.append(", ")
    return line
