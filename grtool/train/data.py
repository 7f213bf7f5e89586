"""Training rows from what `export sft` / `export kto` wrote, as TRL conversational prompt/completion rows.

SFT: ``{"prompt": [system?, user], "completion": [assistant]}`` — TRL's prompt-completion format, so the loss
falls on the completion (the assistant turn) only (``completion_only_loss``), whatever the chat template.
KTO: the same plus ``"label": bool``.

Read: LLaMA-Factory sharegpt (``conversations`` of ``from``/``value``, optional ``system``, ``kto_tag`` for
KTO), `export gmr` pairs (``input``/``target``: the input as :func:`grtool.vocab.gmr.step_request` puts it,
the very request `retrieve --mode gmr` sends, and the target as the completion), LLaMA-Factory alpaca (``instruction``/``input``/``output``), TRL ``messages`` and TRL KTO
``prompt``/``completion``/``label`` rows, as a JSON array or JSON Lines. A filtered-chains stage directory is
turned into rows the way `export sft` does, and responses (a `retrieve` directory or its JSON Lines, with the
corpus and triples) are labelled the way `export kto` does (their own functions, into a temporary file).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from grtool.errors import InputError
from grtool.userinput import require_input
from grtool.store.records import sha256_file
from grtool.vocab.gmr import GMR

Row = dict[str, Any]
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@dataclass
class TrainData:
    rows: list[Row]
    source: str  # what the rows were read from (a file or a stage directory)
    fmt: str  # the format recognised
    sha256: str | None  # of the data file (None for a stage directory: see ``fingerprint``)
    fingerprint: dict[str, Any]
    questions: dict[str, Any] | None = None  # the questions of the rows (export's questions record); None: unknown

    def labels(self) -> Counter:
        return Counter(bool(r["label"]) for r in self.rows if "label" in r)


def read_records(path: Path) -> list[Row]:
    """A JSON array or JSON Lines file of objects (:mod:`grtool.jsonrecords`: streamed, nesting bounded)."""
    from grtool.jsonrecords import RecordsError, iter_json_records

    records: list[Row] = []
    try:
        for position, record in iter_json_records(path):
            if not isinstance(record, dict):
                raise InputError(f"{path}, {position.replace('record', 'row')}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
    except RecordsError as e:
        raise InputError(f"{path}: {e}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read the training data ({e.strerror or e})") from None
    if not records:
        raise InputError(f"{path}: holds no training rows" if path.stat().st_size else f"{path}: the training data file is empty")
    return records


def _message(role: str, content: Any) -> dict[str, str]:
    return {"role": role, "content": str(content)}


def _split_turns(messages: list[dict[str, str]], where: str) -> Row:
    """Everything up to the last assistant turn is the prompt; that turn is the completion."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None or last == 0:
        raise InputError(f"{where}: needs a user turn followed by an assistant turn")
    if not messages[last]["content"].strip():
        raise InputError(f"{where}: the assistant turn is empty")
    return {"prompt": messages[:last], "completion": [messages[last]]}


def _label(value: Any, key: str, where: str) -> bool:
    """A KTO label is a JSON boolean: the text "false" or the number 0 read as truthy or falsy would train the
    model towards the answers it should avoid, or away from the good ones."""
    if not isinstance(value, bool):
        raise InputError(f"{where}: {key} {value!r} is not true or false (a JSON boolean, as `export kto` writes it)")
    return value


def to_row(record: Row, where: str) -> tuple[Row, str]:
    """One record → (a prompt/completion row, the format it was in)."""
    if "conversations" in record:
        messages = [_message("system", record["system"])] if record.get("system") else []
        for turn in record["conversations"]:
            role = _ROLES.get(str(turn.get("from", turn.get("role"))))
            if role is None:
                raise InputError(f"{where}: unknown role {turn.get('from')!r} (expected human/gpt)")
            messages.append(_message(role, turn.get("value", turn.get("content", ""))))
        row, fmt = _split_turns(messages, where), "llamafactory-sharegpt"
        if "kto_tag" in record:
            row["label"] = _label(record["kto_tag"], "kto_tag", where)
        return row, fmt
    if "instruction" in record and "output" in record:
        prompt = str(record["instruction"]) + (f"\n\n{record['input']}" if record.get("input") else "")
        messages = [_message("system", record["system"])] if record.get("system") else []
        messages += [_message("user", prompt), _message("assistant", record["output"])]
        return _split_turns(messages, where), "llamafactory-alpaca"
    if "input" in record and "target" in record:  # an `export gmr` pair
        from grtool.vocab.gmr import step_request

        return _split_turns([*step_request(str(record["input"])), _message("assistant", record["target"])], where), GMR
    if "messages" in record:
        messages = [_message(str(m["role"]), m["content"]) for m in record["messages"]]
        return _split_turns(messages, where), "trl-messages"
    if "prompt" in record and "completion" in record:
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(prompt, str):
            prompt = [_message("user", prompt)]
        if isinstance(completion, str):
            completion = [_message("assistant", completion)]
        row = _split_turns([*prompt, *completion], where)
        if "label" in record:
            row["label"] = _label(record["label"], "label", where)
        return row, "trl-prompt-completion"
    raise InputError(
        f"{where}: not a row `export sft`/`export kto` writes (expected conversations, instruction/output, messages "
        f"prompt/completion, or input/target from `export gmr`; got keys {', '.join(sorted(record))})"
    )


