"""What a run directory holds besides its stage directories, for `grtool status RUN`: indexes (``index.json``),
exported files (``<file>.grtool.json``) and training outputs (``grtool.json`` of ``train sft|kto``, and the
``checkpoint-N`` folders of a run that has not finished). Each is read from its own record; a record that does not
parse is listed as damaged (``grtool validate`` says why)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


from grtool.records import DamagedRecord, read_json_record
from grtool.store.layout import FILE_RECORD
from grtool.store.records import is_stage_dir


def _record(path: Path) -> dict[str, Any] | None:
    try:
        value = read_json_record(path, what="record")  # bounded: /dev/zero, a FIFO or a key given twice is "damaged"
    except (OSError, DamagedRecord):
        return None
    return value if isinstance(value, dict) else None


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "-"


def indexes(found_paths: list[Path]) -> list[dict[str, str]]:
    """Each index by its record, read through its declaration and checked against the files it lists (what
    `validate` and `index stats` read first): a record they refuse is listed as damaged, never as an index."""
    from grtool.errors import GrtoolError

    rows = []
    for path in found_paths:
        from grtool.index.record import confirm_files, read_index_record  # (only where a run holds an index)

        try:
            record = read_index_record(path)
            confirm_files(path, record)
        except GrtoolError:
            rows.append({"path": str(path), "kind": "damaged", "source": "-", "docids": "-", "created": "-"})
            continue
        rows.append({"path": str(path), "kind": record.kind, "source": record.source, "docids": _number(record.sizes.sequences), "created": record.created or "-"})
    return rows


def exports(sidecars: list[Path]) -> list[dict[str, str]]:
    rows = []
    for sidecar in sidecars:
        path = sidecar.with_name(sidecar.name[: -len(".grtool.json")])
        meta = _record(sidecar)
        if meta is None:
            rows.append({"path": str(path), "kind": "damaged", "format": "-", "rows": "-", "created": "-"})
            continue
        if not path.is_file():  # an export stopped before its file was in place, or the file removed: no rows to count
            rows.append({"path": str(path), "kind": f"{meta.get('kind', '-')}: file missing (grtool validate)", "format": str(meta.get("trainer_format") or "-"),
                         "rows": "-", "created": str(meta.get("created", "-"))})  # fmt: skip
            continue
        mark = _size_state(path, meta.get("bytes"), (meta.get("replaces") or {}).get("bytes"))
        rows.append({"path": str(path), "kind": str(meta.get("kind", "-")) + (f": {mark}" if mark else ""), "format": str(meta.get("trainer_format") or "-"),
                     "rows": _number(meta.get("rows")), "created": str(meta.get("created", "-"))})  # fmt: skip
    return rows


def _size_state(path: Path, written: Any, replaced: Any) -> str:
    """What a single file's size says against the sizes its record names (`status` reads no file whole; `validate`
    compares the bytes): nothing when it is the size written."""
    size = path.stat().st_size
    if size == written:
        return ""
    if replaced is not None and size == replaced:
        return "stopped before its new file was in place (grtool validate)"
    return "changed since it was written (grtool validate)"


def files(found: list[Path]) -> list[dict[str, str]]:
    """Reports, plots and JSON files grtool wrote, each by its record: whether it is there at the size recorded
    (`status` reads no file whole; `validate` compares the bytes)."""
    rows = []
    for path in found:
        record_path = path.with_name("." + path.name + FILE_RECORD)
        record = None if os.path.islink(record_path) else _record(record_path)  # grtool never writes a link there
        if record is None:
            state = "damaged record (grtool validate)"
        elif not os.path.lexists(path):
            state = "missing (grtool validate)"
        elif not path.is_file():
            state = "not a file (grtool validate)"
        elif not isinstance(record.get("file"), dict):  # an older grtool's record names no bytes: it vouches for the file
            state = "ok"
        else:
            state = _size_state(path, record["file"].get("size"), (record.get("replaces") or {}).get("size")) or "ok"
        command = record.get("command") if record is not None else None
        rows.append({"path": str(path), "state": state, "written by": " ".join(command[:3]) if isinstance(command, list) else "-",
                     "written": str(record.get("written", "-")) if record is not None else "-"})  # fmt: skip
    return rows


def checkpoints(found: list[Path]) -> list[dict[str, str]]:
    """Training outputs the discovery found (:func:`grtool.audit.discover.discover`): a finished one by its record,
    a run that has not finished (or was killed) by the record it wrote when it started; each with its
    ``checkpoint-N`` folders."""
    from grtool.store.outputs import CHECKPOINT

    rows = []
    for d in found:
        saved = sorted((e.name for e in os.scandir(d) if e.name.startswith("checkpoint-") and e.is_dir()), key=lambda n: (len(n), n))
        record = _record(d / CHECKPOINT.record) if (d / CHECKPOINT.record).is_file() else None
        finished = record is not None and str(record.get("kind", "")).startswith("train ")
        started = _record(d / CHECKPOINT.started) if (d / CHECKPOINT.started).is_file() else None
        if finished:
            state = f"finished {record.get('finished', '-')}"
        elif (d / CHECKPOINT.record).is_file():
            state = "damaged record"
        else:
            state = f"not finished (started {started.get('started', '-')})" if started else "not finished"
        rows.append({"path": str(d), "kind": str(record.get("kind", "-")) if finished else "train",
                     "steps": _number(record.get("global_step")) if finished else "-", "state": state,
                     "saved": ", ".join(saved) or "-"})  # fmt: skip
    return rows


def run_contents(root: str | Path) -> dict[str, list[dict[str, str]]]:
    root = Path(root)
    if is_stage_dir(root):  # holds none of them: `grtool status STAGE` is answered without the discovery's walk
        return {"indexes": [], "exports": [], "files": [], "checkpoints": []}
    from grtool.audit.discover import discover

    found = discover(root)
    return {"indexes": indexes(found.indexes), "exports": exports(found.sidecars), "files": files(found.files), "checkpoints": checkpoints(found.checkpoints)}
