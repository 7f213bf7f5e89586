"""What `retrieve` rejects, the same in every decoding mode (docid modes and GMR)."""

from __future__ import annotations

from typing import Any

from grtool.llm.base import TOO_LONG


def reject_too_long(shard: Any, question: dict[str, Any], sample: int, why: str, source: str) -> None:
    """A question whose prompt does not fit the model's context: each of its samples is a reject (``too_long``),
    counted once per question (``questions_too_long``)."""
    if sample == 0:
        shard.count("questions_too_long")
    record = {"qid": question["qid"], "sample": sample, "dataset": question.get("dataset"), "chars": len(question.get("question") or "")}
    shard.reject(record, TOO_LONG, source=source, detail=why)
