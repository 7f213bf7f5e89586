"""`grtool index build` end to end, the way a user runs it, against the SEAL-like path (issue #27).

One command from a fresh clone (the SEAL side needs the sdsl-lite headers; without them it is skipped with a
message)::

    apt-get install -y libsdsl-dev                      # Debian's sdsl-lite, for the SEAL-like side only
    nice python bench/index_e2e.py --sizes 1M,5M [--flips] [--keep-index DIR]

Per size it writes a generated triples *stage directory* (Parquet shards, the schema and manifest `grtool triples
extract` writes; heads, relations and tails drawn from Zipf vocabularies of synthetic entity names, ~50 relation
names, dates and numbers; ~8 triples per document, most with the document's title as head), then runs in a child
process each:

- grtool: ``python -m grtool index build STAGE --tokenizer llama3 [--flips] --out DIR`` (the real command);
- SEAL-like: a Python child that reads the docids with pyarrow into Python strings, dedupes and sorts them
  (and renders each flip), tokenizes them with HF ``tokenizers`` (batch encode, the same llama3 tokenizer), writes
  the reversed token text and runs sdsl-lite's ``csa_wt_int<>`` construction over it (the program of
  ``bench/index.py --sdsl``), as SEAL builds its FM-index.

Measured from outside: wall time; peak RSS of the process tree (polled every 50 ms: the largest sum of VmRSS
over the tree, or a process's own VmHWM, whichever is larger); the index's bytes (grtool: the whole directory;
sdsl: the serialized CSA alone, SEAL's docid maps not counted); scratch disk (the largest size of the output's
working area during the build, minus the final index); for grtool also the peak RSS of each phase (read / tokenize /
core, split where the command logs their start; `phase_peak_mb` in the JSON line on stderr). Printed as a table with the ratios grtool / SEAL-like
(goals: time <= 0.3, RSS <= 0.7, size <= 0.6) and the command against its own FM core: its time over 1.3x the core
+ what HF ``tokenizers`` takes to encode the docids whole (timed on 200,000 of them; goal <= 1), its peak RSS above
the core phase's (goal <= 200 MB).

Then the `retrieve` memory figures (skip with ``--no-retrieve``): ``bench/retrieve_memory.py --sizes 1000,5M``
(the largest size run when 5M is not), the real ``grtool retrieve --markers brackets`` with the embedded model over
an index of that many triples built with the model's tokenizer, its peak RSS against the model's and a 1K-triple
run's. ``--keep-index DIR``: keep the grtool index of the 5M size (or the largest size run) in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

GOALS = {"seconds": 0.3, "peak_rss_mb": 0.7, "index_mb": 0.6}
RELATIONS = [
    "place of birth", "place of death", "date of birth", "date of death", "country of citizenship", "occupation", "spouse",
    "father", "mother", "child", "sibling", "educated at", "employer", "member of", "award received", "director", "producer",
    "screenwriter", "cast member", "composer", "performer", "genre", "country of origin", "original language", "publication date",
    "located in", "country", "capital", "head of government", "founded by", "inception", "headquarters location", "part of",
    "has part", "instance of", "follows", "followed by", "notable work", "position held", "religion", "military branch",
    "sport", "record label", "publisher", "author", "language of work", "nominated for", "residence", "ethnic group", "field of work",
]  # fmt: skip
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]
SYLLABLES = [a + b for a in ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "st", "ch"]
             for b in ["a", "e", "i", "o", "u", "ar", "en", "or", "el", "an"]]  # fmt: skip


def _names(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct-ish synthetic entity names of 1-3 capitalized words; some carry a comma (``X, Y``) or digits."""
    syl = np.array(SYLLABLES)
    words = ["".join(syl[rng.integers(0, len(syl), rng.integers(2, 4))]).capitalize() for _ in range(min(n, 60_000))]
    w = np.array(words)
    k = rng.choice([1, 2, 2, 2, 3], size=n)
    a, b, c = (w[rng.integers(0, len(w), n)] for _ in range(3))
    out = np.where(k == 1, a, np.where(k == 2, np.char.add(np.char.add(a, " "), b), np.char.add(np.char.add(np.char.add(np.char.add(a, " "), b), " "), c)))
    out = out.astype(object)
    comma = rng.random(n) < 0.03
    out[comma] = [f"{x}, {y}" for x, y in zip(out[comma], c[comma])]
    digits = rng.random(n) < 0.03
    out[digits] = [f"{x} {int(d)}" for x, d in zip(out[digits], rng.integers(1, 2000, digits.sum()))]
    return out.tolist()


