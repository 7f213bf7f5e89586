"""Which questions a checkpoint trained on, and whether `eval recall` scores any of them.

`train sft|kto` records in its checkpoint's ``grtool.json`` the questions of its training rows
(``questions``: qids, count, digest, where they came from): those of its data (the export's
``<file>.grtool.json`` ``questions`` record, or the export run in memory from a chains or responses
directory) and, when its base model is a grtool checkpoint (KTO after SFT), those the base trained on.

`retrieve` pins that record: it copies the questions of the checkpoint that writes the responses into its
manifest (``params.trained_questions``; null for a model grtool did not train), so scoring needs no checkpoint
folder and a checkpoint retrained or moved afterwards changes nothing. :func:`train_overlap` is the one verdict
every scoring route asks, for a `retrieve` stage or the run directory holding it alike: it counts the answered
questions that were in the training data. Recall on training questions measures memory, not retrieval: a scoring
command exits 1 on any overlap unless ``--allow-train-overlap`` is given, and fails closed the same way when the
responses name a local checkpoint whose record can no longer be read (a manifest written before the pin, the
folder moved or recorded by a relative path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from grtool.errors import DataProblem
from grtool.records import Count
from grtool.vocab.provenance import checkpoint_value, questions_record

EXAMPLES = 5


def checkpoint_questions(path: str | Path | None) -> dict[str, Any] | None:
    """The ``questions`` record of a grtool checkpoint (None: not a grtool checkpoint, or written before it)."""
    value = checkpoint_value(path, "questions")
    return value if isinstance(value, dict) and isinstance(value.get("qids"), list) else None


def trained_questions(data_source: str, data_questions: dict[str, Any] | None, base_model: str | Path | None) -> dict[str, Any]:
    """The record a new checkpoint keeps: its data's questions ∪ its base checkpoint's (when it has one)."""
    qids: set[str] = set()
    complete = data_questions is not None
    sources: list[dict[str, Any]] = [{"data": data_source, "splits": (data_questions or {}).get("splits"), "count": (data_questions or {}).get("count")}]
    if data_questions is not None:
        qids.update(data_questions.get("qids") or ())
    base = checkpoint_questions(base_model)
    if base is not None:
        qids.update(base["qids"])
        complete = complete and base.get("complete", True)
        sources.append({"checkpoint": str(base_model), "count": base.get("count")})
    # complete = False: some training rows came from data that names no questions (a hand-made file)
    return questions_record(qids, complete=complete, sources=sources)


def questions_problem(record: Any) -> str | None:
    """What makes a questions record other than :func:`~grtool.vocab.provenance.questions_record` writes it (its qids
    sorted and distinct, their count and digest), or None: a copy edited by hand never decides the verdict."""
    qids = record.get("qids") if isinstance(record, dict) else None
    if not isinstance(qids, list) or not all(isinstance(q, str) for q in qids):
        return "no list of qids"
    written = questions_record(qids)
    if record.get("count") != written["count"] or record.get("sha256") != written["sha256"]:
        return f"{len(qids)} qids, and a count of {record.get('count')!r} and a digest that are not theirs"
    return None


def recorded_checkpoint(params: dict[str, Any]) -> str | None:
    """The local checkpoint a `retrieve` manifest's parameters name (its adapter's checkpoint for ``--adapter``);
    None for a named model (the embedded one, a hub id). A local folder is recorded as PATH@weights-digest."""
    if params.get("adapter"):
        return str(Path(str(params["adapter"])).parent)
    model = str(params.get("model") or "")
    return model.rsplit("@", 1)[0] if "@" in model else None


def pinned_questions(checkpoint: str | Path | None) -> dict[str, Any] | None:
    """What `retrieve` copies into its manifest: the questions record of the checkpoint (None: not a grtool one)."""
    return checkpoint_questions(checkpoint) if checkpoint is not None else None


@dataclass
class Overlap:
    model: str | None  # the checkpoint, when found
    trained: int | None  # questions in its record (None: no record)
    answered: int = 0
    overlapping: list[str] = field(default_factory=list)
    complete: bool = True
    unresolved: str | None = None  # why the record of a named local checkpoint cannot be read (fails closed)

    def as_dict(self, allowed: bool | None = None) -> dict[str, Any]:
        """The verdict as a report records it; ``allowed``: whether the scoring command was given
        --allow-train-overlap (a report written by a refused run says so, and no later route calls it allowed)."""
        return {"model": self.model, "trained_questions": self.trained, "answered_questions": self.answered,
                "answered_in_training": len(self.overlapping), "examples": self.overlapping[:EXAMPLES],
                "record_complete": self.complete, "unresolved": self.unresolved, "allowed": allowed}  # fmt: skip

    def line(self) -> str:
        if self.unresolved is not None:
            return f"training overlap: cannot be checked: {self.unresolved}"
        if self.model is None:
            return "training overlap: not checked (the responses name no local checkpoint)"
        if self.trained is None:
            return f"training overlap: not checked ({self.model} records no training questions)"
        note = "" if self.complete else " (its record is incomplete: some training data named no questions)"
        return (f"training overlap: {len(self.overlapping)} of {self.answered} answered questions were in the training data "
                f"of {self.model} ({self.trained} questions){note}")  # fmt: skip


def train_overlap(responses: str | Path) -> Overlap:
    """How many questions answered in ``responses`` (a `retrieve` stage, the run directory holding it, or JSON
    Lines) the model that wrote them trained on: the verdict every scoring route asks."""
    from grtool.evaluation.selection import retrieve_manifest
    from grtool.vocab.readers import iter_responses

    manifest = retrieve_manifest(responses)
    if manifest is None:  # JSON Lines: nobody recorded which model wrote them
        return Overlap(None, None)
    params = manifest.params
    model = recorded_checkpoint(params)
    if "trained_questions" in params:  # pinned by `retrieve`
        record = params["trained_questions"]
        where = f"{responses}: its manifest's trained_questions"
    elif model is not None and not Path(model).is_dir():
        return Overlap(model, None, unresolved=f"the responses were written by {model}, which is not there any more (moved, or recorded by a "
                                               "relative path), and their manifest holds no copy of its training questions")  # fmt: skip
    else:
        record = checkpoint_questions(model) if model is not None else None
        where = f"{model}: its record's questions"
    if record is None:
        return Overlap(model, None)
    if (problem := questions_problem(record)) is not None:
        return Overlap(model, None, unresolved=f"{where} is not what grtool writes ({problem}; edited or damaged)")
    trained = set(record["qids"])
    answered = {str(r.qid) for r in iter_responses(responses)}
    overlapping = sorted(answered & trained)
    return Overlap(str(model), len(trained), len(answered), overlapping, bool(record.get("complete", True)))


class RecordedOverlap(msgspec.Struct):
    """:meth:`Overlap.as_dict` as a report of `eval recall --json` records it (``train_overlap``)."""

    model: str | None = None
    trained_questions: Count | None = None
    answered_questions: Count = 0
    answered_in_training: Count = 0
    examples: list[str] = []
    record_complete: bool = True
    unresolved: str | None = None
    allowed: bool | None = None  # --allow-train-overlap given (None: an older grtool's report, or a verdict asked anew)

    def __post_init__(self) -> None:
        n = self.answered_in_training
        if n > self.answered_questions or (self.trained_questions is not None and n > self.trained_questions):
            raise ValueError(f"answered_in_training {n} is more than answered_questions {self.answered_questions} or trained_questions {self.trained_questions}")
        if len(self.examples) != min(n, EXAMPLES):
            raise ValueError(f"examples lists {len(self.examples)} qids for {n} answered in training")
        if n and (self.model is None or self.trained_questions is None or self.unresolved is not None):
            raise ValueError(f"answered_in_training {n} without the model and the training questions of a verdict reached")


def overlap_problem(recorded: RecordedOverlap | dict[str, Any] | None) -> str | None:
    """What a recorded verdict holds against the recall beside it (training questions scored, or a verdict that
    could not be reached), for every table that shows that recall; None when nothing, or no verdict was recorded
    (a report of an older grtool). ``recorded``: decoded, or the JSON value of a report not read through its type."""
    if not recorded:
        return None
    verdict = recorded if isinstance(recorded, RecordedOverlap) else msgspec.convert(recorded, RecordedOverlap)
    if verdict.unresolved is not None:
        return f"training overlap cannot be checked: {verdict.unresolved}"
    if verdict.answered_in_training:
        return (f"{verdict.answered_in_training} of {verdict.answered_questions} answered questions were in the training data of "
                f"{verdict.model} (e.g. {', '.join(verdict.examples)})")  # fmt: skip
    return None


def refuse_overlap(overlap: Overlap, responses: str | Path) -> None:
    """Exit 1 when scored questions were training questions, or when that cannot be known (without
    --allow-train-overlap)."""
    if overlap.unresolved is not None:
        raise DataProblem(f"{responses}: training overlap cannot be checked: {overlap.unresolved}; run `retrieve` again with the checkpoint, or pass --allow-train-overlap to score without the check")
    if overlap.overlapping:
        raise DataProblem(
            f"{responses}: {len(overlap.overlapping)} of {overlap.answered} answered questions were in the training data of "
            f"{overlap.model} (e.g. {', '.join(overlap.overlapping[:EXAMPLES])}): recall on them measures memory, not retrieval; "
            "score held-out questions (retrieve --split) or pass --allow-train-overlap"
        )
