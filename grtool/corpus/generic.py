"""Gold documents of the generic layout: questions name them by the ids or titles of a documents file.

The two files may come in any order (and on stdin), so a question cannot be completed when it is read. Its
row waits in a file of the work directory (bounded memory) while every input is read; the documents of the
generic documents files are remembered as ``id -> doc_id`` and ``title -> doc_ids``. Then each waiting
question gets its ``gold_doc_ids`` (grtool's content hashes, in the order given: the hop order) or is
rejected with the reason: an id or title that names no document, or a title that names several.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from grtool.corpus.datasets import BadRecord, Converted
from grtool.corpus.doc_hash import normalize

PENDING = "generic-questions.jsonl"
AMBIGUOUS_TITLE = "ambiguous gold title"  # the reject reason that stops ingest unless --allow-rejects


class GenericGold:
    """The generic documents read so far and the generic questions waiting for them."""

    def __init__(self, work: Path):
        self.by_id: dict[str, str] = {}
        self.by_title: dict[str, list[str]] = {}  # normalized title -> distinct doc_ids
        self.documents = 0
        self.path = work / PENDING
        self.pending = open(self.path, "wb")
        self.waiting = 0

    def add_document(self, converted: Converted) -> None:
        """Remember a generic document; an id already naming a different document is a bad record."""
        did, title, _ = converted.documents[0]
        own_id = converted.source_id
        if own_id is not None:
            known = self.by_id.setdefault(own_id, did)
            if known != did:
                raise BadRecord("duplicate document id", f"id {own_id!r} names an earlier document with another title or text")
        if title:
            ids = self.by_title.setdefault(normalize(title), [])
            if did not in ids:
                ids.append(did)
        self.documents += 1

    def defer(self, converted: Converted, record: Any, source: str, position: str) -> None:
        entry = {"question": converted.question, "refs": converted.gold_refs, "record": record, "source": source, "position": position}
        self.pending.write(orjson.dumps(entry, default=str) + b"\n")
        self.waiting += 1

    def resolved(self):
        """``(entry, gold_doc_ids, None)`` or ``(entry, None, BadRecord)`` for every waiting question, in reading order."""
        self.pending.close()
        if not self.waiting:
            return
        with open(self.path, "rb") as fh:
            for line in fh:
                entry = orjson.loads(line)
                try:
                    yield entry, self._gold(entry["refs"]), None
                except BadRecord as problem:
                    yield entry, None, problem

    def close(self) -> None:
        self.pending.close()

    def _gold(self, refs: list | None) -> list[str]:
        if not refs:
            return []
        by, values = refs
        hint = "" if self.documents else " (no generic documents file was read: give it as another input)"
        gold: list[str] = []
        for value in values:
            if by == "id":
                did = self.by_id.get(value)
                if did is None:
                    raise BadRecord("unknown gold document id", f"{value!r} is not the id of a document read{hint}")
                found = [did]
            else:
                found = self.by_title.get(normalize(value), [])
                if not found:
                    raise BadRecord("unknown gold title", f"{value!r} is not the title of a document read{hint}")
                if len(found) > 1:
                    raise BadRecord(AMBIGUOUS_TITLE, f"{value!r} is the title of {len(found)} different documents: name them by gold_doc_ids")
            gold += [d for d in found if d not in gold]
        return gold
