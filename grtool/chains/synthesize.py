"""`chains synthesize`: for every question, candidate reasoning chains over its gold triples.

Unanswerable questions (MuSiQue-full ``answerable = false``, no gold) are offered the triples of their own
context paragraphs (``meta.context_doc_ids``, written by ingest) with ``unanswerable = "keep"`` (the default):
the chain the recipe wants for them ends in the cannot-answer sentence, which the filters check. ``"skip"``
rejects them before synthesis (``not answerable``).

One output part per questions input part (resume and Slurm sharding work per part). Within a part,
questions go in batches: the triples of the batch's gold documents are looked up together, every candidate
of every question is generated (candidate 0 greedy, the others sampled with their own seed so that each is
a distinct cached request), the citations are normalized, and one candidate per question is selected.

Accounting: a question that gets chains accounts for its ``candidates`` rows; a question that cannot get
any (no gold documents, not answerable, gold documents without triples, malformed, or a prompt that does not
fit the model's context with ``--max-tokens``: ``too_long``, never sent nor truncated) is one rejected record.
So ``in == out + rejected`` holds per part; the ``questions_*`` counters give the per-question view.

Empty outputs: a candidate whose generated text is empty is kept as a row (counter ``candidates_empty``) but
never selected over a non-empty one; when a part's share of empty candidates exceeds ``--max-empty-share``
the empty-output guard (:mod:`grtool.llm.guard`) stops the command with exit 1 after finishing that part.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from grtool.chains.docids import Markers, OfferedTriples, Triple, citation_pattern, normalize_chain
from grtool.chains.entropy import EntropyScorer, pick_lowest
from grtool.chains.prompt import ChainPrompt, offer_triples
from grtool.chains.triples import TripleStore
from grtool.errors import GrtoolError
from grtool.extras import require
from grtool.llm.base import TOO_LONG, Backend, Generation, Messages, Sampling
from grtool.llm.cache import CacheStats
from grtool.llm.guard import DEFAULT_MAX_EMPTY_SHARE, EmptyOutputs, example
from grtool.llm.stage_runner import Meter, Part
from grtool.store.questions import SplitSelection
from grtool.store.records import Manifest
import msgspec
from grtool.records import Report

SELECT_METHODS = ("entropy", "first")
UNANSWERABLE = ("keep", "skip")
OFFERED_TRIPLES = {"markers": "brackets", "source": "prompt"}  # the constraint spec of --constrain
QUESTION_BATCH = 4096  # questions whose gold triples are looked up together: one filtered scan of the triples
GENERATE_BATCH = 512  # questions whose candidates (text + top-k logprobs per token) are held at once
_CANNOT_ANSWER = re.compile(r"not enough to answer|cannot (?:be )?answer|can't answer|unable to answer", re.IGNORECASE)


class LLM(Protocol):
    """What the stage needs of :class:`grtool.llm.cache.CachedLLM`."""

    model: str

    def generate(self, prompts: list[Messages], sampling: Sampling, *, on_progress: Callable[[list[Generation]], None] | None = None) -> list[Generation]: ...


@dataclass(frozen=True)
class ChainSettings:
    """Everything that changes the chains; all of it goes into the manifest's parameters."""

    candidates: int = 5  # GReG: one greedy, four sampled at T = 0.7
    temperature: float = 0.7  # of candidates 1..N-1; candidate 0 is greedy
    top_p: float = 1.0
    max_tokens: int = 512
    select: str = "entropy"
    top_logprobs: int = 5
    distractors: int = 0
    seed: int = 0
    markers: Markers = field(default_factory=Markers)
    constrain: bool = False  # citations can only be the offered triples (grtool.index.constraints.OfferedTriples)
    unanswerable: str = "keep"  # keep: chain over context triples, expect the cannot-answer ending; skip: reject

    def __post_init__(self) -> None:
        if self.candidates < 1:
            raise GrtoolError(f"--candidates must be at least 1, got {self.candidates}")
        if self.select not in SELECT_METHODS:
            raise GrtoolError(f"--select must be one of {', '.join(SELECT_METHODS)}, got {self.select!r}")
        if self.distractors < 0:
            raise GrtoolError(f"--distractors must be at least 0, got {self.distractors}")
        if self.select == "entropy" and self.top_logprobs < 1:
            raise GrtoolError("--top-logprobs must be at least 1 for --select entropy")
        if self.select == "entropy":  # spaCy finds the words and entities (the extra grtool[entities])
            require("entities", "--select entropy")
        if self.unanswerable not in UNANSWERABLE:
            raise GrtoolError(f"--unanswerable must be one of {', '.join(UNANSWERABLE)}, got {self.unanswerable!r}")

    def sampling(self, candidate: int, triples: Sequence[tuple[str, str, str]] = ()) -> Sampling:
        """``triples``: the parts of the triples the batch's prompts offer, for the constraint (--constrain) to
        render their tail-first spellings from (they are not part of the cache key: the prompt lists them)."""
        return Sampling(
            temperature=0.0 if candidate == 0 else self.temperature,
            top_p=1.0 if candidate == 0 else self.top_p,
            max_tokens=self.max_tokens,
            seed=self.seed + candidate,
            logprobs=self.top_logprobs if self.select == "entropy" else None,
            constraint={**OFFERED_TRIPLES, "triples": [list(t) for t in triples]} if self.constrain else None,
        )

    def params(self) -> dict[str, Any]:
        p = asdict(self)
        p["markers"] = [self.markers.start, self.markers.end]
        if self.select != "entropy":
            p.pop("top_logprobs")
        return p


