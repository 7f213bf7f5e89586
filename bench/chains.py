"""Benchmark `chains synthesize` without the model: chains/s of prompt building, triple lookup, cache reads,
citation parsing, entropy scoring and spaCy, on stored candidates, on one core; and spaCy's share of it.

Setup (untimed): a questions stage and a triples stage of generated multi-hop questions (2-4 gold documents,
8 triples each, capitalized made-up names so spaCy finds entities), then one stage run with an in-process
"model" that writes bracketed chains with top-5 logprobs from the offered triples; its answers land in the
request cache. Timed: the same run again from that cache, with a backend that fails if it is ever called.
Times are CPU time of this process (pinned to one core), which a busy shared machine does not
inflate. Baseline in the same process: spaCy's `nlp.pipe` alone over the same chain texts (the floor of any
implementation that finds entities with spaCy).

    .venv/bin/python bench/chains.py            # 50K candidates (12.5K questions x 4), the issue's size
    .venv/bin/python bench/chains.py --n 4000   # a quick run
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse
import math
import random
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from grtool.chains.docids import OfferedTriples, Triple, normalize_chain
from grtool.chains.entropy import EntropyScorer, aligned_tokens, load_nlp
from grtool.chains.prompt import ChainPrompt
from grtool.chains.synthesize import ChainSettings, synthesize
from grtool.llm.base import Generation, Messages, Sampling, TokenLogprobs
from grtool.llm.cache import RequestCache
from grtool.log import configure
from grtool.store.schemas import QUESTIONS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter

S, E = "<docid_start>", "<docid_end>"
CANDIDATES = 4
SYLLABLES = ["ka", "lo", "mer", "tan", "vi", "sor", "del", "ruh", "an", "bel", "cor", "ni", "pas", "ten", "gor", "ul"]
RELATIONS = ["director", "place of birth", "date of birth", "spouse", "educated at", "founded by", "member of", "award received"]
PLACES = ["Port", "Lake", "Mount", "North", "San"]
ROWS_PER_PART = 50_000


def name(rng: random.Random, words: int = 2) -> str:
    return " ".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize() for _ in range(words))


def write(path: Path, table: str, schema, rows: list[dict], parts: int) -> None:
    stage = StageWriter(path, StageSpec(table, schema), num_parts=parts)
    size = -(-len(rows) // parts)
    for p in range(parts):
        with stage.shard(p) as sh:
            chunk = rows[p * size : (p + 1) * size]
            sh.count_in(len(chunk))
            sh.write_rows(chunk)
    stage.finish()


def make_inputs(root: Path, questions: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    qrows, trows = [], []
    for i in range(questions):
        gold = [f"d{i}-{k}" for k in range(rng.randint(2, 4))]
        person = name(rng)
        for g in gold:
            head = name(rng) if rng.random() < 0.5 else f"{rng.choice(PLACES)} {name(rng, 1)}"
            for k in range(8):
                tail = str(rng.randint(1800, 2020)) if "date" in RELATIONS[k] else name(rng)
                trows.append({"doc_id": g, "idx": k, "head": head, "relation": RELATIONS[k], "tail": tail, "docid": f"{S}{head}, {RELATIONS[k]}, {tail}{E}"})
        qrows.append(
            {"qid": f"q{i}", "dataset": "bench", "split": "dev", "question": f"Where was the spouse of the director of {person} born?",
             "answer": "x", "answer_aliases": [], "gold_doc_ids": gold, "type": "compositional", "answerable": True, "meta": "{}"}
        )  # fmt: skip
    parts = max(1, -(-questions // ROWS_PER_PART))
    write(root / "corpus" / "questions", "questions", QUESTIONS, qrows, parts)
    write(root / "triples", "triples", TRIPLES, trows, max(1, -(-len(trows) // 500_000)))


_OFFERED = re.compile(r"^\d+\. \[(.*)\]$", re.M)
_PIECES = re.compile(r"\s*[\w\-']+|\s*[^\w\s]")


class WritingModel:
    """Setup only: writes a chain over 2-3 offered triples (one sometimes flipped) with random top-5 logprobs."""

    name, model = "bench", "bench-model"

    def generate(self, prompts: list[Messages], sampling: Sampling) -> list[Generation]:
        out = []
        for msgs in prompts:
            rng = random.Random(f"{msgs[-1]['content']}|{sampling.seed}")
            offered = _OFFERED.findall(msgs[-1]["content"])
            cites = [f"[{t}]" for t in rng.sample(offered, min(len(offered), rng.randint(2, 3)))]
            if rng.random() < 0.3:
                h, r, t = cites[0][1:-1].split(", ", 2)
                cites[0] = f"[{t}, {r}, {h}]"
            steps = [f"{rng.choice(['First', 'Then', 'Next'])} the chain retrieves {c} to learn more." for c in cites]
            text = " ".join(steps) + f" So the answer is {name(rng)}."
            lps = []
            for piece in _PIECES.findall(text):
                probs = sorted((rng.random() ** 3 for _ in range(5)), reverse=True)
                z = sum(probs)
                top = {piece: math.log(probs[0] / z), **{f"<alt{j}>": math.log(p / z) for j, p in enumerate(probs[1:])}}
                lps.append(TokenLogprobs(piece, top[piece], top))
            out.append(Generation(text, "stop", 900, len(lps), lps))
        return out


class NoScores:
    """Setup only: the warm-up run fills the cache; its selection is thrown away."""

    def score(self, candidates):
        return [None] * len(candidates)


class TimedNLP:
    """spaCy's pipeline with the CPU time spent inside ``pipe`` counted, to measure its share within the stage."""

    def __init__(self, nlp):
        self.nlp, self.seconds = nlp, 0.0

    def pipe(self, texts, **kw):
        it = self.nlp.pipe(texts, **kw)
        while True:
            t = time.process_time()
            try:
                doc = next(it)
            except StopIteration:
                self.seconds += time.process_time() - t
                return
            self.seconds += time.process_time() - t
            yield doc


