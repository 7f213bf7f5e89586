"""The part loop of the stages that call a model (`triples extract`, `chains synthesize`, `retrieve`).

A stage supplies *what one part does* (a :data:`PartFn`). Sharding, skipping finished parts, the progress bar and
each part's timing are :class:`grtool.store.partloop.PartLoop`'s, as for every sharded stage; :class:`ModelStage`
adds what a model needs (datatrove's step/executor split):

- **the backend's lifetime**: built from its factory only when some part has work (a finished run resumes
  without loading a model), once for the run, before the first part's shards open (not in its seconds);
- **the request cache**: one :class:`~grtool.llm.cache.CachedLLM` (one SQLite file) per part, closed after it;
  its hits and misses go into the part's shard counters (``cache_hits``, ``cache_misses``) and the run's totals;
- **progress**: the bar shows units/s, generated tokens/s and cache hits (:class:`Meter`), and what the backend
  is busy with (:func:`grtool.log.activity`: loading the model, generating a batch, requests answered);
- **the guard** (:mod:`grtool.llm.guard`): a finished part is not redone but still judged, so re-running after
  the guard tripped does not exit 0; after a part whose empty share is too large, no further part is started,
  the manifests are finished and the guard's :class:`~grtool.errors.DataProblem` is raised.

A new model stage builds a :class:`ModelStage` with its outputs and guard and calls :meth:`ModelStage.run` with its
part function.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import TextColumn

from grtool.llm.base import Backend, Generation
from grtool.llm.cache import CacheStats, CachedLLM
from grtool.llm.guard import DEFAULT_MAX_EMPTY_SHARE, EmptyOutputs
from grtool.log import activity, log
from grtool.store.io import is_stdio
from grtool.store.partloop import Bar, LoopPart, Output, PartLoop
from grtool.store.stage import StageWriter
from grtool.store.records import Manifest, load_manifest
from grtool.store.layout import part_name


class Meter:
    """Feeds the progress bar: units/s and generated tokens/s over this run, cache hits.

    Pass it as ``on_progress`` to :meth:`CachedLLM.generate` (one unit per generation); :meth:`skip` counts units
    done without a request (rejected rows).
    """

    def __init__(self, bar: Any, task: Any):
        self.bar, self.task = bar, task
        self.start = time.monotonic()
        self.units = self.tokens = self.hits = 0

    def __call__(self, gens: list[Generation]) -> None:
        self.units += len(gens)
        self.tokens += sum(g.completion_tokens for g in gens if not g.cached)
        self.hits += sum(g.cached for g in gens)
        dt = max(time.monotonic() - self.start, 1e-9)
        self.bar.update(self.task, advance=len(gens), rate=self.units / dt, tok_s=self.tokens / dt, hits=self.hits)

    def skip(self, n: int) -> None:
        self.bar.advance(self.task, n)


@dataclass
class Guard:
    """The empty-output guard of a stage: how a finished part is judged again and how the error reads.

    ``recorded(writer, part)`` gives a finished part's counts from its shard record; ``examples(writer, counts)``
    adds examples (read only when the guard trips); ``where(part)`` points at the kept evidence in a directory.
    """

    max_empty_share: float = DEFAULT_MAX_EMPTY_SHARE
    units: str = "outputs"
    outcome: str = "are empty"
    recorded: Callable[[Any, str], EmptyOutputs] | None = None
    examples: Callable[[Any, EmptyOutputs], EmptyOutputs] | None = None
    where: Callable[[str], str] | None = None
    redo: str = ""


@dataclass
class Part:
    """What a part function gets: the part, its request cache, the shards it writes, progress, guard counts.

    ``shards[k]`` writes part ``index`` of output ``k``; it is None where that output already has the part.
    """

    index: int
    name: str
    llm: CachedLLM
    shards: list[Any]
    meter: Meter
    empty: EmptyOutputs

    @property
    def shard(self) -> Any:
        return self.shards[0]


PartFn = Callable[[Part], None]


@dataclass
class StageRun:
    """What a run did: parts done and skipped, this run's cache counts, the model, the outputs' manifests."""

    parts_done: list[str] = field(default_factory=list)
    parts_skipped: list[str] = field(default_factory=list)
    cache: CacheStats = field(default_factory=CacheStats)
    model: str | None = None
    manifests: list[Manifest | None] = field(default_factory=list)  # None: an output on stdout


def backend_factory(backend: Backend | Callable[[], Backend]) -> Callable[[], Backend]:
    """A backend instance, or anything that makes one (a function, a backend class), as a factory."""
    if isinstance(backend, type) or not hasattr(backend, "generate"):
        return backend  # type: ignore[return-value]
    return lambda: backend  # type: ignore[return-value]


@dataclass
class ModelStage:
    """A stage that calls a model, one output part per input part; see the module's docstring."""

    description: str  # the progress bar's name
    unit: str  # what the bar counts ("docs", "rows")
    outputs: Sequence[Output]  # the first is the primary one: the guard and the cache counters are its
    num_parts: int
    backend: Backend | Callable[[], Backend]
    model_name: str | None  # recorded when no part generated in this run and no earlier run recorded one
    cache_dir: Path | None = None
    cache_chunk_size: int | None = None  # prompts per cache commit (at most the backend's own chunk)
    guard: Guard = field(default_factory=Guard)
    overwrite: bool = False
    num_shards: int | None = None
    shard_index: int | None = None
    planned: Callable[[list[int]], int | None] = lambda parts: None  # units of these parts, for the bar's total

    def run(self, part_fn: PartFn) -> StageRun:
        loop = PartLoop(self.outputs, self.num_parts, overwrite=self.overwrite, num_shards=self.num_shards, shard_index=self.shard_index)
        primary = loop.writers[0]
        report = StageRun(parts_skipped=[part_name(i) for i in loop.finished])
        tripped = self._judge_finished(primary, loop.finished)
        factory = backend_factory(self.backend)
        backend: Backend | None = None
        meter: Meter | None = None
        bar = Bar(
            self.description,
            (TextColumn(f"{{task.fields[rate]:.2f}} {self.unit}/s"), TextColumn("{task.fields[tok_s]:.0f} tok/s"), TextColumn("cache hits {task.fields[hits]}")),
            {"rate": 0.0, "tok_s": 0.0, "hits": 0},
            total=self.planned,
        )

        def start(i: int) -> None:
            nonlocal backend, meter
            meter = meter or Meter(bar.progress, bar.task)
            if backend is None:
                # Imports and weights: often the first minute of a run (outside the first part's seconds).
                with activity("starting the backend" + (f" for {self.model_name}" if self.model_name else "")):
                    backend = factory()

        def one(loop_part: LoopPart) -> None:
            nonlocal tripped
            assert backend is not None and meter is not None
            # Opened after the writers, which create the directory the cache lives in (and keep it on --overwrite).
            cache = self.cache_dir / f"{loop_part.name}.sqlite" if self.cache_dir is not None else None
            llm = CachedLLM(backend, cache, **({"chunk_size": self.cache_chunk_size} if self.cache_chunk_size else {}))
            if self.overwrite and llm.cache is not None:  # starting over: entries that no longer decode go too
                llm.cache.drop_undecodable()
            part = Part(loop_part.index, loop_part.name, llm, loop_part.shards, meter, EmptyOutputs(loop_part.name))
            try:
                part_fn(part)
                part.shard.count("cache_hits", llm.stats.hits)
                part.shard.count("cache_misses", llm.stats.misses)
            finally:
                llm.close()
            report.cache.hits += llm.stats.hits
            report.cache.misses += llm.stats.misses
            if part.empty.over(self.guard.max_empty_share):
                tripped = part.empty
                loop_part.stop()

        try:
            report.parts_done = loop.run(one, bar, parts=[] if tripped is not None else loop.todo, before_part=start)
        finally:
            if backend is not None and hasattr(backend, "close"):
                backend.close()  # engines with processes of their own (vLLM) stop here, not at interpreter exit
            if getattr(backend, "malformed_answers", 0):
                log.warning("%d answers of the server did not decode and were asked again (none was cached)", backend.malformed_answers)
        report.model = backend.model if backend is not None else self._recorded_model(primary)
        model = {"model": report.model} if report.model is not None else {}
        # Every output is finished before any is judged; the --max-empty-share guard speaks first (it says more
        # than "no rows"), then the empty-result rule (grtool.store.empty) for each output.
        report.manifests = loop.finish(check_empty=False, **model)
        if tripped is not None:
            where = self.guard.where(tripped.part) if self.guard.where is not None and not is_stdio(self.outputs[0].path) else ""
            raise tripped.error(self.guard.max_empty_share, units=self.guard.units, outcome=self.guard.outcome, where=where, redo=self.guard.redo)
        loop.check_empty(report.manifests)
        return report

    def _judge_finished(self, primary: Any, finished: list[int]) -> EmptyOutputs | None:
        """The first finished part over the guard's share, with examples: re-running after the guard tripped must not exit 0."""
        if self.guard.recorded is None:
            return None
        for i in finished:
            recorded = self.guard.recorded(primary, part_name(i))
            if recorded.over(self.guard.max_empty_share):
                return self.guard.examples(primary, recorded) if self.guard.examples is not None else recorded
        return None

    def _recorded_model(self, primary: Any) -> str | None:
        """Nothing generated in this run: keep what the run that generated recorded."""
        recorded = load_manifest(primary.path).model if isinstance(primary, StageWriter) else None
        return recorded or self.model_name


def part_rows(table: Any, parts: list[int]) -> list[int | None]:
    """Rows of these parts of an :class:`~grtool.store.io.InputTable` from the Parquet footers (None: stdin)."""
    from grtool.store.reading import shard_rows

    return [shard_rows(table.parts[i]) if table.parts[i] is not None else None for i in parts]
