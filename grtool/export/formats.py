"""Trainer-facing formats: rows for LLaMA-Factory and TRL, and their files.

LLaMA-Factory (``data/README.md`` of hiyouga/LLaMA-Factory): a JSON array per dataset, registered in the
``dataset_info.json`` of the dataset directory with ``file_name``, ``formatting`` (alpaca or sharegpt),
``columns`` (which row field plays which part) and, for sharegpt, ``tags`` (the role and content keys and the
user/assistant role values). KTO data is sharegpt plus a boolean ``kto_tag`` column.

TRL (dataset formats of the TRL docs): conversational language modeling rows ``{"messages": [...]}`` for SFT,
and unpaired-preference rows ``{"prompt": [...], "completion": [...], "label": bool}`` for KTO, as JSON Lines.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from grtool.errors import InputError, printable
from grtool.docid import MARKERS, SPECIAL
from grtool.records import DamagedRecord, read_record_bytes
from grtool.store.locks import updating
from grtool.store.outputs import EXPORT, input_stage
from grtool.store.partloop import FileOutput, LoopPart
from grtool.store.records import atomic_write_bytes
from grtool.vocab.provenance import DATASET_INFO


def with_markers(chain: str, markers: str) -> str:
    """A chain stored with special-token docids, rewritten to the wanted markers."""
    if markers == "special":
        return chain
    wanted = MARKERS[markers]
    return chain.replace(SPECIAL.start, wanted.start).replace(SPECIAL.end, wanted.end)


# ------------------------------------------------------------------------------------------------ rows

SFT_FORMATS = ("llamafactory-alpaca", "llamafactory-sharegpt", "trl-messages")
KTO_FORMATS = ("llamafactory", "trl")

_SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"}


def sft_row(fmt: str, prompt: str, response: str, system: str | None) -> dict[str, Any]:
    if fmt == "llamafactory-alpaca":
        row: dict[str, Any] = {"instruction": prompt, "input": "", "output": response}
        if system:
            row["system"] = system
        return row
    if fmt == "llamafactory-sharegpt":
        row = {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": response}]}
        if system:
            row["system"] = system
        return row
    if fmt == "trl-messages":
        messages = [{"role": "system", "content": system}] if system else []
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return {"messages": messages}
    raise ValueError(f"unknown SFT format {fmt!r}")


def kto_row(fmt: str, prompt: str, response: str, desirable: bool, system: str | None) -> dict[str, Any]:
    if fmt == "llamafactory":
        row: dict[str, Any] = {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": response}], "kto_tag": desirable}
        if system:
            row["system"] = system
        return row
    if fmt == "trl":
        messages = [{"role": "system", "content": system}] if system else []
        return {
            "prompt": [*messages, {"role": "user", "content": prompt}],
            "completion": [{"role": "assistant", "content": response}],
            "label": desirable,
        }
    raise ValueError(f"unknown KTO format {fmt!r}")


def dataset_info_stanza(fmt: str, file_name: str, system: bool, kto: bool = False) -> dict[str, Any]:
    """The ``dataset_info.json`` entry LLaMA-Factory needs to load a file written here."""
    if fmt == "llamafactory-alpaca":
        columns = {"prompt": "instruction", "query": "input", "response": "output"}
        if system:
            columns["system"] = "system"
        return {"file_name": file_name, "formatting": "alpaca", "columns": columns}
    columns = {"messages": "conversations"}
    if system:
        columns["system"] = "system"
    if kto:
        columns["kto_tag"] = "kto_tag"
    return {"file_name": file_name, "formatting": "sharegpt", "columns": columns, "tags": dict(_SHAREGPT_TAGS)}


def _registry(directory: Path) -> Path:
    path = directory / DATASET_INFO
    if path.is_symlink():  # a registry kept elsewhere, linked in: updated where it is (and locked there)
        path = Path(os.path.realpath(path))
    return path


def _read_registry(path: Path) -> dict[str, Any]:
    """The entries of a ``dataset_info.json`` (none where there is no such file)."""
    if not path.exists():
        return {}
    try:
        info = orjson.loads(read_record_bytes(path, what="dataset_info"))  # bounded; a FIFO or device is refused
    except orjson.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e}); fix or remove it") from None
    except DamagedRecord as e:  # a directory, a FIFO: the user's file to fix, as a wrong JSON is
        raise InputError(f"{e}; fix or remove it") from None
    if not isinstance(info, dict):
        raise InputError(f"{path}: expected a JSON object of dataset entries; fix or remove it")
    return info


def check_dataset_info(files: list[str | Path]) -> None:
    """The ``dataset_info.json`` an export of ``files`` (one folder) will add their entries to can take them:
    checked before any work, so a registry that cannot be read, or whose entry of a file's name registers another
    file, never leaves an export written and not registered."""
    directory = Path(files[0]).parent
    link, path = directory / DATASET_INFO, _registry(directory)
    if link.is_symlink() and not path.parent.is_dir():  # the registry would be written where no folder is
        raise InputError(f"{link}: links to {path}, in a folder that does not exist; fix the link or remove it")
    _refuse_taken_names(path, directory, _read_registry(path), {Path(f).stem: Path(f).name for f in files})


def _refuse_taken_names(path: Path, directory: Path, info: dict[str, Any], names: dict[str, str]) -> None:
    """An entry is named by its file's stem (``A.json`` and ``A.jsonl`` are both ``A``): an entry of that name that
    registers another file, still there, is not taken over (LLaMA-Factory would train on another file, silently)."""
    for name, file_name in names.items():
        entry = info.get(name)
        other = entry.get("file_name") if isinstance(entry, dict) else None
        if isinstance(other, str) and os.path.normpath(other) != file_name and (directory / other).exists():
            raise InputError(
                f"{path}: its entry {name!r} registers {printable(other)}, and an export to {printable(file_name)} would take that "
                f"name over (an entry is named by its file's stem); name the export otherwise, or remove the entry or its file"
            )


def update_dataset_info(directory: Path, entries: dict[str, dict[str, Any]]) -> Path:
    """Add or replace our entries in ``directory/dataset_info.json``, keeping every other dataset there."""
    path = _registry(directory)
    with updating(path):  # exports into one folder each add their entries: one at a time, none lost
        info = _read_registry(path)
        _refuse_taken_names(path, directory, info, {name: entry["file_name"] for name, entry in entries.items()})  # registered since the check
        info.update(entries)
        atomic_write_bytes(path, orjson.dumps(info, option=orjson.OPT_INDENT_2) + b"\n")
    return path


# ----------------------------------------------------------------------------------------------- files


class RowWriter:
    """Writes rows as one JSON array (``json_array``) or as JSON Lines, counting them."""

    def __init__(self, handle: BinaryIO, json_array: bool):
        self.handle = handle
        self.json_array = json_array
        self.rows = 0
        if json_array:
            handle.write(b"[")

    def write(self, row: dict[str, Any]) -> None:
        self.write_encoded(orjson.dumps(row))

    def write_encoded(self, data: bytes) -> None:
        """A row already encoded as one line of JSON."""
        if self.json_array:
            data = (b",\n" if self.rows else b"\n") + data
        else:
            data += b"\n"
        self.handle.write(data)
        self.rows += 1

    def close(self) -> None:
        if self.json_array:
            self.handle.write(b"\n]\n" if self.rows else b"]\n")
        self.handle.flush()


def export_outputs(files: list[str | Path], kind: str, *, inputs: list[tuple[str | Path | None, str | None]]) -> list[FileOutput]:
    """The files an export writes, as outputs of its part loop: claimed (checked and locked) when the loop opens,
    before anything is read or written (``-``: standard output, nothing to claim).

    ``inputs``: ``(path, table)`` pairs as the export reads them (a run directory resolves to its ``table``
    stage). A file is never one of the inputs nor inside one (an input shard overwritten); an existing file is
    replaced only when its ``<file>.grtool.json`` says grtool exported it; one writer per file.
    """
    for f in files:
        if Path(f).name == DATASET_INFO:  # LLaMA-Factory's registry, which the exports of a folder add to
            raise InputError(f"--out {f}: {DATASET_INFO} is the name of the registry exports add their entries to; name the export otherwise")
    stages = [input_stage(path, table) if table else path for path, table in inputs]
    given = [path for path, _ in inputs]
    return [FileOutput(f, EXPORT, export_kind=kind, inputs=stages, holders=given) for f in files]


def row_writers(part: LoopPart, json_array: bool) -> list[RowWriter]:
    """A :class:`RowWriter` for each file of an export's part (:func:`export_outputs`);
    standard output gets JSON Lines whatever ``json_array`` says."""
    return [RowWriter(shard.handle, json_array and shard.handle is not sys.stdout.buffer) for shard in part.shards]
