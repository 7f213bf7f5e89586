"""Benchmark `filters apply`: chains/s end to end (stage directories in and out) against a naive filter.

Generates a corpus of questions with two gold documents each, 8 triples per document, and one selected
chain per question: mostly good, some with a hallucinated docid, a repeated retrieval, a flipped triple or a
wrong answer. The naive baseline reads rows as dicts, keeps the docids in a dict of strings, and writes kept
rows one dict at a time. Both run on one core (polars limited to one thread) and must keep the same chains.

    .venv/bin/python bench/filters.py           # 200K chains (the issue's size)
    .venv/bin/python bench/filters.py --small   # 20K chains
"""

from __future__ import annotations

import os

os.environ.setdefault("POLARS_MAX_THREADS", "1")

import argparse
import random
import resource
import shutil
import tempfile
import time
from pathlib import Path

from grtool.filters.apply import FilterConfig, apply_filters
from grtool.vocab.text import Markers, conclusion, contains_answer, normalize_answer, parse_markers, says_cannot_answer
from grtool.log import configure
from grtool.store.schemas import CHAINS, DOCUMENTS, QUESTIONS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter, iter_rows

S, E = "<docid_start>", "<docid_end>"
ROWS_PER_PART = 50_000


def write(path: Path, table: str, schema, rows: list[dict]) -> None:
    parts = max(1, -(-len(rows) // ROWS_PER_PART))
    stage = StageWriter(path, StageSpec(table, schema), num_parts=parts)
    for p in range(parts):
        with stage.shard(p) as sh:
            chunk = rows[p * ROWS_PER_PART : (p + 1) * ROWS_PER_PART]
            sh.count_in(len(chunk))
            sh.write_rows(chunk)
    stage.finish()


def generate(root: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    questions, documents, triples, chains = [], [], [], []
    for i in range(n):
        gold = [f"d{i}a", f"d{i}b"]
        facts = []
        for g in gold:
            documents.append({"doc_id": g, "title": f"Entity {g}", "text": f"Entity {g} is described here.", "datasets": ["bench"]})
            for k in range(8):
                h, r, t = f"Entity {g}", f"relation {k}", f"Value {g}-{k}"
                triples.append({"doc_id": g, "idx": k, "head": h, "relation": r, "tail": t, "docid": f"{S}{h}, {r}, {t}{E}"})
                facts.append((h, r, t))
        answer = f"Value {gold[1]}-3"
        questions.append(
            {
                "qid": f"q{i}",
                "dataset": ["hotpotqa", "musique"][i % 2],
                "split": "dev",
                "question": f"What about {gold[0]}?",
                "answer": answer,
                "answer_aliases": [],
                "gold_doc_ids": gold,
                "type": None,
                "answerable": True,
                "meta": "{}",
            }
        )
        first, second = facts[0], facts[8 + 3]
        d1, d2 = f"{S}{first[0]}, {first[1]}, {first[2]}{E}", f"{S}{second[0]}, {second[1]}, {second[2]}{E}"
        kind = rng.random()
        if kind < 0.1:  # hallucinated
            d2 = f"{S}{second[0]}, invented, thing{E}"
        elif kind < 0.2:  # flipped second hop
            d2 = f"{S}{second[2]}, {second[1]}, {second[0]}{E}"
        docids = [d1, d2] + ([d1] if 0.2 <= kind < 0.3 else [])
        said = "Somewhere Else" if 0.3 <= kind < 0.35 else answer
        text = f"The question starts from {gold[0]}: {d1}. That leads on to {d2}." + (f" Again {d1}." if len(docids) == 3 else "") + f" So the answer is {said}."
        chains.append(
            {
                "qid": f"q{i}",
                "candidate": 0,
                "text": text,
                "docids": docids,
                "flipped": [False, 0.1 <= kind < 0.2] + [False] * (len(docids) - 2),
                "selected": True,
                "score": 0.1,
                "model": "bench",
                "temperature": 0.0,
                "finish_reason": "stop",
            }
        )
    write(root / "corpus" / "questions", "questions", QUESTIONS, questions)
    write(root / "corpus" / "documents", "documents", DOCUMENTS, documents)
    write(root / "triples", "triples", TRIPLES, triples)
    write(root / "chains", "chains", CHAINS, chains)


def naive(root: Path, out: Path) -> int:
    """The same rules written plainly: dicts of strings, a dict per row, one row at a time."""
    docs_of: dict[str, set[str]] = {}
    for t in iter_rows(root / "triples"):
        docs_of.setdefault(t["docid"], set()).add(t["doc_id"])
        docs_of.setdefault(f"{S}{t['tail']}, {t['relation']}, {t['head']}{E}", set()).add(t["doc_id"])
    questions = {q["qid"]: q for q in iter_rows(root / "corpus" / "questions")}
    markers = Markers()
    pattern = markers.pattern()
    stage = StageWriter(out, StageSpec("chains", CHAINS), num_parts=1)
    kept = 0
    rows: list[dict] = []
    with stage.shard(0) as sh:
        for row in iter_rows(root / "chains"):
            sh.count_in()
            q = questions.get(row["qid"])
            parsed = parse_markers(row["text"], markers, pattern)
            ok = q is not None and parsed.problem is None and parsed.docids == row["docids"] and bool(row["docids"])
            seen, got = set(), set()
            for d in row["docids"]:
                docs = docs_of.get(d, set())
                ok = ok and bool(docs) and bool(docs & set(q["gold_doc_ids"])) and d not in seen and not docs <= got
                seen.add(d)
                got |= docs
            if ok:
                tail = len(row["text"]) - len(parsed.outside[-1])
                answers = (normalize_answer(q["answer"]),)
                ok = got >= set(q["gold_doc_ids"]) and not says_cannot_answer(row["text"][tail:])
                ok = ok and contains_answer(normalize_answer(conclusion(row["text"], tail)), answers)
                ok = ok and len(row["docids"]) <= 10 and len(row["text"].split()) <= 512
            if ok:
                rows.append(row)
                kept += 1
            else:
                sh.reject(row, "failed")
            if len(rows) == 10_000:
                sh.write_rows(rows)
                rows = []
        sh.write_rows(rows)
    stage.finish()
    return kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", type=int, default=200_000)
    ap.add_argument("--small", action="store_true", help="20K chains")
    args = ap.parse_args()
    n = 20_000 if args.small else args.chains
    configure(quiet=True)
    root = Path(tempfile.mkdtemp(prefix="grtool-bench-filters-"))
    try:
        t = time.perf_counter()
        generate(root, n)
        print(f"generated {n:,} questions/chains, {16 * n:,} triples in {time.perf_counter() - t:.1f}s")

        from grtool.docid.lookup_files import open_lookup
        from grtool.filters.questions import QuestionLookup

        # CPU seconds of this process (polars on one thread): a one-core rate even on a shared machine.
        c = time.process_time()
        open_lookup(root / "triples")
        QuestionLookup.build(root / "corpus")
        lookups_cpu = time.process_time() - c

        t, c = time.perf_counter(), time.process_time()
        report = apply_filters(root / "chains", root / "corpus", root / "triples", root / "out", FilterConfig())
        fast_s, fast_cpu = time.perf_counter() - t, time.process_time() - c
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        t, c = time.perf_counter(), time.process_time()
        kept_naive = naive(root, root / "naive")
        slow_s, slow_cpu = time.perf_counter() - t, time.process_time() - c
        assert kept_naive == report["kept"], (kept_naive, report["kept"])

        print(f"kept {report['kept']:,} of {report['chains']:,}; reasons {report['reasons']}")
        print(f"grtool filters : {n / fast_cpu:>9,.0f} chains/s per CPU-second end to end ({fast_cpu:.1f} CPU s, {fast_s:.1f} s wall; lookups {lookups_cpu:.1f} CPU s)")
        print(f"                 {n / (fast_cpu - lookups_cpu):>9,.0f} chains/s per CPU-second once the lookups are built (target >= 50,000 on one core)")
        print(f"naive          : {n / slow_cpu:>9,.0f} chains/s per CPU-second end to end ({slow_cpu:.1f} CPU s, {slow_s:.1f} s wall)")
        print(f"ratio          : {slow_cpu / fast_cpu:.1f}x")
        print(f"peak RSS after grtool run: {rss:.0f} MB ({16 * n:,} triples)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
