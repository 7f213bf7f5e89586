"""`grtool export sft`: filtered chains → an SFT dataset for LLaMA-Factory or TRL.

Each kept chain becomes one example: the user turn is the question inside :data:`INSTRUCTION_TEMPLATE`, the
assistant turn is the chain. Rows are shuffled by seed in bounded memory (:mod:`grtool.export.shuffle`),
split into train/dev by a hash of the qid (all candidates of a question land on the same side, and the dev
set does not move when the seed changes), and the training side is capped per dataset (the first N in
shuffled order, i.e. a random sample). Dev examples are not capped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from grtool.docid import SPECIAL, cut
from grtool.errors import GrtoolError, InputError, printable
from grtool.log import log
from grtool.export.formats import SFT_FORMATS, check_dataset_info, dataset_info_stanza, export_outputs, row_writers, sft_row, update_dataset_info, with_markers
from grtool.vocab.prompt import instruction
from grtool.vocab.readers import QuestionIndex
from grtool.vocab.provenance import DATASET_INFO, decode_sidecar, input_fingerprint, questions_record, sidecar_path, write_sidecar
from grtool.export.shuffle import KeyedSpill, shuffle_key, unit_hash
from grtool.store.empty import check_rows
from grtool.store.io import InputTable, is_stdio
from grtool.store.outputs import remove_killed_scratch
from grtool.store.partloop import LoopPart, one_part
from grtool.store.questions import SplitSelection
from grtool.records import DamagedRecord, Report


@dataclass
class SftOptions:
    fmt: str = "llamafactory-sharegpt"
    system: str | None = None
    markers: str = "special"
    max_per_dataset: int | None = None
    dev_share: float = 0.0
    seed: int = 0
    all_candidates: bool = False  # every chain, not only the selected ones (filters apply marks the kept chain selected)
    cannot_answer: str | None = None  # --cannot-answer: the sentence the instruction names
    no_thought: bool = False  # --no-thought: the chain's docids and its closing sentence only (the w/o Thought ablation)
    splits: tuple[str, ...] = ()  # --split: only chains of these splits' questions

    def check(self, out: str | Path) -> None:
        if self.fmt not in SFT_FORMATS:
            raise GrtoolError(f"--format must be one of {', '.join(SFT_FORMATS)}, got {self.fmt!r}")
        if not 0.0 <= self.dev_share < 1.0:
            raise GrtoolError(f"--dev-share must be in [0, 1), got {self.dev_share}")
        if self.dev_share > 0 and is_stdio(out):
            raise GrtoolError("--dev-share needs a file for --out (stdout carries one split only)")
        if self.max_per_dataset is not None and self.max_per_dataset < 0:
            raise GrtoolError(f"--max-per-dataset must be ≥ 0, got {self.max_per_dataset}")


@dataclass
class DatasetCounts:
    chains: int = 0
    train: int = 0
    dev: int = 0
    capped: int = 0  # training examples beyond --max-per-dataset


@dataclass
class SftResult:
    per_dataset: dict[str, DatasetCounts] = field(default_factory=dict)
    rows_in: int = 0
    not_selected: int = 0
    outside_split: int = 0  # chains of questions outside --split
    unknown_qid: int = 0
    empty_chain: int = 0
    broken_chain: int = 0  # --no-thought: markers that do not pair up, so the docids cannot be cut out
    unknown_examples: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # split → path
    qids: dict[str, set[str]] = field(default_factory=dict)  # split → the questions of the rows written
    dataset_info: str | None = None

    def skips(self) -> dict[str, int]:
        """Why chains read were not exported, by reason."""
        return {
            "not selected (pass --all-candidates)": self.not_selected,
            "outside --split": self.outside_split,
            "unknown qid": self.unknown_qid,
            "empty chain": self.empty_chain,
            "markers that do not pair up": self.broken_chain,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows_in": self.rows_in,
            "not_selected": self.not_selected,
            "outside_split": self.outside_split,
            "unknown_qid": self.unknown_qid,
            "empty_chain": self.empty_chain,
            "broken_chain": self.broken_chain,
            "train": sum(c.train for c in self.per_dataset.values()),
            "dev": sum(c.dev for c in self.per_dataset.values()),
            "capped": sum(c.capped for c in self.per_dataset.values()),
            "per_dataset": {k: vars(v) for k, v in sorted(self.per_dataset.items())},
            "files": self.files,
            "dataset_info": self.dataset_info,
        }


def dev_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}_dev{out.suffix}")


def sft_files(out: str | Path, dev_share: float) -> dict[str, str | Path]:
    """The file each split is written to: ``out``, and with ``--dev-share`` its ``_dev`` file beside it."""
    return {"train": out, "dev": dev_path(Path(out))} if dev_share > 0 else {"train": out}


def export_sft(filtered: str | Path, corpus: str | Path, out: str | Path, opts: SftOptions) -> SftResult:
    opts.check(out)
    files = sft_files(out, opts.dev_share)
    if not is_stdio(out) and opts.fmt.startswith("llamafactory"):
        check_dataset_info(list(files.values()))
    _refuse_other_roles(files)
    outputs = export_outputs(list(files.values()), "sft", inputs=[(filtered, "chains"), (corpus, "questions")])
    result = SftResult()
    one_part(outputs, lambda part: _export_part(part, filtered, corpus, out, opts, files, result))  # the files claimed before anything is read
    _warn_of_an_earlier_dev_split(out, files)
    if not is_stdio(out) and opts.fmt.startswith("llamafactory"):
        entries = {Path(path).stem: dataset_info_stanza(opts.fmt, Path(path).name, system=bool(opts.system)) for path in result.files.values()}
        result.dataset_info = str(update_dataset_info(Path(out).parent, entries))
    return result


def _export_part(part: LoopPart, filtered: str | Path, corpus: str | Path, out: str | Path, opts: SftOptions, files: dict[str, str | Path], result: SftResult) -> None:
    selected = SplitSelection.of(opts.splits, corpus).qids(corpus)
    questions = QuestionIndex.build(corpus)
    chains = InputTable.open(filtered, "chains")
    spill_dir = None if is_stdio(out) else Path(out).parent
    with KeyedSpill(spill_dir) as spill:
        for row in chains.iter_rows(columns=["qid", "candidate", "text", "selected"]):
            result.rows_in += 1
            if not opts.all_candidates and not row.get("selected"):
                result.not_selected += 1
                continue
            if row["qid"] not in selected:
                result.outside_split += 1
                continue
            question = questions.get(row["qid"])
            if question is None:
                result.unknown_qid += 1
                if len(result.unknown_examples) < 5:
                    result.unknown_examples.append(str(row["qid"]))
                continue
            text = (row.get("text") or "").strip()
            if not text:
                result.empty_chain += 1
                continue
            if opts.no_thought:
                text = without_thought(text)
                if text is None:
                    result.broken_chain += 1
                    continue
            counts = result.per_dataset.setdefault(question.dataset, DatasetCounts())
            counts.chains += 1
            example = sft_row(opts.fmt, instruction(question.question, opts.markers, opts.cannot_answer), with_markers(text, opts.markers), opts.system)
            split = "dev" if unit_hash(question.qid) < opts.dev_share else "train"
            spill.add(shuffle_key(opts.seed, question.qid, row.get("candidate")), f"{split}:{question.dataset}:{question.qid}", orjson.dumps(example))
        # Judged before any file is written: an empty export writes and registers nothing.
        check_rows(str(out), result.rows_in, sum(c.chains for c in result.per_dataset.values()), result.skips(), unit="chains", inputs=[str(filtered)])
        json_array = opts.fmt.startswith("llamafactory")
        writers = dict(zip(files, row_writers(part, json_array)))
        for tag, example in spill:
            split, dataset, qid = tag.split(":", 2)
            counts = result.per_dataset[dataset]
            if split == "train" and opts.max_per_dataset is not None and counts.train >= opts.max_per_dataset:
                counts.capped += 1
                continue
            writers[split].write_encoded(example)
            setattr(counts, split, getattr(counts, split) + 1)
            result.qids.setdefault(split, set()).add(qid)
    inputs = [input_fingerprint(filtered, "chains"), input_fingerprint(corpus, "questions")]
    registered = not is_stdio(out) and json_array  # LLaMA-Factory's formats: registered in dataset_info.json
    for (split, path), writer, shard in zip(files.items(), writers.values(), part.shards):
        writer.close()
        result.files[split] = str(path)
        shard.record = functools.partial(
            write_sidecar, path, kind="sft", fmt=opts.fmt, rows=writer.rows, json_array=json_array, inputs=inputs, split=split,
            dataset_info_entry=Path(path).stem if registered else None,
            params=_params(opts), questions=questions_record(result.qids.get(split, ()), splits=sorted(opts.splits) or None),
        )  # fmt: skip


def _refuse_other_roles(files: dict[str, str | Path]) -> None:
    """An export's file is replaced only in the role it was written in: ``A_dev.json``, the dev split of the export
    ``A.json``, is never the training file of another export, nor the other way round (a trainer would evaluate on
    its training questions, or train on another set, exit 0)."""
    for split, path in files.items():
        if is_stdio(path):
            continue
        try:
            written = decode_sidecar(sidecar_path(Path(path))).split
        except (OSError, DamagedRecord):
            continue  # no record, or one the claim names as damaged
        if written is not None and written != split:
            role = {"dev": "the dev split of the export beside it", "train": "an export's training file"}.get(written, f"the {written} split of an export")
            flag = "--out" if split == "train" else "--out (the file beside it)"
            raise InputError(f"{flag} {printable(path)}: is {role} (its {sidecar_path(Path(path)).name} says split {written!r}), and this export "
                             f"would write its {split} split there; choose another --out")  # fmt: skip


def _warn_of_an_earlier_dev_split(out: str | Path, files: dict[str, str | Path]) -> None:
    """An export without --dev-share beside an earlier export's dev split of the same name: its questions are in
    the training file now, so a trainer evaluating on it would score seen questions. Said, never deleted; only
    the temporary dev file a killed export left goes (as the export of that file would remove it)."""
    if is_stdio(out) or "dev" in files:
        return
    dev = dev_path(Path(out))
    remove_killed_scratch(dev)
    record = sidecar_path(dev)
    if dev.is_file() and record.is_file():
        log.warning(
            "%s: an earlier export's dev split is still there, and its questions are in %s now; remove it (and its %s entry) or export with --dev-share",
            dev, out, DATASET_INFO,
        )  # fmt: skip


def without_thought(chain: str) -> str | None:
    """A chain reduced to its docids in order and the sentence after the last one (the answer, or the
    cannot-answer sentence): the thought sentences between the docids are dropped. None when the markers do
    not pair up (the filters never keep such a chain)."""
    outside, inners, broken = cut(chain, SPECIAL)
    if broken is not None:
        return None
    docids = " ".join(f"{SPECIAL.start}{inner}{SPECIAL.end}" for inner in inners)
    return " ".join(part for part in (docids, outside[-1].strip()) if part)


def _params(opts: SftOptions) -> dict[str, Any] | None:
    params = {k: v for k, v in (("cannot_answer", opts.cannot_answer), ("no_thought", opts.no_thought)) if v}
    return params or None


class SftReport(Report, kw_only=True):
    """``export sft --json``: :meth:`SftResult.as_dict`."""

    rows_in: int
    not_selected: int
    outside_split: int
    unknown_qid: int
    empty_chain: int
    broken_chain: int
    train: int
    dev: int
    capped: int
    per_dataset: dict[str, dict[str, Any]]
    files: dict[str, str]
    dataset_info: str | None
