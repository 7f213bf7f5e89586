"""`filters apply`: run the rules over every candidate of a chains stage, write the candidates that pass, reject
the rest with reasons, and keep one chain per question among those that pass.

Work is per input part (one output part each, so sharding and resume follow the chains stage) and per Arrow
batch: the docids of a whole batch are hashed and resolved against the triple index at once, then each chain
goes through the rules in plain Python. Passing candidates are taken from the input batch unchanged (unless
``--redundant trim`` rewrote them) except ``selected``, which marks the kept chain: the lowest ``score``
among the passing candidates of a question (GReG's rule applied after the filters), the first passing one in
candidate order when no passing candidate has a score. `chains synthesize` writes all candidates of a question
into one part, so the choice is made per part, after its last batch.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from grtool.errors import InputError
from grtool.docid.lookup import TripleLookup, docid_hashes
from grtool.docid.lookup_files import open_lookup
from grtool.filters.questions import QuestionLookup
from grtool.filters.report import build_report
from grtool.filters.rules import RULES, Chain, Failure, Settings, redundant_steps, trim
from grtool.docid import check_markers
from grtool.vocab.text import Markers, parse_markers
from grtool.log import log
from grtool.store.coverage import check_triples_cover
from grtool.store.io import InputTable
from grtool.store.partloop import Bar, LoopPart, Output, PartLoop
from grtool.store.questions import SplitSelection
from grtool.store.records import Manifest, resolve_stage
from grtool.store.reading import iter_shard_batches, open_shard
from grtool.store.schemas import CHAINS
from grtool.store.layout import REJECTS_DIR
from grtool.store.stage import StageSpec

BATCH_ROWS = 16_384
EXAMPLES_PER_REASON = 2
UNKNOWN_QID = "unknown-qid"


@dataclass
class FilterConfig:
    rules: tuple[str, ...] = tuple(RULES)
    settings: Settings = field(default_factory=Settings)
    all_candidates: bool = False
    # --docid-start / --docid-end; None: as recorded by the stage that wrote the chains. apply_filters resolves
    # them into settings.markers (see chain_markers), so a chains stage is read with the markers it was written in.
    docid_start: str | None = None
    docid_end: str | None = None
    splits: tuple[str, ...] = ()  # --split: only chains of these splits' questions are read

    def params(self) -> dict[str, Any]:
        s = self.settings
        params = {
            "rules": list(self.rules),
            "min_recall": s.min_recall,
            "redundant": s.redundant,
            "max_docids": s.max_docids,
            "max_chain_tokens": s.max_chain_tokens,
            "all_candidates": self.all_candidates,
            "keep": "every passing candidate" if self.all_candidates else "lowest score among passing candidates",
            "markers": [s.markers.start, s.markers.end],
        }
        if s.cannot_answer:  # only when given: a manifest written before the option stays resumable
            params["cannot_answer"] = s.cannot_answer
        return SplitSelection(self.splits).record(params)


@dataclass
class Outcome:
    """What happened to one batch."""

    kept: list[int] = field(default_factory=list)  # row indexes of the passing candidates
    rewritten: dict[int, Chain] = field(default_factory=dict)  # trimmed chains among the passing
    failures: dict[int, list[Failure]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    datasets: list[str] = field(default_factory=list)  # per row


class ChainFilter:
    """The rules with their lookups, ready to judge batches of chains."""

    def __init__(self, config: FilterConfig, questions: QuestionLookup, triples: TripleLookup):
        self.config = config
        self.questions = questions
        self.triples = triples
        self.pattern = config.settings.markers.pattern()
        self.checks = [RULES[r] for r in config.rules]
        self.trim = config.settings.redundant == "trim" and "redundant" in config.rules

    def judge(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, Outcome]:
        """Judge every candidate of one batch (the choice among the passing ones is :class:`Chooser`'s)."""
        out = Outcome()
        n = batch.num_rows
        if n == 0:
            return batch, out
        docid_col = batch.column("docids")
        lengths = pc.fill_null(pc.list_value_length(docid_col), 0).to_pylist()
        flat = pc.list_flatten(docid_col)
        resolved = self.triples.resolve(docid_hashes(flat, self.config.settings.markers))
        flat_docids = flat.to_pylist()
        qids = batch.column("qid").to_pylist()
        texts = batch.column("text").to_pylist()
        flipped_col = batch.column("flipped").to_pylist()
        settings, pattern, questions = self.config.settings, self.pattern, self.questions

        judged_in: Counter[str] = Counter()  # per dataset; turned into counter keys once per batch
        kept_in: Counter[str] = Counter()
        at = 0
        for i in range(n):
            end = at + lengths[i]
            text = texts[i] or ""
            question = questions.get(qids[i])
            chain = Chain(
                qids[i],
                text,
                flat_docids[at:end],
                flipped_col[i],
                parse_markers(text, settings.markers, pattern),
                resolved.triple[at:end],
                resolved.docs[at:end],
                question,
            )
            at = end
            if self.trim and not chain.parsed.problem and chain.parsed.docids == chain.docids:
                # Removing a step can make its neighbours adjacent repeats: trim until none is left.
                while steps := redundant_steps(chain):
                    thoughts = frozenset(k for k, code in steps if code == "redundant-repeated-step")
                    chain = trim(chain, [k for k, _ in steps], settings, pattern, thoughts)
                    out.rewritten[i] = chain
            failures = [f for check in self.checks if (f := check(chain, settings)) is not None]
            if question is None:
                failures.insert(0, Failure(UNKNOWN_QID, f"qid {qids[i]!r} is not in the corpus questions"))
            dataset = question.dataset if question is not None else "unknown"
            out.datasets.append(dataset)
            judged_in[dataset] += 1
            if failures:
                out.failures[i] = failures
                for f in failures:
                    rule = rule_of(f.code)
                    out.counts[f"rule/{rule}"] += 1
                    out.counts[f"reason/{f.code}"] += 1
                    out.counts[f"dataset/{dataset}/rule/{rule}"] += 1
                out.rewritten.pop(i, None)
            else:
                out.kept.append(i)
                kept_in[dataset] += 1
                if i in out.rewritten:
                    out.counts["trimmed"] += 1
        for what, per_dataset in (("in", judged_in), ("passed", kept_in)):
            for dataset, count in per_dataset.items():
                out.counts[f"dataset/{dataset}/{what}"] += count
        return batch, out


def chain_markers(manifest: Manifest | None, start: str | None, end: str | None) -> Markers:
    """The docid markers: as given, else as recorded in the chains manifest (`chains synthesize` and
    `filters apply` write ``params.markers``; None: chains on stdin), else the standard ones."""
    recorded = manifest.params.get("markers") if manifest is not None else None
    default = Markers(*recorded) if isinstance(recorded, list) and len(recorded) == 2 and all(isinstance(m, str) for m in recorded) else Markers()
    return check_markers(Markers(start if start is not None else default.start, end if end is not None else default.end))


def rule_of(code: str) -> str:
    """The rule a reason code belongs to (codes are the rule name, or the rule name and a suffix)."""
    if code == UNKNOWN_QID:
        return "question"
    for rule in RULES:
        if code == rule or code.startswith(rule + "-"):
            return rule
    return code


def _batches(table: InputTable, index: int) -> Iterator[pa.RecordBatch]:
    part = table.parts[index]
    if part is None:  # JSON Lines on stdin
        for rows in table.iter_part(index, batch_size=BATCH_ROWS):
            try:
                yield pa.RecordBatch.from_pylist(rows, schema=CHAINS)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
                raise InputError(f"<stdin>: chains rows do not fit the chains schema ({e})") from None
        return
    pf = open_shard(part)
    missing = set(CHAINS.names) - set(pf.schema_arrow.names)
    if missing:
        raise InputError(f"{part}: not a chains table (missing columns {', '.join(sorted(missing))})")
    yield from iter_shard_batches(part, CHAINS.names, BATCH_ROWS)


def _passed(batch: pa.RecordBatch, out: Outcome) -> pa.Table:
    """The passing candidates of a batch, as read except for trimmed chains."""
    if not out.rewritten:
        return pa.Table.from_batches([batch]).take(pa.array(out.kept, pa.int64()))
    rows = []
    for i in out.kept:
        row = batch.slice(i, 1).to_pylist()[0]
        chain = out.rewritten.get(i)
        if chain is not None:
            row.update(text=chain.text, docids=chain.docids, flipped=chain.flipped)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=batch.schema)