class StoredOnly:
    """Timed run: every answer must come from the cache."""

    name, model = "bench", "bench-model"

    def generate(self, prompts: list[Messages], sampling: Sampling) -> list[Generation]:
        raise RuntimeError(f"bench: {len(prompts)} requests missed the cache")


def pin_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000, help="stored candidates (questions = n / 4)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    configure(quiet=True)
    pin_one_core()
    questions = max(1, args.n // CANDIDATES)
    root = Path(tempfile.mkdtemp(prefix="grtool-bench-chains-"))
    settings = ChainSettings(candidates=CANDIDATES, select="entropy", top_logprobs=5)
    prompt = ChainPrompt.load()
    try:
        t = time.perf_counter()
        make_inputs(root, questions)
        common = dict(backend_name="bench", model_name="bench-model", cache_dir=root / "cache")
        synthesize(str(root / "corpus"), str(root / "triples"), str(root / "warm"), WritingModel, settings, prompt, scorer=NoScores(), **common)
        print(f"setup: {questions:,} questions, {questions * CANDIDATES:,} stored candidates in {time.perf_counter() - t:.1f}s")

        timed_nlp = TimedNLP(load_nlp())  # loading the spaCy model is a one-time cost outside the timings
        t, wall = time.process_time(), time.perf_counter()
        manifest, stats = synthesize(
            str(root / "corpus"), str(root / "triples"), str(root / "chains"), StoredOnly, settings, prompt,
            scorer=EntropyScorer(timed_nlp), **common,
        )  # fmt: skip
        total, wall = time.process_time() - t, time.perf_counter() - wall
        assert stats.misses == 0 and stats.hits == questions * CANDIDATES, stats
        rows = manifest["rows"]
        extra = manifest["counters"]["extra"]

        # The same candidates, read back from the cache, for the per-piece timings below.
        gens = []
        for part in sorted((root / "cache").glob("*.sqlite")):
            cache = RequestCache(part)
            gens += [Generation.from_json(blob) for (blob,) in cache._db.execute("SELECT generation FROM generations")]
            cache.close()
        texts = [aligned_tokens(g.logprobs, g.text)[0] for g in gens]

        nlp = load_nlp()
        t = time.process_time()
        for _ in nlp.pipe(list(dict.fromkeys(texts)), batch_size=256):
            pass
        spacy_s = time.process_time() - t

        t = time.process_time()
        for g in gens:
            aligned_tokens(g.logprobs, g.text)
        entropy_s = time.process_time() - t

        offered = OfferedTriples.of(Triple("d", i, *name(random.Random(i)).split(" ", 1), "x") for i in range(40))
        t = time.process_time()
        for g in gens:
            normalize_chain(g.text, offered)
        parse_s = time.process_time() - t

        t = time.process_time()
        for i in range(questions):
            prompt.messages(f"question {i}", [("Head entity", "relation", f"tail {k}") for k in range(24)])
        prompt_s = time.process_time() - t
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    print(f"stage (cache -> chains stage), one core: {rows:,} candidates of {extra['questions_chained']:,} questions "
          f"in {total:.1f}s CPU ({wall:.1f}s wall on a shared machine; all times below are CPU time)")  # fmt: skip
    print(f"  {rows / total:,.0f} candidates/s, {extra['questions_chained'] / total:,.0f} questions/s; "
          f"{extra['docids']:,} docids ({extra['docids_flipped']:,} flipped, {extra['docids_not_offered']:,} not offered)")  # fmt: skip
    in_stage = timed_nlp.seconds
    print(f"spaCy inside the stage: {in_stage:.1f}s = {in_stage / total:.0%} of the stage's CPU time")
    print(f"baseline, spaCy nlp.pipe alone over the same texts: {spacy_s:.1f}s = {rows / spacy_s:,.0f} candidates/s; "
          f"stage / baseline: {total / spacy_s:.2f}x")  # fmt: skip
    print("everything else, pieces measured separately on the same data:")
    pieces = (("token entropies + alignment", entropy_s), ("citation parsing/normalization", parse_s), ("prompt building", prompt_s))
    for label, sec in pieces:
        print(f"  {label:44s} {sec:7.2f}s  {sec / total:5.1%}")
    rest = total - in_stage - sum(sec for _, sec in pieces)
    print(f"  {'rest (cache reads, triple lookup, Parquet)':44s} {rest:7.2f}s  {rest / total:5.1%}")
    lat = statistics.mean(len(g.logprobs) for g in gens)
    print(f"mean tokens per candidate: {lat:.0f}")


if __name__ == "__main__":
    main()
