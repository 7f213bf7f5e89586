"""Does what grtool exports train a retriever? Held-out retrieval quality on real 2WikiMultihopQA questions.

One command on a CPU (the embedded SmolLM2-135M-Instruct unless --model; any local HF folder or GGUF file works,
so a GPU user runs the same benchmark with a large model). Every step is a real `grtool` command in a child
process:

  data      the 99 real 2Wiki dev questions of ../shared/data/bench/2wikimultihopqa (or --data DIR), split by a
            stable hash of the qid into train (~2/3) and test (~1/3); `corpus ingest` of each side and of both;
            the triples stage = every question's evidence triples on its gold paragraphs (grtool.triples.evidence),
            with --index-triples all also extracted triples of the distractor paragraphs;
            test questions with a gold paragraph that holds no triple are left out (no docid can retrieve it)
  chains    for the train questions: `chains gold` (the gold teacher) and `chains synthesize --model TEACHER`,
            both through `filters apply`
  rows      on the test questions, each `retrieve` + `eval recall`, and `eval answer` with the embedded model as the
            reader given the retrieved documents (EM / F1; --no-answers leaves it out):
              BM25            `retrieve --method bm25`: bm25s over the test questions' paragraphs, top |gold| + 1, no model
              base few-shot   the base model, `--markers brackets`, 3 worked examples from the train questions
              base special    the base model with the two marker tokens added (as `train sft` adds them), no examples
              SFT             `train sft` on the gold chains
              SFT → KTO       `retrieve --samples` of the SFT model on the train questions, `export kto`, `train kto`
              w/o Thought     `train sft` on `export sft --no-thought` (docids and answer only)
              GMR             `train sft` on `export gmr` of the train questions, `retrieve --mode gmr`
              SFT (teacher)   `train sft` on the teacher's kept chains, when any pass the filters

How sure a number is: each row is the mean over the scored test questions with a 95% bootstrap interval over
the questions (bench/quality_stats.py, from each question's recall by the scorer of `eval recall`), and the
differences that matter (SFT − base, KTO − SFT, ...) are bootstrapped paired. `--seeds 0,1,2` trains every trained
row once per seed (the base rows train nothing and run once); the interval then draws the seeds too.

`--index-triples all` makes retrieval harder, as in the paper: the index (and the scorer) also hold triples of the
distractor paragraphs (2Wiki gives 10 paragraphs a question, 2-4 of them gold), which the release has no evidence
for, so `triples extract` writes them (the embedded model unless --distractor-model; slow on a CPU, kept in
--distractor-cache for reruns). The gold paragraphs keep their evidence triples; recall still counts gold ones.

Writes bench/results/quality-<model>[-distractors][-seeds-0-1-2].md (the table, seeds, model, steps, wall time,
every command with its time; rewritten after every row, so a stopped run keeps what it measured) and a .png
(`eval compare --plot` of the means).

    python bench/quality.py [--model DIR|GGUF] [--teacher MODEL|none] [--steps 100] [--questions N] [--work DIR]
                            [--seeds 0,1,2] [--index-triples gold|all] [--distractor-cache DIR] [--rows base,sft,kto]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH_DATA = REPO.parent / "shared" / "data" / "bench" / "2wikimultihopqa"  # beside the repository, as tests/conftest.py finds it
RESULTS = REPO / "bench" / "results"
TRAIN_SHARE = 2 / 3


class Failed(Exception):
    """A grtool command exited non-zero: its exit code and the last line it wrote to stderr."""

    def __init__(self, code: int, line: str):
        super().__init__(f"exit {code}: {line}")
        self.code, self.line = code, line


@dataclass
class Runner:
    """Runs `python -m grtool ...` in child processes, keeping each command line and its wall time."""

    log: list[tuple[str, float, int]] = field(default_factory=list)

    def __call__(self, *args, ok: tuple[int, ...] = (0,), stdin: Path | None = None) -> str:
        cmd = ["grtool", *map(str, args)]
        shown = shlex.join(cmd) + (f" < {stdin}" if stdin else "")
        print(f"$ {shown}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "grtool", "-q", *cmd[1:]], capture_output=True, input=stdin.read_bytes() if stdin else None)
        proc.stdout, proc.stderr = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        seconds = time.perf_counter() - t0
        self.log.append((shown, seconds, proc.returncode))
        print(f"  {seconds:.0f} s, exit {proc.returncode}", flush=True)
        if proc.returncode not in ok:
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            sys.stderr.write(proc.stderr[-3000:])
            raise Failed(proc.returncode, lines[-1] if lines else "")
        return proc.stdout


@dataclass
class Row:
    name: str
    note: str = ""
    seed: int | None = None  # the training seed; None: a row that trains nothing (run once)
    report: dict | None = None  # eval recall --json
    tokens: float | None = None  # generated tokens per question
    retrieve_s: float | None = 0.0  # None: not known (a row read back by --merge)
    train_s: float | None = 0.0
    report_file: Path | None = None
    recall_by_qid: dict[str, float] = field(default_factory=dict)
    exact_by_qid: dict[str, float] = field(default_factory=dict)
    answers: dict | None = None  # eval answer --json: the reader's EM and F1 on the retrieved documents


# ------------------------------------------------------------------------------------------------- data


def split_questions(data: Path, limit: int | None) -> tuple[list[dict], list[dict], str]:
    """The records of DATA's JSON files, train / test by a stable hash of the qid (the hash `export sft` splits by)."""
    from grtool.export.shuffle import unit_hash

    files = sorted(data.glob("*.json"))
    if not files:
        sys.exit(f"{data}: no *.json file of 2WikiMultihopQA records (pass --data DIR)")
    records = [r for f in files for r in json.loads(f.read_text())]
    records = records[:limit] if limit else records
    train = [r for r in records if unit_hash(r["_id"]) < TRAIN_SHARE]
    test = [r for r in records if unit_hash(r["_id"]) >= TRAIN_SHARE]
    if not train or not test:  # every row trains on train questions and is scored on test ones
        print(f"quality.py: error: --questions {limit}: {len(train)} train and {len(test)} test questions; both splits need one at least (give more)", file=sys.stderr)
        sys.exit(2)
    return train, test, ", ".join(f.name for f in files)


