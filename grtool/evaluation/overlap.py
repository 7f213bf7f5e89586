"""Which questions a checkpoint trained on, and whether `eval recall` scores any of them.

`train sft|kto` records in its checkpoint's ``grtool.json`` the questions of its training rows
(``questions``: qids, count, digest, where they came from): those of its data (the export's
``<file>.grtool.json`` ``questions`` record, or the export run in memory from a chains or responses
directory) and, when its base model is a grtool checkpoint (KTO after SFT), those the base trained on.

`eval recall` on a `retrieve` directory finds the model that wrote the responses (the retrieve manifest's
``model`` / ``adapter`` parameters), reads that record and counts the answered questions that were in the
training data. Recall on training questions measures memory, not retrieval: the command exits 1 on any
overlap unless ``--allow-train-overlap`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grtool.errors import DataProblem
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


def responses_model(responses: str | Path) -> Path | None:
    """The local checkpoint that wrote a `retrieve` directory's responses (its adapter's checkpoint for
    ``--adapter``); None for a file, a named model, or a directory `retrieve` did not write."""
    from grtool.store.records import is_stage_dir, load_manifest

    p = Path(responses)
    if str(responses) == "-" or not is_stage_dir(p):
        return None
    params = load_manifest(p).get("params") or {}
    if params.get("adapter"):
        return Path(params["adapter"]).parent
    model = str(params.get("model") or "")
    path = model.rsplit("@", 1)[0] if "@" in model else model  # a local folder is recorded as PATH@weights-digest
    return Path(path) if path and Path(path).is_dir() else None


@dataclass
class Overlap:
    model: str | None  # the checkpoint, when found
    trained: int | None  # questions in its record (None: no record)
    answered: int = 0
    overlapping: list[str] = field(default_factory=list)
    complete: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "trained_questions": self.trained, "answered_questions": self.answered,
                "answered_in_training": len(self.overlapping), "examples": self.overlapping[:EXAMPLES],
                "record_complete": self.complete}  # fmt: skip

    def line(self) -> str:
        if self.model is None:
            return "training overlap: not checked (the responses name no local checkpoint)"
        if self.trained is None:
            return f"training overlap: not checked ({self.model} records no training questions)"
        note = "" if self.complete else " (its record is incomplete: some training data named no questions)"
        return (f"training overlap: {len(self.overlapping)} of {self.answered} answered questions were in the training data "
                f"of {self.model} ({self.trained} questions){note}")  # fmt: skip


def train_overlap(responses: str | Path) -> Overlap:
    """How many questions answered in ``responses`` the model that wrote them trained on."""
    from grtool.vocab.readers import iter_responses

    model = responses_model(responses)
    record = checkpoint_questions(model) if model is not None else None
    if record is None:
        return Overlap(str(model) if model is not None else None, None)
    trained = set(record["qids"])
    answered = {str(r.qid) for r in iter_responses(responses)}
    overlapping = sorted(answered & trained)
    return Overlap(str(model), len(trained), len(answered), overlapping, bool(record.get("complete", True)))


def refuse_overlap(overlap: Overlap, responses: str | Path) -> None:
    """Exit 1 when scored questions were training questions (`eval recall` without --allow-train-overlap)."""
    if overlap.overlapping:
        raise DataProblem(
            f"{responses}: {len(overlap.overlapping)} of {overlap.answered} answered questions were in the training data of "
            f"{overlap.model} (e.g. {', '.join(overlap.overlapping[:EXAMPLES])}): recall on them measures memory, not retrieval; "
            "score held-out questions (retrieve --split) or pass --allow-train-overlap"
        )
