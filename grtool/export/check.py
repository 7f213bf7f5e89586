"""`grtool validate` for exported files: each against its provenance sidecar, and LLaMA-Factory's dataset_info.json.

Row shapes are those :mod:`grtool.export.formats` writes (LLaMA-Factory alpaca / sharegpt, TRL messages /
unpaired preference, GMR pairs). A file registered in a dataset_info.json without a sidecar (written before
sidecars existed, or by hand) is checked against its entry's ``formatting`` and ``columns`` instead.
Rows are streamed (:mod:`grtool.jsonrecords`), a JSON array of any layout as well as JSON Lines.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import msgspec
import orjson

from grtool.jsonrecords import RecordsError, first_byte, iter_json_records
from grtool.records import DamagedRecord, field_message, read_record_bytes
from grtool.vocab.provenance import ExportRecord, decode_sidecar, sidecar_path
from grtool.store.outputs import export_state
from grtool.store.records import sha256_file
from grtool.store.fingerprints import check_inputs

MAX_SHAPE_EXAMPLES = 3
Check = Callable[[Any], "str | None"]  # a row → what is wrong with it, or None


# ------------------------------------------------------------------------------------------- shapes


# Row shapes, each declared once as a msgspec Struct: a field's type, a non-empty text, the turns' roles in order.
Text = Annotated[str, msgspec.Meta(pattern=r"\S")]  # a string with something in it
NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class _Row(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


def _roles(turns: list, where: str, roles: list[str], *, system: bool = False) -> None:
    got = [t.role for t in turns]
    want = (["system"] if system and got[:1] == ["system"] else []) + roles
    if got != want:
        raise ValueError(f"{where} roles are {got}, expected {want}")


class ShareGPTTurn(_Row, rename={"role": "from"}):
    role: str
    value: Text


class ShareGPT(_Row):
    conversations: list[ShareGPTTurn]
    system: Text | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        _roles(self.conversations, "conversations", ["human", "gpt"])


class ShareGPTKTO(ShareGPT, kw_only=True):
    kto_tag: bool


class Alpaca(_Row):
    instruction: Text
    input: str
    output: Text
    system: Text | msgspec.UnsetType = msgspec.UNSET


class Message(_Row):
    role: str
    content: Text


class TRLMessages(_Row):
    messages: list[Message]

    def __post_init__(self) -> None:
        _roles(self.messages, "messages", ["user", "assistant"], system=True)


class TRLKTO(_Row):
    prompt: list[Message]
    completion: list[Message]
    label: bool

    def __post_init__(self) -> None:
        _roles(self.prompt, "prompt", ["user"], system=True)
        _roles(self.completion, "completion", ["assistant"])


class GMRRetrieval(_Row, tag_field="kind", tag="retrieval"):
    qid: Text
    step: NonNegative
    input: Text
    target: Text
    doc_id: str | None


class GMRMemorization(_Row, tag_field="kind", tag="memorization"):
    doc_id: Text
    input: Text
    target: Text


def _declared(kind: Any) -> Check:
    """A row check decoding through the declaration ``kind``: None, or what is wrong and where."""

    def check(row: Any) -> str | None:
        try:
            msgspec.convert(row, type=kind)
        except msgspec.ValidationError as e:
            return field_message(e).replace("`str` matching regex", "`str` with text in it, regex")
        except RecursionError:
            return "nested deeper than any row grtool writes"
        return None

    return check


_alpaca, _sharegpt, _sharegpt_kto = _declared(Alpaca), _declared(ShareGPT), _declared(ShareGPTKTO)
_trl_messages, _trl_kto, _gmr = _declared(TRLMessages), _declared(TRLKTO), _declared(GMRRetrieval | GMRMemorization)


def _text(value: Any, where: str, *, empty_ok: bool = False) -> str | None:
    if not isinstance(value, str):
        return f"{where} is {type(value).__name__}, expected a string"
    if not empty_ok and not value.strip():
        return f"{where} is empty"
    return None


def _bool(value: Any, where: str) -> str | None:
    return None if isinstance(value, bool) else f"{where} is {type(value).__name__}, expected true/false"


ROW_SHAPES: dict[tuple[str, str], Check] = {
    ("sft", "llamafactory-alpaca"): _alpaca,
    ("sft", "llamafactory-sharegpt"): _sharegpt,
    ("sft", "trl-messages"): _trl_messages,
    ("kto", "llamafactory"): _sharegpt_kto,
    ("kto", "trl"): _trl_kto,
    ("gmr", "gmr"): _gmr,
}
# What a dataset_info entry's `formatting` must be for a file of each LLaMA-Factory format.
LLAMAFACTORY_FORMATTING = {("sft", "llamafactory-alpaca"): "alpaca", ("sft", "llamafactory-sharegpt"): "sharegpt", ("kto", "llamafactory"): "sharegpt"}


def shape_from_entry(entry: dict[str, Any]) -> Check:
    """A row check from a dataset_info entry (files without a sidecar): its formatting, columns and tags."""
    columns = entry.get("columns") or {}
    if entry.get("formatting", "alpaca") == "alpaca":
        names = {k: columns.get(k, d) for k, d in (("prompt", "instruction"), ("query", "input"), ("response", "output"))}

        def alpaca(row: Any) -> str | None:
            if not isinstance(row, dict):
                return f"a {type(row).__name__}, expected an object"
            for role, name in names.items():
                if name not in row:
                    if role == "query":
                        continue
                    return f"missing {name} (columns.{role})"
                bad = _text(row[name], name, empty_ok=role == "query")
                if bad:
                    return bad
            return None

        return alpaca
    tags = entry.get("tags") or {}
    messages = columns.get("messages", "conversations")
    role_tag, content_tag = tags.get("role_tag", "from"), tags.get("content_tag", "value")
    kto_tag = columns.get("kto_tag")

    def sharegpt(row: Any) -> str | None:
        if not isinstance(row, dict):
            return f"a {type(row).__name__}, expected an object"
        if messages not in row:
            return f"missing {messages} (columns.messages)"
        turns = row[messages]
        if not isinstance(turns, list) or not turns:
            return f"{messages} is not a non-empty list"
        for i, t in enumerate(turns):
            if not isinstance(t, dict) or role_tag not in t or content_tag not in t:
                return f"{messages}[{i}] lacks {role_tag!r} or {content_tag!r}"
        if kto_tag is not None:
            return _bool(row.get(kto_tag), kto_tag)
        return None

    return sharegpt


# -------------------------------------------------------------------------------------------- rows


def check_rows(path: Path, check: Check, json_array: bool | None, label: str) -> tuple[int, list[str]]:
    """(rows read, problems): a file that cannot be read, and the rows not in ``label``'s shape."""
    n, bad, examples = 0, 0, []
    try:
        for n, (_, row) in enumerate(iter_json_records(path, json_array), 1):
            why = check(row)
            if why is not None:
                bad += 1
                if len(examples) < MAX_SHAPE_EXAMPLES:
                    examples.append(f"row {n}: {why}")
    except RecordsError as e:
        return n, [f"{path.name}: {e}"]
    except OSError as e:
        return n, [f"{path.name}: cannot be read ({e})"]
    if bad:
        return n, [f"{path.name}: {bad} of {n} rows are not {label} rows ({'; '.join(examples)})"]
    return n, []