@dataclass
class Question:
    qid: str
    question: str
    gold_doc_ids: list[str]
    context_doc_ids: list[str] = field(default_factory=list)  # unanswerable questions: what is offered instead of gold

    @property
    def answerable(self) -> bool:
        return not self.context_doc_ids

    @property
    def offered_doc_ids(self) -> list[str]:
        return self.gold_doc_ids if self.answerable else self.context_doc_ids


def check_question(row: dict[str, Any], unanswerable: str = "keep") -> tuple[Question | None, str | None, str | None]:
    """A question ready for a prompt, or (None, reason, detail) saying why it cannot have a chain."""
    qid, text = row.get("qid"), row.get("question")
    if not isinstance(qid, str) or not qid:
        return None, "malformed question", "no qid"
    if not isinstance(text, str) or not text.strip():
        return None, "malformed question", f"{qid}: empty question text"
    if row.get("answerable") is False:
        if unanswerable == "skip":
            return None, "not answerable", None
        context = _context_doc_ids(row.get("meta"))
        if not context:
            return None, "unanswerable without context documents", "meta.context_doc_ids is empty (ingested before grtool recorded it? ingest again)"
        return Question(qid, text, [], context), None, None
    gold = [g for g in (row.get("gold_doc_ids") or []) if g]
    if not gold:
        return None, "no gold documents", None
    return Question(qid, text, list(dict.fromkeys(gold))), None, None


def _context_doc_ids(meta: Any) -> list[str]:
    try:
        ids = orjson.loads(meta).get("context_doc_ids") if isinstance(meta, str) and meta else None
    except (orjson.JSONDecodeError, AttributeError):
        return []
    return list(dict.fromkeys(i for i in ids if isinstance(i, str) and i)) if isinstance(ids, list) else []


def context_triples(question: Question, by_doc: dict[str, list[Triple]]) -> list[Triple]:
    """An unanswerable question's context triples (none is gold; a context paragraph without triples is fine)."""
    triples, seen = [], set()
    for doc_id in question.context_doc_ids:
        for t in by_doc.get(doc_id, ()):
            key = t.text().casefold()
            if key not in seen:
                seen.add(key)
                triples.append(t)
    return triples


def gold_triples(question: Question, by_doc: dict[str, list[Triple]]) -> tuple[list[Triple], list[str]]:
    """The question's gold triples in gold-document order (a triple found in two gold documents once),
    and the gold documents that have none."""
    triples, seen, missing = [], set(), []
    for doc_id in question.gold_doc_ids:
        found = by_doc.get(doc_id)
        if not found:
            missing.append(doc_id)
            continue
        for t in found:
            key = t.text().casefold()
            if key not in seen:
                seen.add(key)
                triples.append(t)
    return triples, missing


@dataclass
class PreparedQuestion:
    question: Question
    messages: Messages
    offered: OfferedTriples
    position: int | None = None  # of its row in the part (for a reject)
    parts: tuple[tuple[str, str, str], ...] = ()  # the offered triples' (head, relation, tail), as listed


