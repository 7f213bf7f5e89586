"""How much memory `grtool retrieve --markers brackets` takes beyond the model, as the number of docids grows.

For each size: a generated triples stage (the real schema; heads, relations and tails drawn Zipf-like from
pseudo-word vocabularies, five triples per document), an index of it built by the real `grtool index build
--tokenizer default` (the embedded model's tokenizer), then the real `grtool retrieve --markers brackets` over a
few questions of the 2Wiki sample in ../shared/data (else the repository's example) with the embedded model (SmolLM2-135M-Instruct, CPU), in a
child process that reports its peak RSS (VmHWM). Another child loads only the model the way the transformers
backend does: its VmHWM is "the model". Printed per size: docids, index files (MB), peak RSS, peak minus model,
and whether peak ≤ model + index files + 300 MB (issue #27's goal).

    python bench/retrieve_memory.py [--sizes 1000000,10000000] [--questions 3] [--max-tokens 48] [--repo DIR] [--keep DIR]
    python bench/retrieve_memory.py --latency 5000     # µs per decoding step: docids in a Python list vs the files

``--repo`` runs the children against another checkout (e.g. one before a change) to compare. ``measure(index_dir,
corpus)`` is the part bench/index_e2e.py calls on an index it built.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data" / "2wikimultihopqa"  # the real 2Wiki sample beside a checkout, when present
EXAMPLES = REPO / "examples" / "data" / "2wikimultihopqa"  # else the repository's 4 questions
BUDGET_MB = 300  # peak RSS ≤ model + index files + this
ROWS_PER_PART = 100_000
TRIPLES_PER_DOC = 5

# The child: run a grtool command in this process, then report the process's peak RSS (also when it exits non-zero).
_CHILD = r"""
import json, sys
def peak():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f) if k in ("VmHWM", "VmRSS")}
out, what, args = sys.argv[1], sys.argv[2], sys.argv[3:]
code = 0
try:
    if what == "model":  # what the transformers backend loads: the tokenizer and the weights on the CPU
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from grtool.models import resolve_model
        path = resolve_model(None).path
        AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]))
    else:
        sys.argv = ["grtool", *args]
        from grtool.cli.main import run
        run()
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
finally:
    with open(out, "w") as f:
        json.dump({**peak(), "code": code}, f)
