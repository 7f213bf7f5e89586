"""`triples extract`: one LLM request per document, its output parsed into docid triples.

Layout of ``--out DIR`` (a run directory, like the ingest output)::

    DIR/triples/      stage directory of the triples table, one part per part of the documents input
    DIR/llm_calls/    stage directory of the raw outputs (text, finish reason, token counts), same parts
    DIR/_llm_cache/   the request cache, one SQLite file per part (one writer per file, safe on shared disks)

With ``--out -`` the triples go to stdout as JSON Lines and no ``llm_calls`` table is written.

Accounting of the triples stage (in == out + merged + rejected): ``in`` counts the triples read from the outputs
plus one per document that gave none; ``merged`` are duplicates within a document; rejects are triples with an
empty part (``empty_part``) and documents without triples (``no_triples``, kept with the raw output) or without
text (``empty_text``). Extra counters: documents, documents_without_triples, parse_failures, truncated_outputs,
cache_hits, cache_misses, prompt_tokens, completion_tokens.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
from rich.progress import TextColumn

from grtool.llm.base import Backend, Generation, Sampling
from grtool.llm.cache import CachedLLM, call_row
from grtool.llm.guard import DEFAULT_MAX_EMPTY_SHARE, EmptyOutputs, example
from grtool.log import log, progress
from grtool.store.io import InputTable, is_stdio, open_output
from grtool.store.schemas import LLM_CALLS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter, load_manifest, part_name, parts_for_task
from grtool.triples.parse import parse_output, render_docid
from grtool.triples.prompt import PromptSpec


@dataclass
class ExtractConfig:
    docid_start: str = "<docid_start>"
    docid_end: str = "<docid_end>"
    limit: int | None = None
    max_empty_share: float = DEFAULT_MAX_EMPTY_SHARE  # the empty-output guard (grtool.llm.guard), over documents
    chunk_size: int = 2048  # documents read and sent per generate call (memory); progress moves per request


PartResult = EmptyOutputs  # a part's documents and those without triples: the empty-output guard's count


@dataclass
class ExtractReport:
    parts_done: list[str] = field(default_factory=list)
    parts_skipped: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    model: str | None = None
    manifest: dict[str, Any] | None = None


class _LazyBackend:
    """The backend is built only when a part needs generation: a finished run resumes without loading a model."""

    def __init__(self, factory: Callable[[], Backend]):
        self.factory = factory
        self.backend: Backend | None = None

    def get(self) -> Backend:
        if self.backend is None:
            self.backend = self.factory()
        return self.backend


def _part_sizes(corpus: InputTable) -> list[int | None]:
    return [pq.ParquetFile(p).metadata.num_rows if p is not None else None for p in corpus.parts]


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
    num_shards: int = 1,
    shard_index: int = 0,
    overwrite: bool = False,
) -> ExtractReport:
    """Run the extraction for this task's parts; raises DataProblem when the empty-document guard trips."""
    lazy = _LazyBackend((lambda: backend) if hasattr(backend, "generate") else backend)  # type: ignore[arg-type]
    num_parts = corpus.num_parts
    inputs = [] if is_stdio(corpus.source) else [corpus.source]
    triples_spec = StageSpec("triples", TRIPLES, params, inputs)
    if is_stdio(out):
        triples_out = open_output(out, triples_spec)
        calls_out = None
    else:
        out = Path(out)
        shards = (num_shards, shard_index)
        triples_out = StageWriter(out / "triples", triples_spec, overwrite=overwrite, num_parts=num_parts, shards=shards)
        calls_out = StageWriter(out / "llm_calls", StageSpec("llm_calls", LLM_CALLS, params, inputs), overwrite=overwrite,
                                num_parts=num_parts, shards=shards)

    mine = parts_for_task(num_parts, num_shards, shard_index)
    sizes = _part_sizes(corpus)
    budget = _doc_budget(sizes, config.limit)
    total = sum(b if b is not None else 0 for i, b in enumerate(budget) if i in mine) or None
    report = ExtractReport()
    tripped: PartResult | None = None

    with progress(
        TextColumn("{task.fields[docs_s]:.2f} docs/s"),
        TextColumn("{task.fields[tok_s]:.0f} tok/s"),
        TextColumn("cache hits {task.fields[hits]}"),
    ) as bar:
        task = bar.add_task("triples extract", total=total, docs_s=0.0, tok_s=0.0, hits=0)
        meter = _Meter(bar, task)
        for i in mine:
            name = part_name(i)
            if triples_out.done(i) and (calls_out is None or calls_out.done(i)):
                report.parts_skipped.append(name)
                bar.advance(task, budget[i] or 0)
                # A finished part is still judged: re-running after the guard tripped must not exit 0.
                result = _recorded_result(triples_out, name)
                if result.over(config.max_empty_share):
                    tripped = _with_recorded_examples(triples_out, result)
                    break
                continue
            llm = CachedLLM(lazy.get(), (cache_dir / f"{name}.sqlite") if cache_dir is not None else None, chunk_size=config.chunk_size)
            try:
                result = _extract_part(corpus, i, triples_out, calls_out, llm, sampling, prompt, config, budget[i], meter)
            finally:
                llm.close()
            report.parts_done.append(name)
            for k, v in (("cache_hits", llm.stats.hits), ("cache_misses", llm.stats.misses)):
                report.counters[k] = report.counters.get(k, 0) + v
            if result.over(config.max_empty_share):
                tripped = result
                break

    if lazy.backend is not None:
        report.model = lazy.backend.model
    else:  # nothing generated in this run: keep what the run that generated recorded
        recorded = load_manifest(triples_out.path).get("model") if isinstance(triples_out, StageWriter) else None
        report.model = recorded or params.get("model")
    report.manifest = triples_out.finish(model=report.model, prompt_sha256=prompt.sha256())
    if calls_out is not None:
        calls_out.finish(model=report.model)
    if tripped is not None:
        where = f" (rejects: {Path(out) / 'triples' / '_rejects' / (tripped.part + '.jsonl')})" if not is_stdio(out) else ""
        raise tripped.error(config.max_empty_share, units="documents", outcome="gave no triples", where=where, redo="re-parsing cached outputs")
    return report


