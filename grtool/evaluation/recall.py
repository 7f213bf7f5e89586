"""Retrieval recall of model responses (`grtool eval recall`), also the scorer behind the KTO labels.

Per response: the docids are parsed (special tokens or brackets), each is looked up in the triples
(collisions retrieve every document holding the triple, a tail-first docid counts, see
:class:`~grtool.vocab.readers.DocidIndex`), and recall = |retrieved ∩ gold| / |gold|. A well-formed docid
found nowhere in the corpus is a hallucination; spans that are not docids are malformed (see
:func:`grtool.docid.parse`; docids are compared by :func:`grtool.docid.normalize`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grtool.docid import Parsed, parse
from grtool.errors import InputError
from grtool.evaluation.per_question import PerQuestion
from grtool.evaluation.verdicts import Score
from grtool.vocab.readers import DocidIndex, Question, QuestionIndex, Response, iter_responses
import msgspec
from grtool.records import Report


SCORE_BATCH = 2048  # responses scored per lookup call


def score_response(response: Response, question: Question, index: DocidIndex) -> Score:
    parsed = parse(response.text, response.markers)
    return _score(response, question, parsed, index.resolve_many(parsed.docids))


def _score(response: Response, question: Question, parsed: Parsed, resolved: list[tuple[frozenset[str], bool]]) -> Score:
    retrieved: set[str] = set()
    hallucinated = flipped = 0
    for docs, was_flipped in resolved:
        if not docs:
            hallucinated += 1
            continue
        flipped += was_flipped
        retrieved.update(docs)
    return Score(question, response, frozenset(retrieved), len(resolved), hallucinated, flipped, parsed.malformed,
                 keys=tuple(parsed.docids), resolved=tuple(resolved))  # fmt: skip


def _score_batch(pending: list[tuple[Response, Question, Parsed]], index: DocidIndex | None) -> Iterator[Score]:
    """Score responses with one lookup call for all their docids (a call has a fixed cost of ~0.1 ms)."""
    if not pending:
        return
    if index is None:
        response = pending[0][0]
        raise InputError(f"response {response.line} (qid {response.qid}) names docids: scoring them needs the triples (--triples)")
    keys = [k for _, _, parsed in pending for k in parsed.docids]
    resolved = index.resolve_many(keys)
    at = 0
    for response, question, parsed in pending:
        n = len(parsed.docids)
        yield _score(response, question, parsed, resolved[at : at + n])
        at += n


@dataclass
class Skipped:
    unknown_qid: int = 0  # no such question in the corpus
    no_gold: int = 0  # unanswerable or without gold documents: recall is undefined
    incomplete_gold: int = 0  # a gold document is unknown (fullwiki context without it): recall would be wrong
    unknown_examples: list[str] = field(default_factory=list)


def iter_scores(responses: str | Path | Iterable[Response], questions: QuestionIndex, index: DocidIndex | None, skipped: Skipped) -> Iterator[Score]:
    """Score every response line, in order; lines that cannot be scored are counted in ``skipped``. ``index``:
    None when the responses name documents (BM25, GMR, a TREC run), which need no triples."""
    pending: list[tuple[Response, Question, Parsed]] = []
    for response in iter_responses(responses) if isinstance(responses, (str, Path)) else responses:
        question = questions.get(response.qid)
        if question is None:
            skipped.unknown_qid += 1
            if len(skipped.unknown_examples) < 5:
                skipped.unknown_examples.append(f"line {response.line}: {response.qid}")
            continue
        if not question.gold or not question.answerable:
            skipped.no_gold += 1
            continue
        if not question.gold_complete:
            skipped.incomplete_gold += 1
            continue
        if response.documents is not None:  # documents named (GMR, BM25, a TREC run): nothing to look up
            yield Score(question, response, frozenset(response.documents), len(response.documents) + response.unknown, response.unknown, 0, 0)
            continue
        pending.append((response, question, parse(response.text, response.markers)))
        if len(pending) == SCORE_BATCH:
            yield from _score_batch(pending, index)
            pending = []
    yield from _score_batch(pending, index)


@dataclass
class Tally:
    responses: int = 0
    recall_sum: float = 0.0
    retrieved_sum: int = 0
    exact: int = 0
    docids: int = 0
    hallucinated: int = 0
    flipped: int = 0
    malformed: int = 0
    with_malformed: int = 0
    qids: set[str] = field(default_factory=set)  # the questions scored (several samples of one count once)

    def add(self, s: Score) -> None:
        self.responses += 1
        self.recall_sum += s.recall
        self.retrieved_sum += len(s.retrieved)
        self.exact += s.exact
        self.docids += s.docids
        self.hallucinated += s.hallucinated
        self.flipped += s.flipped
        self.malformed += s.malformed
        self.with_malformed += s.malformed > 0
        self.qids.add(s.question.qid)

    def summary(self) -> dict[str, Any]:
        n = self.responses
        return {
            "responses": n,
            "questions_scored": len(self.qids),
            "recall": self.recall_sum / n if n else None,
            "exact_match_share": self.exact / n if n else None,
            "docs_per_response": self.retrieved_sum / n if n else None,
            "docids": self.docids,
            "hallucinated": self.hallucinated,
            "hallucinated_share": self.hallucinated / self.docids if self.docids else 0.0,
            "flipped": self.flipped,
            "malformed": self.malformed,
            "responses_with_malformed": self.with_malformed,
        }


def scorable(question: Question | None) -> bool:
    """A question whose responses are scored: known, answerable, with a complete gold set."""
    return question is not None and bool(question.gold) and question.answerable and question.gold_complete


def evaluate_recall(
    responses: str | Path | Iterable[Response],
    questions: QuestionIndex,
    index: DocidIndex | None,
    *,
    selected: Collection[str] | None = None,
    per_question: PerQuestion | None = None,
    coverage: Callable[[Collection[str]], dict[str, Any]] | None = None,
    on_score: Callable[[Score], None] | None = None,
) -> dict[str, Any]:
    """The report of `grtool eval recall`: overall figures, ``per_dataset`` and what was skipped.

    ``selected``: the qids the responses were meant to answer (a `retrieve` directory's selection, see
    :func:`grtool.evaluation.selection.selected_questions`); a scorable one without any response row is counted
    in ``without_response``. ``per_question``: collects every scored response, for the ``questions`` list;
    ``on_score``: called with every scored response too (the TREC writer). ``coverage``: asked with the questions
    the report is about (the selected ones, else those scored), its answer is the report's ``coverage``
    (:func:`grtool.evaluation.gold_coverage.gold_coverage`)."""
    overall = Tally()
    per_dataset: dict[str, Tally] = {}
    skipped = Skipped()
    for s in iter_scores(responses, questions, index, skipped):
        overall.add(s)
        per_dataset.setdefault(s.question.dataset, Tally()).add(s)
        if per_question is not None:
            per_question.add(s)
        if on_score is not None:
            on_score(s)
    missing: list[Question] = []
    if selected is not None:
        missing = [q for q in map(questions.get, sorted(set(selected) - overall.qids)) if scorable(q)]  # type: ignore[arg-type]
    report = {
        **overall.summary(),
        "per_dataset": {name: t.summary() for name, t in sorted(per_dataset.items())},
        "unknown_qid": skipped.unknown_qid,
        "unknown_qid_examples": skipped.unknown_examples,
        "no_gold": skipped.no_gold,
        "incomplete_gold": skipped.incomplete_gold,
        # None: the responses do not say which questions were asked (JSON Lines), so nothing can be missing
        "selected": None if selected is None else len(selected),
        "without_response": None if selected is None else len(missing),
        "without_response_examples": [q.qid for q in missing[:5]],
    }
    report["question_set"] = question_set(overall.qids)
    if coverage is not None:
        report["coverage"] = coverage(selected if selected is not None else overall.qids)
    if per_question is not None:
        report["questions"] = per_question.entries(missing)
    return report


def question_set(qids: Collection[str]) -> dict[str, Any]:
    """The scored questions' identity: their count and the sha256 of their sorted qids (one per line), so two
    reports tell whether they scored the same questions without listing them."""
    import hashlib

    return {"count": len(qids), "sha256": hashlib.sha256("".join(f"{q}\n" for q in sorted(qids)).encode()).hexdigest()}


def query_seconds(responses: str | Path) -> dict[str, float] | None:
    """Seconds per query (mean and median) from a responses directory's ``latency_ms``; None for JSON Lines or
    a directory without latencies."""
    import pyarrow.compute as pc

    from grtool.evaluation.selection import retrieve_manifest
    from grtool.store.records import resolve_stage
    from grtool.store.stage import read_table

    if retrieve_manifest(responses) is None:
        return None
    column = read_table(resolve_stage(responses, "responses"), columns=["latency_ms"])["latency_ms"].drop_null()
    if len(column) == 0:
        return None
    return {"mean": pc.mean(column).as_py() / 1000, "p50": pc.quantile(column, q=0.5)[0].as_py() / 1000}


class RecallSummary(Report, kw_only=True):
    """``eval recall --json``: :func:`evaluate_recall`, with the run's timing and training overlap."""

    responses: int
    questions_scored: int
    recall: float | None
    exact_match_share: float | None
    docs_per_response: float | None
    docids: int
    hallucinated: int
    hallucinated_share: float
    flipped: int
    malformed: int
    responses_with_malformed: int
    per_dataset: dict[str, dict[str, Any]]
    unknown_qid: int
    unknown_qid_examples: list[str]
    no_gold: int
    incomplete_gold: int
    selected: int | None
    without_response: int | None
    without_response_examples: list[str]
    question_set: dict[str, Any]
    coverage: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    questions: list[dict[str, Any]] | msgspec.UnsetType = msgspec.UNSET
    seconds_per_query: dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET
    train_overlap: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