def load_rows(path: Path) -> tuple[list[Row], str]:
    rows, formats = [], set()
    for n, record in enumerate(read_records(path), 1):
        row, fmt = to_row(record, f"{path}, row {n}")
        rows.append(row)
        formats.add(fmt)
    return rows, "+".join(sorted(formats))


def apply_system(rows: list[Row], system: str | None, data: Path) -> None:
    """--system reaches every row of a file: as the prompt's first turn, in place. A row with another system prompt
    of its own is refused (--system would silently be ignored for it, or replace what the export wrote)."""
    if system is None:
        return
    for n, row in enumerate(rows, 1):
        own = [m["content"] for m in row["prompt"] if m["role"] == "system"]
        if own and own != [system]:
            raise InputError(f"{data}, row {n}: has a system prompt of its own, so --system would not be what it trains on; leave --system out, or export the rows again with `export … --system`")
        if not own:
            row["prompt"] = [_message("system", system), *row["prompt"]]


def drop_long_prompts(data: TrainData, tokenizer: Any, cutoff: int) -> dict[str, int]:
    """Rows as the trainer will cut them at --cutoff-len tokens (the chat template applied): a row whose prompt alone
    takes ``cutoff`` tokens or more keeps no completion token and trains nothing, so it is dropped here, counted
    and named (the trainer would drop it silently, or stop with no samples at all); a row whose completion is cut
    is counted. No row left is an error. Returns the counts by reason."""
    from grtool.log import log

    prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in data.rows]
    whole = [tokenizer.apply_chat_template([*r["prompt"], *r["completion"]], tokenize=False) for r in data.rows]
    prompt_tokens = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    whole_tokens = [len(ids) for ids in tokenizer(whole, add_special_tokens=False)["input_ids"]]
    beyond = [n for n, k in enumerate(prompt_tokens) if k >= cutoff]
    cut = sum(1 for n, k in enumerate(whole_tokens) if k > cutoff and prompt_tokens[n] < cutoff)
    if len(beyond) == len(data.rows):
        raise InputError(f"{data.source}: every prompt is at least --cutoff-len {cutoff} tokens long (the shortest {min(prompt_tokens)}): no completion token would be trained; raise --cutoff-len")
    if beyond:
        log.warning(
            "%s: %d of %d rows dropped: the prompt alone is at least --cutoff-len %d tokens (row %d: %d tokens); raise --cutoff-len to keep them",
            data.source,
            len(beyond),
            len(data.rows),
            cutoff,
            beyond[0] + 1,
            prompt_tokens[beyond[0]],
        )
        dropped = set(beyond)
        data.rows = [r for n, r in enumerate(data.rows) if n not in dropped]
    if cut:
        log.warning("%s: %d rows are longer than --cutoff-len %d tokens: their completions are cut there", data.source, cut, cutoff)
    return {"prompt_beyond_cutoff": len(beyond), "completion_cut": cut}


def load_sft(data: str | Path, *, corpus: str | None = None, system: str | None = None, markers: str = "special", cannot_answer: str | None = None) -> TrainData:
    data = Path(data)
    if data.is_dir():
        return _from_chains(data, corpus, system, markers, cannot_answer)
    require_input(data)
    rows, fmt = load_rows(data)
    _check_export_kind(data, fmt, "sft")
    apply_system(rows, system, data)
    labelled = next((n for n, row in enumerate(rows, 1) if "label" in row), None)
    if labelled is not None:
        raise InputError(f"{data}, row {labelled}: carries a KTO label (kto_tag / label): rows of `export kto`, whose undesirable answers SFT would learn "
                         "as well as the desirable ones; train kto on this file, or train sft on the file `export sft` wrote")  # fmt: skip
    return TrainData(rows, str(data), fmt, sha256_file(data), {"path": str(data), "sha256": sha256_file(data)}, exported_questions(data))