"""


def _child(what: str, args: list[str], repo: Path) -> dict:
    """Run the child (``model`` or a grtool command) with ``repo`` first on the path; its VmHWM, VmRSS, exit code,
    stderr tail and wall time."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as report:
        env = {**os.environ, "PYTHONPATH": str(repo)}
        t0 = time.perf_counter()
        # cwd = repo too: `python -c` puts the working directory first on sys.path, before PYTHONPATH.
        proc = subprocess.run([sys.executable, "-c", _CHILD, report.name, what, *map(str, args)], cwd=repo, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        got = json.loads(Path(report.name).read_text() or "{}")
    if got.get("code") or proc.returncode:
        raise RuntimeError(f"{what} {' '.join(map(str, args[:3]))}…: exit {got.get('code', proc.returncode)}: {proc.stderr[-2000:]}")
    return {**got, "seconds": seconds, "stdout": proc.stdout, "stderr": proc.stderr}


_MODEL: dict[str, int] = {}


def model_rss(repo: Path = REPO) -> int:
    """Peak RSS (bytes) of a process that only loads the embedded model as the transformers backend does."""
    if str(repo) not in _MODEL:
        _MODEL[str(repo)] = _child("model", [], repo)["VmHWM"]
    return _MODEL[str(repo)]


def index_bytes(index_dir: Path) -> int:
    return sum(p.stat().st_size for p in Path(index_dir).iterdir() if p.is_file())


def lookup_dir(index_dir: Path, triples: str | Path | None = None) -> Path | None:
    """The cached triples lookup `retrieve` maps for this index (grtool.docid.lookup_files), or None (a grtool
    without it, or not built yet)."""
    try:
        from grtool.docid.lookup_files import cache_dir, stage_key
        from grtool.store.records import resolve_stage
    except ImportError:
        return None
    if triples is None:
        meta = json.loads((Path(index_dir) / "index.json").read_text())
        triples = next((e["path"] for e in meta.get("inputs", []) if e.get("path") and Path(e["path"]).is_dir()), None)
    if triples is None:
        return None
    d = cache_dir() / stage_key(resolve_stage(triples, "triples"))
    return d if d.is_dir() else None


def measure(index_dir: str | Path, corpus: str | Path, *, triples: str | Path | None = None, questions: int = 3, max_tokens: int = 48, repo: str | Path = REPO, out: str | Path | None = None) -> dict:
    """Run `grtool retrieve CORPUS --index INDEX_DIR --markers brackets --few-shot 2 --few-shot-from dev --limit
    QUESTIONS` (the corpus's gold triples must be in the index: worked examples, docids to write) in a child
    process (``repo``'s grtool) and report its peak RSS against the model's alone and the index files' size:
    ``{"peak_mb", "model_mb", "over_model_mb", "index_mb", "budget_mb", "within_budget", "seconds", "docids"}``.
    The first run over an index without the bracket files writes them (a second run shows the steady state)."""
    index_dir, repo = Path(index_dir).resolve(), Path(repo).resolve()
    work = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="retrieve_memory."))
    responses = work / f"responses-{time.monotonic_ns()}"
    args = ["retrieve", Path(corpus).resolve(), "--index", index_dir, "--markers", "brackets", "--few-shot", "2", "--few-shot-from", "dev", "--limit", questions,
            "--max-tokens", max_tokens, "--threads", "2", "--no-cache", "--out", responses, "--json"]  # fmt: skip
    if triples is not None:
        args += ["--triples", Path(triples).resolve()]
    try:
        got = _child("retrieve", args, repo)
        report = json.loads(got["stdout"] or "{}")
    finally:
        shutil.rmtree(responses, ignore_errors=True)
        if out is None:
            shutil.rmtree(work, ignore_errors=True)
    model = model_rss(repo)
    size = index_bytes(index_dir)
    lookup = lookup_dir(index_dir, triples)
    lookup_size = index_bytes(lookup) if lookup is not None else 0
    meta = json.loads((index_dir / "index.json").read_text())
    mb = 1 << 20
    return {
        "docids": (meta.get("sizes") or {}).get("sequences"),
        "index_mb": round(size / mb, 1),
        "lookup_mb": round(lookup_size / mb, 1),  # the triples lookup's files, mapped too
        "peak_mb": round(got["VmHWM"] / mb, 1),
        "model_mb": round(model / mb, 1),
        "over_model_mb": round((got["VmHWM"] - model) / mb, 1),
        "budget_mb": round((model + size + lookup_size) / mb + BUDGET_MB, 1),
        "within_budget": got["VmHWM"] <= model + size + lookup_size + BUDGET_MB * mb,
        "seconds": round(got["seconds"], 1),
        "responses": report.get("responses"),
        "docids_written": report.get("docids"),
    }


# ------------------------------------------------------------------------------------------ generated data


def _words(rng, n: int, syllables=(1, 4)) -> list[str]:
    """``n`` distinct pronounceable pseudo-words."""
    cons, vow = "bcdfghjklmnprstvwz", "aeiou"
    seen: dict[str, None] = {}
    while len(seen) < n:
        k = int(rng.integers(*syllables, endpoint=True))
        w = "".join(cons[int(rng.integers(len(cons)))] + vow[int(rng.integers(len(vow)))] for _ in range(k))
        seen.setdefault(w.capitalize())
    return list(seen)


def _zipf(rng, n: int, size: int, a: float = 1.1):
    """``size`` indices in [0, n) with Zipf-like frequencies (rank r ~ 1/r^a)."""
    import numpy as np

    ranks = np.arange(1, n + 1, dtype=np.float64) ** -a
    cdf = np.cumsum(ranks)
    return np.searchsorted(cdf, rng.random(size) * cdf[-1]).clip(0, n - 1)


