"""`triples extract`: one LLM request per document, its output parsed into docid triples.

Layout of ``--out DIR`` (a run directory, like the ingest output)::

    DIR/triples/      stage directory of the triples table, one part per part of the documents input
    DIR/llm_calls/    stage directory of the raw outputs (text, finish reason, token counts), same parts
    DIR/_llm_cache/   the request cache, one SQLite file per part (one writer per file, safe on shared disks)

With ``--out -`` the triples go to stdout as JSON Lines and no ``llm_calls`` table is written.

Accounting of the triples stage (in == out + merged + rejected): ``in`` counts the triples read from the outputs
plus one per document that gave none; ``merged`` are duplicates within a document; rejects are triples with a
part that cannot live inside a docid (``empty_part``, ``docid_marker_in_part``, ``bracket_in_part``,
``control_char_in_part``, ``separator_in_part``: :func:`grtool.docid.triple_problem`), self-loops (``self_loop``),
copies of the prompt's examples (``prompt_example``), triples whose head or tail the document does not hold
(``ungrounded``, by ``--grounding``; the rules are in :mod:`grtool.triples.grounding`), and documents without
triples (``no_triples``, kept with the raw output), without text (``empty_text``) or whose prompt does not fit the
model's context with ``--max-tokens`` (``too_long``: never sent nor truncated, no ``llm_calls`` row). A document
whose every triple was dropped counts as a document without triples (no ``no_triples`` reject: its triples are
rejected one by one). Extra counters: documents, documents_without_triples, documents_all_triples_dropped,
parse_failures, truncated_outputs, cache_hits, cache_misses, prompt_tokens, completion_tokens, documents_too_long.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from grtool.docid import DOCID_END, DOCID_START
from grtool.llm.base import TOO_LONG, Backend, Generation, Sampling
from grtool.llm.cache import call_row
from grtool.llm.guard import DEFAULT_MAX_EMPTY_SHARE, EmptyOutputs, example
from grtool.llm.stage_runner import Guard, ModelStage, Output, Part, part_rows
from grtool.log import log
from grtool.store.io import InputTable, is_stdio
from grtool.store.schemas import LLM_CALLS, TRIPLES
from grtool.store.records import Manifest
from grtool.store.stage import StageSpec, StageWriter
from grtool.triples.grounding import DocumentTokens, TripleChecks
from grtool.triples.parse import parse_output, render_docid
from grtool.triples.prompt import PromptSpec
from grtool.records import Report


@dataclass
class ExtractConfig:
    docid_start: str = DOCID_START
    docid_end: str = DOCID_END
    limit: int | None = None
    max_empty_share: float = DEFAULT_MAX_EMPTY_SHARE  # the empty-output guard (grtool.llm.guard), over documents
    chunk_size: int = 2048  # documents read and sent per generate call (memory); progress moves per request
    grounding: str = "strict"  # strict | loose | off: grtool.triples.grounding
    doc_ids: frozenset[str] | None = None  # --questions: only these documents (those of the chosen questions)


PartResult = EmptyOutputs  # a part's documents and those without triples: the empty-output guard's count


@dataclass
class ExtractReport:
    parts_done: list[str] = field(default_factory=list)
    parts_skipped: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    model: str | None = None
    manifest: Manifest | None = None  # None: the triples went to stdout


def extract(
    corpus: InputTable,
    out: str | Path,
    backend: Backend | Callable[[], Backend],
    sampling: Sampling,
    prompt: PromptSpec,
    *,
    params: dict[str, Any],
    config: ExtractConfig,
    cache_dir: Path | None,
    num_shards: int | None = None,
    shard_index: int | None = None,
    overwrite: bool = False,
) -> ExtractReport:
    """Run the extraction for this task's parts; raises DataProblem when the empty-document guard trips.

    ``backend`` is a backend or a factory called only when a part needs generating. Sharding defaults to the
    Slurm array variables (:func:`~grtool.store.sharding.resolve_sharding`).
    """
    inputs = [corpus.source]  # standard input too ("-"): a run from it is never resumed with other rows
    outputs = [Output(out if is_stdio(out) else Path(out) / "triples", StageSpec("triples", TRIPLES, params, inputs), {"prompt_sha256": prompt.sha256()})]
    if not is_stdio(out):
        outputs.append(Output(Path(out) / "llm_calls", StageSpec("llm_calls", LLM_CALLS, params, inputs)))
    if config.doc_ids is not None:
        budget: list[int | None] = _chosen_per_part(corpus, config.doc_ids)
    else:
        budget = _doc_budget(part_rows(corpus, list(range(corpus.num_parts))), config.limit)
    stage = ModelStage(
        "triples extract", "docs", outputs, corpus.num_parts, backend, params.get("model"),
        cache_dir=cache_dir, cache_chunk_size=config.chunk_size, overwrite=overwrite, num_shards=num_shards, shard_index=shard_index,
        planned=lambda parts: sum(budget[i] or 0 for i in parts) or None,
        guard=Guard(
            config.max_empty_share, "documents", "gave no triples", _recorded_result, _with_recorded_examples,
            where=lambda part: f" (rejects: {Path(out) / 'triples' / '_rejects' / (part + '.jsonl')})", redo="re-parsing cached outputs",
        ),
    )  # fmt: skip
    run = stage.run(lambda part: _extract_part(corpus, part, sampling, prompt, config, budget[part.index]))
    counters = {"cache_hits": run.cache.hits, "cache_misses": run.cache.misses} if run.parts_done else {}
    return ExtractReport(run.parts_done, run.parts_skipped, counters, run.model, run.manifests[0])


def _recorded_result(stage: StageWriter, name: str) -> PartResult:
    """A finished part's document counts, from its committed shard record."""
    record = stage.records.get(name)
    extra = record.counters.extra if record is not None else {}
    return PartResult(name, extra.get("documents", 0), extra.get("documents_without_triples", 0), resumed=True)