def exported_questions(data: Path) -> dict[str, Any] | None:
    """The questions an export file's ``<file>.grtool.json`` says its rows come from (None: no such record). The
    record speaks for the file only while the file is the one it describes (its sha256): rows edited or appended
    since would train on questions the record does not list, so such a file is refused."""
    import msgspec

    from grtool.store.outputs import export_state
    from grtool.vocab.provenance import decode_sidecar, sidecar_path

    sidecar = sidecar_path(data)
    try:
        written = decode_sidecar(sidecar)
    except (OSError, ValueError):
        return None
    state = export_state(data, msgspec.to_builtins(written))
    if state == "replaced":
        raise InputError(f"{data}: an export stopped before its new file was in place ({sidecar.name} records the new one): export it again")
    if state != "written":
        raise InputError(f"{data}: changed since `export` wrote it ({sidecar.name} records another sha256), so its record no longer says which "
                         f"questions the rows come from; move it away and export it again, or delete {sidecar.name} to train on it as a hand-made file "
                         "(its questions then unknown to the overlap check)")  # fmt: skip
    # the JSON form: the checkpoint's record copies it (trained_questions)
    return msgspec.to_builtins(written.questions) if written.questions is not None else None


# What each command trains on, by the `export` that wrote the file (its ``<file>.grtool.json`` says which).
TRAINS_ON = {"sft": ("sft", GMR), "kto": ("kto",)}


def _check_export_kind(data: Path, fmt: str, kind: str) -> None:
    """A file an `export` wrote is trained by its own command: `train sft` takes `export sft` and `export gmr`
    files, `train kto` `export kto` files. GMR pairs train a document generator, chains a docid reasoner: one file
    is one or the other. The export's record (when there) must agree with the command and with the rows."""
    from grtool.vocab.provenance import decode_sidecar, sidecar_path

    if GMR in fmt.split("+") and fmt != GMR:
        raise InputError(f"{data}: mixes `export gmr` pairs with chat rows ({fmt}); train a GMR model and a chains model from separate files")
    sidecar = sidecar_path(data)
    if not sidecar.is_file():
        return
    try:
        exported = decode_sidecar(sidecar).kind
    except (ValueError, OSError):
        return  # not grtool's record: the rows alone decide
    if exported not in TRAINS_ON[kind]:
        raise InputError(f"{data}: {sidecar.name} says `export {exported}` wrote it; `train {kind}` trains on what `export {' or export '.join(TRAINS_ON[kind])}` writes"
                         f"{f' (train {exported} takes this file)' if exported in TRAINS_ON else ''}")  # fmt: skip
    if (exported == GMR) != (fmt == GMR):
        raise InputError(f"{data}: {sidecar.name} says `export {exported}` wrote it, but its rows are {fmt}")


def _from_chains(stage: Path, corpus: str | None, system: str | None, markers: str, cannot_answer: str | None = None) -> TrainData:
    from grtool.vocab.provenance import input_fingerprint, questions_record
    from grtool.export.sft import SftOptions, export_sft

    if corpus is None:
        raise InputError(f"{stage}: a filtered-chains directory needs --corpus (the run holding questions/) to build the prompts")
    with tempfile.TemporaryDirectory(prefix="grtool-train-") as tmp:
        out = Path(tmp) / "sft.jsonl"
        exported = export_sft(stage, corpus, out, SftOptions(fmt="trl-messages", system=system, markers=markers, cannot_answer=cannot_answer))
        if not out.exists() or not out.stat().st_size:
            raise InputError(f"{stage}: no selected chain with a known question: nothing to train on")
        rows, _ = load_rows(out)
    fingerprint = {"chains": input_fingerprint(stage, "chains"), "questions": input_fingerprint(corpus, "questions")}
    return TrainData(rows, str(stage), "filtered-chains", None, fingerprint, questions_record(exported.qids.get("train", ())))


