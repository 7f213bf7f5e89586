"""Answer accuracy (`grtool eval answer`): exact match and token F1 as SQuAD v1.1's official script scores them.

Both sides are normalised the same way: lower case, punctuation removed, the articles "a", "an" and "the"
removed as words, whitespace collapsed. Exact match: the normalised strings are equal. Token F1: the harmonic
mean of precision and recall over the normalised tokens (a multiset); no shared token gives 0 (so two
answers that normalise to nothing get exact match 1 and F1 0, as in v1.1). A prediction is scored against the
question's answer and each alias, and the best of each figure counts.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grtool.errors import InputError
import msgspec
from grtool.records import Report

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    shared = sum((Counter(predicted) & Counter(expected)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted), shared / len(expected)
    return 2 * precision * recall / (precision + recall)


def best_scores(prediction: str, golds: Iterable[str]) -> tuple[float, float]:
    """(exact match, F1): each the best over the answer and its aliases."""
    golds = list(golds)
    return max(exact_match(prediction, g) for g in golds), max(token_f1(prediction, g) for g in golds)


@dataclass(frozen=True)
class GoldAnswer:
    qid: str
    dataset: str
    question: str
    answers: tuple[str, ...]  # the answer first, then its aliases


def gold_answers(corpus: str | Path, qids: set[str] | None = None) -> dict[str, GoldAnswer]:
    """qid → its gold answers, from the corpus's questions stage (only ``qids`` when given); questions without
    any answer (unanswerable) are left out."""
    from grtool.store.records import resolve_stage
    from grtool.store.stage import iter_batches

    found: dict[str, GoldAnswer] = {}
    for batch in iter_batches(resolve_stage(corpus, "questions"), columns=["qid", "dataset", "question", "answer", "answer_aliases", "answerable"]):
        for row in batch.to_pylist():
            if qids is not None and row["qid"] not in qids:
                continue
            answers = tuple(a for a in dict.fromkeys([row["answer"], *(row["answer_aliases"] or [])]) if isinstance(a, str) and a.strip())
            if answers and row["answerable"] is not False:
                found[row["qid"]] = GoldAnswer(row["qid"], row["dataset"], row["question"], answers)
    return found


@dataclass(frozen=True)
class Prediction:
    line: int
    qid: str
    answer: str
    judged_correct: bool | None = None  # `eval answer --judge`: the judge's verdict (None: not judged, or unclear)


def read_predictions(path: str | Path) -> Iterator[Prediction]:
    """``{"qid": …, "answer": …}`` lines of a JSON Lines file (another reader's answers); blank lines skipped."""
    import orjson

    from grtool.userinput import missing_input

    p = Path(path)
    if not p.is_file():
        raise missing_input(p)
    with open(p, "rb") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise InputError(f"{p}, line {lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("qid"), (str, int)) or isinstance(row.get("qid"), bool):
                raise InputError(f"{p}, line {lineno}: expected a JSON object with 'qid' and 'answer'")
            if not isinstance(row.get("answer"), str):
                raise InputError(f"{p}, line {lineno}: 'answer' must be a string, got {type(row.get('answer')).__name__}")
            yield Prediction(lineno, str(row["qid"]), row["answer"])


@dataclass
class AnswerTally:
    scored: int = 0
    em: float = 0.0
    f1: float = 0.0
    judged: int = 0  # predictions with a yes or no from the judge
    judged_correct: int = 0

    def add(self, em: float, f1: float, judged_correct: bool | None = None) -> None:
        self.scored += 1
        self.em += em
        self.f1 += f1
        self.judged += judged_correct is not None
        self.judged_correct += judged_correct is True

    def summary(self) -> dict[str, Any]:
        n = self.scored
        return {"scored": n, "exact_match": self.em / n if n else None, "f1": self.f1 / n if n else None,
                "judged": self.judged, "judged_accuracy": self.judged_correct / self.judged if self.judged else None}  # fmt: skip


def score_predictions(predictions: Iterable[Prediction], gold: dict[str, GoldAnswer], *, per_question: bool = False) -> dict[str, Any]:
    """The report of `eval answer`: EM and F1 overall and per dataset, what could not be scored and why, and
    (``per_question``) every scored question. A qid answered twice is scored once, by its first line."""
    overall, per_dataset = AnswerTally(), {}
    unknown: list[str] = []
    repeated = 0
    seen: set[str] = set()
    questions = []
    for p in predictions:
        if p.qid in seen:
            repeated += 1
            continue
        seen.add(p.qid)
        g = gold.get(p.qid)
        if g is None:
            unknown.append(f"line {p.line}: {p.qid}")
            continue
        em, f1 = best_scores(p.answer, g.answers)
        overall.add(em, f1, p.judged_correct)
        per_dataset.setdefault(g.dataset, AnswerTally()).add(em, f1, p.judged_correct)
        if per_question:
            questions.append({"qid": p.qid, "dataset": g.dataset, "prediction": p.answer, "answers": list(g.answers), "exact_match": em, "f1": f1,
                              "judged_correct": p.judged_correct})  # fmt: skip
    report = {
        **overall.summary(),
        "per_dataset": {name: t.summary() for name, t in sorted(per_dataset.items())},
        "normalisation": "SQuAD v1.1 (lower case, punctuation and a/an/the removed, whitespace collapsed); best over answer and aliases",
        "not_scored": {"unknown_or_unanswerable_qid": len(unknown), "examples": unknown[:5], "repeated_qid": repeated},
    }
    if per_question:
        report["questions"] = questions
    return report


class AnswerReport(Report, kw_only=True):
    """``eval answer --json``: :func:`score_predictions`."""

    scored: int
    exact_match: float | None
    f1: float | None
    judged: int
    judged_accuracy: float | None
    per_dataset: dict[str, dict[str, Any]]
    normalisation: str
    not_scored: dict[str, Any]
    questions: list[dict[str, Any]] | msgspec.UnsetType = msgspec.UNSET