# ---------------------------------------------------------------------------------------- the checks


def check_export(path: Path, meta: ExportRecord) -> tuple[dict[str, Any], list[str], list[str]]:
    """One exported file against its sidecar ``meta``: (checked, problems, notes)."""
    problems: list[str] = []
    notes: list[str] = []
    checked: dict[str, Any] = {"kind": meta.kind, "format": meta.trainer_format, "rows": 0}
    side = sidecar_path(path).name
    if not path.is_file():
        return checked, [f"{path.name}: missing, but {side} records it ({meta.rows} rows): an export stopped before its file was in place, or the file was removed; export it again"], notes
    size = path.stat().st_size
    state = export_state(path, msgspec.to_builtins(meta))
    if state == "replaced" and meta.replaces is msgspec.UNSET:  # an older grtool's record: it cannot tell which
        problems.append(f"{path.name}: changed since it was written ({side}, of an older grtool, records other bytes): edited, or an export stopped before its new file was in place; export it again")
    elif state == "replaced":
        problems.append(f"{path.name}: an export stopped before its new file was in place ({side} records the new one): export it again")
    elif state == "changed":
        digest = sha256_file(path)
        problems.append(
            f"{path.name}: changed since it was written ({size} bytes, sha256 {digest[:12]}…; {side} says {meta.bytes} bytes, {meta.sha256[:12]}…): "
            "it is yours now, and no export replaces it; move it away to export again"
        )
    key = (meta.kind, meta.trainer_format)
    check = ROW_SHAPES.get(key)
    if check is None:
        problems.append(f"{side}: unknown export {key[0]!r} format {key[1]!r}")
        return checked, problems, notes
    if meta.json_array != (first_byte(path) == b"[") and size:
        problems.append(f"{side}: field json_array: {str(meta.json_array).lower()}, but {path.name} is {'not ' if meta.json_array else ''}a JSON array")
        return checked, problems, notes
    rows, bad = check_rows(path, check, meta.json_array, f"{key[0]} {key[1]}")
    checked["rows"] = rows
    problems += bad
    if not bad and rows != meta.rows:
        problems.append(f"{path.name}: {rows} rows, {side} says {meta.rows}")
    problems += _check_entry(path, meta, key)
    p, n = check_inputs(meta.inputs, path.name)
    return checked, problems + p, notes + n


