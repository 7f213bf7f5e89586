"""`grtool export kto`: sampled responses → KTO data labelled by retrieval.

A response is desirable when the documents it retrieves are exactly the gold set (``--desirable exact``, the
default: the paper's "match the ground truth exactly"), or, with ``--desirable all-gold``, when it retrieves
every gold document, extra documents allowed (the paper's equation: accuracy 1). It is undesirable when its
recall is below ``tau``, and dropped in between (recall exactly ``tau`` is dropped; so is, under ``exact``,
recall ≥ tau with a missing or an extra document). An extra document includes one pulled in by a colliding
triple: the retrieved set is what the response would hand to a reader.

The prompt is rebuilt from the question with the same template, markers and system prompt as
`export sft`, so the KTO prompt is the one the SFT model was trained on. Rows are written in input order
(trainers shuffle), one response at a time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grtool.errors import DataProblem, GrtoolError
from grtool.export.formats import KTO_FORMATS, check_dataset_info, dataset_info_stanza, export_outputs, kto_row, row_writers, update_dataset_info
from grtool.vocab.prompt import instruction
from grtool.vocab.readers import DocidIndex, QuestionIndex
from grtool.vocab.provenance import input_fingerprint, questions_record, write_sidecar
from grtool.evaluation.verdicts import Score
from grtool.evaluation.recall import Skipped, iter_scores
from grtool.store.coverage import check_triples_cover
from grtool.store.empty import check_rows
from grtool.store.io import is_stdio
from grtool.store.partloop import LoopPart, one_part
from grtool.store.questions import SplitSelection
from grtool.records import Report


DESIRABLE_RULES = {
    "exact": "retrieves exactly the gold documents",
    "all-gold": "retrieves every gold document (extra documents allowed)",
}


def kto_label(score: Score, tau: float, desirable: str = "exact") -> bool | None:
    """True (desirable), False (undesirable) or None (dropped)."""
    if score.exact or (desirable == "all-gold" and score.recall >= 1.0):
        return True
    if score.recall < tau:
        return False
    return None


def balancing_weights(desirable: int, undesirable: int) -> tuple[float, float]:
    """(desirable_weight, undesirable_weight) for TRL's KTOConfig that make weight × count equal for both
    classes (TRL advises keeping desirable_weight·n_desirable : undesirable_weight·n_undesirable within
    1:1 … 4:3): the rarer class is up-weighted, the commoner one keeps 1."""
    if desirable == 0 or undesirable == 0:
        return 1.0, 1.0
    if desirable < undesirable:
        return undesirable / desirable, 1.0
    return 1.0, desirable / undesirable


@dataclass
class KtoResult:
    desirable: int = 0
    undesirable: int = 0
    dropped: int = 0
    skipped: Skipped = field(default_factory=Skipped)
    per_dataset: dict[str, dict[str, int]] = field(default_factory=dict)
    outside_split: int = 0  # responses to questions outside --split
    qids: set[str] = field(default_factory=set)  # the questions of the rows written
    desirable_rule: str = "exact"
    tau: float = 0.5
    file: str | None = None
    dataset_info: str | None = None

    @property
    def weights(self) -> tuple[float, float]:
        return balancing_weights(self.desirable, self.undesirable)

    def as_dict(self) -> dict[str, Any]:
        dw, uw = self.weights
        return {
            "desirable_rule": self.desirable_rule,
            "rule": f"desirable: {DESIRABLE_RULES[self.desirable_rule]}; undesirable: recall < {self.tau:g}; dropped: the rest",
            "tau": self.tau,
            "desirable": self.desirable,
            "undesirable": self.undesirable,
            "dropped": self.dropped,
            "outside_split": self.outside_split,
            "unknown_qid": self.skipped.unknown_qid,
            "no_gold": self.skipped.no_gold,
            "incomplete_gold": self.skipped.incomplete_gold,
            "desirable_weight": round(dw, 4),
            "undesirable_weight": round(uw, 4),
            "per_dataset": dict(sorted(self.per_dataset.items())),
            "file": self.file,
            "dataset_info": self.dataset_info,
        }


def one_class(result: KtoResult, tau: float) -> None:
    """KTO needs desirable and undesirable rows; a file with one class (and no row at all, --allow-empty aside)
    would only fail when trained on (exit 1)."""
    empty = [name for name, n in (("desirable", result.desirable), ("undesirable", result.undesirable)) if n == 0]
    if empty and result.desirable + result.undesirable:
        raise DataProblem(f"no {' and no '.join(empty)} responses: KTO needs both classes (tau = {tau}); nothing written")


def export_kto(
    responses: str | Path,
    corpus: str | Path,
    triples: str | Path,
    out: str | Path,
    *,
    tau: float = 0.5,
    fmt: str = "llamafactory",
    system: str | None = None,
    markers: str = "special",
    desirable: str = "exact",
    cannot_answer: str | None = None,
    splits: tuple[str, ...] = (),
) -> KtoResult:
    if desirable not in DESIRABLE_RULES:
        raise GrtoolError(f"--desirable must be one of {', '.join(DESIRABLE_RULES)}, got {desirable!r}")
    if fmt not in KTO_FORMATS:
        raise GrtoolError(f"--format must be one of {', '.join(KTO_FORMATS)}, got {fmt!r}")
    if not 0.0 < tau <= 1.0:
        raise GrtoolError(f"--tau must be in (0, 1], got {tau}")
    check_triples_cover(triples, corpus)
    outputs = export_outputs([out], "kto", inputs=[(responses, "responses"), (corpus, "questions"), (triples, "triples")])
    result = KtoResult(desirable_rule=desirable, tau=tau)
    json_array = fmt == "llamafactory"
    registered = json_array and not is_stdio(out)  # LLaMA-Factory's format: registered in dataset_info.json
    if registered:
        check_dataset_info([out])

    def part(p: LoopPart) -> None:
        selected = SplitSelection.of(splits, corpus).qids(corpus)
        questions = QuestionIndex.build(corpus)
        index = DocidIndex.build(triples)
        [writer] = row_writers(p, json_array)
        for score in iter_scores(responses, questions, index, result.skipped):
            if score.question.qid not in selected:
                result.outside_split += 1
                continue
            label = kto_label(score, tau, desirable)
            counts = result.per_dataset.setdefault(score.question.dataset, {"desirable": 0, "undesirable": 0, "dropped": 0})
            if label is None:
                result.dropped += 1
                counts["dropped"] += 1
                continue
            prompt = instruction(score.question.question, markers, cannot_answer)
            writer.write(kto_row(fmt, prompt, score.response.text, label, system))
            result.qids.add(score.question.qid)
            key = "desirable" if label else "undesirable"
            setattr(result, key, getattr(result, key) + 1)
            counts[key] += 1
        skips = {
            "recall between tau and the desirable rule": result.dropped,
            "unknown qid": result.skipped.unknown_qid,
            "no gold documents": result.skipped.no_gold,
            "a gold document unknown": result.skipped.incomplete_gold,
        }
        written = result.desirable + result.undesirable
        check_rows(str(out), written + sum(skips.values()), written, skips, unit="responses", inputs=[str(responses)])  # before the file is committed
        one_class(result, tau)  # also before: a failed export writes and registers nothing
        writer.close()
        inputs = [input_fingerprint(responses), input_fingerprint(corpus, "questions"), input_fingerprint(triples, "triples")]
        p.shards[0].record = functools.partial(
            write_sidecar, out, kind="kto", fmt=fmt, rows=written, json_array=json_array,
            inputs=inputs, dataset_info_entry=Path(out).stem if registered else None,
            params={"cannot_answer": cannot_answer} if cannot_answer else None, questions=questions_record(result.qids, splits=sorted(splits) or None),
        )  # fmt: skip

    one_part(outputs, part)  # the file claimed before anything is read
    if not is_stdio(out):
        result.file = str(out)
    if registered:
        stanza = dataset_info_stanza("llamafactory-sharegpt", Path(out).name, system=bool(system), kto=True)
        result.dataset_info = str(update_dataset_info(Path(out).parent, {Path(out).stem: stanza}))
    return result


class KtoReport(Report, kw_only=True):
    """``export kto --json``: :meth:`KtoResult.as_dict`."""

    desirable_rule: str
    rule: str
    tau: float
    desirable: int
    undesirable: int
    dropped: int
    outside_split: int
    unknown_qid: int
    no_gold: int
    incomplete_gold: int
    desirable_weight: float
    undesirable_weight: float
    per_dataset: dict[str, dict[str, int]]
    file: str | None
    dataset_info: str | None
