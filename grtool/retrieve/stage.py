"""`grtool retrieve`: model responses to questions under hybrid docid decoding, as a stage directory.

For every selected question the model writes freely; between the docid markers only text the index allows can
come (:mod:`grtool.index.decoding`), then it is free again. One row per (question, sample). The part loop,
sharding, resume and the request cache are :class:`grtool.llm.stage_runner.ModelStage`'s; this module selects
the questions, builds the prompts and turns generations into rows.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from grtool.docid import parse
from grtool.vocab.readers import DocidIndex
from grtool.index.base import Index
from grtool.llm.base import Backend, Generation, Sampling
from grtool.llm.guard import DEFAULT_MAX_EMPTY_SHARE, EmptyOutputs, example
from grtool.retrieve.prompt import RetrievePrompt
from grtool.retrieve.rejects import reject_too_long
from grtool.store.questions import Selection

MARKER_MODES = ("special", "brackets")
MODES = ("docids", "gmr")


@dataclass(frozen=True)
class RetrieveSettings:
    markers: str = "special"
    mode: str = "docids"
    samples: int = 1
    temperature: float = 0.0  # 0 = greedy; above 0 every sample (one too) is sampled with seed --seed + sample
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 512
    max_docids: int | None = None
    beams: int = 1
    max_steps: int = 4

    def sampling(self, sample: int, constraint: dict[str, Any]) -> Sampling:
        """Sample k's parameters: its own seed, so each sample is its own request (and cache entry)."""
        greedy = self.temperature == 0
        return Sampling(
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p,
            max_tokens=self.max_tokens,
            seed=self.seed + sample,
            constraint=constraint,
            beams=self.beams,
        )

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


# ------------------------------------------------------------------------------------------ constraint


