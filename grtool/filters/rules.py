"""The filter rules. Each is a small function of one chain that returns ``None`` (pass) or one :class:`Failure`.

A chain reaches the rules already resolved (:class:`Chain`): its text cut at the docid markers, and for every
docid the stored triple it names (exact spelling or flipped) and the documents holding that triple.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from grtool.vocab.text import CANNOT_ANSWER_SENTENCE
from grtool.filters.questions import QuestionInfo
from grtool.vocab.text import Markers, Parsed, conclusion, contains_answer, ends_with_cannot_answer, has_answer_phrase, normalize_answer, parse_markers, says_cannot_answer, sentence_bounds


_EMPTY_PART = re.compile(r"(?:^|,)\s*(?:,|$)")


class Failure(NamedTuple):
    code: str  # reason code, prefixed by its rule's name
    detail: str


@dataclass(frozen=True)
class Settings:
    min_recall: float = 1.0
    redundant: str = "reject"  # or "trim"
    max_docids: int = 10
    max_chain_tokens: int = 512
    markers: Markers = field(default_factory=Markers)
    cannot_answer: str | None = None  # --cannot-answer: a further accepted ending for unanswerable questions


@dataclass(slots=True)
class Chain:
    qid: str
    text: str
    docids: list[str]  # the docids column
    flipped: list[bool] | None
    parsed: Parsed  # the text cut at its markers
    triples: list[int]  # per docid: the stored triple it names (a hash), 0 when none
    docs: list[tuple[int, ...]]  # per docid: the documents holding that triple
    question: QuestionInfo | None

    @property
    def conclusion_start(self) -> int:
        """Offset just after the last docid (0 without docids or with broken markers)."""
        if self.parsed.problem or not self.parsed.docids:
            return 0
        return len(self.text) - len(self.parsed.outside[-1])


def check_format(chain: Chain, settings: Settings) -> Failure | None:
    if chain.parsed.problem:
        return Failure("format-markers", chain.parsed.problem)
    if not chain.parsed.docids:
        return Failure("format-no-docid", "the chain retrieves nothing")
    cut = len(settings.markers.start), -len(settings.markers.end)
    for docid in chain.parsed.docids:
        inner = docid[cut[0] : cut[1]]
        if inner.count(",") < 2 or _EMPTY_PART.search(inner):
            return Failure("format-empty-part", f"not a full triple: {docid}")
    if chain.parsed.docids != chain.docids:
        return Failure("format-docids-column", "the docids column differs from the docids in the text")
    return None


def check_docid_exists(chain: Chain, settings: Settings) -> Failure | None:
    missing = [d for d, t in zip(chain.docids, chain.triples) if not t]
    if missing:
        return Failure("docid-exists-missing", f"{len(missing)} of {len(chain.docids)} docids name no stored triple, e.g. {missing[0]}")
    return None


def check_gold(chain: Chain, settings: Settings) -> Failure | None:
    question = chain.question
    if question is None or not question.answerable:
        return None  # no gold to cover: the answer rule demands the "cannot answer" conclusion instead
    if not question.gold:
        return Failure("gold-no-gold", "the question has no gold documents")
    # A docid naming no stored triple belongs to no document, so to no gold one (also when run without docid-exists).
    unknown = [d for d, t in zip(chain.docids, chain.triples) if not t]
    if unknown:
        return Failure("gold-unknown-docid", f"{len(unknown)} docids name no stored triple, e.g. {unknown[0]}")
    # A triple stored in a gold and a non-gold document (a collision) counts for the gold one: not outside.
    outside = [d for d, docs in zip(chain.docids, chain.docs) if question.gold.isdisjoint(docs)]
    if outside:
        return Failure("gold-outside", f"{len(outside)} docids from non-gold documents, e.g. {outside[0]}")
    covered = question.gold.intersection(d for docs in chain.docs for d in docs)
    if len(covered) < settings.min_recall * len(question.gold) - 1e-9:
        return Failure("gold-recall", f"covers {len(covered)} of {len(question.gold)} gold documents (min recall {settings.min_recall:g})")
    return None


def check_answer(chain: Chain, settings: Settings) -> Failure | None:
    """The conclusion (after the last "answer is", else after the last retrieval) must name the answer."""
    question = chain.question
    if question is None:
        return None
    start = chain.conclusion_start
    cannot = says_cannot_answer(chain.text[start:])
    if not question.answerable:
        return _check_unanswerable(chain.text, start, cannot, settings.cannot_answer)
    if cannot:
        return Failure("answer-cannot-answer", "says it cannot answer an answerable question")
    if not question.answers:
        return None  # no gold answer to compare with
    said = conclusion(chain.text, start)
    if not contains_answer(normalize_answer(said), question.answers):
        return Failure("answer-wrong", f"conclusion {said.strip()[:80]!r} does not contain {question.answers[0]!r}")
    return None


def _check_unanswerable(text: str, start: int, cannot: bool, configured: str | None) -> Failure | None:
    """Only a cannot-answer ending is accepted (grtool's sentence, the paper's wording, or ``configured``): a chain
    that also states an answer, or ends another way, fails."""
    if has_answer_phrase(text[start:]):
        return Failure("answer-unanswerable", f"claims an answer ({conclusion(text, start).strip()[:80]!r}) to a question the dataset marks unanswerable")
    if ends_with_cannot_answer(text, configured):
        return None
    if cannot:
        wanted = f"{CANNOT_ANSWER_SENTENCE!r}" + (f" or {configured!r}" if configured else "")
        return Failure("answer-unanswerable-ending", f"does not end with {wanted} (or the paper's wording)")
    return Failure("answer-unanswerable", "answers a question the dataset marks unanswerable")


def _thought(segment: str) -> str:
    return " ".join(normalize_answer(segment).split())


def redundant_steps(chain: Chain) -> list[tuple[int, str]]:
    """Retrievals that repeat a state, as SMR defines it, with their reason code: a triple already retrieved
    (in either orientation: the flip names the same stored triple), or a step whose thought text and
    documents both equal the previous step's. A different triple of a document already retrieved is new
    information, not a repeat."""
    seen: set = set()
    steps = []
    outside = chain.parsed.outside if not chain.parsed.problem and len(chain.parsed.outside) == len(chain.docids) + 1 else None
    for i, (docid, triple, docs) in enumerate(zip(chain.docids, chain.triples, chain.docs)):
        key = triple or docid
        if key in seen:
            steps.append((i, "redundant"))
        elif (
            i and outside is not None and docs and set(docs) == set(chain.docs[i - 1]) and (thought := _thought(outside[i])) and thought == _thought(outside[i - 1])
        ):  # fmt: skip  (no words before a docid: it continues the previous step's list, it does not re-ask)
            steps.append((i, "redundant-repeated-step"))
        seen.add(key)
    return steps


def check_redundant(chain: Chain, settings: Settings) -> Failure | None:
    steps = redundant_steps(chain)
    if not steps:
        return None
    k, code = steps[0]
    if code == "redundant":
        return Failure(code, f"retrieval {k + 1} repeats an earlier triple: {chain.docids[k]}")
    return Failure(code, f"retrieval {k + 1} repeats the previous step's thought and documents: {chain.docids[k]}")


def check_length(chain: Chain, settings: Settings) -> Failure | None:
    if len(chain.docids) > settings.max_docids:
        return Failure("length-docids", f"{len(chain.docids)} docids > {settings.max_docids}")
    tokens = len(chain.text.split())
    if tokens > settings.max_chain_tokens:
        return Failure("length-tokens", f"{tokens} whitespace tokens > {settings.max_chain_tokens}")
    return None


RULES: dict[str, Callable[[Chain, Settings], Failure | None]] = {
    "format": check_format,
    "docid-exists": check_docid_exists,
    "gold": check_gold,
    "answer": check_answer,
    "redundant": check_redundant,
    "length": check_length,
}


def parse_rules(spec: str | None) -> tuple[str, ...]:
    if not spec:
        return tuple(RULES)
    rules = tuple(dict.fromkeys(r.strip() for r in spec.split(",") if r.strip()))
    unknown = [r for r in rules if r not in RULES]
    if unknown or not rules:
        from grtool.errors import InputError

        raise InputError(f"--rules: unknown rule(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(RULES)}")
    return rules


# ------------------------------------------------------------------------------------------ trim

_TRAILING_LINK = re.compile(r"(?:,|\s+and|\s+or|\s+then)$")
_LEADING_LINK = re.compile(r"^(?:and|or|then|,)\s+")


def trim(c: Chain, steps: list[int], s: Settings, pattern: re.Pattern[str], thoughts: frozenset[int] = frozenset()) -> Chain:
    """The chain without the given retrievals.

    A retrieval whose sentence holds no other docid and no "answer is" is removed with its sentence;
    otherwise only the docid is cut out of the sentence (and a dangling "and" or space before punctuation).
    For the steps in ``thoughts`` (a repeated step) the repeated thought goes too: everything from the end of
    the previous docid's sentence to the end of this docid's sentence.
    """
    outside = list(c.parsed.outside)
    docids = list(c.parsed.docids)
    keep = [i for i in range(len(docids)) if i not in set(steps)]
    for k in sorted(steps, reverse=True):
        before, after = outside[k], outside[k + 1]
        b_bounds, a_bounds = sentence_bounds(before), sentence_bounds(after)
        if k in thoughts and b_bounds:
            a_end = a_bounds[0] if a_bounds else len(after)
            if not has_answer_phrase(before[b_bounds[0] :] + after[:a_end]):
                outside[k : k + 2] = [before[: b_bounds[0]] + after[a_end:]]
                del docids[k]
                continue
        starts = b_bounds[-1] if b_bounds else (0 if k == 0 else None)
        ends = a_bounds[0] if a_bounds else (len(after) if k == len(docids) - 1 else None)
        sentence = None if starts is None or ends is None else before[starts:] + docids[k] + after[:ends]
        if sentence is not None and not has_answer_phrase(sentence):
            merged = before[:starts] + (after[ends:] if starts else after[ends:].lstrip())
        else:
            merged = _cut_docid(before, after)
        outside[k : k + 2] = [merged]
        del docids[k]
    text = "".join(o + d for o, d in zip(outside, docids)) + outside[-1]
    flipped = [c.flipped[i] for i in keep] if c.flipped is not None and len(c.flipped) == len(c.docids) else c.flipped
    return Chain(
        qid=c.qid,
        text=text,
        docids=[c.docids[i] for i in keep],
        flipped=flipped,
        parsed=parse_markers(text, s.markers, pattern),
        triples=[c.triples[i] for i in keep],
        docs=[c.docs[i] for i in keep],
        question=c.question,
    )


def _cut_docid(before: str, after: str) -> str:
    """Join the text around a removed docid, dropping the one "and"/"," that linked it."""
    b, a = before.rstrip(" "), after.lstrip(" ")
    if _TRAILING_LINK.search(b):
        b = _TRAILING_LINK.sub("", b)
    else:
        a = _LEADING_LINK.sub("", a)
    if not before or not a or a[0] in ".,;:!?":  # at the very start, or right before punctuation: no space
        return b + a
    return b + " " + a