@dataclass(slots=True)
class _QuestionState:
    dataset: str
    best: tuple | None = None  # sort key of the best passing candidate so far; its output position last
    common: set[str] | None = None  # the rules every failing candidate so far failed


class Chooser:
    """Per part: which passing candidate each question keeps, and the rules that lost the others."""

    def __init__(self, all_candidates: bool):
        self.all_candidates = all_candidates
        self.questions: dict[str, _QuestionState] = {}
        self.passed = 0  # passing candidates so far = the output position of the next one

    def add(self, batch: pa.RecordBatch, out: Outcome) -> None:
        qids = batch.column("qid").to_pylist()
        candidates = batch.column("candidate").to_pylist()
        scores = batch.column("score").to_pylist()
        passing = set(out.kept)
        for i, qid in enumerate(qids):
            q = self.questions.get(qid)
            if q is None:
                q = self.questions[qid] = _QuestionState(out.datasets[i])
            if i in passing:
                score = scores[i]
                unscored = score is None or score != score  # None or NaN
                # Lowest score first; unscored ones after, in candidate order; the position breaks ties.
                order = candidates[i] if candidates[i] is not None else self.passed
                key = (unscored, 0.0 if unscored else score, order, self.passed)
                if q.best is None or key < q.best:
                    q.best = key
                self.passed += 1
            else:
                failed = {rule_of(f.code) for f in out.failures.get(i, ())}
                q.common = failed if q.common is None else q.common & failed

    def selected(self) -> pa.Array:
        """``selected`` for the part's passing candidates, in output order."""
        if self.all_candidates:
            return pa.array([True] * self.passed, pa.bool_())
        mask = [False] * self.passed
        for q in self.questions.values():
            if q.best is not None:
                mask[q.best[-1]] = True
        return pa.array(mask, pa.bool_())

    def counts(self) -> Counter[str]:
        c: Counter[str] = Counter()
        for q in self.questions.values():
            d = q.dataset
            c[f"dataset/{d}/questions"] += 1
            if q.best is not None:
                c[f"dataset/{d}/questions_kept"] += 1
            elif q.common:
                for rule in q.common:  # no candidate passed this rule
                    c[f"dataset/{d}/lost/{rule}"] += 1
            else:
                c[f"dataset/{d}/lost/mixed"] += 1  # every rule passed by some candidate, never all by one
        c["kept"] = self.passed if self.all_candidates else sum(q.best is not None for q in self.questions.values())
        return c