class ChainSynthesizer:
    """Turns batches of question rows into chain rows, writing rejects and counters to a shard."""

    def __init__(
        self,
        triples: TripleStore,
        settings: ChainSettings,
        prompt: ChainPrompt,
        *,
        scorer: EntropyScorer | None = None,
        selection: SplitSelection = SplitSelection(),
    ):
        self.triples = triples
        self.selection = selection
        self.settings = settings
        self.prompt = prompt
        self.pattern = citation_pattern(settings.markers)
        self._pool: list[Triple] | None = None
        self._scorer = scorer

    @property
    def scorer(self) -> EntropyScorer:
        if self._scorer is None:
            self._scorer = EntropyScorer()
        return self._scorer

    @property
    def pool(self) -> list[Triple]:
        if self._pool is None:
            self._pool = self.triples.distractor_pool(self.settings.seed) if self.settings.distractors else []
        return self._pool

    # -- preparing prompts
    def prepare(self, rows: Sequence[dict[str, Any]], shard: Any, source: str, first_position: int) -> list[PreparedQuestion]:
        checked: list[tuple[int, dict[str, Any], Question]] = []
        for offset, row in enumerate(rows):
            if not self.selection.keeps(row.get("split")):  # --split: not read (counted, not rejected)
                shard.count("questions_not_selected")
                continue
            shard.count("questions")
            q, reason, detail = check_question(row, self.settings.unanswerable)
            if q is None:
                shard.count_in(1)
                shard.reject(row, reason, source=source, position=first_position + offset, detail=detail)
                continue
            checked.append((first_position + offset, row, q))
        by_doc = self.triples.for_docs(g for _, _, q in checked for g in q.offered_doc_ids)
        prepared = []
        for position, row, q in checked:
            if not q.answerable:
                gold, missing = context_triples(q, by_doc), []
                if not gold:
                    shard.count_in(1)
                    shard.reject(row, "context documents without triples", source=source, position=position,
                                 detail=f"none of {len(q.context_doc_ids)} context documents has triples")  # fmt: skip
                    continue
                shard.count("questions_unanswerable")
            else:
                gold, missing = gold_triples(q, by_doc)
            if missing:
                shard.count_in(1)
                shard.reject(
                    row,
                    "gold documents without triples",
                    source=source,
                    position=position,
                    detail=f"{len(missing)} of {len(q.gold_doc_ids)} gold documents have no triples: {', '.join(missing[:5])}",
                )
                continue
            offered = offer_triples(q.qid, gold, self.pool, self.settings.distractors, self.settings.seed)
            if len(offered) - len(gold) < self.settings.distractors:
                shard.count("questions_short_of_distractors")
            parts = tuple((t.head, t.relation, t.tail) for t in offered)
            msgs = self.prompt.messages(q.question, parts)
            prepared.append(PreparedQuestion(q, msgs, OfferedTriples.of(offered), position, parts))
        return prepared

    # -- generating
    def generate(self, llm: LLM, prepared: Sequence[PreparedQuestion], meter: Meter) -> list[list[Generation]]:
        """Every candidate of every question: ``result[q][c]`` (the LLM layer chunks and caches)."""
        messages = [p.messages for p in prepared]
        triples = list(dict.fromkeys(t for p in prepared for t in p.parts)) if self.settings.constrain else []
        per_candidate = []
        for c in range(self.settings.candidates):
            gens = llm.generate(messages, self.settings.sampling(c, triples), on_progress=meter)
            if len(gens) != len(messages):
                raise GrtoolError(f"the LLM returned {len(gens)} generations for {len(messages)} prompts")
            per_candidate.append(gens)
        return [list(gens) for gens in zip(*per_candidate)]

    # -- rows
    def rows(
        self,
        model: str,
        prepared: Sequence[PreparedQuestion],
        generations: Sequence[Sequence[Generation]],
        shard: Any,
        empty: EmptyOutputs | None = None,
    ) -> list[dict[str, Any]]:
        s = self.settings
        empty = empty if empty is not None else EmptyOutputs("")
        if s.select == "entropy":
            flat = [(g.text, g.logprobs) for gens in generations for g in gens]
            flat_scores = self.scorer.score(flat)
            scores = [flat_scores[i * s.candidates : (i + 1) * s.candidates] for i in range(len(generations))]
        else:
            scores = [[None] * s.candidates for _ in generations]
        rows = []
        for p, gens, cand_scores in zip(prepared, generations, scores):
            shard.count_in(len(gens))
            blank = [not g.text.strip() for g in gens]
            chosen = _choose(cand_scores, blank, s.select)
            shard.count("questions_chained")
            for c, (g, score) in enumerate(zip(gens, cand_scores)):
                empty.add()
                if blank[c]:
                    shard.count("candidates_empty")
                    empty.add_empty(example(f"{p.question.qid} candidate {c}", "empty output", g.finish_reason, g.text) if empty.wants_examples else None)
                chain = normalize_chain(g.text, p.offered, s.markers, self.pattern)
                shard.count("docids", len(chain.docids))
                shard.count("docids_flipped", sum(chain.flipped))
                shard.count("docids_not_offered", chain.unmatched)
                if not chain.docids:
                    shard.count("candidates_without_docids")
                if g.finish_reason == "length":
                    shard.count("candidates_truncated")
                if c == chosen and _CANNOT_ANSWER.search(g.text):
                    shard.count("selected_cannot_answer")
                rows.append(
                    {
                        "qid": p.question.qid,
                        "candidate": c,
                        "text": chain.text,
                        "docids": chain.docids,
                        "flipped": chain.flipped,
                        "selected": c == chosen,
                        "score": score,
                        "model": model,
                        "temperature": s.sampling(c).temperature,
                        "finish_reason": g.finish_reason,
                    }
                )
        return rows

    def run_batch(
        self,
        llm: LLM,
        rows: Sequence[dict[str, Any]],
        shard: Any,
        source: str,
        first_position: int,
        meter: Meter,
        empty: EmptyOutputs | None = None,
    ) -> None:
        prepared = self.prepare(rows, shard, source, first_position)
        meter.skip((len(rows) - len(prepared)) * self.settings.candidates)  # rejected questions are done
        # Generations with their logprobs are the bulky part: held for GENERATE_BATCH questions at a time.
        for lo in range(0, len(prepared), GENERATE_BATCH):
            chunk = prepared[lo : lo + GENERATE_BATCH]
            chunk, generations = self.reject_too_long(chunk, self.generate(llm, chunk, meter), shard, source)
            shard.write_rows(self.rows(llm.model, chunk, generations, shard, empty))

    def reject_too_long(self, prepared: Sequence[PreparedQuestion], generations: Sequence[Sequence[Generation]], shard: Any, source: str) -> tuple[list[PreparedQuestion], list[Sequence[Generation]]]:
        """The questions whose prompt fitted the model's context; the others are rejected (``too_long``)."""
        kept: list[PreparedQuestion] = []
        kept_generations: list[Sequence[Generation]] = []
        for p, gens in zip(prepared, generations):
            why = next((g.too_long for g in gens if g.too_long is not None), None)
            if why is None:
                kept.append(p)
                kept_generations.append(gens)
                continue
            shard.count_in(1)
            shard.count("questions_too_long")
            record = {"qid": p.question.qid, "chars": len(p.question.question)}
            shard.reject(record, TOO_LONG, source=source, position=p.position, detail=why)
        return kept, kept_generations


