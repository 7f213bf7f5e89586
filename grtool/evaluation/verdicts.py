"""What one docid of a response (or a chain) did for its question: retrieved a gold document, only other
documents, or nothing at all (a hallucination).

:func:`docid_verdict` is the one rule; `eval recall --per-question` applies it to every docid of every response,
and anything else that shows a question's docids (a chain, a response) can apply it the same way with
:func:`judge_docids`. A response's :class:`Score` (its retrieved documents, recall and verdicts) is what
`eval recall`, its per-question detail and `export kto` read.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from grtool.vocab.readers import Question, Response

GOLD = "gold"  # the docid's triple is held by at least one gold document of the question
NON_GOLD = "non-gold"  # held only by documents that are not gold
HALLUCINATED = "hallucinated"  # a well-formed docid no document holds (as written or tail-first)


def docid_verdict(documents: Collection[str], gold: Collection[str]) -> str:
    """The verdict of a docid that resolved to ``documents`` (every document holding its triple) for a question
    whose gold documents are ``gold``. A colliding triple held by a gold document and others is ``gold``: it
    retrieves that gold document (the others count against exact set, not against the docid)."""
    if not documents:
        return HALLUCINATED
    return GOLD if any(d in gold for d in documents) else NON_GOLD


@dataclass(frozen=True)
class JudgedDocid:
    docid: str  # the docid key (:func:`grtool.docid.normalize` d), as looked up
    verdict: str  # GOLD | NON_GOLD | HALLUCINATED
    documents: tuple[str, ...]  # every document holding the triple, sorted
    flipped: bool  # found only when read tail-first


def judged(keys: Sequence[str], resolved: Sequence[tuple[Collection[str], bool]], gold: Collection[str]) -> list[JudgedDocid]:
    """The verdicts of docids already looked up (``resolved``: (documents, flipped) per key, as
    :meth:`grtool.vocab.readers.DocidIndex.resolve_many` returns them)."""
    return [JudgedDocid(key, docid_verdict(docs, gold), tuple(sorted(docs)), bool(flipped) and bool(docs)) for key, (docs, flipped) in zip(keys, resolved)]


def judge_docids(keys: Sequence[str], gold: Collection[str], index) -> list[JudgedDocid]:
    """Look up ``keys`` (docid keys) in ``index`` (a :class:`~grtool.vocab.readers.DocidIndex` of the triples)
    and judge each against the question's ``gold`` document ids."""
    return judged(keys, index.resolve_many(list(keys)), frozenset(gold))


@dataclass
class Score:
    question: Question
    response: Response
    retrieved: frozenset[str]
    docids: int  # well-formed docids in the response
    hallucinated: int  # of those, found nowhere in the corpus
    flipped: int  # of those, found only when read tail-first
    malformed: int
    recall: float = field(init=False)  # |retrieved ∩ gold| / |gold|
    exact: bool = field(init=False)  # retrieved documents are exactly the gold set (the recipe's "accuracy 1")
    keys: tuple[str, ...] = ()  # the docid keys, in order (none for a GMR response)
    resolved: tuple[tuple[frozenset[str], bool], ...] = ()  # per key: (documents, flipped)

    def __post_init__(self) -> None:
        gold = frozenset(self.question.gold)
        self.recall = len(self.retrieved & gold) / len(gold)
        self.exact = self.retrieved == gold

    def verdicts(self) -> list[JudgedDocid]:
        """Each docid of the response with its verdict (gold / non-gold / hallucinated) for this question."""
        return judged(self.keys, self.resolved, frozenset(self.question.gold))