def _check_entry(path: Path, meta: ExportRecord, key: tuple[str, str]) -> list[str]:
    """The dataset_info.json entry the sidecar names: present, pointing at this file, in this file's formatting."""
    ref = meta.dataset_info
    if ref is None:
        return []
    info_path = path.parent / ref.file
    name = ref.entry
    try:
        info = orjson.loads(read_record_bytes(info_path, what="dataset_info"))
    except FileNotFoundError:
        return [f"{info_path.name}: missing, but {path.name} is registered there as {name!r}"]
    except DamagedRecord as e:
        return [str(e)]
    except orjson.JSONDecodeError as e:
        return [f"{info_path.name}: not valid JSON ({e})"]
    entry = info.get(name) if isinstance(info, dict) else None
    if not isinstance(entry, dict):
        return [f"{info_path.name}: no entry {name!r} for {path.name}"]
    problems = []
    if entry.get("file_name") != path.name:
        problems.append(f"{info_path.name}: entry {name!r} points to {entry.get('file_name')!r}, not {path.name!r}")
    want = LLAMAFACTORY_FORMATTING.get(key)
    if want and entry.get("formatting") != want:
        problems.append(f"{info_path.name}: entry {name!r} has formatting {entry.get('formatting')!r}, the file is {want}")
    if key[0] == "kto" and (entry.get("columns") or {}).get("kto_tag") != "kto_tag":
        problems.append(f"{info_path.name}: entry {name!r} does not map columns.kto_tag, LLaMA-Factory would not see the labels")
    return problems


def check_dataset_info(path: Path, with_sidecar: set[Path]) -> tuple[dict[str, Any], list[str], list[str]]:
    """A dataset_info.json: valid, every entry's file present; rows of files without a sidecar in the entry's shape
    (files with one are checked against it on their own)."""
    problems: list[str] = []
    notes: list[str] = []
    checked: dict[str, Any] = {"entries": 0, "rows": 0}
    try:
        info = orjson.loads(read_record_bytes(path, what="dataset_info"))
    except orjson.JSONDecodeError as e:
        return checked, [f"{path.name}: not valid JSON ({e})"], notes
    except DamagedRecord as e:
        return checked, [str(e)], notes
    if not isinstance(info, dict):
        return checked, [f"{path.name}: a JSON {type(info).__name__}, expected an object of dataset entries"], notes
    checked["entries"] = len(info)
    for name, entry in sorted(info.items()):
        if not isinstance(entry, dict):
            problems.append(f"{path.name}: entry {name!r} is not an object")
            continue
        file_name = entry.get("file_name")
        if not file_name:
            continue  # a hub dataset (hf_hub_url, ms_hub_url, …): nothing local to check
        target = path.parent / file_name
        if not target.exists():
            problems.append(f"{path.name}: entry {name!r} points to {file_name}, which does not exist")
            continue
        if target.resolve() in with_sidecar or target.is_dir():
            continue
        rows, bad = check_rows(target, shape_from_entry(entry), None, f"{entry.get('formatting', 'alpaca')} (entry {name!r})")
        checked["rows"] += rows
        problems += bad
        notes.append(f"{file_name}: no {sidecar_path(target).name} (written by an older grtool or by hand): checked against its entry only")
    return checked, problems, notes


def load_sidecar(path: Path) -> tuple[Path, ExportRecord | None, str | None]:
    """(the exported file a sidecar describes, its record or None, the problem reading it)."""
    target = path.with_name(path.name[: -len(".grtool.json")])
    try:
        meta = decode_sidecar(path)
    except DamagedRecord as e:
        return target, None, str(e)
    except OSError as e:
        return target, None, f"{path.name}: cannot be read ({e})"
    if meta.file != target.name:
        return target, meta, f"{path.name}: describes {meta.file!r}, not {target.name!r}"
    return target, meta, None
