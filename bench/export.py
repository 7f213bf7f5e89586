"""Benchmark the export/eval stage: lookup memory per million triples, recall throughput, SFT export memory.

Generates a corpus in stage directories (questions with two gold documents, ~20 triples per document, 2%
of triples repeated in a second document) and JSONL responses with three docids each (one of them flipped,
some hallucinated). Each measurement runs in a fresh child process of this run, so peak RSS is its own:

- docid→documents lookup: the hashed :class:`grtool.docid.lookup.TripleLookup` behind :class:`DocidIndex` (looked up
  in batches, as recall does) against a plain ``dict[str, list[str]]``
  (the baseline) — build time, lookups/s and peak RSS, scaled to one million triples;
- ``eval recall``: responses/s and peak RSS against a naive baseline (``json`` per line, regex docids, the
  dict index; it does not read flipped docids, so its recall is lower by the flipped half of the second hops);
- ``export sft``: chains/s and peak RSS of the bounded-memory shuffle against an in-memory baseline
  (all rows in a list, ``random.shuffle``, one ``json.dump``) at two input sizes.

    .venv/bin/python bench/export.py            # 2M triples, 300K questions, 1M responses, 300K chains
    .venv/bin/python bench/export.py --small    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from grtool.store.schemas import CHAINS, DOCUMENTS, QUESTIONS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter, iter_batches

ROWS_PER_PART = 100_000


def rss_mb() -> float:
    """Peak RSS of this process. VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the parent."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ------------------------------------------------------------------------------------------- data


