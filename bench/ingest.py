"""Benchmark `grtool corpus ingest` against a plain baseline, in one run.

Generates (in a temporary directory, or --workdir to keep and reuse it):
- a Wikipedia-abstracts-dump tree of .bz2 JSON Lines files (1M articles at --scale 1), the same tree
  uncompressed (to separate bzip2's cost from ours), and a quarter-size tree;
- a HotpotQA-train-like JSON array (200K questions × 10 paragraphs at --scale 1) and a quarter-size one.

Each input is ingested by `grtool corpus ingest` and by a baseline that writes the same rows with plain
`json` + `pyarrow` and nothing else (no streaming of the array, in-memory deduplication, no checks, no
rejects, no manifest, no resume). Every run is its own process, so peak RSS is that process's own
(``wait4``). Reported: documents/s (paragraphs read per wall second), documents per CPU second (robust to
other load on the machine), peak RSS, and the ratios.

    .venv/bin/python bench/ingest.py --scale 0.05      # a quick run
    .venv/bin/python bench/ingest.py                   # the full size (several minutes, ~4 GB of disk)
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WIKI_DOCS = 1_000_000
HOTPOT_QUESTIONS = 200_000
DOCS_PER_FILE = 10_000
ROWS_PER_FILE = 100_000


# ------------------------------------------------------------------------------------ the baseline


def baseline_wiki(files: list[Path], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grtool.corpus.doc_hash import doc_id
    from grtool.store.schemas import DOCUMENTS

    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    part = 0
    for f in files:
        opener = bz2.open if f.suffix == ".bz2" else open
        with opener(f, "rb") as fh:
            for line in fh:
                rec = json.loads(line)
                text = "".join(rec["text"])
                rows.append({"doc_id": doc_id(rec["title"], text), "title": rec["title"], "text": text, "datasets": ["hotpotqa"]})
                if len(rows) >= ROWS_PER_FILE:
                    pq.write_table(pa.Table.from_pylist(rows, schema=DOCUMENTS), out / f"part-{part:05d}.parquet", compression="zstd")
                    rows, part = [], part + 1
    if rows:
        pq.write_table(pa.Table.from_pylist(rows, schema=DOCUMENTS), out / f"part-{part:05d}.parquet", compression="zstd")


def baseline_hotpot(path: Path, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grtool.corpus.doc_hash import doc_id
    from grtool.store.schemas import DOCUMENTS, QUESTIONS

    out.mkdir(parents=True, exist_ok=True)
    with open(path, "rb") as fh:
        records = json.load(fh)
    docs: dict[str, dict] = {}
    questions = []
    for rec in records:
        ids = {}
        for title, sentences in rec["context"]:
            text = "".join(sentences)
            did = doc_id(title, text)
            ids.setdefault(title, did)
            docs.setdefault(did, {"doc_id": did, "title": title, "text": text, "datasets": ["hotpotqa"]})
        gold = list(dict.fromkeys(ids[t] for t, _ in rec["supporting_facts"] if t in ids))
        meta = {k: v for k, v in rec.items() if k not in ("_id", "question", "answer", "type", "context")}
        questions.append(
            {
                "qid": rec["_id"],
                "dataset": "hotpotqa",
                "split": "train",
                "question": rec["question"],
                "answer": rec["answer"],
                "answer_aliases": [],
                "gold_doc_ids": gold,
                "type": rec["type"],
                "answerable": True,
                "meta": json.dumps(meta),
            }
        )
    values = list(docs.values())
    for i in range(0, len(values), ROWS_PER_FILE):
        pq.write_table(pa.Table.from_pylist(values[i : i + ROWS_PER_FILE], schema=DOCUMENTS), out / f"documents-{i // ROWS_PER_FILE:05d}.parquet", compression="zstd")
    for i in range(0, len(questions), ROWS_PER_FILE):
        pq.write_table(pa.Table.from_pylist(questions[i : i + ROWS_PER_FILE], schema=QUESTIONS), out / f"questions-{i // ROWS_PER_FILE:05d}.parquet", compression="zstd")


def read_only(files: list[Path]) -> None:
    """Just decompress and split lines: the floor set by bzip2."""
    n = 0
    for f in files:
        with bz2.open(f, "rb") as fh:
            for _ in fh:
                n += 1


# ------------------------------------------------------------------------------------- measuring


def measure(cmd: list[str]) -> dict:
    """Run a command in its own process; wall seconds, CPU seconds and its own peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}


def self_cmd(*args: str) -> list[str]:
    return [sys.executable, __file__, *args]


def grtool_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "grtool", "-q", "corpus", "ingest", *args]


def files_list(tree: Path) -> list[Path]:
    return sorted(p for p in tree.rglob("wiki_*") if p.is_file())


# ----------------------------------------------------------------------------------------- main