def _choose(scores: Sequence[float | None], blank: Sequence[bool], select: str) -> int:
    """The selected candidate: the lowest entropy score, or the greedy one (``first``); an empty candidate is
    never selected while another one has text."""
    if select == "entropy":
        chosen = pick_lowest([None if b else sc for sc, b in zip(scores, blank)])
    else:
        chosen = 0
    if blank[chosen] and not all(blank):
        chosen = blank.index(False)
    return chosen


def question_batches(batches: Iterator[list[dict[str, Any]]], size: int) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Re-chunk a part's row batches to ``size`` questions, with the position of each chunk's first row."""
    buf: list[dict[str, Any]] = []
    position = 0
    for batch in batches:
        buf.extend(batch)
        while len(buf) >= size:
            yield position, buf[:size]
            position += size
            buf = buf[size:]
    if buf:
        yield position, buf


def synthesize(
    corpus: str,
    triples: str,
    out: str,
    backend: Callable[[], Backend],
    settings: ChainSettings,
    prompt: ChainPrompt,
    *,
    backend_name: str,
    model_name: str | None,
    cache_dir: Path | None = None,
    overwrite: bool = False,
    num_shards: int | None = None,
    shard_index: int | None = None,
    scorer: EntropyScorer | None = None,
    max_empty_share: float = DEFAULT_MAX_EMPTY_SHARE,
    splits: tuple[str, ...] = (),
) -> tuple[dict[str, Any], CacheStats]:
    """Run the stage over this task's parts; returns the output manifest (or stdout summary) and cache stats.

    ``backend`` is called only when a part needs generating, so a finished run resumes without loading a model.
    The request cache is one SQLite file per part under ``cache_dir`` (one writer per file on shared disks).
    Raises :class:`~grtool.errors.DataProblem` (exit 1) when a part's share of empty candidates exceeds
    ``max_empty_share``, after finishing that part and the manifest.
    """
    from grtool.llm.stage_runner import Guard, ModelStage, Output, part_rows
    from grtool.store.io import InputTable
    from grtool.store.schemas import CHAINS
    from grtool.store.stage import StageSpec

    questions = InputTable.open(corpus, "questions")
    selection = SplitSelection.of(splits, corpus)
    store = TripleStore(triples)
    params = selection.record({**settings.params(), "backend": backend_name, "model": model_name, "prompt_sha256": prompt.sha256()})
    if prompt.cannot_answer:  # read back by `filters apply` as its --cannot-answer default
        params["cannot_answer"] = prompt.cannot_answer
    inputs = [questions.source, store.path]  # standard input too ("-"): a run from it is never resumed with other rows
    synth = ChainSynthesizer(store, settings, prompt, scorer=scorer, selection=selection)

    def part_fn(part: Part) -> None:
        path = questions.parts[part.index]
        source = f"{questions.source}/{path.name}" if path is not None else "<stdin>"
        for position, rows in question_batches(questions.iter_part(part.index), QUESTION_BATCH):
            synth.run_batch(part.llm, rows, part.shard, source, position, part.meter, part.empty)

    def planned(parts: list[int]) -> int | None:
        rows = part_rows(questions, parts)
        return None if None in rows else sum(rows) * settings.candidates  # type: ignore[arg-type]

    stage = ModelStage(
        "chains", "rows", [Output(out, StageSpec("chains", CHAINS, params, inputs=[str(p) for p in inputs]))], questions.num_parts,
        backend, model_name, cache_dir=cache_dir, overwrite=overwrite, num_shards=num_shards, shard_index=shard_index, planned=planned,
        guard=Guard(
            max_empty_share, "candidate chains", "are empty", _recorded_empty, _with_recorded_examples,
            where=lambda part: f" (kept in {Path(out) / (part + '.parquet')}, counter candidates_empty)",
            redo="from the request cache, which keeps the empty answers: change the model or prompt, or pass --no-cache",
        ),
    )  # fmt: skip
    run = stage.run(part_fn)
    return run.manifests[0], run.cache


def run_summary(out: str, manifest: Manifest, stats: CacheStats) -> dict[str, Any]:
    """What a finished ``synthesize`` call did, from the output manifest (true also for a resumed run) and
    this process's cache statistics: the summary line, and ``--json``."""
    counters = manifest.counters
    extra = counters.extra
    return {
        "out": out,
        "complete": manifest.complete,
        "questions": extra.get("questions", 0),
        "questions_chained": extra.get("questions_chained", 0),
        "rows": counters.out,
        "rejected": dict(counters.rejected),
        "docids": extra.get("docids", 0),
        "docids_flipped": extra.get("docids_flipped", 0),
        "docids_not_offered": extra.get("docids_not_offered", 0),
        "cache_hits": stats.hits,
        "cache_generated": stats.misses,
    }