def evaluable(corpus: Path, triples: Path) -> tuple[set[str], set[str]]:
    """Questions of CORPUS whose every gold document holds a triple, and the others."""
    from grtool.store.stage import read_table

    holders = set(read_table(triples, ["doc_id"]).column("doc_id").to_pylist())
    good, bad = set(), set()
    for q in read_table(corpus / "questions", ["qid", "gold_doc_ids"]).to_pylist():
        (good if q["gold_doc_ids"] and set(q["gold_doc_ids"]) <= holders else bad).add(q["qid"])
    return good, bad


def marker_model(model: str | None, out: Path) -> Path:
    """The base model with the two docid markers added and initialised exactly as `train sft` starts from."""
    from grtool.train.model import add_markers, load_model, load_tokenizer, resize_and_init, resolve

    ref = resolve(model)
    tokenizer = load_tokenizer(ref)
    lm = load_model(ref)
    resize_and_init(lm, tokenizer, add_markers(tokenizer))
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def slug(model: str | None) -> str:
    from grtool.models import DEFAULT_MODEL_NAME

    name = DEFAULT_MODEL_NAME if model in (None, "default") else Path(model.rstrip("/")).name.removesuffix(".gguf")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-").lower()


# ------------------------------------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, args, work: Path):
        self.args, self.work, self.run = args, work, Runner()
        self.model = args.model  # None: the embedded model
        self.rows: list[Row] = []
        self.notes: list[str] = []
        self.seed = args.seeds[0]  # the training seed of the rows being run
        self.scoring = None  # (questions, docid index) of the test questions, built once

    def p(self, name: str) -> Path:
        return self.work / name

    def s(self, name: str) -> Path:
        """A path of the current training seed (each seed trains its own checkpoints)."""
        return self.work / f"seed-{self.seed}" / name

    def model_args(self, model: str | Path | None) -> list:
        return ["--model", model] if model else []

    def train(self, kind: str, data: Path, out: Path, steps: int, lr: float, cutoff: int, base: Path | str | None = None, batch: int = 1) -> float:
        t0 = time.perf_counter()
        self.run("train", kind, data, "--out", out, *self.model_args(base if base is not None else self.model),
                 "--max-steps", steps, "--per-device-batch-size", batch, "--learning-rate", lr, "--warmup-ratio", 0,
                 "--cutoff-len", cutoff, "--seed", self.seed, "--save-steps", 100_000)  # fmt: skip
        return time.perf_counter() - t0

    def index(self, tokenizer: Path | str, out: Path, *extra) -> Path:
        self.run("index", "build", self.p("triples"), "--tokenizer", tokenizer, "--flips", "--out", out, *extra)
        return out

    def retrieve(self, row: Row, index: Path, model: Path | str | None, *extra, max_tokens: int | None = None) -> Row:
        """`retrieve` the test questions and `eval recall` them into ROW."""
        where = self.p if row.seed is None else self.s
        out = where(f"responses/{slug_row(row.name)}")
        t0 = time.perf_counter()
        self.run("retrieve", self.p("test"), "--index", index, *self.model_args(model), "--max-tokens", max_tokens or self.args.max_tokens,
                 "--seed", self.seed, "--split", "test", "--out", out, *extra)  # fmt: skip
        row.retrieve_s = time.perf_counter() - t0
        return self.record(row, out)

    def bm25_row(self) -> Row:
        """The lexical baseline: no model, no index; the same test questions, |gold| + 1 documents each."""
        row, out = Row("BM25", "bm25s over the test questions' paragraphs, top |gold| + 1"), self.p("responses/bm25")
        t0 = time.perf_counter()
        self.run("retrieve", self.p("test"), "--method", "bm25", "--split", "test", "--out", out)
        row.retrieve_s = time.perf_counter() - t0
        return self.record(row, out)

    def record(self, row: Row, out: Path) -> Row:
        """`eval recall` (and `eval answer`, the embedded model reading) of a row's responses."""
        from grtool.store.stage import read_table

        where = self.p if row.seed is None else self.s
        row.report = json.loads(self.run("eval", "recall", out, "--corpus", self.p("test"), "--triples", self.p("triples"), "--json"))
        if self.args.answers:
            answers = where(f"answers/{slug_row(row.name)}")
            row.answers = json.loads(self.run("eval", "answer", out, "--corpus", self.p("test"), "--out", answers, "--max-empty-share", 1.0, "--json"))
        row.report_file = where(f"reports/{slug_row(row.name)}.json")
        row.report_file.parent.mkdir(parents=True, exist_ok=True)
        row.report_file.write_text(json.dumps(row.report))
        row.recall_by_qid, row.exact_by_qid = self.per_question(out)
        tokens = read_table(out, ["tokens"]).column("tokens").to_pylist()
        row.tokens = sum(tokens) / len(tokens) if tokens else None
        self.rows.append(row)
        print(f"  {row.name}{'' if row.seed is None else f' (seed {row.seed})'}: recall {row.report['recall']:.4f}", flush=True)
        return row

    def per_question(self, responses: Path) -> tuple[dict[str, float], dict[str, float]]:
        """Each scored test question's recall and exact set (1/0), by the scorer of `eval recall`; a question
        with several responses gets their mean."""
        from grtool.evaluation.recall import Skipped, iter_scores
        from grtool.vocab.readers import DocidIndex, QuestionIndex

        if self.scoring is None:
            self.scoring = (QuestionIndex.build(self.p("test")), DocidIndex.build(self.p("triples")))
        sums: dict[str, list[float]] = {}
        for score in iter_scores(responses, *self.scoring, Skipped()):
            acc = sums.setdefault(score.question.qid, [0.0, 0.0, 0])
            acc[0] += score.recall
            acc[1] += score.exact
            acc[2] += 1
        return {q: r / n for q, (r, _, n) in sums.items()}, {q: e / n for q, (_, e, n) in sums.items()}

    def attempt(self, name: str, fn) -> None:
        """A row that may not be possible (e.g. KTO with one class): recorded with the reason instead of a number."""
        try:
            fn()
        except Failed as e:
            self.rows.append(Row(name, note=f"not run: {e.line}", seed=self.seed))
        except Exception as e:  # noqa: BLE001 - a bug in one row must not cost the others' numbers
            self.rows.append(Row(name, note=f"failed: {type(e).__name__}: {e}", seed=self.seed))

    # -- steps

    def prepare(self) -> None:
        a = self.args
        train, test, files = split_questions(a.data, a.questions)
        src = self.p("src")
        src.mkdir(parents=True)
        (src / "data_ids_train.json").write_text(json.dumps(train))
        (src / "data_ids_test.json").write_text(json.dumps(test))
        self.run("corpus", "ingest", src / "data_ids_train.json", src / "data_ids_test.json", "--out", self.p("all"))
        self.run("corpus", "ingest", src / "data_ids_train.json", "--out", self.p("train"))
        (src / "data_ids_train_teacher.json").write_text(json.dumps(train[: a.teacher_questions]))
        self.run("corpus", "ingest", src / "data_ids_train_teacher.json", "--out", self.p("teacher"))
        from grtool.triples.evidence import write_evidence_stage

        others = self.distractor_triples() if a.index_triples == "all" else []
        n = write_evidence_stage(self.p("all"), self.p("triples"), extra=others)
        good, bad = evaluable(self.p("all"), self.p("triples"))
        kept = [r for r in test if r["_id"] in good]
        (src / "data_ids_test_scored.json").write_text(json.dumps(kept))
        self.run("corpus", "ingest", src / "data_ids_test_scored.json", "--out", self.p("test"))
        self.split = (len(train), len(test), len(kept))
        held = (f"{n - len(others)} evidence triples on the gold paragraphs and {len(others)} triples `triples extract` wrote for the "
                f"{self.distractor_docs} distractor paragraphs ({self.distractor_holders} of them hold one), all in one index"
                if others or a.index_triples == "all" else f"{n} evidence triples (the gold paragraphs only)")  # fmt: skip
        self.notes.append(
            f"Data: {files} in {os.path.relpath(a.data, REPO)} ({len(train) + len(test)} questions); train {len(train)}, test {len(test)} by a hash "
            f"of the qid; {len(test) - len(kept)} test questions left out because a gold paragraph holds no evidence "
            f"triple (no docid can retrieve it), so {len(kept)} are scored. Triples: {held}."
        )  # fmt: skip

    def distractor_triples(self) -> list[dict]:
        """Triples of every paragraph that is gold for no question, by `grtool triples extract` with the bench's
        model settings (--distractor-model, the tiny embedded one by default). Extraction is slow on a CPU, so
        its stage lives in --distractor-cache and a rerun over the same paragraphs reuses it."""
        from grtool.store.stage import read_table

        gold = {d for q in read_table(self.p("all/questions"), ["gold_doc_ids"]).column("gold_doc_ids").to_pylist() for d in q or ()}
        docs = [d for d in read_table(self.p("all/documents")).to_pylist() if d["doc_id"] not in gold]
        self.distractor_docs = len(docs)
        cache = self.args.distractor_cache or self.p("distractor-triples")
        cache.mkdir(parents=True, exist_ok=True)
        listing = "".join(json.dumps(d, sort_keys=True) + "\n" for d in docs)
        stage = cache / "extract"
        if not ((cache / "documents.jsonl").exists() and (cache / "documents.jsonl").read_text() == listing and (stage / "triples").is_dir()):
            (cache / "documents.jsonl").write_text(listing)
            model = ["--model", self.args.distractor_model] if self.args.distractor_model else []
            t0 = time.perf_counter()
            self.run("triples", "extract", "-", "--out", stage, "--cache-dir", cache / "llm-cache", "--overwrite", "--backend", "transformers", *model,
                     "--max-tokens", 256, "--max-empty-share", 1.0, "--grounding", "loose", "--seed", 0, stdin=cache / "documents.jsonl")  # fmt: skip
            self.notes.append(f"Distractor triples: `triples extract` of {len(docs)} paragraphs took {time.perf_counter() - t0:.0f} s.")
        else:
            self.notes.append(f"Distractor triples: reused from the cache ({len(docs)} paragraphs).")
        rows = read_table(stage / "triples", ["doc_id", "idx", "head", "relation", "tail", "docid"]).to_pylist()
        self.distractor_holders = len({r["doc_id"] for r in rows})
        return rows

    def base_rows(self, rows: set[str]) -> None:
        if "bm25" in rows:
            self.bm25_row()
        if "base" in rows:
            index = self.index(self.model or "default", self.p("index-base"))
            self.retrieve(Row("base few-shot", "brackets, 3 examples from train"), index, self.model,
                          "--markers", "brackets", "--few-shot", 3, "--few-shot-from", self.p("train"))  # fmt: skip
        if "special" in rows:
            marked = marker_model(self.model, self.p("base-markers"))
            self.retrieve(Row("base special", "marker tokens added, untrained, no examples"), self.index(marked, self.p("index-markers")), marked, "--few-shot", 0)

    def gold_chains(self) -> None:
        out = json.loads(self.run("chains", "gold", self.p("train"), self.p("triples"), "--out", self.p("chains-gold"), "--split", "train", "--json"))
        self.run("filters", "apply", self.p("chains-gold"), "--corpus", self.p("train"), "--triples", self.p("triples"), "--out", self.p("filtered-gold"), "--split", "train")
        self.gold_kept = kept(self.p("filtered-gold"))
        rejected = ", ".join(f"{n} {why}" for why, n in out["rejected"].items()) or "none"
        self.notes.append(f"Gold teacher: `chains gold` wrote {out['rows']} chains for {out['questions']} train questions (rejected: {rejected}); {self.gold_kept} passed the filters.")

    def sft_row(self, name: str, filtered: Path, ckpt: str, *export_extra, note: str = "", corpus: Path | None = None) -> Path:
        data = self.s(f"export/{ckpt}.json")
        self.run("export", "sft", filtered, "--corpus", corpus or self.p("train"), "--out", data, "--seed", self.seed, "--split", "train", *export_extra)
        seconds = self.train("sft", data, self.s(ckpt), self.args.steps, self.args.lr, 512)
        row = self.retrieve(Row(name, note, self.seed), self.index(self.s(ckpt), self.s(f"index-{ckpt}")), self.s(ckpt))
        row.train_s = seconds
        return self.s(ckpt)

    def kto_row(self) -> None:
        a = self.args
        sft = self.s("sft")
        samples = self.s("responses/sft-samples-train")
        t0 = time.perf_counter()
        self.run("retrieve", self.p("train"), "--index", self.s("index-sft"), "--model", sft, "--samples", a.kto_samples, "--temperature", 1.0,
                 "--max-tokens", a.max_tokens, "--seed", self.seed, "--split", "train", "--out", samples)  # fmt: skip
        labels = json.loads(
            self.run("export", "kto", samples, "--corpus", self.p("train"), "--triples", self.p("triples"), "--out", self.s("export/kto.json"), "--split", "train", "--json", ok=(0, 1)) or "{}"
        )
        sampling = time.perf_counter() - t0
        self.notes.append(f"Seed {self.seed}: KTO labels (`export kto`, exact gold set desirable, recall < 0.5 undesirable) of {a.kto_samples} samples per train question at temperature 1.0: "
                          f"{labels.get('desirable')} desirable, {labels.get('undesirable')} undesirable, {labels.get('dropped')} dropped.")  # fmt: skip
        if not labels.get("desirable") or not labels.get("undesirable"):
            self.rows.append(Row("SFT → KTO", note="not run: KTO needs both classes", seed=self.seed))
            return
        seconds = self.train("kto", self.s("export/kto.json"), self.s("kto"), a.kto_steps, a.kto_lr, 512, base=sft, batch=2)
        row = self.retrieve(Row("SFT → KTO", f"{a.kto_steps} KTO steps from SFT", self.seed), self.s("index-sft"), self.s("kto"))
        row.train_s = seconds + sampling

    def gmr_row(self) -> None:
        a = self.args
        data = self.s("export/gmr.jsonl")
        self.run("export", "gmr", self.p("train"), "--out", data, "--split", "train")
        seconds = self.train("sft", data, self.s("gmr"), a.steps, a.lr, 1024)
        index = self.s("index-gmr")
        self.run("index", "build", self.p("all/documents"), "--source", "documents", "--tokenizer", self.s("gmr"), "--out", index)
        from grtool.index.base import Index

        longest = Index.open(index).meta["sizes"]["max_sequence_tokens"]  # a step writes one whole document
        limit = ["--limit", a.gmr_questions] if a.gmr_questions else []
        scored = f"the first {a.gmr_questions} test questions, " if a.gmr_questions and a.gmr_questions < self.split[2] else ""
        row = self.retrieve(Row("GMR", f"{scored}one whole document per step, greedy, at most {a.gmr_steps} steps", self.seed), index, self.s("gmr"),
                            "--mode", "gmr", "--max-steps", a.gmr_steps, *limit, max_tokens=longest + 8)  # fmt: skip
        row.train_s = seconds

    def teacher_row(self) -> None:
        a = self.args
        chains, filtered = self.s("chains-teacher"), self.s("filtered-teacher")
        teacher = [] if a.teacher == "default" else ["--model", a.teacher]
        t0 = time.perf_counter()
        self.run("chains", "synthesize", self.p("teacher"), self.p("triples"), "--out", chains, "--backend", a.teacher_backend, *teacher,
                 "--candidates", a.teacher_candidates, "--few-shot-corpus", 3, "--max-tokens", 192, "--max-empty-share", 1.0, "--seed", self.seed, "--split", "train")  # fmt: skip
        self.run("filters", "apply", chains, "--corpus", self.p("teacher"), "--triples", self.p("triples"), "--out", filtered, "--report", self.s("reports/filters-teacher.md"), "--split", "train")
        synth = time.perf_counter() - t0
        n = kept(filtered)
        name = slug(None if a.teacher == "default" else a.teacher)
        self.notes.append(f"Seed {self.seed}: teacher {name} (`chains synthesize --backend {a.teacher_backend} --candidates {a.teacher_candidates} --few-shot-corpus 3`, "
                          f"{synth:.0f} s): {n} of the first {min(a.teacher_questions, self.split[0])} train questions kept a chain after `filters apply`.")  # fmt: skip
        if n == 0:
            self.rows.append(Row(f"SFT (teacher {name})", note="not run: no chain passed the filters", seed=self.seed))
            return
        self.sft_row(f"SFT (teacher {name})", filtered, "sft-teacher", note=f"{n} chains", corpus=self.p("teacher"))
        self.rows[-1].train_s += synth