def generate(work: Path, scale: float) -> dict:
    from grtool.corpus.synthetic import write_hotpot_array, write_wiki_dump

    n_docs = max(DOCS_PER_FILE, int(WIKI_DOCS * scale))
    n_q = max(1000, int(HOTPOT_QUESTIONS * scale))
    spec = {"docs": n_docs, "questions": n_q}
    marker = work / "generated.json"
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return spec
    shutil.rmtree(work, ignore_errors=True)
    t = time.perf_counter()
    print(f"generating {n_docs:,} articles and {n_q:,} questions under {work} ...", flush=True)
    write_wiki_dump(work / "wiki", n_docs, docs_per_file=DOCS_PER_FILE)
    write_wiki_dump(work / "wiki-plain", n_docs, docs_per_file=DOCS_PER_FILE, compress=False)
    write_hotpot_array(work / "hotpot_train_v1.1.json", n_q)
    write_hotpot_array(work / "quarter" / "hotpot_train_v1.1.json", n_q // 4)
    marker.write_text(json.dumps(spec))
    print(f"generated in {time.perf_counter() - t:.0f} s", flush=True)
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full size (1M articles, 200K questions)")
    ap.add_argument("--workdir", type=Path, help="generate here and keep it (reused when the size matches)")
    ap.add_argument("--baseline", nargs="+", help=argparse.SUPPRESS)  # internal: run one baseline in this process
    args = ap.parse_args()

    if args.baseline:
        kind, *rest = args.baseline
        if kind == "wiki":
            baseline_wiki([Path(p) for p in rest[:-1]], Path(rest[-1]))
        elif kind == "hotpot":
            baseline_hotpot(Path(rest[0]), Path(rest[1]))
        elif kind == "read":
            read_only([Path(p) for p in rest])
        return

    work = args.workdir or Path(tempfile.mkdtemp(prefix="grtool-bench-"))
    try:
        spec = generate(work, args.scale)
        wiki = files_list(work / "wiki")
        plain = files_list(work / "wiki-plain")
        quarter = wiki[: max(1, len(wiki) // 4)]
        n_docs, n_q = spec["docs"], spec["questions"]
        n_quarter = min(n_docs, len(quarter) * DOCS_PER_FILE)
        runs = []

        def run(label: str, n: int, ours: list[str], base: list[str] | None) -> None:
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            g = measure(ours)
            shutil.rmtree(out, ignore_errors=True)
            b = measure(base) if base else None
            shutil.rmtree(out, ignore_errors=True)
            runs.append((label, n, g, b))
            print(_row(label, n, g, b), flush=True)

        out = str(work / "out")
        print(_header(), flush=True)
        r = measure(self_cmd("--baseline", "read", *map(str, wiki)))
        runs.append(("bz2 decompress only", n_docs, r, None))
        print(_row("bz2 decompress only", n_docs, r, None), flush=True)
        run(f"wiki dump .bz2, {n_docs:,} docs", n_docs, grtool_cmd(str(work / "wiki"), "--out", out), self_cmd("--baseline", "wiki", *map(str, wiki), out))
        run(f"wiki dump .bz2, {n_quarter:,} docs", n_quarter, grtool_cmd(*map(str, quarter), "--out", out), self_cmd("--baseline", "wiki", *map(str, quarter), out))
        run(f"wiki dump plain, {n_docs:,} docs", n_docs, grtool_cmd(str(work / "wiki-plain"), "--out", out), self_cmd("--baseline", "wiki", *map(str, plain), out))
        paragraphs = 10 * n_q
        array = work / "hotpot_train_v1.1.json"
        run(f"HotpotQA array, {n_q:,} q ({paragraphs:,} paragraphs)", paragraphs, grtool_cmd(str(array), "--out", out), self_cmd("--baseline", "hotpot", str(array), out))
        small = work / "quarter" / "hotpot_train_v1.1.json"
        run(f"HotpotQA array, {n_q // 4:,} q ({paragraphs // 4:,} paragraphs)", paragraphs // 4, grtool_cmd(str(small), "--out", out), self_cmd("--baseline", "hotpot", str(small), out))
        print()
        print(f"input sizes: wiki .bz2 {_mb(work / 'wiki'):,.0f} MB, plain {_mb(work / 'wiki-plain'):,.0f} MB, array {array.stat().st_size / 2**20:,.0f} MB")
        # The input fingerprint hashes every byte (BLAKE3) once per run; against the same bytes ingested:
        array_run = next(g for label, _, g, _ in runs if label.startswith(f"HotpotQA array, {n_q:,} q"))
        plain_run = next(g for label, _, g, _ in runs if label.startswith("wiki dump plain"))
        for name, path, ingest_run in (("array", array, array_run), ("wiki plain tree", work / "wiki-plain", plain_run)):
            mb = _mb(path) if path.is_dir() else path.stat().st_size / 2**20
            seconds = fingerprint_seconds(path)
            print(
                f"fingerprint of the {name} ({mb:,.0f} MB, page cache warm): {mb / seconds:,.0f} MB/s hashed vs "
                f"{mb / ingest_run['wall']:,.1f} MB/s ingested: {seconds / ingest_run['wall']:.1%} of the ingest time"
            )
        print("docs/s = paragraphs read per wall second; docs/cpu-s = per CPU second of that process (user+sys)")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def fingerprint_seconds(path: Path) -> float:
    """Wall seconds of one input fingerprint (a fresh process: nothing memoized)."""
    code = "import sys, time; from grtool.store.stage import fingerprint; t = time.perf_counter(); fingerprint(sys.argv[1]); print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout)


def _mb(tree: Path) -> float:
    return sum(p.stat().st_size for p in tree.rglob("*") if p.is_file()) / 2**20


def _header() -> str:
    return f"{'input':<48} {'grtool docs/s':>13} {'docs/cpu-s':>11} {'peak RSS':>9} | {'baseline docs/s':>15} {'docs/cpu-s':>11} {'peak RSS':>9} | {'speed':>6} {'RSS':>6}"


def _row(label: str, n: int, g: dict, b: dict | None) -> str:
    left = f"{label:<48} {n / g['wall']:>13,.0f} {n / g['cpu']:>11,.0f} {g['rss_mb']:>7,.0f}MB"
    if b is None:
        return left
    return left + f" | {n / b['wall']:>15,.0f} {n / b['cpu']:>11,.0f} {b['rss_mb']:>7,.0f}MB | {b['wall'] / g['wall']:>5.2f}x {g['rss_mb'] / b['rss_mb']:>5.2f}x"


if __name__ == "__main__":
    main()
