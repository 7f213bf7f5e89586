"""A persistent request cache in front of any backend, and the audit rows of the ``llm_calls`` table.

The key is :func:`~grtool.llm.base.request_hash` (model + messages + every sampling parameter, max tokens and
JSON schema included); what a stage makes of the text (parsing) is outside the key, so fixing a parser and
re-running re-parses without generating again. Answers are committed to SQLite chunk by chunk as they arrive
(chunks no larger than the backend's own), and a backend that fails part of a chunk raises
:class:`PartialGenerations` so the answers that did arrive are committed too: a crashed run loses at most the
chunk in flight, a failed request loses only itself. Nothing about the transport (URLs, keys, headers) is stored,
and every answer has the known credentials masked (:func:`~grtool.llm.base.redact_generation`) before it is
stored or handed to a stage, so a server echoing the API key cannot put it into the cache or any output. A
prompt that does not fit the model's context comes back as a ``too_long`` generation and is never stored.
Entries are typed both ways (:mod:`grtool.llm.answers`): a generation that would not read back is not stored, and
an entry that does not decode (stored before answers were typed, or edited) is a miss: generated again and
replaced; ``--overwrite`` of a stage removes such entries first (:meth:`RequestCache.drop_undecodable`).
"""

from __future__ import annotations

import inspect
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from grtool.llm.answers import MalformedAnswer, check_generation, decode_generation
from grtool.llm.base import (
    Backend,
    Generation,
    Messages,
    OnDone,
    PartialGenerations,
    Sampling,
    chunks,
    logprobs_summary,
    redact_generation,
    request_hash,
    require_logprobs,
)
from grtool.log import log
from grtool.secrets import redact_known

