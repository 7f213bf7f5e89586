"""``corpus ingest --columns``: your own files' key names mapped to the names the own-data layouts read.

``--columns question=query,answer=golden_answers`` renames ``query`` to ``question`` and ``golden_answers`` to
``answer`` in every record before its layout is chosen, so a QA set whose keys differ only in name (FlashRAG's
``golden_answers``, a ``query`` column) is read without rewriting it. ``title``, ``text`` and ``is_supporting``
are renamed inside each of a question's ``paragraphs`` too. A target that no layout reads, or a source key that
no record holds, is a usage error: a mapping that does nothing must not pass unnoticed.
"""

from __future__ import annotations

from typing import Any

from grtool.errors import InputError

# The names the generic and inline layouts read (docs/data-formats.md); the last three also inside paragraphs.
TARGETS = ("qid", "id", "question", "answer", "aliases", "split", "type", "answerable", "gold_doc_ids", "gold_titles", "paragraphs", "title", "text", "is_supporting")
PARAGRAPH_TARGETS = ("title", "text", "is_supporting")

# Key names other QA releases use for what a layout reads: the summary suggests the mapping when it sees one unread.
KNOWN_VARIANTS = {
    "answer_aliases": "aliases",
    "golden_answers": "answer",
    "answers": "answer",
    "query": "question",
    "_id": "qid",
    "gold_ids": "gold_doc_ids",
    "supporting_titles": "gold_titles",
    "contexts": "paragraphs",
    "ctxs": "paragraphs",
}


class Columns:
    """A parsed ``--columns`` mapping; it remembers which source keys it met, for :meth:`check_all_seen`."""

    def __init__(self, pairs: dict[str, str]):
        self.targets = pairs  # target -> source, as given
        self.top = {source: target for target, source in pairs.items()}
        self.inner = {source: target for target, source in pairs.items() if target in PARAGRAPH_TARGETS}
        self.seen: set[str] = set()

    def apply(self, record: Any) -> tuple[Any, list[str]]:
        """The record with its keys renamed, and the target names it held twice (its own key and a mapped one)."""
        if not isinstance(record, dict):
            return record, []
        renamed, twice = self._rename(record, self.top)
        paragraphs = renamed.get("paragraphs")
        if self.inner and isinstance(paragraphs, list):
            renamed["paragraphs"] = [self._rename(p, self.inner)[0] if isinstance(p, dict) else p for p in paragraphs]
        elif self.inner and isinstance(paragraphs, dict):  # a Hugging Face sequence of structs: parallel lists
            renamed["paragraphs"] = self._rename(paragraphs, self.inner)[0]
        return renamed, twice

    def _rename(self, record: dict, names: dict[str, str]) -> tuple[dict, list[str]]:
        out: dict[str, Any] = {}
        twice = []
        for key, value in record.items():
            name = names.get(key, key)
            if name != key:
                self.seen.add(key)
            if name in out:
                twice.append(name)
                continue
            out[name] = value
        return out, twice

    def check_all_seen(self) -> None:
        """After every record was read: a source key no record held is a usage error naming it."""
        missing = [f"{target}={source}" for target, source in self.targets.items() if source not in self.seen]
        if missing:
            raise InputError(f"--columns {','.join(missing)}: no record of the inputs has the key{'s' if len(missing) > 1 else ''} {', '.join(repr(m.split('=', 1)[1]) for m in missing)}")

    def as_param(self) -> dict[str, str]:
        return dict(sorted(self.targets.items()))


def parse_columns(text: str | None) -> Columns | None:
    """``target=source,target=source`` → :class:`Columns` (None when not given); a usage error names what is wrong."""
    if text is None:
        return None
    pairs: dict[str, str] = {}
    for item in text.split(","):
        target, sep, source = (part.strip() for part in item.partition("="))
        if not sep or not target or not source:
            raise InputError(f"--columns {text!r}: {item.strip()!r} is not TARGET=SOURCE (e.g. --columns question=query,answer=golden_answers)")
        if target not in TARGETS:
            raise InputError(f"--columns: unknown target name {target!r}; the names a layout reads are {', '.join(TARGETS)}")
        if target in pairs:
            raise InputError(f"--columns: target {target!r} is given twice")
        if source in pairs.values():
            raise InputError(f"--columns: source key {source!r} is given twice")
        pairs[target] = source
    return Columns(pairs)


def variant_hints(unread: list[str]) -> list[str]:
    """``--columns`` suggestions for unread keys that other releases use for what a layout reads."""
    return [f"{target}={key}" for key in unread if (target := KNOWN_VARIANTS.get(key))]