def load_kto(
    data: str | Path,
    *,
    corpus: str | None = None,
    triples: str | None = None,
    system: str | None = None,
    markers: str = "special",
    tau: float = 0.5,
    desirable: str = "exact",
    cannot_answer: str | None = None,
) -> TrainData:
    data = Path(data)
    if triples is not None or corpus is not None:
        loaded = _from_responses(data, corpus, triples, system, markers, tau, desirable, cannot_answer)
    elif data.is_dir():
        raise InputError(f"{data}: is a directory; pass the file `grtool export kto` wrote, or a `retrieve` directory with --corpus and --triples")
    elif not data.exists():
        raise InputError(f"{data}: no such file")
    else:
        rows, fmt = load_rows(data)
        _check_export_kind(data, fmt, "kto")
        apply_system(rows, system, data)
        loaded = TrainData(rows, str(data), fmt, sha256_file(data), {"path": str(data), "sha256": sha256_file(data)}, exported_questions(data))
    missing = sum("label" not in r for r in loaded.rows)
    if missing:
        raise InputError(f"{data}: {missing} rows have no label (kto_tag / label): not a file `grtool export kto` wrote")
    counts = loaded.labels()
    if len(counts) < 2:
        only = "desirable" if True in counts else "undesirable"
        raise InputError(f"{data}: every row is {only}: KTO needs both desirable and undesirable responses")
    return loaded


def _from_responses(responses: Path, corpus: str | None, triples: str | None, system: str | None, markers: str, tau: float, desirable: str, cannot_answer: str | None = None) -> TrainData:
    """Sampled responses labelled by retrieval with `export kto`'s own rule (into a temporary TRL file)."""
    from grtool.export.kto import export_kto
    from grtool.vocab.provenance import input_fingerprint, questions_record

    if corpus is None or triples is None:
        raise InputError(f"{responses}: responses as KTO data need both --corpus (the run holding questions/) and --triples to be labelled")
    require_input(responses)
    with tempfile.TemporaryDirectory(prefix="grtool-train-") as tmp:
        out = Path(tmp) / "kto.jsonl"
        result = export_kto(responses, corpus, triples, out, tau=tau, fmt="trl", system=system, markers=markers, desirable=desirable, cannot_answer=cannot_answer)
        if not out.exists() or not out.stat().st_size:
            raise InputError(f"{responses}: no response could be labelled (dropped {result.dropped}, unknown qid {result.skipped.unknown_qid}, "
                             f"no gold {result.skipped.no_gold}): nothing to train on")  # fmt: skip
        rows, _ = load_rows(out)
    labelling = result.as_dict()
    fingerprint = {
        "responses": input_fingerprint(responses),
        "questions": input_fingerprint(corpus, "questions"),
        "triples": input_fingerprint(triples, "triples"),
        "labelling": {k: labelling[k] for k in ("rule", "desirable", "undesirable", "dropped", "unknown_qid", "no_gold", "incomplete_gold")},
    }
    return TrainData(rows, str(responses), "responses", None, fingerprint, questions_record(result.qids))


FLIPPED_TABLES = ("chains", "responses")  # the stages whose rows say, per docid, whether it is written tail-first


def data_flips(source: str | Path) -> bool | None:
    """Whether the docids the model trains on include tail-first (flipped) spellings: read from the ``flipped``
    column of the chains or responses stage behind the data (the data itself, or the stage an export file's
    ``.grtool.json`` names). None when no such stage is known (a hand-made file, a stage since removed)."""
    from grtool.vocab.provenance import decode_sidecar, sidecar_path
    from grtool.store.records import is_stage_dir, load_manifest

    p = Path(source)
    if p.is_file():
        try:
            inputs = decode_sidecar(sidecar_path(p)).inputs
        except (OSError, ValueError):
            return None
        found = [data_flips(e["path"]) for e in inputs if e.get("path") not in (None, "-") and Path(e["path"]).is_dir()]
        known = [f for f in found if f is not None]
        return any(known) if known else None
    for stage in (p, *(p / t for t in FLIPPED_TABLES)):
        table = load_manifest(stage).table if is_stage_dir(stage) else None
        if table in FLIPPED_TABLES:
            return _stage_flips(stage, table)
    return None


def _stage_flips(stage: Path, table: str) -> bool:
    from grtool.store.stage import iter_batches

    columns = ["flipped", "selected"] if table == "chains" else ["flipped"]
    for batch in iter_batches(stage, columns=columns):
        for row in batch.to_pylist():
            if row.get("selected") is not False and any(row["flipped"] or ()):  # chains: only the kept ones train
                return True
    return False