def _write(path: Path, table: str, schema, rows_iter, total: int) -> None:
    parts = max(1, -(-total // ROWS_PER_PART))
    stage = StageWriter(path, StageSpec(table, schema), num_parts=parts, overwrite=True)
    batch: list[dict] = []
    part = 0
    for row in rows_iter:
        batch.append(row)
        if len(batch) == ROWS_PER_PART:
            with stage.shard(part) as sh:
                sh.count_in(len(batch))
                sh.write_rows(batch)
            part, batch = part + 1, []
    if batch or part == 0:
        with stage.shard(part) as sh:
            sh.count_in(len(batch))
            sh.write_rows(batch)
    stage.finish()


def generate(root: Path, n_triples: int, n_questions: int, n_responses: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    n_docs = max(2 * n_questions, n_triples // 20)
    vocab = [f"{rng.choice('bcdfghklmnprstvz')}{rng.choice('aeiou')}{rng.choice('lmnrst')}{i}" for i in range(50_000)]
    relations = ["date of birth", "place of birth", "director", "spouse", "member of", "located in", "founded by", "genre"]

    def doc_id(i: int) -> str:
        return f"{i:032x}"

    def triple(i: int) -> tuple[str, str, str]:
        r = random.Random(i)
        return (f"{r.choice(vocab)} {r.choice(vocab)}", r.choice(relations), f"{r.choice(vocab)}, {r.choice(vocab)}")

    def triples():
        for t in range(n_triples):
            h, r, tl = triple(t)
            d = t * n_docs // n_triples
            yield {"doc_id": doc_id(d), "idx": t % 20, "head": h, "relation": r, "tail": tl, "docid": f"<docid_start>{h}, {r}, {tl}<docid_end>"}
            if t % 50 == 0:  # a 2% collision: the same triple in another document
                yield {"doc_id": doc_id((d + 1) % n_docs), "idx": 1000 + t % 20, "head": h, "relation": r, "tail": tl, "docid": ""}

    _write(root / "triples", "triples", TRIPLES, triples(), n_triples + n_triples // 50)
    per_doc = max(1, n_triples // n_docs)

    def gold_of(q: int) -> list[int]:
        return [(2 * q) % n_docs, (2 * q + 1) % n_docs]

    def questions():
        for q in range(n_questions):
            yield {
                "qid": f"q{q}",
                "dataset": ["hotpotqa", "2wikimultihopqa", "musique"][q % 3],
                "split": "train",
                "question": "Who " + " ".join(rng.choices(vocab, k=12)) + "?",
                "answer": "x",
                "answer_aliases": [],
                "gold_doc_ids": [doc_id(d) for d in gold_of(q)],
                "type": None,
                "answerable": True,
                "meta": "{}",
            }

    _write(root / "corpus" / "questions", "questions", QUESTIONS, questions(), n_questions)
    _write(
        root / "corpus" / "documents",
        "documents",
        DOCUMENTS,
        ({"doc_id": doc_id(d), "title": vocab[d % len(vocab)], "text": "Some text.", "datasets": ["x"]} for d in range(min(n_docs, 1000))),
        min(n_docs, 1000),
    )

    def first_triple_of(d: int) -> int:
        # the triple numbers of document d are those t with t * n_docs // n_triples == d
        return -(-d * n_triples // n_docs)

    with open(root / "responses.jsonl", "wb") as f:
        for i in range(n_responses):
            q = i % n_questions
            g1, g2 = gold_of(q)
            h1, r1, t1 = triple(first_triple_of(g1) + rng.randrange(per_doc))
            parts = [f"First <docid_start>{h1}, {r1}, {t1}<docid_end>."]
            if i % 2:  # the second gold document, written tail-first
                h2, r2, t2 = triple(first_triple_of(g2))
                parts.append(f"Then [{t2}, {r2}, {h2}].")
            parts.append("Also <docid_start>" + f"{rng.choice(vocab)}, invented, {rng.choice(vocab)}" + "<docid_end>" if i % 5 == 0 else "Done.")
            f.write(orjson.dumps({"qid": f"q{q}", "response": " ".join(parts)}) + b"\n")


def write_chains(path: Path, n_chains: int, n_questions: int) -> None:
    text = "Reasoning step by step about the question. " * 12 + "<docid_start>a, b, c<docid_end>"
    rows = (
        {
            "qid": f"q{i % n_questions}",
            "candidate": i // n_questions,
            "text": text,
            "docids": ["<docid_start>a, b, c<docid_end>"],
            "flipped": [False],
            "selected": True,
            "score": 0.0,
            "model": "m",
            "temperature": 0.0,
            "finish_reason": "stop",
        }
        for i in range(n_chains)
    )
    _write(path, "chains", CHAINS, rows, n_chains)


# ---------------------------------------------------------------------------------------- workers


def _key(h: str, r: str, t: str) -> str:
    from grtool.docid import triple_key

    return triple_key(h, r, t)


def worker_index(kind: str, root: Path) -> dict:
    base = current_rss_mb()
    start = time.perf_counter()
    if kind == "grtool":
        from grtool.vocab.readers import DocidIndex

        index = DocidIndex.build(root / "triples")
        lookup = None
        n = index.triples
        lk = index.lookup
        structure_mb = (sum(a.nbytes for a in (lk.fkeys, lk.fdocs, lk.bkeys, lk.bfwd, lk.doc_hashes, lk.doc_offsets)) + len(lk.doc_text)) / 2**20
    else:
        table: dict[str, list[str]] = {}
        n = 0
        for batch in iter_batches(root / "triples", columns=["doc_id", "head", "relation", "tail"]):
            cols = [batch.column(c).to_pylist() for c in ("doc_id", "head", "relation", "tail")]
            for d, h, r, t in zip(*cols):
                table.setdefault(_key(h, r, t), []).append(d)
                n += 1
        lookup = table.get
        structure_mb = None
    build = time.perf_counter() - start
    held = current_rss_mb() - base
    keys = []
    for batch in iter_batches(root / "triples", columns=["head", "relation", "tail"]):
        keys += [_key(h, r, t) for h, r, t in zip(*(batch.column(c).to_pylist() for c in ("head", "relation", "tail")))]
        if len(keys) >= 200_000:
            break
    start = time.perf_counter()
    if lookup is None:
        for i in range(0, len(keys), 4096):
            index.resolve_many(keys[i : i + 4096])
    else:
        for k in keys:
            lookup(k)
    per_lookup = (time.perf_counter() - start) / len(keys)
    return {"triples": n, "build_s": build, "lookup_us": per_lookup * 1e6, "rss_mb": held, "structure_mb": structure_mb, "peak_mb": rss_mb() - base}


def worker_recall(kind: str, root: Path) -> dict:
    start = time.perf_counter()
    if kind == "grtool":
        from grtool.vocab.readers import DocidIndex, QuestionIndex
        from grtool.evaluation.recall import evaluate_recall

        report = evaluate_recall(root / "responses.jsonl", QuestionIndex.build(root / "corpus"), DocidIndex.build(root / "triples"))
        return {"seconds": time.perf_counter() - start, "responses": report["responses"], "recall": report["recall"], "peak_mb": rss_mb()}
    # Naive baseline: everything in dicts, json per line, regex docids, exact text only.
    gold: dict[str, set[str]] = {}
    for batch in iter_batches(root / "corpus" / "questions", columns=["qid", "gold_doc_ids"]):
        for q, g in zip(batch.column("qid").to_pylist(), batch.column("gold_doc_ids").to_pylist()):
            gold[q] = set(g)
    table: dict[str, set[str]] = {}
    for batch in iter_batches(root / "triples", columns=["doc_id", "head", "relation", "tail"]):
        cols = [batch.column(c).to_pylist() for c in ("doc_id", "head", "relation", "tail")]
        for d, h, r, t in zip(*cols):
            table.setdefault(_key(h, r, t), set()).add(d)
    pattern = re.compile(r"<docid_start>(.*?)<docid_end>|\[([^\[\]]*)\]")
    total = n = 0.0
    with open(root / "responses.jsonl") as f:
        for line in f:
            row = json.loads(line)
            retrieved: set[str] = set()
            for a, b in pattern.findall(row["response"]):
                retrieved |= table.get(_key(*(a or b).split(",", 2)) if (a or b).count(",") >= 2 else "", set())
            g = gold[row["qid"]]
            total += len(retrieved & g) / len(g)
            n += 1
    return {"seconds": time.perf_counter() - start, "responses": int(n), "recall": total / n, "peak_mb": rss_mb()}


def worker_sft(kind: str, root: Path, out: Path) -> dict:
    start = time.perf_counter()
    if kind == "grtool":
        from grtool.export.sft import SftOptions, export_sft

        result = export_sft(root / "chains", root / "corpus", out, SftOptions(max_per_dataset=None, seed=1))
        rows = sum(c.train for c in result.per_dataset.values())
    else:
        from grtool.vocab.prompt import instruction
        from grtool.export.formats import sft_row

        questions = {}
        for batch in iter_batches(root / "corpus" / "questions", columns=["qid", "question"]):
            questions.update(zip(batch.column("qid").to_pylist(), batch.column("question").to_pylist()))
        examples = []
        for batch in iter_batches(root / "chains", columns=["qid", "text"]):
            for q, t in zip(batch.column("qid").to_pylist(), batch.column("text").to_pylist()):
                examples.append(sft_row("llamafactory-sharegpt", instruction(questions[q]), t, None))
        random.Random(1).shuffle(examples)
        with open(out, "w") as f:
            json.dump(examples, f)
        rows = len(examples)
    return {"seconds": time.perf_counter() - start, "rows": rows, "peak_mb": rss_mb()}


def child(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"worker {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


# ------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--worker", nargs="+")
    args = ap.parse_args()
    if args.worker:
        kind, what, root, *rest = args.worker
        fn = {"index": worker_index, "recall": worker_recall, "sft": worker_sft}[kind]
        print(json.dumps(fn(what, Path(root), *map(Path, rest))))
        return

    sizes = dict(n_triples=200_000, n_questions=30_000, n_responses=100_000, n_chains=30_000) if args.small else dict(n_triples=2_000_000, n_questions=300_000, n_responses=1_000_000, n_chains=300_000)
    with tempfile.TemporaryDirectory(prefix="grtool-bench-export-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        generate(root, sizes["n_triples"], sizes["n_questions"], sizes["n_responses"])
        print(f"generated {sizes} in {time.perf_counter() - t0:.1f}s")

        m, d = child("index", "grtool", str(root)), child("index", "dict", str(root))
        per_m = 1e6 / m["triples"]
        print(f"\ndocid → documents lookup over {m['triples']} triples (RSS above the process after imports)")
        print(
            f"  grtool lookup: arrays {m['structure_mb']:6.1f} MB ({m['structure_mb'] * per_m:.1f} MB per million)  RSS held {m['rss_mb']:6.1f} MB"
            f"  peak +{m['peak_mb']:6.1f} MB  build {m['build_s'] * per_m:5.1f} s per million  lookup {m['lookup_us']:.2f} µs"
        )
        print(
            f"  dict baseline:                                       RSS held {d['rss_mb']:6.1f} MB"
            f"  peak +{d['peak_mb']:6.1f} MB  build {d['build_s'] * per_m:5.1f} s per million  lookup {d['lookup_us']:.2f} µs"
        )
        print(f"  held-memory ratio dict/grtool: {d['rss_mb'] / m['rss_mb']:.1f}x")

        g, b = child("recall", "grtool", str(root)), child("recall", "naive", str(root))
        print(f"\neval recall over {g['responses']} responses ({sizes['n_questions']} questions, {m['triples']} triples)")
        print(f"  grtool: {g['responses'] / g['seconds']:9.0f} responses/s  peak RSS {g['peak_mb']:6.0f} MB  recall {g['recall']:.4f}")
        print(f"  naive:  {b['responses'] / b['seconds']:9.0f} responses/s  peak RSS {b['peak_mb']:6.0f} MB  recall {b['recall']:.4f} (no flips)")
        print(f"  speed ratio grtool/naive: {b['seconds'] / g['seconds']:.2f}   memory ratio naive/grtool: {b['peak_mb'] / g['peak_mb']:.2f}")

        print("\nexport sft (llamafactory-sharegpt, seeded shuffle)")
        for n in (sizes["n_chains"] // 3, sizes["n_chains"]):
            sub = root / f"chains_{n}"
            write_chains(sub / "chains", n, sizes["n_questions"])
            (sub / "corpus").symlink_to(root / "corpus")
            s = child("sft", "grtool", str(sub), str(sub / "sft.json"))
            base = child("sft", "inmemory", str(sub), str(sub / "base.json"))
            print(
                f"  {s['rows']:>8} chains: grtool {s['rows'] / s['seconds']:8.0f} chains/s peak {s['peak_mb']:6.0f} MB | "
                f"in-memory {base['rows'] / base['seconds']:8.0f} chains/s peak {base['peak_mb']:6.0f} MB | time ratio {s['seconds'] / base['seconds']:.2f}"
            )


if __name__ == "__main__":
    main()