def _recorded_result(stage: StageWriter, name: str) -> PartResult:
    """A finished part's document counts, from its committed shard record."""
    extra = stage.records.get(name, {}).get("counters", {}).get("extra", {})
    return PartResult(name, extra.get("documents", 0), extra.get("documents_without_triples", 0), resumed=True)


def _with_recorded_examples(stage: StageWriter, result: PartResult) -> PartResult:
    """Examples for the guard's message from the part's rejects file (read only when the guard trips)."""
    rejects = stage.records.get(result.part, {}).get("rejects_file")
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


class _Meter:
    """Feeds the progress bar: documents/s and generated tokens/s over this run, cache hits."""

    def __init__(self, bar, task):
        self.bar, self.task = bar, task
        self.start = time.monotonic()
        self.docs = self.tokens = self.hits = 0

    def __call__(self, gens: list[Generation]) -> None:
        self.docs += len(gens)
        self.tokens += sum(g.completion_tokens for g in gens if not g.cached)
        self.hits += sum(g.cached for g in gens)
        dt = max(time.monotonic() - self.start, 1e-9)
        self.bar.update(self.task, advance=len(gens), docs_s=self.docs / dt, tok_s=self.tokens / dt, hits=self.hits)

    def skip(self, n: int) -> None:
        self.bar.advance(self.task, n)


def _extract_part(corpus, index, triples_out, calls_out, llm: CachedLLM, sampling, prompt, config, budget, meter) -> PartResult:
    result = PartResult(part_name(index))
    write_calls = calls_out is not None and not calls_out.done(index)
    left = budget
    with triples_out.shard(index) as shard, (calls_out.shard(index) if write_calls else contextlib.nullcontext()) as calls:
        for batch in corpus.iter_part(index, columns=["doc_id", "title", "text"], batch_size=config.chunk_size):
            if left is not None:
                if left <= 0:
                    break
                batch = batch[:left]
                left -= len(batch)
            docs = []
            for pos, doc in enumerate(batch):
                if not doc.get("doc_id") or not (doc.get("text") or "").strip():
                    shard.count_in(1)
                    shard.reject({"doc_id": doc.get("doc_id"), "title": doc.get("title")}, "empty_text", source=corpus.source, position=pos)
                    meter.skip(1)
                    continue
                docs.append(doc)
            messages = [prompt.messages(d.get("title"), d["text"]) for d in docs]
            gens = llm.generate(messages, sampling, on_progress=meter)
            rows, call_rows = [], []
            for doc, msgs, gen in zip(docs, messages, gens):
                rows.extend(_rows_for(doc, gen, shard, config, result, corpus.source))
                if write_calls:
                    call_rows.append(call_row(llm.key(msgs, sampling), doc["doc_id"], llm.model, msgs, sampling, gen))
                shard.count("prompt_tokens", gen.prompt_tokens)
                shard.count("completion_tokens", gen.completion_tokens)
            shard.write_rows(rows)
            if write_calls:
                calls.count_in(len(call_rows))
                calls.write_rows(call_rows)
        shard.count("documents", result.total)
        shard.count("documents_without_triples", result.empty)
        shard.count("cache_hits", llm.stats.hits)
        shard.count("cache_misses", llm.stats.misses)
    if result.empty:
        log.info("%s: %d of %d documents gave no triples", result.part, result.empty, result.total)
    return result


def _rows_for(doc, gen: Generation, shard, config: ExtractConfig, result: PartResult, source: str) -> list[dict[str, Any]]:
    doc_id = doc["doc_id"]
    parsed = parse_output(gen.text, gen.finish_reason)
    result.add()
    shard.count_in(parsed.candidates)
    if parsed.truncated:
        shard.count("truncated_outputs")
    if parsed.failed:
        shard.count("parse_failures")
    for triple in parsed.empty_parts:
        shard.reject({"doc_id": doc_id, "head": triple[0], "relation": triple[1], "tail": triple[2]}, "empty_part", source=source)
    shard.count_merged(parsed.duplicates)
    if not parsed.triples:
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
    return [
        {
            "doc_id": doc_id,
            "idx": idx,
            "head": h,
            "relation": r,
            "tail": t,
            "docid": render_docid((h, r, t), config.docid_start, config.docid_end),
        }
        for idx, (h, r, t) in enumerate(parsed.triples)
    ]
