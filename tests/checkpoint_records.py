"""A checkpoint's ``grtool.json`` for tests that stand a model folder in for a trained checkpoint: every field
`train` writes, with what the test is about given by the caller (readers decode the whole declared record)."""

from __future__ import annotations

from typing import Any

import orjson


def checkpoint_record(**fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "kind": "train sft",
        "command": ["grtool", "train", "sft"],
        "versions": {},
        "finished": "2026-01-01T00:00:00+00:00",
        "data": {"source": "sft.json", "format": "llamafactory-sharegpt", "rows": 1},
        "base_model": {"name": "SmolLM2-135M-Instruct", "path": "SmolLM2-135M-Instruct"},
        "hyperparameters": {},
        "effective_batch_size": 1,
        "global_step": 1,
    }
    record.update(fields)
    return record


def checkpoint_record_bytes(**fields: Any) -> bytes:
    return orjson.dumps(checkpoint_record(**fields))
