"""`chains synthesize --constrain` on every real question here: no citation outside the offered triples, and its cost.

The whole pipeline on the real samples in ../shared/data (all four datasets, every file; else examples/data), with
the embedded SmolLM2-135M-Instruct on the CPU: `corpus ingest` → `triples extract` of the gold documents only (the
triples a question is offered come from its gold documents) → `chains synthesize` on each backend, constrained and
free, same seed. Prints per side the questions chained, citations, citations not offered (must be 0 when
constrained) and wall time, and the ratio constrained / free time per backend.

    python bench/constrained_chains.py [--work DIR] [--candidates 2] [--max-tokens 160] [--no-vllm]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
EXAMPLES = REPO / "examples" / "data"
VLLM = ("--backend", "vllm", "--enforce-eager", "--max-model-len", "4096")


def grtool(*args, stdin: bytes | None = None, env: dict | None = None) -> float:
    """Run grtool; returns the wall seconds."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grtool", "-q", *map(str, args)], input=stdin, capture_output=True, env={**os.environ, **(env or {})})
    if proc.returncode:
        sys.exit(f"grtool {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr.decode()[-3000:]}")
    return time.perf_counter() - started


def gold_documents(run: Path) -> bytes:
    """The gold documents of the run's questions, as JSON Lines for `triples extract -`."""
    from grtool.store.stage import read_table

    gold = {d for q in read_table(run / "questions").to_pylist() for d in q["gold_doc_ids"] or ()}
    rows = [d for d in read_table(run / "documents").to_pylist() if d["doc_id"] in gold]
    return b"".join(orjson.dumps(d) + b"\n" for d in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, help="working directory (kept; default a temporary one)")
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="grtool-bench-"))
    data = SHARED if SHARED.is_dir() else EXAMPLES
    files = sorted(p for p in data.rglob("*") if p.suffix in (".json", ".jsonl") and "variants" not in p.parts)
    run = work / "run"
    if not (run / "questions").is_dir():
        grtool("corpus", "ingest", *files, "--out", run)
    if not (run / "triples" / "_manifest.json").is_file():
        seconds = grtool("triples", "extract", "-", "--out", run / "triples_out", "--max-tokens", "128", "--grounding", "loose",
                         "--max-empty-share", "1", stdin=gold_documents(run))  # fmt: skip
        (run / "triples_out" / "triples").rename(run / "triples")
        print(f"triples extract (gold documents): {seconds:.0f} s", flush=True)
    sides = [("transformers", ())] + ([] if args.no_vllm else [("vllm", VLLM)])
    common = ("--candidates", args.candidates, "--max-tokens", args.max_tokens, "--select", "first", "--unanswerable", "skip", "--no-cache")
    print(f"{'backend':13} {'side':12} {'questions':>9} {'chained':>8} {'docids':>7} {'not offered':>11} {'seconds':>8}")
    for backend, options in sides:
        times = {}
        for side in ("constrain", "no-constrain"):
            out = work / f"chains-{backend}-{side}"
            times[side] = grtool("chains", "synthesize", run, run / "triples", "--out", out, f"--{side}", *common, *options, "--overwrite",
                                 env={"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CPU_KVCACHE_SPACE": "1"})  # fmt: skip
            counters = orjson.loads((out / "_manifest.json").read_bytes())["counters"]
            extra = counters["extra"]
            print(f"{backend:13} {side:12} {extra['questions']:>9} {extra['questions_chained']:>8} {extra['docids']:>7} "
                  f"{extra['docids_not_offered']:>11} {times[side]:>8.0f}", flush=True)  # fmt: skip
        print(f"{backend}: constrained / free time = {times['constrain'] / times['no-constrain']:.3f}", flush=True)
    print(f"work: {work}")


if __name__ == "__main__":
    main()