_SCHEMA = """
CREATE TABLE IF NOT EXISTS generations (
    request_hash TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    generation BLOB NOT NULL,
    created REAL NOT NULL
)
"""


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class RequestCache:
    """SQLite file: request hash → the serialized :class:`Generation`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=60, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)

    def get_many(self, hashes: list[str]) -> dict[str, Generation]:
        """The entries that decode, by request hash (one that does not is left out: a miss)."""
        found: dict[str, Generation] = {}
        unique = list(dict.fromkeys(hashes))
        for batch in chunks(unique, 500):  # SQLite's bound-parameter limit
            marks = ",".join("?" * len(batch))
            for key, blob in self._db.execute(f"SELECT request_hash, generation FROM generations WHERE request_hash IN ({marks})", batch):
                try:
                    found[key] = decode_generation(blob)
                except MalformedAnswer as e:
                    log.warning("%s: entry %s does not decode (%s); generating it again", self.path, key[:12], e)
        return found

    def drop_undecodable(self) -> int:
        """Delete every entry that does not decode; how many."""
        bad = []
        for key, blob in self._db.execute("SELECT request_hash, generation FROM generations"):
            try:
                decode_generation(blob)
            except MalformedAnswer:
                bad.append((key,))
        if bad:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany("DELETE FROM generations WHERE request_hash = ?", bad)
        return len(bad)

    def put_many(self, items: list[tuple[str, str, Generation]]) -> None:
        now = time.time()
        rows = []
        for key, model, gen in items:
            stored = Generation(**{**gen.__dict__, "cached": False})
            try:
                check_generation(stored)
            except MalformedAnswer as e:  # never stored: the next run generates it again
                log.warning("%s: not caching a malformed generation (%s)", self.path, e)
                continue
            rows.append((key, model, stored.to_json(), now))
        with self._db:  # one transaction per chunk
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO generations VALUES (?, ?, ?, ?)", rows)

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM generations").fetchone()[0]

    def close(self) -> None:
        self._db.close()


class CachedLLM:
    """A backend behind the request cache (``cache_path=None``: no cache, every prompt is generated).

    ``generate`` answers hits from the cache (``Generation.cached=True``) and sends the misses to the backend in
    chunks of ``chunk_size`` (at most the backend's own preference), storing each chunk before the next, and
    calling ``on_progress(finished_generations)`` for the hits, then as the backend finishes requests (its
    ``on_done``: per request or per internal batch; a backend without ``on_done``, per chunk). When the backend
    raises :class:`PartialGenerations`, the answers it carries are stored before the error goes on.
    """

    def __init__(self, backend: Backend, cache_path: Path | None, *, chunk_size: int | None = None):
        self.backend = backend
        self.cache = RequestCache(cache_path) if cache_path is not None else None
        own = getattr(backend, "chunk_size", None) or 256
        # The backend's chunk bounds what a crash loses, however large a chunk the caller reads and sends.
        self.chunk_size = min(chunk_size, own) if chunk_size else own
        self.stats = CacheStats()
        self._reports_done = "on_done" in inspect.signature(backend.generate).parameters

    @property
    def model(self) -> str:
        return self.backend.model

    @property
    def name(self) -> str:
        return self.backend.name

    def key(self, messages: Messages, sampling: Sampling) -> str:
        return request_hash(self.model, messages, sampling)

    def generate(
        self,
        prompts: list[Messages],
        sampling: Sampling,
        *,
        on_progress: Callable[[list[Generation]], None] | None = None,
    ) -> list[Generation]:
        keys = [self.key(p, sampling) for p in prompts]
        results: list[Generation | None] = [None] * len(prompts)
        cached = self.cache.get_many(keys) if self.cache is not None else {}
        todo: dict[str, list[int]] = {}  # identical requests in one call are generated once
        for i, key in enumerate(keys):
            hit = cached.get(key)
            if hit is not None and not (sampling.logprobs and hit.completion_tokens and not hit.logprobs):
                hit.cached = True
                redact_generation(hit)  # an entry stored before the key was known to be one
                results[i] = hit
            else:
                todo.setdefault(key, []).append(i)
        hits = [g for g in results if g is not None]
        self.stats.hits += len(hits)
        if hits and on_progress:
            on_progress(hits)

        pending = list(todo)
        for batch in chunks(pending, self.chunk_size):
            reported: set[int] = set()  # ids of the generations the backend already reported as done
            try:
                gens = self.backend.generate([prompts[todo[k][0]] for k in batch], sampling, **self._on_done(on_progress, reported))
            except PartialGenerations as e:
                answered = [(k, redact_generation(g)) for k, g in zip(batch, e.generations) if g is not None]
                self._store(answered, sampling)
                self.stats.misses += len(answered)
                raise
            if len(gens) != len(batch):
                raise RuntimeError(f"{self.backend.name} backend returned {len(gens)} generations for {len(batch)} prompts")
            for g in gens:
                redact_generation(g)  # in place: the backend's on_done already reported these objects
            self._store(list(zip(batch, gens)), sampling)
            done = []
            for k, g in zip(batch, gens):
                g.cached = False
                for n, i in enumerate(todo[k]):
                    results[i] = g if n == 0 else Generation(**{**g.__dict__, "cached": True})
                    done.append(results[i])
            self.stats.misses += len(batch)
            self.stats.hits += len(done) - len(batch)
            rest = [g for g in done if id(g) not in reported]  # copies for repeated prompts, or a backend without on_done
            if on_progress and rest:
                on_progress(rest)
        return results  # type: ignore[return-value]

    def _on_done(self, on_progress: Callable[[list[Generation]], None] | None, reported: set[int]) -> dict[str, OnDone]:
        """The backend's ``on_done`` argument: forward finished requests to ``on_progress`` as they come."""
        if on_progress is None or not self._reports_done:
            return {}

        def on_done(gens: list[Generation]) -> None:
            reported.update(id(g) for g in gens)
            on_progress(gens)

        return {"on_done": on_done}

    def _store(self, answered: list[tuple[str, Generation]], sampling: Sampling) -> None:
        answered = [(k, g) for k, g in answered if g.too_long is None]  # not generated: nothing to keep
        require_logprobs(self.backend.name, [g for _, g in answered], sampling)
        if self.cache is not None and answered:
            self.cache.put_many([(k, self.model, g) for k, g in answered])

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def call_row(key: str, row_key: str, model: str, messages: Messages, sampling: Sampling, gen: Generation) -> dict[str, Any]:
    """One row of the ``llm_calls`` audit table (schema ``LLM_CALLS``), known credentials masked in its texts."""
    summary = logprobs_summary(gen)
    return {
        "request_hash": key,
        "row_key": row_key,
        "model": model,
        "prompt": redact_known(orjson.dumps(messages).decode()),
        "sampling": orjson.dumps(sampling.as_dict(), option=orjson.OPT_SORT_KEYS).decode(),
        "output": redact_known(gen.text),
        "finish_reason": gen.finish_reason,
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "logprobs_summary": orjson.dumps(summary).decode() if summary is not None else None,
        "cached": gen.cached,
    }