def _zipf(n_vocab: int, size: int, rng: np.random.Generator, s: float = 1.1) -> np.ndarray:
    """Ranks in [0, n_vocab) with P(rank r) ~ 1 / (r + 1)^s."""
    p = 1.0 / np.arange(1, n_vocab + 1) ** s
    cdf = np.cumsum(p / p.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n_vocab - 1)


def write_stage(path: Path, triples: int, seed: int = 0, parts: int = 8) -> Path:
    """A triples stage of ``triples`` rows (see the module docstring), written as `triples extract` writes one."""
    import polars as pl

    from grtool.store.schemas import TRIPLES
    from grtool.store.stage import StageSpec, StageWriter

    rng = np.random.default_rng(seed)
    n_ent = max(1000, triples // 4)
    ents = pl.Series(_names(n_ent, rng))
    dates = pl.Series([f"{MONTHS[m]} {d}, {y}" for m, d, y in zip(rng.integers(0, 12, 20_000), rng.integers(1, 29, 20_000), rng.integers(1800, 2024, 20_000))])
    rels = pl.Series(RELATIONS)
    stage = StageWriter(path, StageSpec("triples", TRIPLES, params={"bench": "index_e2e", "triples": triples, "seed": seed}), num_parts=parts)
    per = -(-triples // parts // 8) * 8  # parts end at a document's end
    for part in range(parts):
        lo, hi = part * per, min(triples, (part + 1) * per)
        if lo >= hi:
            break
        m = hi - lo
        row = np.arange(lo, hi)
        doc = row // 8  # 8 consecutive triples per document
        title = (doc * 7919) % n_ent  # each document its own title entity
        head_i = np.where(rng.random(m) < 0.8, title, _zipf(n_ent, m, rng))
        rel_i = _zipf(len(RELATIONS), m, rng, s=1.0)
        date = rng.random(m) < 0.15
        tail_i = _zipf(n_ent, m, rng)
        head = ents.gather(head_i)
        tail = pl.Series(np.where(date, dates.gather(rng.integers(0, len(dates), m)).to_numpy(), ents.gather(tail_i).to_numpy()))
        df = pl.DataFrame({"doc_id": pl.Series([f"doc{d:09d}" for d in doc]), "idx": (row % 8).astype(np.int32),
                           "head": head, "relation": rels.gather(rel_i), "tail": tail})  # fmt: skip
        df = df.with_columns(pl.concat_str([pl.lit("<docid_start>"), "head", pl.lit(", "), "relation", pl.lit(", "), "tail", pl.lit("<docid_end>")]).alias("docid"))
        with stage.shard(part) as sh:
            sh.count_in(m)
            for s in range(0, m, 500_000):
                sh.write_table(df.slice(s, 500_000).to_arrow())
    stage.finish()
    return path


# ---------------------------------------------------------------------------------------- measuring


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return pids


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def run_measured(argv: list[str], area: Path, env: dict | None = None, phases: dict[str, str] | None = None) -> dict:
    """Run ``argv``; its wall time, the peak RSS of its process tree (MB) and the peak bytes under ``area``.
    ``phases``: name -> the start of a log line (stderr) that opens that phase; the peak RSS sampled in each phase
    (the phase before the first such line is ``start``) comes back as ``phase_peak_mb``."""
    peak = {"rss_kb": 0, "disk": 0}
    samples: list[tuple[float, int]] = []
    marks: list[tuple[float, str]] = []
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = time.perf_counter()
    done = threading.Event()

    def poll() -> None:
        n = 0
        while not done.is_set():
            pids = _tree(proc.pid)
            rss = sum(_status_kb(p, "VmRSS:") for p in pids)
            samples.append((time.perf_counter(), rss))
            peak["rss_kb"] = max(peak["rss_kb"], rss, *(_status_kb(p, "VmHWM:") for p in pids))
            if n % 4 == 0:
                peak["disk"] = max(peak["disk"], _du(area))
            n += 1
            time.sleep(0.05)

    err_lines: list[str] = []

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            text = line.split(" ", 2)[-1]  # after the log's date and time
            for name, start in (phases or {}).items():
                if text.startswith(start):
                    marks.append((time.perf_counter(), name))

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    te = threading.Thread(target=read_err, daemon=True)
    te.start()
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait()
    te.join()
    seconds = time.perf_counter() - started
    done.set()
    t.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv[:6]))} … exited {proc.returncode}:\n{''.join(err_lines)[-2000:]}")
    phase_peak: dict[str, float] = {}
    for at, rss in samples:
        name = "start"
        for when, m in marks:
            if when <= at:
                name = m
        phase_peak[name] = max(phase_peak.get(name, 0.0), rss / 1024)
    return {"seconds": seconds, "peak_rss_mb": peak["rss_kb"] / 1024, "peak_disk": peak["disk"], "stdout": out, "phase_peak_mb": {k: round(v) for k, v in phase_peak.items()}}


