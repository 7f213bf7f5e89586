"""What a `grtool retrieve` directory's manifest says about its run: the questions it was asked to answer and
the questions and triples stages it read (so `eval compare` can score a directory without being told)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grtool.errors import InputError
from grtool.log import log
from grtool.store.records import Manifest, is_stage_dir, load_manifest


def retrieve_manifest(responses: str | Path) -> Manifest | None:
    """The manifest of a `retrieve` output directory; None for JSON Lines (a file or stdin)."""
    p = Path(responses)
    if str(responses) == "-" or not p.is_dir():
        return None
    stage = p if is_stage_dir(p) else p / "responses"
    if not is_stage_dir(stage):
        return None
    manifest = load_manifest(stage)
    return manifest if manifest.table == "responses" else None


def selected_questions(responses: str | Path, corpus: str | Path) -> set[str] | None:
    """The qids a `retrieve` directory was asked to answer: its manifest's ``--dataset``, ``--split`` and
    ``--limit`` applied to ``corpus``'s questions, as `retrieve` selects them. None for JSON Lines responses,
    whose selection nobody recorded."""
    manifest = retrieve_manifest(responses)
    if manifest is None:
        return None
    from grtool.store.questions import Selection

    params = manifest.params
    datasets, splits, limit = params.get("datasets") or [], params.get("splits") or [], params.get("limit")
    if not (_strings(datasets) and _strings(splits) and (limit is None or (type(limit) is int and limit >= 0))):
        raise InputError(f"{responses}: its manifest's datasets / splits / limit are not what `retrieve` writes (edited or damaged)")
    try:
        selection = Selection.of(corpus, tuple(datasets), tuple(splits), limit)
    except InputError as e:  # another corpus than the run's: recall is still right, only the missing rows are unknown
        log.warning("%s: cannot select the questions it was asked from %s (%s): questions without a response row are not counted", responses, corpus, e)
        return None
    return selection.qids()


def recorded_inputs(responses: str | Path) -> tuple[str | None, str | None]:
    """(questions stage, triples stage) a `retrieve` directory read, as its manifest records them (None when not
    recorded: triples under --mode gmr, or a directory written by something else)."""
    manifest = retrieve_manifest(responses)
    if manifest is None:
        raise InputError(f"{responses}: not a `grtool retrieve` output directory (no responses manifest)")
    questions = triples = None
    for entry in manifest.inputs:
        path = entry.path
        if not path or not is_stage_dir(path):
            continue
        table = load_manifest(path).table
        if table == "questions" and questions is None:
            questions = path
        elif table == "triples" and triples is None:
            triples = path
    return questions, triples


def needs_triples(responses: str | Path) -> bool:
    """Whether scoring ``responses`` needs the triples: a `retrieve` directory of docid responses does, one of
    responses that name their documents (--method bm25, --mode gmr) does not; JSON Lines are looked at as they
    are scored (a docid line without --triples stops there)."""
    from grtool.vocab.readers import DOCUMENT_MODES

    manifest = retrieve_manifest(responses)
    return manifest is not None and manifest.params.get("mode") not in DOCUMENT_MODES


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
