"""The base model and its tokenizer for training: the docid markers as special tokens, the chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from grtool.docid import BRACKET_END, BRACKET_START, DOCID_END, DOCID_START
from grtool.errors import InputError
from grtool.models import ModelRef, resolve_model

MARKER_TOKENS = (DOCID_START, DOCID_END)
# Each new marker row starts as the embedding of the bracket it replaces: a docid opens where the model
# would open a bracket (off-the-shelf models write docids as [h, r, t]), so the marker starts out as likely
# as the bracket in that position and training only has to sharpen it.
MARKER_INIT = {DOCID_START: BRACKET_START, DOCID_END: BRACKET_END}


def resolve(model: str | None) -> ModelRef:
    """``--model``: None = the embedded SmolLM2, a folder, a GGUF file (converted once), a hub id in the local cache."""
    return resolve_model(model)


def load_tokenizer(ref: ModelRef, chat_template: str | None = None):
    from grtool.models import check_chat_template, check_tokenizer, embedding_rows

    tokenizer = load_model_tokenizer(ref)
    check_tokenizer(tokenizer, ref.name, embedding_rows(ref.path))
    if chat_template:
        try:
            tokenizer.chat_template = Path(chat_template).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"--chat-template {chat_template}: cannot read it as text ({getattr(e, 'strerror', None) or e})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            f"--model {ref.name}: its tokenizer has no chat template, so the user and assistant turns cannot be "
            "rendered; pass one with --chat-template FILE (a Jinja file, e.g. the chat template of the instruct "
            "model this base was made from: the `chat_template` of its tokenizer_config.json or chat_template.jinja)"
        )
    check_chat_template(tokenizer, f"--chat-template {chat_template}" if chat_template else f"--model {ref.name}")
    return tokenizer


def load_model_tokenizer(ref: ModelRef):
    """The tokenizer of a model folder or hub id; a failure is one line (transformers' own advice, such as
    installing sentencepiece for a folder that simply has no tokenizer, would mislead).

    AutoTokenizer's module imports torch (seconds before a dry run or a refusal can answer), so the class it picks
    for a folder is remembered (:func:`~grtool.models.remember`) and later loads of that folder go to that class
    directly: the same tokenizer, without torch."""
    from grtool.models import fact_file, recall, remember

    entry = fact_file(ref.path, TOKENIZER_CLASS)
    try:
        known = _tokenizer_class(recall(entry, str))
        if known is not None:
            return known.from_pretrained(ref.path)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(ref.path)
    except Exception as e:  # noqa: BLE001  (OSError, ValueError, ImportError, tokenizers' Exception, ...)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"--model {ref.name}: cannot load its tokenizer ({first[:300]})") from None
    chosen = type(tokenizer)
    if chosen.__module__.startswith("transformers."):  # a model's own code (trust_remote_code) is never loaded this way
        remember(entry, f"{chosen.__module__}:{chosen.__qualname__}")
    return tokenizer


TOKENIZER_CLASS = "tokenizer-class"  # the question remembered: "module:class" of the tokenizer AutoTokenizer picked


def _tokenizer_class(remembered: str | None) -> type | None:
    """The transformers class a remembered ``module:class`` names; None when it names none (a damaged entry)."""
    import importlib

    module, _, name = (remembered or "").partition(":")
    if not module.startswith("transformers.") or not name:
        return None
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) and hasattr(found, "from_pretrained") else None


def model_context(ref: ModelRef) -> int | None:
    """The model's context in tokens from its config (None: unknown without loading it), as the transformers backend
    knows it before loading: a folder's config.json read as it is where it states it plainly, else the config
    transformers loads (its import takes seconds)."""
    from grtool.llm.models import known_context

    return known_context("transformers", ref.path, {})


class LoraLayers(msgspec.Struct):
    names: list[str]
    hidden_size: int | None


LORA_LAYERS = "lora-layers"  # the question remembered: a LoraLayers


def lora_layers(ref: ModelRef) -> tuple[list[str], int | None]:
    """The names of the model's layers LoRA can adapt (linear, embedding and convolution layers: what peft wraps;
    a block such as ``mlp`` is none of them) and its hidden size, from its config without its weights (meta
    device); ([], None) when unknown. Even that takes torch (seconds), so a folder's answer is remembered."""
    from grtool.models import fact_file, recall, remember

    entry = fact_file(ref.path, LORA_LAYERS)
    known = recall(entry, LoraLayers)
    if known is not None:
        return known.names, known.hidden_size
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.pytorch_utils import Conv1D

        config = AutoConfig.from_pretrained(ref.path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001  (a hub id not in the cache: the load itself says why)
        return [], None
    kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, Conv1D)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
    found = LoraLayers([name for name, m in model.named_modules() if isinstance(m, kinds)], hidden if isinstance(hidden, int) else None)
    remember(entry, found)
    return found.names, found.hidden_size


def load_model(ref: ModelRef, dtype: Any = None):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype) if dtype is not None else AutoModelForCausalLM.from_pretrained(ref.path)
    except Exception as e:  # noqa: BLE001  (a folder checked by check_model_folder; a hub id may still fail here)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"--model {ref.name}: cannot load it ({first[:300]})") from None


def add_markers(tokenizer) -> list[str]:
    """Add the docid markers as special tokens (one id each) when missing; returns the ones added."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in MARKER_TOKENS if t not in vocab]
    if missing:
        tokenizer.add_tokens(missing, special_tokens=True)
    for token in MARKER_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise InputError(f"the tokenizer splits {token} into {len(ids)} tokens after adding it as a special token")
    return missing


def _source_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def resize_and_init(model, tokenizer, added: list[str]) -> None:
    """Resize the embeddings to the tokenizer and give each added marker the embedding of its bracket."""
    import torch

    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    if not added:
        return
    with torch.no_grad():
        matrices = [model.get_input_embeddings().weight]
        output = model.get_output_embeddings()
        if output is not None and output.weight.data_ptr() != matrices[0].data_ptr():  # untied head
            matrices.append(output.weight)
        for token in added:
            new_id = tokenizer.convert_tokens_to_ids(token)
            source = _source_ids(tokenizer, MARKER_INIT[token]) or _source_ids(tokenizer, " ")
            for weight in matrices:
                weight[new_id] = weight[source].mean(dim=0)


def marker_ids(tokenizer) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(t) for t in MARKER_TOKENS]