def hf_tokenize_seconds(stage: Path, sequences: int, sample: int = 200_000) -> float:
    """What HF ``tokenizers`` takes to tokenize ``sequences`` docids whole (batch encode, the llama3 tokenizer,
    this machine's threads): timed on the first ``sample`` distinct docids of the stage, scaled to ``sequences``
    (the time budget of issue #27: the command within 1.3x the FM core + tokenization at this speed)."""
    import pyarrow.parquet as pq

    from grtool.index.tokenizer import load_tokenizer
    from grtool.store.stage import shard_paths

    texts = sorted(set(pq.read_table(shard_paths(stage)[0], columns=["docid"]).column("docid").to_pylist()))[:sample]
    tok = load_tokenizer("llama3").tokenizer
    started = time.perf_counter()
    tok.encode_batch_fast(texts, add_special_tokens=False)
    return (time.perf_counter() - started) * sequences / len(texts)


def run_grtool(stage: Path, out: Path, flips: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, "-m", "grtool", "index", "build", str(stage), "--tokenizer", "llama3", "--out", str(out), "--json", *(["--flips"] if flips else [])]
    # the peak RSS of each phase, split where the command logs that it starts tokenizing and building the index
    r = run_measured(argv, out.parent, env, phases={"read": "reading docids", "tokenize": "tokenizing ", "core": "building "})
    stats = json.loads(r["stdout"])
    size = sum(f.stat().st_size for f in out.iterdir())
    build = stats.get("build", {})
    return {"seconds": r["seconds"], "peak_rss_mb": r["peak_rss_mb"], "index_mb": size / 2**20, "scratch_mb": max(0, r["peak_disk"] - size) / 2**20,
            "search_mb": stats["index_bytes"] / 2**20, "tokens": stats["tokens"], "sequences": stats["sequences"],
            "read_seconds": build.get("read_seconds"), "tokenize_seconds": build.get("tokenize_seconds"), "core_seconds": build.get("core_seconds"),
            "build_scratch_mb": build.get("scratch_bytes", 0) / 2**20, "phase_peak_mb": r["phase_peak_mb"],
            "hf_tokenize_seconds": hf_tokenize_seconds(stage, stats["sequences"])}  # fmt: skip