def _with_recorded_examples(stage: StageWriter, result: PartResult) -> PartResult:
    """Examples for the guard's message from the part's rejects file (read only when the guard trips)."""
    record = stage.records.get(result.part)
    rejects = record.rejects_file if record is not None else None
    if not rejects or not (stage.path / rejects).is_file():
        return result
    with open(stage.path / rejects, "rb") as f:
        for line in f:
            entry = orjson.loads(line)
            if entry.get("reason") != "no_triples":
                continue
            rec = entry.get("record") or {}
            result.examples.append(example(rec.get("doc_id"), entry.get("detail"), rec.get("finish_reason"), rec.get("output") or ""))
            if not result.wants_examples:
                break
    return result


def _doc_budget(sizes: list[int | None], limit: int | None) -> list[int | None]:
    """Documents to take from each part: all of them, or the first ``limit`` of the corpus in part order."""
    if limit is None:
        return list(sizes)
    left, out = limit, []
    for n in sizes:
        take = left if n is None else min(n, left)
        out.append(take)
        left -= take
    return out


def question_documents(corpus: str | Path, count: int, splits: tuple[str, ...] = ()) -> tuple[list[str], frozenset[str]]:
    """``--questions N``: the first ``count`` questions of the corpus (in its part order; of ``splits`` when given)
    and the documents they need: their gold documents, and an unanswerable question's context documents."""
    from grtool.store.records import resolve_stage
    from grtool.store.stage import iter_rows

    qids: list[str] = []
    doc_ids: set[str] = set()
    for row in iter_rows(resolve_stage(corpus, "questions"), ["qid", "split", "gold_doc_ids", "meta"]):
        if splits and row["split"] not in splits:
            continue
        qids.append(row["qid"])
        doc_ids.update(row["gold_doc_ids"] or ())
        try:
            context = orjson.loads(row["meta"] or "{}").get("context_doc_ids")
        except (orjson.JSONDecodeError, AttributeError):
            context = None
        doc_ids.update(d for d in context or () if isinstance(d, str))
        if len(qids) >= count:
            break
    return qids, frozenset(doc_ids)


def _chosen_per_part(corpus: InputTable, doc_ids: frozenset[str]) -> list[int | None]:
    """How many of the chosen documents each part of the documents input holds (the parts' planned work)."""
    counts: list[int | None] = []
    for index in range(corpus.num_parts):
        counts.append(sum(d["doc_id"] in doc_ids for batch in corpus.iter_part(index, ["doc_id"]) for d in batch))
    return counts