def kept(filtered: Path) -> int:
    from grtool.store.stage import read_table

    return sum(read_table(filtered, ["selected"]).column("selected").to_pylist())


def slug_row(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ------------------------------------------------------------------------------------------------- report


# rows compared pairwise in the results (A − B, bootstrapped paired); a name ending in "(" matches by prefix
COMPARISONS = [
    ("base few-shot", "BM25"),
    ("SFT", "BM25"),
    ("SFT", "base few-shot"),
    ("SFT → KTO", "SFT"),
    ("SFT → KTO", "base few-shot"),
    ("w/o Thought", "SFT"),
    ("GMR", "base few-shot"),
    ("SFT (teacher", "SFT"),
]


def grouped(rows: list[Row]) -> dict[str, list[Row]]:
    """A row name's runs (one per training seed), in the order the rows first ran."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.name, []).append(r)
    return groups


def score_matrix(runs: list[Row], attr: str, qids: list[str]) -> list[list[float]]:
    """Seeds × questions of one measure (``recall_by_qid`` or ``exact_by_qid``)."""
    return [[getattr(r, attr)[q] for q in qids] for r in runs]


def common_qids(runs: list[Row]) -> list[str]:
    return sorted(set.intersection(*(set(r.recall_by_qid) for r in runs))) if runs else []


def paired_runs(a: list[Row], b: list[Row]) -> tuple[list[Row], list[Row]]:
    """Seed lines of A and B to subtract: the seeds both trained (in order), or every line against a row run once."""
    if a[0].seed is None or b[0].seed is None:
        return a, b
    seeds = [r.seed for r in a if r.seed in {x.seed for x in b}]
    return [r for r in a if r.seed in seeds], [next(x for x in b if x.seed == s) for s in seeds]


def mean_report(reports: list[dict]) -> dict:
    """The mean of several `eval recall --json` reports, field by field (numbers only), for `eval compare`."""
    first = reports[0]
    if isinstance(first, dict):
        return {k: mean_report([r[k] for r in reports]) if all(isinstance(r.get(k), (dict, int, float)) and not isinstance(r.get(k), bool) for r in reports) else v
                for k, v in first.items()}  # fmt: skip
    return sum(reports) / len(reports)


def reader_text(runs: list[Row]) -> str:
    scored = [r.answers for r in runs if r.answers and r.answers.get("scored")]
    if not scored:
        return "-"
    return f"{sum(a['exact_match'] for a in scored) / len(scored):.3f} / {sum(a['f1'] for a in scored) / len(scored):.3f}"


def mean_text(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{sum(known) / len(known):.0f}" if known else "-"


def results_name(args) -> str:
    seeds = "" if args.seeds == [0] else "-seeds-" + "-".join(map(str, args.seeds))
    return f"quality-{slug(args.model)}{'-distractors' if args.index_triples == 'all' else ''}{seeds}"


def write_results(bench: Bench, wall: float, started: str, finished: bool = True, merged: tuple[Path, ...] = ()) -> Path:
    from quality_stats import RESAMPLES, bootstrap, paired_difference

    a = bench.args
    a.results.mkdir(parents=True, exist_ok=True)
    md, png = a.results / f"{results_name(a)}.md", a.results / f"{results_name(a)}.png"
    groups = grouped(bench.rows)
    plotted = []
    for name, runs in groups.items():
        reports = [r.report for r in runs if r.report]
        if reports:
            path = bench.p(f"reports/mean-{slug_row(name)}.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(mean_report(reports)))
            plotted.append(f"{name}={path}")
    if plotted and finished:
        bench.run("eval", "compare", *plotted, "--out", bench.p("reports/compare.md"), "--plot", png)
    n_train, n_test, n_scored = bench.split
    seeds = ", ".join(map(str, a.seeds))
    lines = [
        f"# Retrieval quality on held-out 2WikiMultihopQA questions: {slug(a.model)}" + (", distractor paragraphs in the index" if a.index_triples == "all" else ""),
        "",
        f"`{' '.join(['python bench/quality.py', *sys.argv[1:]])}` — "
        + (
            f"the rows of {len(merged)} runs of the bench read back from their folders on {started}."
            if merged
            else f"started {started}, "
            + (f"**wall time {wall / 60:.1f} min**" if finished else f"**still running: the rows finished after {wall / 60:.1f} min**")
            + f" on {os.cpu_count()} CPU cores shared with other work."
        ),
        "",
        f"Model `{a.model or 'SmolLM2-135M-Instruct (embedded)'}`, training seeds {seeds}; SFT {a.steps} steps (batch 1, lr {a.lr}, no warm-up), "
        f"KTO {a.kto_steps} steps (batch 2, lr {a.kto_lr}) from the SFT checkpoint of the same seed; retrieve greedy, `--max-tokens {a.max_tokens}`, "
        f"index `--flips` built with each model's tokenizer (index triples: {a.index_triples}). "
        f"Train questions {n_train}, test questions {n_test} ({n_scored} scored).",
        "",
        "| row | seeds | recall [95% interval] | recall per seed | exact set [95% interval] | hallucinated / docids | reader EM / F1 | tokens / question | retrieve s | train s | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, runs in groups.items():
        done = [r for r in runs if r.report]
        notes = "; ".join(dict.fromkeys(r.note if r.report or r.seed is None else f"seed {r.seed}: {r.note}" for r in runs if r.note))
        if not done:
            lines.append(f"| {name} | - | - | - | - | - | - | - | - | - | {notes} |")
            continue
        qids = common_qids(done)
        recall, exact = bootstrap(score_matrix(done, "recall_by_qid", qids)), bootstrap(score_matrix(done, "exact_by_qid", qids))
        seed_list = "-" if done[0].seed is None else ", ".join(str(r.seed) for r in done)
        per_seed = " / ".join(f"{x:.3f}" for x in recall.per_seed) if len(done) > 1 else "-"
        hall = f"{sum(r.report['hallucinated'] for r in done)} / {sum(r.report['docids'] for r in done)}"
        lines.append(f"| {name} | {seed_list} | {recall.text()} | {per_seed} | {exact.text()} | {hall} | {reader_text(done)} | {mean_text([r.tokens for r in done])} | "
                     f"{mean_text([r.retrieve_s for r in done])} | {mean_text([r.train_s for r in done])} | {notes} |")  # fmt: skip
    diffs = []
    for left, right in COMPARISONS:
        lname = next((n for n in groups if n == left or (left.endswith("(teacher") and n.startswith(left))), None)
        a_runs, b_runs = ([r for r in groups.get(n, []) if r.report] for n in (lname, right))
        if not a_runs or not b_runs:
            continue
        a_runs, b_runs = paired_runs(a_runs, b_runs)
        if not a_runs:
            continue
        qids = sorted(set(common_qids(a_runs)) & set(common_qids(b_runs)))
        d_recall = paired_difference(score_matrix(a_runs, "recall_by_qid", qids), score_matrix(b_runs, "recall_by_qid", qids))
        d_exact = paired_difference(score_matrix(a_runs, "exact_by_qid", qids), score_matrix(b_runs, "exact_by_qid", qids))
        verdict = f"yes: {lname} {'above' if d_recall.mean > 0 else 'below'}" if d_recall.excludes_zero() else "no: the interval holds 0"
        diffs.append(f"| {lname} − {right} | {len(qids)} | {len(a_runs) if a_runs[0].seed is not None else len(b_runs) if b_runs[0].seed is not None else 1} | "
                     f"{d_recall.text()} | {d_exact.text()} | {verdict} |")  # fmt: skip
    if diffs:
        lines += ["", "Differences between rows, paired on the same questions (and seeds):", "",
                  "| difference | questions | seed lines | recall [95% interval] | exact set [95% interval] | recall difference sure? |",
                  "|---|---:|---:|---:|---:|---|", *diffs]  # fmt: skip
    lines += [
        "",
        "Recall = |retrieved ∩ gold| / |gold| per question (the scorer of `eval recall`); exact set = the retrieved documents are exactly "
        "the gold ones; a GMR step writes a whole document, so its docids column counts documents. Reader EM / F1: `eval answer`, the embedded "
        "model answering from the documents each response retrieved, scored with SQuAD v1.1's normalisation (means over the seeds). `train s` includes "
        "the sampling of the KTO row and the chain synthesis of the teacher row; seconds and tokens are means over the seeds, "
        "hallucinated / docids their sum.",
        "",
        f"Each value is the mean over the scored questions (and the seeds); the interval is a 95% percentile bootstrap ({RESAMPLES} resamples, "
        "fixed seed) that draws the questions with replacement and, for a trained row, its seeds with replacement too (bench/quality_stats.py). "
        "A difference draws the same questions and seeds for both rows; it is sure when its interval leaves out 0. "
        "The base rows train nothing and run once.",
        "",
        *(f"- {n}" for n in bench.notes),
        "",
        *([f"![recall]({png.name})", ""] if finished and plotted else []),
        "<details><summary>Every command, with its wall time</summary>",
        "",
        "```",
        *(f"{s:7.0f} s  exit {code}  {cmd}" for cmd, s, code in bench.run.log),
        "```",
        "</details>",
        "",
    ]
    text = "\n".join(lines).replace(str(bench.work), "WORK")
    if a.distractor_cache:
        text = text.replace(str(a.distractor_cache), "CACHE")
    md.write_text(text)
    return md


ROW_NAMES = ("BM25", "base few-shot", "base special", "SFT", "SFT → KTO", "w/o Thought", "GMR")  # the order of the table


def rows_from_work(bench: Bench) -> list[Row]:
    """The rows a run of this bench left in its folder: each `eval recall` report under reports/ (rows run once)
    or seed-N/reports/ (trained rows), scored per question again from its responses. Times and notes are not
    kept there: the run's own results file has them."""
    from grtool.store.stage import read_table

    names = {slug_row(n): n for n in ROW_NAMES}
    seeded = [(d, int(d.name.removeprefix("seed-"))) for d in sorted(bench.work.glob("seed-*")) if d.name.removeprefix("seed-").isdigit()]
    rows = []
    for folder, seed in [(bench.work, None), *seeded]:
        for report in sorted((folder / "reports").glob("*.json")):
            name = names.get(report.stem) or (f"SFT (teacher {report.stem.removeprefix('sft-teacher-')})" if report.stem.startswith("sft-teacher-") else None)
            if name is None:  # the means write_results keeps for `eval compare`
                continue
            responses = folder / "responses" / report.stem
            row = Row(name, seed=seed, report=json.loads(report.read_text()), report_file=report, retrieve_s=None, train_s=None)
            row.recall_by_qid, row.exact_by_qid = bench.per_question(responses)
            tokens = read_table(responses, ["tokens"]).column("tokens").to_pylist()
            row.tokens = sum(tokens) / len(tokens) if tokens else None
            rows.append(row)
    return rows


def merge(args) -> Path:
    """One results file from the rows of several runs on the same questions (e.g. each seed on its own machine);
    a row (and seed) two runs both hold is taken from the first."""
    from grtool.store.stage import read_table

    rows: dict[tuple[str, int | None], Row] = {}
    tests = set()
    for work in args.merge:
        if not (work / "test" / "questions").is_dir():
            sys.exit(f"--merge {work}: not a folder of a bench run (no test/questions)")
        for r in rows_from_work(Bench(args, work)):
            rows.setdefault((r.name, r.seed), r)
        tests.add(tuple(sorted(read_table(work / "test" / "questions", ["qid"]).column("qid").to_pylist())))
    if len(tests) > 1:
        sys.exit(f"--merge {' '.join(map(str, args.merge))}: the runs scored different test questions")
    first = args.merge[0]
    bench = Bench(args, Path(tempfile.mkdtemp(prefix="grtool_quality_merge_")))
    order = {n: i for i, n in enumerate(ROW_NAMES)}
    bench.rows = sorted(rows.values(), key=lambda r: (order.get(r.name, len(order)), r.name, -1 if r.seed is None else r.seed))
    bench.split = (read_table(first / "train" / "questions", ["qid"]).num_rows, len(json.loads((first / "src" / "data_ids_test.json").read_text())), len(next(iter(tests))))
    args.seeds = sorted({r.seed for r in bench.rows if r.seed is not None}) or args.seeds
    bench.notes.append(f"Rows read back from the runs in {', '.join(map(str, args.merge))}; each run's own results file holds its notes, times and commands.")
    try:
        return write_results(bench, 0.0, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), merged=tuple(args.merge))
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)