def _recorded_empty(writer: Any, name: str) -> EmptyOutputs:
    """A finished part's candidates and empty candidates, from its committed shard record."""
    record = writer.records.get(name)  # a ShardRecord
    rows, extra = (record.rows, record.counters.extra) if record is not None else (0, {})
    return EmptyOutputs(name, rows, extra.get("candidates_empty", 0), resumed=True)


def _with_recorded_examples(writer: Any, result: EmptyOutputs) -> EmptyOutputs:
    """Examples for the guard's message from the part's rows (read only when the guard trips)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from grtool.store.reading import arrow_source

    path = Path(writer.path) / f"{result.part}.parquet"
    if not path.is_file():
        return result
    table = pq.read_table(arrow_source(path), columns=["qid", "candidate", "text", "finish_reason"])
    blank = table.filter(pc.equal(pc.utf8_trim_whitespace(table["text"]), ""))
    for row in blank.slice(0, 3).to_pylist():
        result.examples.append(example(f"{row['qid']} candidate {row['candidate']}", "empty output", row["finish_reason"], row["text"] or ""))
    return result


class ChainsReport(Report, kw_only=True):
    """``chains synthesize --json`` and ``chains gold --json`` (which has no cache figures)."""

    out: str
    complete: bool
    questions: int
    questions_chained: int
    rows: int
    rejected: dict[str, int]
    docids: int
    docids_flipped: int
    docids_not_offered: int | msgspec.UnsetType = msgspec.UNSET
    cache_hits: int | msgspec.UnsetType = msgspec.UNSET
    cache_generated: int | msgspec.UnsetType = msgspec.UNSET