def _extract_part(corpus: InputTable, part: Part, sampling, prompt, config, budget) -> None:
    """One part: its documents' requests, triples rows, rejects and ``llm_calls`` rows (unless already written)."""
    llm, shard, result = part.llm, part.shard, part.empty
    calls = part.shards[1] if len(part.shards) > 1 else None
    left = budget
    checks = TripleChecks((t for ex in prompt.examples for t in ex.triples), config.grounding)
    for batch in corpus.iter_part(part.index, columns=["doc_id", "title", "text"], batch_size=config.chunk_size):
        if config.doc_ids is not None:
            batch = [doc for doc in batch if doc.get("doc_id") in config.doc_ids]
        elif left is not None:
            if left <= 0:
                break
            batch = batch[:left]
            left -= len(batch)
        docs = []
        for pos, doc in enumerate(batch):
            if not doc.get("doc_id") or not (doc.get("text") or "").strip():
                shard.count_in(1)
                shard.reject({"doc_id": doc.get("doc_id"), "title": doc.get("title")}, "empty_text", source=corpus.source, position=pos)
                part.meter.skip(1)
                continue
            docs.append(doc)
        messages = [prompt.messages(d.get("title"), d["text"]) for d in docs]
        gens = llm.generate(messages, sampling, on_progress=part.meter)
        rows, call_rows = [], []
        for doc, msgs, gen in zip(docs, messages, gens):
            if gen.too_long is not None:  # an input the model cannot take whole, like an empty one: rejected
                shard.count_in(1)
                shard.count("documents_too_long")
                record = {"doc_id": doc["doc_id"], "title": doc.get("title"), "chars": len(doc["text"])}
                shard.reject(record, TOO_LONG, source=corpus.source, detail=gen.too_long)
                continue
            rows.extend(_rows_for(doc, gen, shard, config, result, corpus.source, checks))
            if calls is not None:
                call_rows.append(call_row(llm.key(msgs, sampling), doc["doc_id"], llm.model, msgs, sampling, gen))
            shard.count("prompt_tokens", gen.prompt_tokens)
            shard.count("completion_tokens", gen.completion_tokens)
        shard.write_rows(rows)
        if calls is not None:
            calls.count_in(len(call_rows))
            calls.write_rows(call_rows)
    shard.count("documents", result.total)
    shard.count("documents_without_triples", result.empty)
    if result.empty:
        log.info("%s: %d of %d documents gave no triples", result.part, result.empty, result.total)


def _rows_for(doc, gen: Generation, shard, config: ExtractConfig, result: PartResult, source: str, checks: TripleChecks) -> list[dict[str, Any]]:
    doc_id = doc["doc_id"]
    parsed = parse_output(gen.text, gen.finish_reason, (config.docid_start, config.docid_end))
    result.add()
    shard.count_in(parsed.candidates)
    if parsed.truncated:
        shard.count("truncated_outputs")
    if parsed.failed:
        shard.count("parse_failures")
    dropped: Counter[str] = Counter()
    for triple, problem in parsed.rejected:  # a part that cannot live inside a docid (grtool.docid.triple_problem)
        dropped[problem.reason] += 1
        shard.reject({"doc_id": doc_id, "head": triple[0], "relation": triple[1], "tail": triple[2]}, problem.reason, source=source, detail=problem.detail)
    shard.count_merged(parsed.duplicates)
    if not parsed.triples and not parsed.rejected:
        shard.count_in(1)
        why = "empty output" if not gen.text.strip() else "truncated before the first triple" if parsed.truncated else "no readable triple"
        shard.reject(
            {"doc_id": doc_id, "finish_reason": gen.finish_reason, "output": gen.text[:2000]},
            "no_triples",
            source=source,
            detail=why,
        )
        result.add_empty(example(doc_id, why, gen.finish_reason, gen.text) if result.wants_examples else None)
        return []
    doc_tokens = DocumentTokens(doc.get("title"), doc["text"])
    kept = []
    for h, r, t in parsed.triples:
        verdict = checks.check((h, r, t), doc_tokens)
        if verdict is None:
            kept.append((h, r, t))
            continue
        dropped[verdict.reason] += 1
        shard.reject({"doc_id": doc_id, "head": h, "relation": r, "tail": t}, verdict.reason, source=source, detail=verdict.detail)
    if not kept:  # no docid for this document: the guard counts it, its triples are already rejected
        shard.count("documents_all_triples_dropped")
        why = "all triples dropped (" + ", ".join(f"{k} {n}" for k, n in sorted(dropped.items())) + ")"
        result.add_empty(example(doc_id, why, gen.finish_reason, gen.text) if result.wants_examples else None)
        return []
    return [
        {
            "doc_id": doc_id,
            "idx": idx,
            "head": h,
            "relation": r,
            "tail": t,
            "docid": render_docid((h, r, t), config.docid_start, config.docid_end),
        }
        for idx, (h, r, t) in enumerate(kept)
    ]


class ExtractSummary(Report, kw_only=True):
    """``triples extract --json``."""

    triples: int
    documents: int
    grounding: str
    dropped: dict[str, Any]
    parts_done: list[str]
    parts_skipped: list[str]
    counters: dict[str, Any]
    this_run: dict[str, Any]