ROWS = ("bm25", "base", "special", "sft", "kto", "nothought", "gmr", "teacher")


def check_arguments(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the CLI checks of its own options, checked here too before anything runs: one line, exit 2."""
    unknown = sorted(set(args.rows.split(",")) - set(ROWS))
    if unknown:
        ap.error(f"--rows {args.rows}: unknown row {', '.join(map(repr, unknown))} (rows: {', '.join(ROWS)})")
    for name in ("questions", "steps", "kto_steps", "kto_samples", "gmr_steps", "teacher_candidates", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} {value}: accepted is a whole number from 1")
    for name in ("gmr_questions", "teacher_questions"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: accepted is 0 (all) or more")
    if args.work is not None and args.work.exists() and not args.work.is_dir():
        ap.error(f"--work {args.work}: not a folder (the intermediate stages go into one)")
    if args.work is not None and args.work.is_dir() and any(args.work.iterdir()):
        ap.error(f"--work {args.work}: not empty")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=BENCH_DATA, help="folder of 2Wiki data_ids JSON files with evidences")
    ap.add_argument("--model", help="base model: a local HF folder or a .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--teacher", default="default", help="model for `chains synthesize` ('none': skip; default: the embedded model)")
    ap.add_argument("--teacher-backend", default="transformers", choices=("transformers", "vllm", "openai"))
    ap.add_argument("--teacher-candidates", type=int, default=1)
    ap.add_argument("--questions", type=int, help="only the first N questions (a quick try)")
    ap.add_argument("--steps", type=int, default=60, help="SFT steps (w/o Thought, GMR and the teacher row too)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--kto-steps", type=int, default=12)
    ap.add_argument("--kto-lr", type=float, default=5e-5)
    ap.add_argument("--kto-samples", type=int, default=2, help="samples per train question for the KTO labels")
    ap.add_argument("--gmr-steps", type=int, default=4)
    ap.add_argument("--gmr-questions", type=int, default=12, help="GMR writes whole documents (slow on a CPU): scored on the first N test questions (0: all)")
    ap.add_argument("--teacher-questions", type=int, default=12, help="the teacher writes chains for the first N train questions")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--seed", type=int, default=0, help="the training seed (one)")
    ap.add_argument("--seeds", help="comma-separated training seeds, e.g. 0,1,2: every trained row runs once per seed (default: --seed)")
    ap.add_argument("--index-triples", choices=("gold", "all"), default="gold",
                    help="gold: the index holds the evidence triples of the gold paragraphs; all: also triples `triples extract` writes "
                         "for the distractor paragraphs, so retrieval chooses among every paragraph of the questions")  # fmt: skip
    ap.add_argument("--distractor-model", help="model of `triples extract` for the distractor paragraphs (default: the embedded one)")
    ap.add_argument("--distractor-cache", type=Path, help="keep the distractor triples here and reuse them on a rerun (default: inside --work)")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of bm25,base,special,sft,kto,nothought,gmr,teacher "
                    "(bm25: the lexical baseline; base: the few-shot base model; special: the base model with marker tokens)")  # fmt: skip
    ap.add_argument("--no-answers", dest="answers", action="store_false", help="leave out `eval answer` (the embedded model reading each row's documents)")
    ap.add_argument("--work", type=Path, help="keep the intermediate stages here (default: a temporary folder, removed)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="where the results file and plot go (default: bench/results)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="WORK",
                    help="run nothing: write one results file from the --work folders of earlier runs on the same questions "
                         "(e.g. --seeds 0 and --seeds 1 run apart); pass the settings those runs used")  # fmt: skip
    args = ap.parse_args()
    check_arguments(ap, args)
    if not args.data.is_dir():
        sys.exit(f"--data {args.data}: not a folder (the bench data lives in ../shared/data/bench/2wikimultihopqa)")
    try:
        args.seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    except ValueError:
        sys.exit(f"--seeds {args.seeds}: not a comma-separated list of integers")
    if len(set(args.seeds)) != len(args.seeds):
        sys.exit(f"--seeds {args.seeds}: a seed is listed twice")
    if args.merge:
        md = merge(args)
        print(md.read_text())
        print(f"wrote {md}")
        return
    rows = set(args.rows.split(","))
    work = args.work or Path(tempfile.mkdtemp(prefix="grtool_quality_"))
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    bench = Bench(args, work)

    def save() -> None:  # the results so far, so a run stopped early still leaves what it measured
        try:
            write_results(bench, time.perf_counter() - t0, started, finished=False)
        except Exception:  # noqa: BLE001 - a report that fails must not stop the measurement (the final one still raises)
            traceback.print_exc()

    try:
        bench.prepare()
        bench.base_rows(rows)
        save()
        bench.gold_chains()
        for seed in args.seeds:  # the main rows of every seed first, then the ablations
            bench.seed = seed
            if rows & {"sft", "kto"}:
                bench.sft_row("SFT", bench.p("filtered-gold"), "sft", note=f"{bench.gold_kept} gold chains")
                save()
            if "kto" in rows:
                bench.attempt("SFT → KTO", bench.kto_row)
                save()
        for seed in args.seeds:
            bench.seed = seed
            if "nothought" in rows:
                bench.sft_row("w/o Thought", bench.p("filtered-gold"), "sft-nothought", "--no-thought", note="gold chains, docids and answer only")
                save()
            if "gmr" in rows:
                bench.attempt("GMR", bench.gmr_row)
                save()
            if "teacher" in rows and args.teacher != "none":
                bench.attempt("SFT (teacher)", bench.teacher_row)
                save()
        md = write_results(bench, time.perf_counter() - t0, started)
        print(md.read_text())
        print(f"wrote {md}")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
