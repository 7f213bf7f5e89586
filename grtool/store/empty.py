"""The empty-result rule (DESIGN §8): a stage or export that writes no row is an error unless the user allows it.

Every stage directory is judged when its last part is committed (:meth:`grtool.store.stage.StageWriter.finish`,
and the ``--out -`` stream's ``finish``); an export is judged before it writes a file (:func:`check_rows`). The
error is one line built from the rejection counters (the most frequent reasons, with counts), exit 1, and it
is a guard (``--allow-empty``) so the stage's manifest records it as a stop: `grtool status` shows it,
`grtool validate` fails the stage, and a resume that finds every part committed judges it again.

``--allow-empty`` (:func:`allowing`, set by the command for the time it runs) lets an empty result pass; the
stage's manifest records ``"allow_empty": true`` so `grtool validate` can say the emptiness was allowed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from grtool.errors import GuardTripped
from grtool.store.records import Counters, Manifest

GUARD = "--allow-empty"
SHOWN_REASONS = 3  # rejection reasons named in the line (the manifest and _rejects/ keep them all)

_lock = threading.Lock()
_allowed: list[bool] = []  # a stack: a pipeline's stages each set their own, inside the pipeline's


class EmptyResult(GuardTripped):
    """A stage or export wrote no row (exit 1); recorded as a stop of the guard ``--allow-empty``."""

    def __init__(self, message: str, numbers: dict[str, object]):
        super().__init__(message, guard=GUARD, numbers=numbers)


@contextlib.contextmanager
def allowing(allow: bool) -> Iterator[None]:
    """While the block runs, an empty result is allowed (``--allow-empty``) or an error."""
    with _lock:
        _allowed.append(bool(allow))
    try:
        yield
    finally:
        with _lock:
            _allowed.pop()


def allowed() -> bool:
    """Whether the running command was given ``--allow-empty`` (False outside any command: the rule holds)."""
    return bool(_allowed) and _allowed[-1]


def top_reasons(rejected: Mapping[str, int], shown: int = SHOWN_REASONS) -> str:
    """``"no gold triple" ×5, "no answer" ×1`` — the most frequent reasons first, the rest counted."""
    ranked = sorted(((n, r) for r, n in rejected.items() if n), key=lambda t: (-t[0], t[1]))
    text = ", ".join(f"{r!r} ×{n}" for n, r in ranked[:shown])
    if len(ranked) > shown:
        text += f" and {len(ranked) - shown} more reasons ×{sum(n for n, _ in ranked[shown:])}"
    return text


def check_rows(what: str, rows_in: int, rows_out: int, rejected: Mapping[str, int], *, unit: str = "rows", inputs: list[str] | None = None, hint: str | None = None) -> None:
    """Raise :class:`EmptyResult` when ``rows_out`` is 0 and ``--allow-empty`` was not given.

    ``what`` names the output (a directory or a file), ``rejected`` says why the ``rows_in`` input rows were
    dropped, ``hint`` (optional) is the likely cause, asked as a question.
    """
    if rows_out or allowed():
        return
    if rows_in:
        reasons = top_reasons(rejected)
        why = f"all {rows_in} input {unit} were rejected: {reasons}" if reasons else f"none of the {rows_in} input {unit} gave a row"
    else:
        source = "standard input" if inputs and inputs[0] == "-" else inputs[0] if inputs else None
        why = f"its input {source} has no {unit}" if source else f"its input has no {unit}"
    hint_text = f"; {hint}" if hint else ""
    raise EmptyResult(
        f"{what}: no rows written: {why}{hint_text} (pass {GUARD} to accept an empty result)",
        {"rows_in": rows_in, "rows_out": 0, "rejected": {r: n for r, n in rejected.items() if n}},
    )


def check_stage(path: str | Path, manifest: Manifest) -> None:
    """Judge a stage directory whose manifest was just merged: only once every part is committed."""
    if manifest.complete:
        check_counted(str(path), manifest.counters, manifest.rows or 0, [i.path for i in manifest.inputs if i.path])


def check_counted(what: str, counters: Counters, rows: int, inputs: list[str]) -> None:
    """Judge a finished output (a stage directory, a stream) by its counters and the rows it wrote."""
    rejected = dict(counters.rejected)
    if counters.merged:
        rejected["merged into another row"] = counters.merged
    check_rows(what, counters.in_, rows, rejected, inputs=inputs, hint=_HINTS.get(max(rejected, key=rejected.get)) if rejected else None)


# The likely cause behind a reason that rejected everything.
_HINTS = {
    "gold documents without triples": "were triples extracted for the questions' gold documents?",
    "context documents without triples": "were triples extracted for the questions' context documents?",
    "too_long": "every prompt is longer than the model's context: is --model the one meant, or are the questions (or --few-shot examples) too long?",
}