def index_fingerprint(index: Index) -> str:
    """A short digest of the index files' checksums: a rebuilt index is a new constraint (and cache key)."""
    files = index.meta.get("files", {})
    text = "\n".join(f"{name}:{info.get('sha256')}" for name, info in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def constraint_spec(index: Index, markers: str, max_docids: int | None) -> dict[str, Any]:
    return {"index": str(Path(index.path).resolve()), "fingerprint": index_fingerprint(index), "markers": markers, "max_docids": max_docids}


# ------------------------------------------------------------------------------------------ rows


def response_row(question: dict[str, Any], sample: int, gen: Generation, lookup: DocidIndex, settings: RetrieveSettings, model: str) -> tuple[dict[str, Any], int]:
    """One output row (the response and its docids as written, flipped, their documents) and its hallucinated docids."""
    parsed = parse(gen.text, settings.markers)
    good = [s for s in parsed.spans if s.problem is None]
    resolved = lookup.resolve_many([s.key for s in good])
    docs: list[str] = []
    for found, _ in resolved:
        docs.extend(d for d in sorted(found) if d not in docs)
    row = {
        "qid": question["qid"],
        "sample": sample,
        "dataset": question["dataset"],
        "text": gen.text,
        "docids": [gen.text[s.start : s.end] for s in good],
        "flipped": [bool(f) and bool(found) for found, f in resolved],
        "doc_ids": docs,
        "n_docids": len(good),
        "malformed": parsed.malformed,
        "tokens": gen.completion_tokens,
        "latency_ms": gen.latency_ms,
        "finish_reason": gen.finish_reason,
        "model": model,
        "markers": settings.markers,
        "mode": settings.mode,
    }
    return row, sum(1 for found, _ in resolved if not found)


# End-of-text and padding tokens as models write them when special tokens are kept in the text (the docid markers
# are special tokens, so decoding keeps them all): <|endoftext|>, <|im_end|>, </s>, <eos>, <pad>, <end_of_turn>.
_END_TOKENS = re.compile(r"<\|[A-Za-z0-9_]+\|>|</?s>|<(?:eos|pad|unk|end_of_turn|start_of_turn)>")


def degenerate(text: str) -> bool:
    """An answer with nothing in it: empty, blank, or only end-of-text / padding tokens (a model whose weights
    are broken writes end-of-text at once). Counted as empty by the empty-output guard."""
    return not _END_TOKENS.sub("", text).strip()


def docids_part_fn(selection: Selection, prompt: RetrievePrompt, lookup: DocidIndex, settings: RetrieveSettings, spec: dict[str, Any]):
    """The part function of the docid modes: every sample of every question of the part, one row each."""

    def part_fn(part: Any) -> None:
        questions = selection.rows(part.index)
        part.shard.count_in(len(questions) * settings.samples)  # one row per (question, sample): in = out
        prompts = [prompt.messages(q["qid"], q["question"]) for q in questions]
        for sample in range(settings.samples):
            gens = part.llm.generate(prompts, settings.sampling(sample, spec), on_progress=part.meter) if prompts else []
            rows = []
            for question, gen in zip(questions, gens):
                if gen.too_long is not None:  # never generated: a reject, not an empty response
                    reject_too_long(part.shard, question, sample, gen.too_long, str(selection.table.source))
                    continue
                row, hallucinated = response_row(question, sample, gen, lookup, settings, part.llm.model)
                rows.append(row)
                part.empty.add()
                if degenerate(gen.text):
                    part.shard.count("responses_empty")
                    part.empty.add_empty(example(f"{row['qid']} sample {sample}", "empty output", gen.finish_reason, gen.text) if part.empty.wants_examples else None)
                part.shard.count("docids", row["n_docids"])
                part.shard.count("docids_hallucinated", hallucinated)
                part.shard.count("docids_flipped", sum(row["flipped"]))
                part.shard.count("malformed", row["malformed"])
            part.shard.write_rows(rows)

    return part_fn


def run_retrieve(
    selection: Selection,
    prompt: RetrievePrompt,
    index: Index,
    lookup: DocidIndex,
    out: str | Path,
    backend: Callable[[], Backend],
    settings: RetrieveSettings,
    *,
    model_name: str,
    params: dict[str, Any],
    inputs: list[str],
    cache_dir: Path | None = None,
    overwrite: bool = False,
    num_shards: int | None = None,
    shard_index: int | None = None,
    max_empty_share: float = DEFAULT_MAX_EMPTY_SHARE,
):
    """Run the stage over this task's parts; returns the :class:`~grtool.llm.stage_runner.StageRun`."""
    from grtool.llm.stage_runner import Guard, ModelStage, Output
    from grtool.store.schemas import RESPONSES
    from grtool.store.stage import StageSpec

    if settings.mode == "gmr":  # one whole document per step until DONE: its own loop
        from grtool.retrieve.gmr import MARKERS, gmr_part_fn

        part_fn = gmr_part_fn(selection, index, settings, constraint_spec(index, MARKERS, None))
    else:
        part_fn = docids_part_fn(selection, prompt, lookup, settings, constraint_spec(index, settings.markers, settings.max_docids))

    guard = Guard(
        max_empty_share, "responses", "are empty", _recorded_empty,
        redo="from the request cache, which keeps the empty answers: change the model or prompt, or pass --no-cache",
    )  # fmt: skip
    stage = ModelStage(
        "retrieve", "questions", [Output(out, StageSpec("responses", RESPONSES, params, inputs=inputs))], selection.table.num_parts,
        backend, model_name, cache_dir=cache_dir, overwrite=overwrite, num_shards=num_shards, shard_index=shard_index,
        planned=lambda parts: selection.planned(parts) * settings.samples, guard=guard,
    )  # fmt: skip
    return stage.run(part_fn)


def _recorded_empty(writer: Any, name: str) -> EmptyOutputs:
    record = writer.records.get(name)  # a ShardRecord
    rows, extra = (record.rows, record.counters.extra) if record is not None else (0, {})
    return EmptyOutputs(name, rows, extra.get("responses_empty", 0), resumed=True)


def latency_percentiles(path: str | Path) -> dict[str, float | None]:
    """p50 / p95 of ``latency_ms`` over a responses stage (per query: from its batch's start until its last token)."""
    from grtool.store.stage import read_table

    column = read_table(path, columns=["latency_ms"])["latency_ms"].drop_null()
    if len(column) == 0:
        return {"p50": None, "p95": None}
    q = pc.quantile(column, q=[0.5, 0.95]).to_pylist()
    return {"p50": round(q[0], 1), "p95": round(q[1], 1)}
