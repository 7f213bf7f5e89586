"""Reading a chain's text: docid markers, the conclusion, answers and "cannot answer" statements. Chains write
by it (the cannot-answer sentence, the answer normalisation of gold chains) and the filters judge by it."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from grtool.docid import NESTED, UNCLOSED, UNOPENED, Markers, cut

# The recipe's ending for a question the triples cannot answer (system prompt rule 5); the filters require it
# exactly for unanswerable questions.
CANNOT_ANSWER_SENTENCE = "The retrieved triples are not enough to answer the question."

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD-style: lowercase, no ASCII punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


# Where the chain states its result. The recipe's chains end with "So the answer is X." (or a variant); the
# text after the last such phrase is the conclusion. A chain without one concludes after its last retrieval.
_ANSWER_PHRASE = re.compile(r"\b(?:answer\s+(?:is|was|would be)|answer\s*:)", re.IGNORECASE)
_CANNOT_ANSWER = re.compile(
    r"\b(?:cannot|can ?not|can't|unable to|impossible to)\s+(?:be\s+)?(?:answer(?:ed)?|determine[d]?|tell)\b"
    r"|\bnot\s+(?:enough|sufficient)\b[^.]*\banswer"
    r"|\binsufficient\b[^.]*\banswer"
    r"|\bno\s+(?:triple|retrieved\s+triple|information)\b[^.]*\b(?:gives|states|says|tells|answers)\b",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"[.!?](?=\s)|\n")


@dataclass
class Parsed:
    """A chain's text cut at its docids: ``outside[0] docid[0] outside[1] … docid[k-1] outside[k]``."""

    outside: list[str]
    docids: list[str]  # with markers, as written
    problem: str | None  # why the markers are malformed, None when fine


_PROBLEMS = {NESTED: "nested docid start marker", UNOPENED: "docid end marker without a start"}


def parse_markers(text: str, markers: Markers, pattern: re.Pattern[str] | None = None) -> Parsed:
    """Cut a chain at its docids (:func:`grtool.docid.cut`); the first broken marker makes the whole text one
    piece with the problem. Empty or incomplete docids are cut as docids: the format rule judges them."""
    outside, inners, broken = cut(text, markers, pattern)
    if broken is None:
        return Parsed(outside, [markers.start + inner + markers.end for inner in inners], None)
    if broken.problem == UNCLOSED:
        return Parsed([text], [], "docid start marker never closed")
    total = len((pattern or markers.pattern()).findall(text))
    return Parsed([text], [], f"{_PROBLEMS[broken.problem]} (marker {broken.marker} of {total})")


def conclusion(text: str, last_docid_end: int) -> str:
    """The conclusion of a chain: after its last "answer is"-like phrase that follows the last retrieval, else
    everything after the last retrieval."""
    tail = text[last_docid_end:]
    phrase = None
    for phrase in _ANSWER_PHRASE.finditer(tail):
        pass
    return tail[phrase.end() :] if phrase is not None else tail


def says_cannot_answer(text: str) -> bool:
    return _CANNOT_ANSWER.search(text) is not None


def last_sentence(text: str) -> str:
    text = text.rstrip()
    bounds = [b for b in sentence_bounds(text) if b < len(text)]
    return text[bounds[-1] :] if bounds else text


_CANNOT_ANSWER_KEY = normalize_answer(CANNOT_ANSWER_SENTENCE)

# The paper's chains close an unanswerable question with their own words ("The question cannot be answered based
# on the retrieved triples.", "I cannot answer the question from the retrieved information."). These are matched
# on the SQuAD-normalized last sentence (lowercase, no punctuation, no articles), whole: an optional connective,
# a cannot-answer phrase about the question, and what it was based on. Nothing looser: a sentence that also gives
# an answer or names something else does not match.
_LEAD = r"(?:(?:so|therefore|thus|hence|consequently)\s)?"
_SOURCE = r"(?:based\son|from|with|given|using)\s(?:retrieved\s|given\s|provided\s|available\s)?(?:triples|information|knowledge|facts)"
_PAPER_ENDINGS = re.compile(
    rf"^{_LEAD}(?:(?:i|we)\s)?(?:cannot|can\snot|cant|am\sunable\sto|are\sunable\sto|unable\sto)\sanswer\s(?:this\s)?question\s{_SOURCE}$"
    rf"|^{_LEAD}(?:this\s)?question\s(?:cannot|can\snot|cant)\sbe\sanswered\s{_SOURCE}$"
)


def ends_with_cannot_answer(text: str, configured: str | None = None) -> bool:
    """The chain's last sentence says the question cannot be answered, in one of the accepted wordings:
    grtool's :data:`CANNOT_ANSWER_SENTENCE`, the paper's (:data:`_PAPER_ENDINGS`), or ``configured`` (the
    user's `--cannot-answer` sentence). All are compared SQuAD-normalized, so case and punctuation are free,
    the words are not."""
    key = normalize_answer(last_sentence(text))
    if key == _CANNOT_ANSWER_KEY or _PAPER_ENDINGS.match(key):
        return True
    if not configured:
        return False
    wanted = normalize_answer(configured)  # may be several sentences: compare the chain's end
    ending = normalize_answer(text)
    return bool(wanted) and (ending == wanted or ending.endswith(" " + wanted))


def contains_answer(normalized_conclusion: str, answers: tuple[str, ...]) -> bool:
    """Whole-word containment of any normalized answer ("1" does not match inside "1901")."""
    padded = f" {normalized_conclusion} "
    return any(f" {a} " in padded for a in answers)


def has_answer_phrase(text: str) -> bool:
    return _ANSWER_PHRASE.search(text) is not None


def sentence_bounds(segment: str) -> list[int]:
    """Offsets just after each sentence end in a piece of text outside the docids."""
    return [m.end() for m in _SENTENCE_END.finditer(segment)]