def _reject(sh, batch: pa.RecordBatch, out: Outcome, examples: dict[str, list[dict]]) -> None:
    if not out.failures:
        return
    records = batch.take(pa.array(list(out.failures), pa.int64())).to_pylist()  # one conversion per batch
    for record, failures in zip(records, out.failures.values()):
        record["reasons"] = [f.code for f in failures]
        detail = "; ".join(f"{f.code}: {f.detail}" for f in failures)
        sh.reject(record, failures[0].code, source="filters", detail=detail)
        for f in failures:
            bucket = examples.setdefault(f.code, [])
            if len(bucket) < EXAMPLES_PER_REASON:
                bucket.append(_example(record, f.code, detail))


def _example(record: dict, code: str, detail: str) -> dict:
    return {"qid": record.get("qid"), "candidate": record.get("candidate"), "reason": code, "detail": detail, "text": record.get("text")}


def apply_filters(
    chains: str | Path,
    corpus: str | Path,
    triples: str | Path,
    out: str | Path,
    config: FilterConfig,
    *,
    overwrite: bool = False,
    num_shards: int | None = None,
    shard_index: int | None = None,
) -> dict[str, Any]:
    """Filter a chains stage into ``out``; returns the report (see :mod:`grtool.filters.report`)."""
    source = InputTable.open(chains, "chains")
    chains_manifest = source.manifest
    markers = chain_markers(chains_manifest, config.docid_start, config.docid_end)
    # --cannot-answer: as given, else the sentence `chains synthesize --cannot-answer` asked for
    cannot_answer = config.settings.cannot_answer or (chains_manifest.params.get("cannot_answer") if chains_manifest is not None else None) or None
    config = replace(config, settings=replace(config.settings, markers=markers, cannot_answer=cannot_answer))
    for path, what in ((corpus, "corpus"), (triples, "triples")):
        if not Path(path).exists():
            raise InputError(f"{path}: no such {what} directory")
    check_triples_cover(triples, corpus)
    selected = SplitSelection.of(config.splits, corpus).qids(corpus)
    questions = QuestionLookup.build(corpus)
    index = open_lookup(triples)
    log.info("lookups: %d questions, %d triples; docid markers %s %s", len(questions), index.count, markers.start, markers.end)
    judge = ChainFilter(config, questions, index)

    inputs = [source.source]  # standard input too ("-"): a run from it is never resumed with other rows
    # the stages it reads, a run directory resolved: what else a run directory holds (a plot, a report) is not its input
    spec = StageSpec("chains", CHAINS, params=config.params(), inputs=[*inputs, str(resolve_stage(corpus, "questions")), str(resolve_stage(triples, "triples"))])
    loop = PartLoop([Output(out, spec)], source.num_parts, overwrite=overwrite, num_shards=num_shards, shard_index=shard_index)
    counts: Counter[str] = Counter()
    examples: dict[str, list[dict]] = {}

    def filter_part(part: LoopPart) -> None:
        sh = part.shard
        chooser, passed = Chooser(config.all_candidates), []
        for batch in _batches(source, part.index):
            batch, left_out = selected.filter(batch)
            if left_out:  # chains of questions outside --split: not read (counted, not rejected)
                sh.count("not_selected", left_out)
                counts["not_selected"] += left_out
            if not batch.num_rows:
                continue
            judged, outcome = judge.judge(batch)
            sh.count_in(judged.num_rows)
            passed.append(_passed(judged, outcome))
            chooser.add(judged, outcome)
            _reject(sh, judged, outcome, examples)
            for key, value in outcome.counts.items():
                sh.count(key, value)
            counts.update(outcome.counts)
        if passed:  # written once the part's questions are complete: `selected` marks the kept chains
            table = pa.concat_tables(passed)
            at = table.schema.get_field_index("selected")
            sh.write_table(table.set_column(at, table.schema.field(at), chooser.selected()))
        chosen = chooser.counts()
        for key, value in chosen.items():
            sh.count(key, value)
        counts.update(chosen)

    with _collector_paused():
        loop.run(filter_part, Bar("filtering chains"))
    (manifest,) = loop.finish()
    if manifest is not None:  # None: the rows went to stdout
        counts = Counter(manifest.counters.extra)
        examples = examples_from_rejects(Path(out), counts, examples)
    return build_report(counts, examples, rules=tuple(config.rules), all_candidates=config.all_candidates, settings=config.params())


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Judging allocates no reference cycles, but each full collection would re-scan the lookups' millions of
    objects (about a tenth of the judging time at 200K chains); the collector resumes afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def examples_from_rejects(stage: Path, counts: Counter[str], have: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Two examples per reason, topped up from the stage's rejects (parts done by earlier runs or tasks)."""
    examples = {k: list(v) for k, v in have.items()}
    wanted = {key.split("/", 1)[1] for key in counts if key.startswith("reason/")}

    def short() -> set[str]:
        return {code for code in wanted if len(examples.get(code, [])) < EXAMPLES_PER_REASON}

    seen = {(e["qid"], e["candidate"]) for v in examples.values() for e in v}
    for path in sorted((stage / REJECTS_DIR).glob("part-*.jsonl")):
        if not short():
            break
        with open(path, "rb") as f:
            for line in f:
                entry = orjson.loads(line)
                record = entry.get("record") or {}
                if (record.get("qid"), record.get("candidate")) in seen:
                    continue
                for code in record.get("reasons") or [entry.get("reason")]:
                    if code in short():
                        examples.setdefault(code, []).append(_example(record, code, entry.get("detail") or ""))
                if not short():
                    break
    return examples
