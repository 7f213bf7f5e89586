"""The part loop every stage that calls a model shares (`triples extract`, `chains synthesize`, …).

A stage supplies *what one part does* (a :data:`PartFn`); :class:`ModelStage` owns the rest, the same way for
every stage (datatrove's step/executor split):

- **sharding**: ``--num-shards/--shard-index`` resolved once here (defaults: the Slurm array variables), the
  output writers opened as that task (:class:`~grtool.store.stage.StageWriter` locks, shard records);
- **skipping**: a part is done when every output has it; a finished part is not redone but still judged by
  the empty-output guard (:mod:`grtool.llm.guard`), so re-running after the guard tripped does not exit 0;
- **the backend's lifetime**: built from its factory only when some part has work (a finished run resumes
  without loading a model), once for the run;
- **the request cache**: one :class:`~grtool.llm.cache.CachedLLM` (one SQLite file) per part, closed after it;
  its hits and misses go into the part's shard counters (``cache_hits``, ``cache_misses``) and the run's totals;
- **progress**: one bar with units/s, generated tokens/s and cache hits (:class:`Meter`), and what the backend is
  busy with (:func:`grtool.log.activity`: loading the model, generating a batch, requests answered);
- **the guard**: after a part whose empty share is too large, no further part is started; the manifests are
  finished and the guard's :class:`~grtool.errors.DataProblem` is raised.

A new model stage (``retrieve``…) builds a :class:`ModelStage` with its outputs and guard and calls
:meth:`ModelStage.run` with its part function.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import TextColumn

from grtool.llm.base import Backend, Generation
from grtool.llm.cache import CacheStats, CachedLLM
from grtool.llm.guard import DEFAULT_MAX_EMPTY_SHARE, EmptyOutputs
from grtool.log import activity, progress
from grtool.store.io import is_stdio, open_output
from grtool.store.sharding import parts_for_task, resolve_sharding
from grtool.store.stage import StageSpec, StageWriter
from grtool.store.records import load_manifest
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
class Output:
    """One stage directory the stage writes (``path`` ``-``: JSON Lines on stdout); ``finish`` goes into its manifest."""

    path: str | Path
    spec: StageSpec
    finish: dict[str, Any] = field(default_factory=dict)


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
    manifests: list[dict[str, Any]] = field(default_factory=list)


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
        shards = resolve_sharding(self.num_shards, self.shard_index)
        writers = [open_output(o.path, o.spec, overwrite=self.overwrite, num_parts=self.num_parts, shards=shards) for o in self.outputs]
        primary = writers[0]
        mine = parts_for_task(self.num_parts, *shards)
        todo = [i for i in mine if not all(w.done(i) for w in writers)]
        report = StageRun(parts_skipped=[part_name(i) for i in mine if i not in todo])
        tripped = self._judge_finished(primary, [i for i in mine if i not in todo])
        if tripped is not None:
            todo = []
        factory = backend_factory(self.backend)
        backend: Backend | None = None
        try:
            with progress(
                TextColumn(f"{{task.fields[rate]:.2f}} {self.unit}/s"),
                TextColumn("{task.fields[tok_s]:.0f} tok/s"),
                TextColumn("cache hits {task.fields[hits]}"),
            ) as bar:
                meter = Meter(bar, bar.add_task(self.description, total=self.planned(todo), rate=0.0, tok_s=0.0, hits=0))
                for i in todo:
                    if backend is None:
                        # Imports and weights: often the first minute of a run.
                        with activity("starting the backend" + (f" for {self.model_name}" if self.model_name else "")):
                            backend = factory()
                    name = part_name(i)
                    # Opened after the writers, which create the directory the cache lives in (and keep it on --overwrite).
                    cache = self.cache_dir / f"{name}.sqlite" if self.cache_dir is not None else None
                    llm = CachedLLM(backend, cache, **({"chunk_size": self.cache_chunk_size} if self.cache_chunk_size else {}))
                    part = Part(i, name, llm, [], meter, EmptyOutputs(name))
                    try:
                        with contextlib.ExitStack() as stack:
                            part.shards = [None if w.done(i) else stack.enter_context(w.shard(i)) for w in writers]
                            part_fn(part)
                            part.shard.count("cache_hits", llm.stats.hits)
                            part.shard.count("cache_misses", llm.stats.misses)
                    finally:
                        llm.close()
                    report.parts_done.append(name)
                    report.cache.hits += llm.stats.hits
                    report.cache.misses += llm.stats.misses
                    if part.empty.over(self.guard.max_empty_share):
                        tripped = part.empty
                        break
        finally:
            if backend is not None and hasattr(backend, "close"):
                backend.close()  # engines with processes of their own (vLLM) stop here, not at interpreter exit
        report.model = backend.model if backend is not None else self._recorded_model(primary)
        model = {"model": report.model} if report.model is not None else {}
        # Every output is finished before any is judged; the --max-empty-share guard speaks first (it says more
        # than "no rows"), then the empty-result rule (grtool.store.empty) for each output.
        report.manifests = [w.finish(check_empty=False, **model, **o.finish) for w, o in zip(writers, self.outputs)]
        if tripped is not None:
            where = self.guard.where(tripped.part) if self.guard.where is not None and not is_stdio(self.outputs[0].path) else ""
            raise tripped.error(self.guard.max_empty_share, units=self.guard.units, outcome=self.guard.outcome, where=where, redo=self.guard.redo)
        for w, m in zip(writers, report.manifests):
            w.check_empty(m)
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
        recorded = load_manifest(primary.path).get("model") if isinstance(primary, StageWriter) else None
        return recorded or self.model_name


def part_rows(table: Any, parts: list[int]) -> list[int | None]:
    """Rows of these parts of an :class:`~grtool.store.io.InputTable` from the Parquet footers (None: stdin)."""
    from grtool.store.reading import shard_rows

    return [shard_rows(table.parts[i]) if table.parts[i] is not None else None for i in parts]
