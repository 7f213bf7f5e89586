"""Which extracted triples to drop before they become docids: self-loops, copies of the prompt's worked examples,
and triples whose head or tail the document does not mention.

The token rule (``tokens``): NFKC, case folded, accents removed, every character that is not a letter or a digit
is a separator; every remaining token counts (one character is enough). Content tokens are tokens that are not
English function words (``STOPWORDS``). A content token of a head or tail is *in the document* when the title +
text tokens hold it, or hold it with up to 3 more or fewer trailing characters where the shorter of the two has
at least 4 (``Russia``/``Russian``, ``novel``/``novels``, ``direct``/``directed``).

- ``self_loop``: head and tail have the same tokens (``Steven Spielberg, associated with, steven spielberg.``).
- ``prompt_example``: the head or the tail is an entity of one of the prompt's example triples (the whole triple
  compared by :func:`grtool.docid.triple_key` is the special case of both) and the document does not contain that
  entity by the strict rule. An example's entity that the document really holds is not a copy.
- ``ungrounded`` (``--grounding``): ``strict``: every content token of the head and of the tail is in the
  document; ``loose``: at least half of each side's content tokens, and at least one; ``off``: no check. A side
  without any content token (``it``, ``the``) is not grounded. Relations are never checked: the prompt asks for
  general relations (``associated with``) the text need not spell.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from grtool.docid import triple_key
from grtool.store.records import Counters

GROUNDING_MODES = ("strict", "loose", "off")
REASONS = ("self_loop", "prompt_example", "ungrounded")

_NON_WORD = re.compile(r"[\W_]+")
_MIN_STEM = 4  # the shorter token of a prefix match needs this many characters ("us" must not match "used")
_MAX_EXTRA = 3  # at most this many trailing characters differ ("Russia"/"Russian", not "Steven"/"Stevenage")

STOPWORDS = frozenset(
    """a an the this that these those it its he she they them his her their him we our you your i me my
    of in on at to for from by with without into onto upon over under about as and or nor but so than then
    is are was were be been being has have had do does did not no
    who whom whose which what where when why how there here also""".split()
)


def tokens(text: str) -> list[str]:
    """The token rule of the module docstring."""
    folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text).casefold())
    folded = "".join(c for c in folded if not unicodedata.combining(c))
    return [t for t in _NON_WORD.split(folded) if t]


def content_tokens(text: str) -> list[str]:
    return [t for t in tokens(text) if t not in STOPWORDS]


class DocumentTokens:
    """A document's tokens and the stems its tokens allow (the prefix match), built once per document."""

    def __init__(self, title: str | None, text: str):
        self.words = set(tokens(f"{title or ''} {text}"))
        self.stems = {w[:k] for w in self.words for k in range(max(_MIN_STEM, len(w) - _MAX_EXTRA), len(w))}

    def has(self, token: str) -> bool:
        if token in self.words or token in self.stems:  # equal, or the document's word is longer
            return True
        return any(token[:k] in self.words for k in range(max(_MIN_STEM, len(token) - _MAX_EXTRA), len(token)))

    def support(self, side: str) -> tuple[int, int, list[str]]:
        """(content tokens found, content tokens, the missing ones) of a head or tail."""
        content = content_tokens(side)
        missing = [t for t in content if not self.has(t)]
        return len(content) - len(missing), len(content), missing


def grounded(found: int, total: int, mode: str) -> bool:
    if mode == "off":
        return True
    if total == 0 or found == 0:
        return False
    return found == total if mode == "strict" else 2 * found >= total


@dataclass(frozen=True)
class Verdict:
    reason: str  # one of REASONS
    detail: str


class TripleChecks:
    """The three checks for one prompt (its example triples) and one ``--grounding`` mode."""

    def __init__(self, example_triples: Iterable[tuple[str, str, str]], mode: str = "strict"):
        if mode not in GROUNDING_MODES:
            raise ValueError(f"grounding mode {mode!r}: expected one of {', '.join(GROUNDING_MODES)}")
        self.mode = mode
        examples = list(example_triples)
        self.example_keys = {triple_key(*t) for t in examples}
        self.example_entities = {tuple(tokens(part)) for h, _, t in examples for part in (h, t)}

    def check(self, triple: tuple[str, str, str], doc: DocumentTokens) -> Verdict | None:
        """Why the triple is dropped, or None to keep it."""
        head, _, tail = triple
        head_tokens, tail_tokens = tokens(head), tokens(tail)
        if head_tokens == tail_tokens:
            return Verdict("self_loop", "head and tail are the same entity")
        copied = triple_key(*triple) in self.example_keys
        for name, side, side_tokens in (("head", head, head_tokens), ("tail", tail, tail_tokens)):
            if (copied or tuple(side_tokens) in self.example_entities) and not grounded(*doc.support(side)[:2], "strict"):
                return Verdict("prompt_example", f"{name} {side!r} comes from the prompt's examples, not the document")
        for name, side in (("head", head), ("tail", tail)):
            found, total, missing = doc.support(side)
            if not grounded(found, total, self.mode):
                why = "no content word" if not total else f"not in the document: {', '.join(missing)}"
                return Verdict("ungrounded", f"{name} {side!r}: {why}")
        return None


def drop_shares(counters: Counters) -> dict[str, dict[str, float]]:
    """Per reason, the triples dropped and their share of the triples judged (kept + dropped), from a triples
    stage's manifest counters."""
    rejected = counters.rejected
    judged = counters.out + sum(rejected.get(r, 0) for r in REASONS)
    return {r: {"dropped": rejected.get(r, 0), "share": rejected.get(r, 0) / judged if judged else 0.0} for r in REASONS}