def make_triples(out: Path, n: int, corpus: Path | None = None, seed: int = 0) -> Path:
    """A triples stage of ``n`` rows: ``head, relation, tail`` like extracted facts (entity names of 1-3 words,
    ~300 relation phrases, tails that are entities, years or quantities), Zipf-distributed; with ``corpus``, its
    evidence triples first (so its questions have real gold triples: worked examples, docids the model writes)."""
    import numpy as np
    import pyarrow as pa

    from grtool.store.schemas import TRIPLES
    from grtool.store.stage import StageSpec, StageWriter

    rng = np.random.default_rng(seed)
    words = np.array(_words(rng, 40_000))
    n_entities = max(1000, n // 3)
    ent_words = _zipf(rng, len(words), (n_entities, 3))
    ent_len = rng.integers(1, 4, n_entities)
    entities = np.array([" ".join(words[ent_words[i, : ent_len[i]]]) for i in range(n_entities)])
    verbs = _words(rng, 400, (1, 3))
    relations = np.array(sorted({f"{v.lower()}{s}" for v in verbs for s in ("", " of", " in", " by")})[:300])
    parts = -(-n // ROWS_PER_PART)
    stage = StageWriter(out, StageSpec("triples", TRIPLES, {"source": "bench/retrieve_memory.py", "seed": seed, "rows": n}), num_parts=parts)
    evidence = None
    if corpus is not None:
        from grtool.store.stage import read_table
        from grtool.store.records import resolve_stage
        from grtool.triples.evidence import evidence_triples

        found = evidence_triples(read_table(resolve_stage(corpus, "questions")).to_pylist(), read_table(resolve_stage(corpus, "documents"), ["doc_id", "title"]).to_pylist())
        evidence = pa.Table.from_pylist(found, schema=TRIPLES)
    for p in range(parts):
        lo, hi = p * ROWS_PER_PART, min(n, (p + 1) * ROWS_PER_PART)
        m = hi - lo
        head = entities[_zipf(rng, n_entities, m, 0.8)]
        rel = relations[_zipf(rng, len(relations), m, 1.0)]
        kind = rng.random(m)
        tail = np.where(kind < 0.7, entities[_zipf(rng, n_entities, m, 0.8)],
                        np.where(kind < 0.85, rng.integers(1000, 2025, m).astype(str), np.char.add(rng.integers(1, 5000, m).astype(str), " km")))  # fmt: skip
        rows = np.arange(lo, hi)
        docid = np.char.add(np.char.add(np.char.add("<docid_start>", head), np.char.add(", ", rel)), np.char.add(np.char.add(", ", tail), "<docid_end>"))
        table = pa.table({
            "doc_id": pa.array(np.char.add("doc-", (rows // TRIPLES_PER_DOC).astype(str)).tolist()),
            "idx": pa.array((rows % TRIPLES_PER_DOC).astype(np.int32)),
            "head": pa.array(head.tolist()), "relation": pa.array(rel.tolist()), "tail": pa.array(tail.tolist()),
            "docid": pa.array(docid.tolist()),
        }, schema=TRIPLES)  # fmt: skip
        if p == 0 and evidence is not None:
            table = pa.concat_tables([evidence, table])
        with stage.shard(p) as shard:
            shard.count_in(len(table))
            shard.write_table(table)
    stage.finish()
    return out


def step_latency(n: int = 5000, tokenizer: str = "default", walks: int = 200, seed: int = 3) -> dict:
    """µs per decoding step of the bracket constraint over ``n`` generated docids, the docids held as a sorted
    Python list (before #27) against the memory-mapped files (after): the first ``allowed`` at an open bracket
    (the widest question) and random walks through docids with a cold cache (advance + allowed per step)."""
    import random

    import numpy as np

    from grtool.index.docid_bytes import open_docid_bytes
    from grtool.index.text_constraint import BracketConstraint, token_bytes
    from grtool.index.tokenizer import load_tokenizer
    from grtool.store.stage import read_table

    vocab = token_bytes(load_tokenizer(tokenizer).tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        make_triples(Path(tmp) / "triples", n, seed=seed)
        texts = sorted(set(read_table(Path(tmp) / "triples", ["docid"])["docid"].to_pylist()))
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"docid": texts}), Path(tmp) / "docids.parquet")
        sides = {"list": BracketConstraint([t[len("<docid_start>") : -len("<docid_end>")] for t in texts], vocab),
                 "mmap": BracketConstraint(open_docid_bytes(tmp), vocab)}  # fmt: skip
        out: dict[str, dict[str, float]] = {}
        for name, c in sides.items():
            c._allowed_inside.cache_clear()
            t0 = time.perf_counter()
            c.allowed(b"")
            first = (time.perf_counter() - t0) * 1e6
            c._allowed_inside.cache_clear()
            rng, steps, t0 = random.Random(seed), 0, time.perf_counter()
            for _ in range(walks):
                state = c.advance(None, int(c.openers[0]))
                while not c.is_free(state):
                    allowed = c.allowed(state)
                    state = c.advance(state, int(allowed[rng.randrange(len(allowed))]) if isinstance(allowed, np.ndarray) else int(c.openers[0]))
                    steps += 1
            out[name] = {"open_bracket_us": round(first), "walk_step_us": round((time.perf_counter() - t0) / steps * 1e6, 1), "steps": steps}
        out["ratio"] = {k: round(out["mmap"][k] / out["list"][k], 2) for k in ("open_bracket_us", "walk_step_us")}
        return out


_CONSTRAINT_CHILD = r"""
import json, random, sys, time
import numpy as np
from grtool.index.text_constraint import BracketConstraint
from grtool.index.tokenizer import load_tokenizer
def rss():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f) if k in ("VmHWM", "VmRSS")}
tok = load_tokenizer("default")
before = rss()
t0 = time.perf_counter()
c = BracketConstraint.from_index(sys.argv[1], tok)
opened = time.perf_counter() - t0
rng, steps, t0 = random.Random(1), 0, time.perf_counter()
for _ in range(int(sys.argv[2])):
    state = c.advance(None, int(c.openers[0]))
    while not c.is_free(state):
        allowed = c.allowed(state)
        state = c.advance(state, int(allowed[rng.randrange(len(allowed))]) if isinstance(allowed, np.ndarray) else int(c.openers[0]))
        steps += 1
print(json.dumps({"base": before["VmHWM"], **rss(), "open_s": opened, "step_us": (time.perf_counter() - t0) / max(steps, 1) * 1e6, "steps": steps}))
"""


def constraint_memory(docids_dir: Path, repo: Path = REPO, walks: int = 50) -> dict:
    """The bracket constraint alone over an index directory's docids.parquet, in a child with ``repo``'s grtool:
    peak RSS beyond the tokenizer loaded (MB), seconds to open, µs per decoding step of random walks."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", _CONSTRAINT_CHILD, str(docids_dir), str(walks)], env=env, capture_output=True, text=True, cwd=repo)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    mb = 1 << 20
    return {"peak_over_tokenizer_mb": round((got["VmHWM"] - got["base"]) / mb, 1), "rss_after_mb": round((got["VmRSS"] - got["base"]) / mb, 1),
            "open_s": round(got["open_s"], 2), "step_us": round(got["step_us"], 1), "steps": got["steps"]}  # fmt: skip


def docids_only(triples: Path, out: Path) -> int:
    """``out/docids.parquet``: the distinct docids of a triples stage (what an index build writes), no index."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from grtool.store.stage import read_table

    out.mkdir(parents=True, exist_ok=True)
    docids = pc.unique(read_table(triples, ["docid"])["docid"])
    pq.write_table(pa.table({"docid": docids}), out / "docids.parquet", compression="zstd")
    return len(docids)


def grtool(args: list, repo: Path = REPO) -> dict:
    return _child("grtool", [str(a) for a in args], repo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,10000000", help="triples per generated stage, comma-separated")
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repo", type=Path, action="append", help="checkout(s) whose grtool retrieve is measured (default: this one)")
    ap.add_argument("--keep", type=Path, help="keep the generated data here (reused when present)")
    ap.add_argument("--latency", type=int, metavar="N", help="only time the bracket constraint's steps over N docids, list vs files")
    ap.add_argument("--constraint-only", action="store_true", help="only the bracket constraint over each size's docids.parquet (no index, no model)")
    a = ap.parse_args()
    if a.latency:
        print(json.dumps(step_latency(a.latency)))
        return
    repos = [r.resolve() for r in a.repo] if a.repo else [REPO]
    root = a.keep or Path(tempfile.mkdtemp(prefix="retrieve_memory."))
    root.mkdir(parents=True, exist_ok=True)
    try:
        corpus = root / "corpus"
        if not (corpus / "questions").is_dir():
            grtool(["corpus", "ingest", *sorted((SHARED if SHARED.is_dir() else EXAMPLES).glob("*.json")), "--out", corpus])
        rows = []
        for n in (int(s) for s in a.sizes.split(",")):
            triples, index = root / f"triples-{n}", root / f"index-{n}"
            if not (triples / "_manifest.json").is_file():
                t0 = time.perf_counter()
                make_triples(triples, n, corpus)
                print(f"{n:,} triples generated in {time.perf_counter() - t0:.0f} s", flush=True)
            if a.constraint_only:
                only = root / f"docids-{n}"
                if not (only / "docids.parquet").is_file():
                    print(f"{docids_only(triples, only):,} distinct docids", flush=True)
                for repo in repos:
                    for run in ("first", "again"):
                        for f in only.glob("docid_bytes*") if run == "first" else ():
                            f.unlink()
                        got = constraint_memory(only, repo)
                        print(json.dumps({"triples": n, "repo": str(repo), "run": run, **got}), flush=True)
                continue
            if not (index / "index.json").is_file():
                built = grtool(["index", "build", triples, "--tokenizer", "default", "--out", index])
                print(f"index of {n:,} triples built in {built['seconds']:.0f} s, peak RSS {built['VmHWM'] / 2**20:.0f} MB", flush=True)
            for repo in repos:
                for run in ("first", "again"):
                    for f in index.glob("docid_bytes*") if run == "first" else ():
                        f.unlink()  # the first run writes them (an index built before `index build` did)
                    cached = lookup_dir(index) if run == "first" else None
                    if cached is not None:
                        shutil.rmtree(cached)  # and the triples lookup
                    got = measure(index, corpus, questions=a.questions, max_tokens=a.max_tokens, repo=repo)
                    rows.append({"triples": n, "repo": str(repo), "run": run, **got})
                    print(json.dumps(rows[-1]), flush=True)
        print()
        # peak-smallest: the growth with the number of docids (the smallest size's peak is the fixed cost of the
        # model, the imports and generation), against the files the run maps
        print(f"{'triples':>10} {'docids':>10} {'index MB':>9} {'lookup MB':>9} {'peak MB':>8} {'model MB':>9} {'peak-model':>10} {'peak-smallest':>13} {'budget MB':>9} {'ok':>3}  run    repo")
        for r in rows:
            base = min((x for x in rows if x["repo"] == r["repo"] and x["run"] == r["run"]), key=lambda x: x["triples"])
            print(f"{r['triples']:>10,} {r['docids'] or 0:>10,} {r['index_mb']:>9} {r['lookup_mb']:>9} {r['peak_mb']:>8} {r['model_mb']:>9} {r['over_model_mb']:>10} "
                  f"{round(r['peak_mb'] - base['peak_mb'], 1):>13} {r['budget_mb']:>9} {'yes' if r['within_budget'] else 'NO':>3}  {r['run']:<6} {r['repo']}")  # fmt: skip
    finally:
        if a.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
