"""Benchmark `corpus overlap`: questions/s of the vectorized computation against a naive per-question one.

Generates HotpotQA-like data: every question has two gold documents of ~80 tokens (title + text), and half
of the questions copy a span of one of their gold documents. The naive baseline is the definition written
plainly: NLTK tokenizer, `nltk.util.ngrams`, Python sets, one question at a time. Both run in this process
on one core (polars limited to one thread), and must agree on every number.

    .venv/bin/python bench/overlap.py            # 300K questions (the issue's size)
    .venv/bin/python bench/overlap.py --small    # 20K questions, for a quick look
The naive baseline runs on the first 30K questions (--baseline-questions); rates are per question.
"""

from __future__ import annotations

import os

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # one core, before polars is imported

import argparse
import random
import resource
import time

from nltk.tokenize import RegexpTokenizer
from nltk.util import ngrams

from grtool.corpus.overlap import DEFAULT_NS, document_text, overlap_of_rows, word_regex


def generate(n_questions: int, seed: int = 0) -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str]]]:
    rng = random.Random(seed)
    vocab = [f"{rng.choice('bcdfghklmnprstvz')}{rng.choice('aeiou')}{rng.choice('lmnrst')}{i}" for i in range(30_000)]
    common = ["the", "of", "in", "a", "and", "was", "is", "by", "for", "to"]
    docs: list[tuple[str, str]] = []
    for _ in range(2 * n_questions):
        words = [rng.choice(common) if rng.random() < 0.35 else rng.choice(vocab) for _ in range(78)]
        title = " ".join(w.capitalize() for w in rng.choices(vocab, k=2))
        docs.append((title, " ".join(words[:40]) + ", " + " ".join(words[40:]) + "."))
    rows = []
    for i in range(n_questions):
        gold = [2 * i, 2 * i + 1]
        words = [rng.choice(vocab) for _ in range(rng.randint(8, 18))]
        if i % 2 == 0:  # over-specified: copies a span of a gold document
            src = docs[gold[rng.randint(0, 1)]][1].split()
            at = rng.randint(0, len(src) - 12)
            words[2:2] = src[at : at + rng.randint(4, 12)]
        rows.append((["hotpotqa", "musique"][i % 2], "What " + " ".join(words) + "?", gold))
    return rows, docs


def naive(rows, docs, ns) -> dict[str, dict[int, float]]:
    tokenizer = RegexpTokenizer(r"\w+")
    sums: dict[str, dict[int, float]] = {}
    counts: dict[str, dict[int, int]] = {}
    for dataset, question, gold in rows:
        q_tokens = tokenizer.tokenize(question.lower())
        d_tokens = [tokenizer.tokenize(docs[d][0].lower()) + tokenizer.tokenize(docs[d][1].lower()) for d in gold]
        for n in ns:
            q_grams = set(ngrams(q_tokens, n))
            if not q_grams:
                continue
            d_grams = set()
            for tokens in d_tokens:
                d_grams.update(ngrams(tokens, n))
            sums.setdefault(dataset, {}).setdefault(n, 0.0)
            sums[dataset][n] += len(q_grams & d_grams) / len(q_grams)
            counts.setdefault(dataset, {}).setdefault(n, 0)
            counts[dataset][n] += 1
    return {ds: {n: sums[ds][n] / counts[ds][n] for n in sums[ds]} for ds in sums}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=300_000)
    ap.add_argument("--small", action="store_true", help="20K questions")
    ap.add_argument("--baseline-questions", type=int, default=30_000, help="run the slow naive baseline on the first N only")
    args = ap.parse_args()
    n_q = 20_000 if args.small else args.questions
    ns = list(DEFAULT_NS)

    t = time.perf_counter()
    rows, docs = generate(n_q)
    print(f"generated {n_q:,} questions, {len(docs):,} gold documents in {time.perf_counter() - t:.1f}s")
    texts = [document_text(*d) for d in docs]

    t = time.perf_counter()
    word_regex()  # one-time per process: NLTK is asked which characters are word characters
    setup = time.perf_counter() - t
    # CPU seconds of this process (polars on one thread): a one-core rate even on a shared machine.
    t, c = time.perf_counter(), time.process_time()
    fast = overlap_of_rows(rows, texts, ns)
    fast_wall, fast_s = time.perf_counter() - t, time.process_time() - c

    n_base = min(args.baseline_questions or n_q, n_q)
    t, c = time.perf_counter(), time.process_time()
    slow = naive(rows[:n_base], docs, ns)
    slow_wall, slow_s = time.perf_counter() - t, time.process_time() - c

    same = fast if n_base == n_q else overlap_of_rows(rows[:n_base], texts, ns)
    for ds in slow:
        for n in ns:
            assert abs(slow[ds][n] - same.mean[ds][n]) < 1e-9, (ds, n, slow[ds][n], same.mean[ds][n])
    print(f"numbers: identical to the naive computation for every dataset and n (on the {n_base:,} it ran on)")
    fast_rate = n_q / fast_s
    slow_rate = n_base / slow_s
    print(f"vectorized : {fast_rate:>10,.0f} questions per CPU-second ({fast_s:.1f} CPU s, {fast_wall:.1f} s wall for {n_q:,}; +{setup:.2f}s one-time tokenizer setup)")
    print(f"naive      : {slow_rate:>10,.0f} questions per CPU-second ({slow_s:.1f} CPU s, {slow_wall:.1f} s wall for {n_base:,})")
    print(f"ratio      : {fast_rate / slow_rate:.1f}x   (target >= 20,000 questions/s on one core)")
    print(f"peak RSS   : {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    print("mean overlap n=4: " + ", ".join(f"{ds} {fast.mean[ds][4]:.3f}" for ds in sorted(fast.mean)))


if __name__ == "__main__":
    main()
