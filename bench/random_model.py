"""A random-init Llama written as a local HF model folder, for benchmarks on machines without the weights.

The speed of a training step or of generation depends on the shapes, not on the values: a folder with a config,
random weights and a real tokenizer (by default the embedded SmolLM2's, chat template included) stands in for a
downloaded checkpoint of the same shape. Presets:
  1b     hidden 2048, 16 layers, MLP 8192, 32 heads (8 key/value), tied embeddings: 1.07B with SmolLM2's
         49,152-token vocabulary (the shape of Llama 3.2 1B)
  135m   the shape of SmolLM2-135M (hidden 576, 30 layers, MLP 1536, 9 heads, 3 key/value)
  tiny   hidden 64, 2 layers: to try a benchmark's code path in seconds
"""

from __future__ import annotations

import shutil
from pathlib import Path

PRESETS = {
    "1b": dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64),
    "135m": dict(hidden_size=576, num_hidden_layers=30, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, head_dim=64),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json", "generation_config.json")


def tokenizer_folder(tokenizer: str | None) -> Path:
    """The folder whose tokenizer files the model gets: ``tokenizer``, else the embedded model's (converted once)."""
    if tokenizer:
        return Path(tokenizer)
    from grtool.models import resolve_model

    return Path(resolve_model(None).path)


def write_random_model(folder: Path, preset: str, tokenizer: str | None = None, dtype: str = "bfloat16", device: str = "cpu") -> Path:
    """Write a random-init Llama of ``preset``'s shape with the tokenizer files of ``tokenizer`` into ``folder``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source = tokenizer_folder(tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    tok = AutoTokenizer.from_pretrained(folder)
    config = LlamaConfig(vocab_size=len(tok), tie_word_embeddings=True, max_position_embeddings=8192, rope_theta=100000.0,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **PRESETS[preset])  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it will run: seconds on a GPU for 1B parameters
        model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    del model
    return folder


def parameters(preset: str, vocab: int = 49152) -> int:
    """The parameter count of a preset (tied embeddings)."""
    p = PRESETS[preset]
    h, f, layers = p["hidden_size"], p["intermediate_size"], p["num_hidden_layers"]
    kv = p["num_key_value_heads"] * p["head_dim"]
    attention = h * p["num_attention_heads"] * p["head_dim"] * 2 + h * kv * 2
    return vocab * h + layers * (attention + 3 * h * f + 2 * h) + h