def seal_child(stage: str, workdir: str, flips: bool, exe: str) -> None:
    """`--seal-child`: the SEAL-like path in this process (Python + HF tokenizers), then sdsl's build as a child."""
    import pyarrow.parquet as pq

    from grtool.docid import DOCID_END, DOCID_START
    from grtool.index.tokenizer import load_tokenizer
    from grtool.store.stage import shard_paths

    tok = load_tokenizer("llama3")
    docids: set[str] = set()
    for shard in shard_paths(stage):
        cols = ["docid", "head", "relation", "tail"] if flips else ["docid"]
        t = pq.read_table(shard, columns=cols).to_pydict()
        docids.update(t["docid"])
        if flips:
            docids.update(f"{DOCID_START}{tl}, {r}, {h}{DOCID_END}" for h, r, tl in zip(t["head"], t["relation"], t["tail"]))
        del t
    texts = sorted(docids)
    del docids
    # what SEAL keeps beside the CSA to answer the same questions (docid -> its documents): the docid strings
    # (one a line) and a document number per sequence
    maps_bytes = int(sum(len(t.encode()) + 1 for t in texts)) + 4 * len(texts)
    ids = [e.ids for e in tok.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    lengths = np.array([len(x) for x in ids], dtype=np.uint32)
    w = Path(workdir)
    # the reversed text as bench/index.py feeds sdsl: separator 1, token t as t + 2
    text = np.fromiter((v for x in ids for v in (1, *(t + 2 for t in x))), dtype=np.uint32, count=int(lengths.sum()) + len(lengths))
    del ids, texts
    text[::-1].tofile(w / "sdsl_text.u32")
    del text
    lengths.tofile(w / "lengths.u32")
    np.zeros(len(lengths), np.uint32).tofile(w / "seq2doc.u32")
    for name in ("walks.u32", "locate.u32"):
        np.zeros(1, np.uint32).tofile(w / name)  # no queries: the build alone
    got = subprocess.run([exe, workdir], capture_output=True, text=True, check=True)
    result = json.loads(got.stdout.strip().splitlines()[-1])
    result["maps_bytes"] = maps_bytes
    print(json.dumps(result))


def run_seal(stage: Path, workdir: Path, flips: bool, exe: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, __file__, "--seal-child", str(stage), str(workdir), str(exe), *(["--flips"] if flips else [])]
    r = run_measured(argv, workdir, {**os.environ, "PYTHONPATH": str(ROOT)})
    sd = json.loads(r["stdout"].strip().splitlines()[-1])
    size = sd["bytes"]
    return {"seconds": r["seconds"], "peak_rss_mb": r["peak_rss_mb"], "index_mb": (size + sd["maps_bytes"]) / 2**20, "search_mb": size / 2**20,
            "scratch_mb": max(0, r["peak_disk"] - size) / 2**20, "core_seconds": sd["seconds"]}  # fmt: skip


def print_table(rows: list, flips: bool) -> None:
    """The Markdown table: per side time (grtool: reading + tokenizing + FM build), peak RSS, index (grtool: the
    whole directory, then its FM arrays; SEAL-like: the CSA + the docid strings and a document per sequence it
    keeps to answer the same questions, then the CSA alone) and scratch disk; the ratios grtool / SEAL-like; the
    command against its own FM core (goals of #27): its time over 1.3x the core + HF tokenization of the docids
    (<= 1), and its peak RSS above the core phase's (<= 200 MB)."""
    print(
        f"\n| triples | tokens{' (flips)' if flips else ''} | grtool: time (read + tokenize + core) / peak RSS / index (FM arrays) / scratch "
        "| SEAL-like: time (sdsl) / peak RSS / index + maps (CSA) / scratch | time | RSS | size (FM vs CSA) "
        "| time / (1.3 core + HF tokenize) | peak RSS − core phase's |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n, g, s in rows:
        parts = " + ".join(f"{g[k]:.1f}" for k in ("read_seconds", "tokenize_seconds", "core_seconds") if g.get(k) is not None)
        gs = f"{g['seconds']:.1f} s ({parts}) / {g['peak_rss_mb']:.0f} MB / {g['index_mb']:.0f} MB ({g['search_mb']:.0f}) / {g['scratch_mb']:.0f} MB"
        budget = g["seconds"] / (1.3 * g["core_seconds"] + g["hf_tokenize_seconds"]) if g.get("core_seconds") else float("nan")
        above = g["peak_rss_mb"] - g["phase_peak_mb"].get("core", float("nan"))
        own = f"{budget:.2f} (HF {g['hf_tokenize_seconds']:.0f} s) | {above:+.0f} MB"
        if s is None:
            print(f"| {n:,} | {g['tokens']:,} | {gs} | skipped | | | | {own} |")
            continue
        ss = f"{s['seconds']:.1f} s ({s['core_seconds']:.1f}) / {s['peak_rss_mb']:.0f} MB / {s['index_mb']:.0f} MB ({s['search_mb']:.0f}) / {s['scratch_mb']:.0f} MB"
        cells = [f"{g[k] / s[k]:.2f}{'' if g[k] / s[k] <= GOALS[k] else ' (goal ' + str(GOALS[k]) + ')'}" for k in GOALS]
        cells[-1] += f" ({g['search_mb'] / s['search_mb']:.2f})"
        print(f"| {n:,} | {g['tokens']:,} | {gs} | {ss} | " + " | ".join(cells) + f" | {own} |")


def parse_size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,5M", help="triples per stage, comma-separated (1M,5M,20M)")
    ap.add_argument("--flips", action="store_true", help="index each docid tail-first too (both sides)")
    ap.add_argument("--workdir", default=None, help="where stages and indexes go (default: a temporary directory)")
    ap.add_argument("--keep-index", default=None, metavar="DIR", help="keep grtool's index of the 5M size (else the largest) here")
    ap.add_argument("--no-seal", action="store_true", help="grtool only")
    ap.add_argument("--no-retrieve", action="store_true", help="skip the retrieve memory figures (bench/retrieve_memory.py)")
    ap.add_argument("--seal-child", nargs=3, metavar=("STAGE", "WORKDIR", "EXE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.seal_child:
        seal_child(args.seal_child[0], args.seal_child[1], args.flips, args.seal_child[2])
        return
    from index import sdsl_program  # bench/index.py: compiles the sdsl baseline (None with a message without the headers)

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    base = Path(args.workdir or tempfile.mkdtemp(prefix="grtool-e2e-"))
    base.mkdir(parents=True, exist_ok=True)
    exe = None if args.no_seal else sdsl_program(base)
    keep_at = 5_000_000 if 5_000_000 in sizes else max(sizes)
    rows = []
    for n in sizes:
        stage = base / f"triples_{n}"
        if not (stage / "_manifest.json").exists():  # a stage kept in --workdir is reused
            t = time.perf_counter()
            write_stage(stage, n)
            print(f"{n:,} triples: stage written in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        out = base / f"g{n}" / "index"
        shutil.rmtree(out.parent, ignore_errors=True)
        out.parent.mkdir(parents=True)
        g = run_grtool(stage, out, args.flips)
        print(f"{n:,} triples grtool: {json.dumps(g)}", file=sys.stderr)
        s = None
        if exe is not None:
            wd = base / f"s{n}"
            shutil.rmtree(wd, ignore_errors=True)
            try:
                s = run_seal(stage, wd, args.flips, exe)
                print(f"{n:,} triples SEAL-like: {json.dumps(s)}", file=sys.stderr)
            except (RuntimeError, subprocess.CalledProcessError) as e:
                print(f"SEAL-like side failed at {n:,} triples (out of memory?): {e}", file=sys.stderr)
            shutil.rmtree(wd, ignore_errors=True)
        if args.keep_index and n == keep_at:
            dest = Path(args.keep_index)
            shutil.rmtree(dest, ignore_errors=True)
            shutil.move(str(out), dest)
            print(f"kept the {n:,}-triple index in {dest}", file=sys.stderr)
        shutil.rmtree(out.parent, ignore_errors=True)
        rows.append((n, g, s))
    print_table(rows, args.flips)
    if not args.workdir:
        shutil.rmtree(base, ignore_errors=True)
    if not args.no_retrieve:
        # `retrieve --markers brackets` with the embedded model over an index of the 5M size (or the largest), built
        # with the model's tokenizer, against a 1K-triple one (the fixed cost of the model, imports and generation)
        print(f"\nretrieve memory (bench/retrieve_memory.py --sizes 1000,{keep_at}):", flush=True)
        subprocess.run([sys.executable, str(Path(__file__).with_name("retrieve_memory.py")), "--sizes", f"1000,{keep_at}"], check=True)


if __name__ == "__main__":
    main()
