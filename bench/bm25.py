"""What `grtool retrieve --method bm25` costs beside bm25s called directly, and that both find the same documents.

HotpotQA in its release layout (the dev sample in ../shared/data, else the bundled example; --data with the whole
dev set, hotpot_dev_distractor_v1.json; or --synthetic N: N questions of grtool.corpus.synthetic's pseudo-words,
ten paragraphs each drawn from a pool of 10 N, the dev set's shape at N = 7405): `grtool corpus ingest` (not
timed), then

  grtool   `grtool retrieve CORPUS --method bm25` in a child process: start-up, reading the documents stage,
           the index, every question, the Parquet rows and the recall summary
  direct   bm25s in this process with the settings grtool states (title + " " + text, English stopwords, no
           stemmer, Lucene BM25 k1 1.5 b 0.75), |gold| + 1 documents per question: tokenize, index, retrieve

and prints both wall times and whether the two rankings agree question by question.

    python bench/bm25.py [--data FILE.json | --synthetic 7405]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO.parent / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.sample.json"
EXAMPLE = REPO / "examples" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"


def grtool(*args) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "grtool", *map(str, args)], check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - t0


def direct(corpus: Path) -> tuple[dict[str, list[str]], float]:
    """qid → the top |gold| + 1 doc ids, by bm25s on the corpus's own documents, and the seconds it took."""
    import bm25s

    from grtool.store.stage import read_table

    docs = read_table(corpus / "documents", ["doc_id", "title", "text"]).to_pylist()
    questions = read_table(corpus / "questions", ["qid", "question", "gold_doc_ids"]).to_pylist()
    t0 = time.perf_counter()
    retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    retriever.index(bm25s.tokenize([f"{d['title']} {d['text']}" for d in docs], stopwords="en", show_progress=False), show_progress=False)
    ks = [len(q["gold_doc_ids"] or ()) + 1 for q in questions]
    found, _ = retriever.retrieve(bm25s.tokenize([q["question"] for q in questions], stopwords="en", show_progress=False), k=max(ks), show_progress=False)
    seconds = time.perf_counter() - t0
    return {q["qid"]: [docs[int(i)]["doc_id"] for i in row[:k]] for q, row, k in zip(questions, found, ks)}, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SAMPLE if SAMPLE.is_file() else EXAMPLE, help="a HotpotQA JSON file (release layout)")
    ap.add_argument("--synthetic", type=int, metavar="N", help="N synthetic questions in the HotpotQA layout instead of --data")
    args = ap.parse_args()
    from grtool.store.stage import read_table

    with tempfile.TemporaryDirectory(prefix="grtool_bm25_") as work:
        corpus, out = Path(work) / "corpus", Path(work) / "bm25"
        if args.synthetic:
            from grtool.corpus.synthetic import write_hotpot_array

            args.data = write_hotpot_array(Path(work) / f"hotpot_synthetic_{args.synthetic}.json", args.synthetic, pool_paragraphs=10 * args.synthetic)
        grtool("corpus", "ingest", args.data, "--out", corpus)
        questions = read_table(corpus / "questions", ["qid"]).num_rows
        documents = read_table(corpus / "documents", ["doc_id"]).num_rows
        ours = grtool("retrieve", corpus, "--method", "bm25", "--out", out)
        rows = {r["qid"]: r["doc_ids"] for r in read_table(out, ["qid", "doc_ids"]).to_pylist()}
        theirs, seconds = direct(corpus)
    same = sum(rows.get(q) == docs for q, docs in theirs.items())
    print(f"{args.data.name}: {questions:,} questions, {documents:,} distinct paragraphs ({os.cpu_count()} CPU cores)")
    print(f"  grtool retrieve --method bm25   {ours:8.2f} s  (a child process: start-up, Parquet in and out, recall summary)")
    print(f"  bm25s called directly           {seconds:8.2f} s  (tokenize, index, retrieve in this process)")
    print(f"  same ranked documents: {same:,} of {len(theirs):,} questions")


if __name__ == "__main__":
    main()
