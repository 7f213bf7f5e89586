"""`--format llamafactory-yaml`: the LLaMA-Factory training config equivalent to a `grtool train` run.

Run it with ``llamafactory-cli train FILE``. The dataset is the entry `export sft` / `export kto` registered in
the ``dataset_info.json`` beside the data file (``dataset`` + ``dataset_dir``); the markers are added as special
tokens (``add_special_tokens``, ``resize_vocab``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from grtool.docid import DOCID_END, DOCID_START
from grtool.errors import InputError
from grtool.train.run import Plan


def template_for(model_name: str) -> str:
    """LLaMA-Factory's chat template name for a model (check it against the model you use)."""
    name = model_name.lower()
    for needle, template in (("llama-3", "llama3"), ("llama3", "llama3"), ("qwen3", "qwen3"), ("qwen", "qwen"), ("smollm", "chatml"), ("mistral", "mistral")):
        if needle in name:
            return template
    return "default"


def dataset_entry(data: Path) -> tuple[str, Path]:
    info = data.parent / "dataset_info.json"
    if data.is_file() and info.is_file():
        try:
            entries = orjson.loads(info.read_bytes())
        except orjson.JSONDecodeError as e:
            raise InputError(f"{info}: not valid JSON ({e})") from None
        for name, entry in entries.items():
            if isinstance(entry, dict) and entry.get("file_name") == data.name:
                return name, data.parent
    raise InputError(
        f"{data}: not registered in a dataset_info.json beside it; LLaMA-Factory reads registered datasets: "
        "write it with `grtool export sft --format llamafactory-sharegpt` (or `export kto --format llamafactory`)"
    )


def llamafactory_config(p: Plan, output_dir: str) -> dict[str, Any]:
    cfg = p.cfg
    name, dataset_dir = dataset_entry(Path(p.data.source))
    config: dict[str, Any] = {
        "model_name_or_path": p.model.path,
        "trust_remote_code": False,
        "add_special_tokens": f"{DOCID_START},{DOCID_END}",
        "resize_vocab": True,
        "stage": p.kind,
        "do_train": True,
        "finetuning_type": "lora" if cfg.lora else "full",
    }
    if cfg.lora:
        config.update(lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_target="all" if cfg.lora_target == "all-linear" else cfg.lora_target,
                      additional_target="embed_tokens,lm_head")  # fmt: skip
    if cfg.deepspeed:
        config["deepspeed"] = cfg.deepspeed
    if p.kind == "kto":
        config.update(pref_beta=cfg.beta, pref_loss="sigmoid", kto_chosen_weight=p.weights[0], kto_rejected_weight=p.weights[1])
    config.update(
        dataset=name,
        dataset_dir=str(dataset_dir),
        template=template_for(p.model.name),
        cutoff_len=cfg.cutoff_len,
        packing=cfg.packing,
        overwrite_cache=True,
        output_dir=output_dir,
        logging_steps=cfg.logging_steps,
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        plot_loss=True,
        report_to=cfg.report_to,
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation,
        learning_rate=cfg.lr,
        num_train_epochs=cfg.epochs,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_ratio=cfg.warmup_ratio,
        seed=cfg.seed,
        bf16=cfg.bf16 if cfg.bf16 is not None else True,
    )
    if cfg.max_steps is not None:
        config["max_steps"] = cfg.max_steps
    return config


def render(p: Plan, output_dir: str) -> str:
    import yaml

    header = (
        f"# LLaMA-Factory config equivalent to grtool train {p.kind} (run: llamafactory-cli train THIS_FILE)\n"
        f"# effective batch {p.report()['effective_batch_size']} = per-device x accumulation x {p.report()['processes']} processes;"
        " check `template` against your model\n"
    )
    return header + yaml.safe_dump(llamafactory_config(p, output_dir), sort_keys=False)
