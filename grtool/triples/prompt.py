"""The extraction prompt: a system message, few-shot turns, then the document; all overridable by file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from grtool.errors import InputError
from grtool.llm.base import Messages

# Structured output (vllm, openai): the same shape the prompt asks for.
TRIPLES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "triples": {
            "type": "array",
            "items": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 3},
        }
    },
    "required": ["triples"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class FewShot:
    title: str
    text: str
    triples: tuple[tuple[str, str, str], ...]


@dataclass(frozen=True)
class PromptSpec:
    system: str
    examples: tuple[FewShot, ...]

    def messages(self, title: str | None, text: str) -> Messages:
        msgs: Messages = [{"role": "system", "content": self.system}]
        for ex in self.examples:  # the same prefix for every document: vLLM's prefix cache reuses it
            msgs.append({"role": "user", "content": document_message(ex.title, ex.text)})
            msgs.append({"role": "assistant", "content": orjson.dumps({"triples": [list(t) for t in ex.triples]}).decode()})
        msgs.append({"role": "user", "content": document_message(title, text)})
        return msgs

    def sha256(self) -> str:
        payload = orjson.dumps({"system": self.system, "examples": [ex.__dict__ for ex in self.examples]})
        return hashlib.sha256(payload).hexdigest()


def document_message(title: str | None, text: str) -> str:
    return f"Title: {title}\nDocument: {text}" if title else f"Document: {text}"


def _packaged(name: str) -> str:
    return resources.files("grtool.triples").joinpath("prompts", name).read_text(encoding="utf-8")


def load_prompt(prompt_file: Path | None = None, few_shot_file: Path | None = None) -> PromptSpec:
    """The packaged prompt and examples, or the user's: a text file (system message) and a JSON/JSONL file of
    ``{"title", "text", "triples": [[h, r, t], ...]}`` records (an empty list means zero-shot)."""
    if prompt_file is not None:
        try:
            system = Path(prompt_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise InputError(f"{prompt_file}: cannot read the prompt file ({e.strerror})") from None
        if not system:
            raise InputError(f"{prompt_file}: the prompt file is empty")
    else:
        system = _packaged("system.txt").strip()
    source = str(few_shot_file) if few_shot_file is not None else "grtool/triples/prompts/few_shot.json"
    if few_shot_file is not None:
        try:
            raw = Path(few_shot_file).read_bytes()
        except OSError as e:
            raise InputError(f"{few_shot_file}: cannot read the few-shot file ({e.strerror})") from None
    else:
        raw = _packaged("few_shot.json").encode()
    return PromptSpec(system, tuple(_parse_examples(raw, source)))


def _parse_examples(raw: bytes, source: str) -> list[FewShot]:
    try:
        data = orjson.loads(raw)
        records = data if isinstance(data, list) else [data]
    except orjson.JSONDecodeError:
        records = []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    records.append(orjson.loads(line))
                except orjson.JSONDecodeError as e:
                    raise InputError(f"{source}, line {n}: not JSON ({e})") from None
    out = []
    for n, rec in enumerate(records, 1):
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str) or not isinstance(rec.get("triples"), list):
            raise InputError(f"{source}, example {n}: expected an object with 'text' (string) and 'triples' (list)")
        triples = []
        for t in rec["triples"]:
            if not (isinstance(t, list) and len(t) == 3 and all(isinstance(x, str) and x.strip() for x in t)):
                raise InputError(f"{source}, example {n}: every triple must be three non-empty strings, got {t!r}")
            triples.append((t[0], t[1], t[2]))
        out.append(FewShot(str(rec.get("title") or ""), rec["text"], tuple(triples)))
    return out
