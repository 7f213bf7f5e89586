"""Stand-ins for what `train` makes: a checkpoint's ``grtool.json`` for tests that stand a model folder in for a
trained checkpoint (every field `train` writes, with what the test is about given by the caller: readers decode
the whole declared record), and a model whose weights are not finite (what a diverged run would have saved)."""

from __future__ import annotations

from pathlib import Path
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


def nan_model(folder: Path, base: Path) -> Path:
    """The model folder ``base`` with its final norm NaN: every loss NaN, every answer end-of-text."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True)
    for f in base.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    weights = load_file(base / "model.safetensors")
    weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], float("nan"))
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder
