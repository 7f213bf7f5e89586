"""Does what grtool exports train a retriever? Held-out retrieval quality on real 2WikiMultihopQA questions.

One command on a CPU (the embedded SmolLM2-135M-Instruct unless --model; any local HF folder or GGUF file works,
so a GPU user runs the same benchmark with a large model). Every step is a real `grtool` command in a child
process:

  data      the 99 real 2Wiki dev questions of ../shared/data/bench/2wikimultihopqa (or --data DIR), split by a
            stable hash of the qid into train (~2/3) and test (~1/3); `corpus ingest` of each side and of both;
            the triples stage = every question's evidence triples on its gold paragraphs (grtool.triples.evidence);
            test questions with a gold paragraph that holds no triple are left out (no docid can retrieve it)
  chains    for the train questions: `chains gold` (the gold teacher) and `chains synthesize --model TEACHER`,
            both through `filters apply`
  rows      on the test questions, each `retrieve` + `eval recall`:
              base few-shot   the base model, `--markers brackets`, 3 worked examples from the train questions
              base special    the base model with the two marker tokens added (as `train sft` adds them), no examples
              SFT             `train sft` on the gold chains
              SFT → KTO       `retrieve --samples` of the SFT model on the train questions, `export kto`, `train kto`
              w/o Thought     `train sft` on `export sft --no-thought` (docids and answer only)
              GMR             `train sft` on `export gmr` of the train questions, `retrieve --mode gmr`
              SFT (teacher)   `train sft` on the teacher's kept chains, when any pass the filters
Writes bench/results/quality-<model>.md (the table, seed, model, steps, wall time, every command with its time)
and bench/results/quality-<model>.png (`eval compare --plot`).

    python bench/quality.py [--model DIR|GGUF] [--teacher MODEL|none] [--steps 100] [--questions N] [--work DIR]
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

    def __call__(self, *args, ok: tuple[int, ...] = (0,)) -> str:
        cmd = ["grtool", *map(str, args)]
        print(f"$ {shlex.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "grtool", "-q", *cmd[1:]], capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        self.log.append((shlex.join(cmd), seconds, proc.returncode))
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
    report: dict | None = None  # eval recall --json
    tokens: float | None = None  # generated tokens per question
    retrieve_s: float = 0.0
    train_s: float = 0.0
    report_file: Path | None = None


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
    from grtool.llm.models import DEFAULT_MODEL_NAME

    name = DEFAULT_MODEL_NAME if model in (None, "default") else Path(model.rstrip("/")).name.removesuffix(".gguf")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-").lower()


# ------------------------------------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, args, work: Path):
        self.args, self.work, self.run = args, work, Runner()
        self.model = args.model  # None: the embedded model
        self.rows: list[Row] = []
        self.notes: list[str] = []

    def p(self, name: str) -> Path:
        return self.work / name

    def model_args(self, model: str | Path | None) -> list:
        return ["--model", model] if model else []

    def train(self, kind: str, data: Path, out: Path, steps: int, lr: float, cutoff: int, base: Path | str | None = None, batch: int = 1) -> float:
        t0 = time.perf_counter()
        self.run("train", kind, data, "--out", out, *self.model_args(base if base is not None else self.model),
                 "--max-steps", steps, "--per-device-batch-size", batch, "--learning-rate", lr, "--warmup-ratio", 0,
                 "--cutoff-len", cutoff, "--seed", self.args.seed, "--save-steps", 100_000)  # fmt: skip
        return time.perf_counter() - t0

    def index(self, tokenizer: Path | str, name: str, *extra) -> Path:
        out = self.p(name)
        self.run("index", "build", self.p("triples"), "--tokenizer", tokenizer, "--flips", "--out", out, *extra)
        return out

    def retrieve(self, row: Row, index: Path, model: Path | str | None, *extra, max_tokens: int | None = None) -> Row:
        """`retrieve` the test questions and `eval recall` them into ROW."""
        from grtool.store.stage import read_table

        out = self.p(f"responses/{slug_row(row.name)}")
        t0 = time.perf_counter()
        self.run("retrieve", self.p("test"), "--index", index, *self.model_args(model), "--max-tokens", max_tokens or self.args.max_tokens,
                 "--seed", self.args.seed, "--split", "test", "--out", out, *extra)  # fmt: skip
        row.retrieve_s = time.perf_counter() - t0
        row.report = json.loads(self.run("eval", "recall", out, "--corpus", self.p("test"), "--triples", self.p("triples"), "--json"))
        row.report_file = self.p(f"reports/{slug_row(row.name)}.json")
        row.report_file.parent.mkdir(parents=True, exist_ok=True)
        row.report_file.write_text(json.dumps(row.report))
        tokens = read_table(out, ["tokens"]).column("tokens").to_pylist()
        row.tokens = sum(tokens) / len(tokens) if tokens else None
        self.rows.append(row)
        print(f"  {row.name}: recall {row.report['recall']:.4f}", flush=True)
        return row

    def attempt(self, name: str, fn) -> None:
        """A row that may not be possible (e.g. KTO with one class): recorded with the reason instead of a number."""
        try:
            fn()
        except Failed as e:
            self.rows.append(Row(name, note=f"not run: {e.line}"))
        except Exception as e:  # noqa: BLE001 - a bug in one row must not cost the others' numbers
            self.rows.append(Row(name, note=f"failed: {type(e).__name__}: {e}"))

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

        n = write_evidence_stage(self.p("all"), self.p("triples"))
        good, bad = evaluable(self.p("all"), self.p("triples"))
        kept = [r for r in test if r["_id"] in good]
        (src / "data_ids_test_scored.json").write_text(json.dumps(kept))
        self.run("corpus", "ingest", src / "data_ids_test_scored.json", "--out", self.p("test"))
        self.split = (len(train), len(test), len(kept))
        self.notes.append(
            f"Data: {files} in {os.path.relpath(a.data, REPO)} ({len(train) + len(test)} questions); train {len(train)}, test {len(test)} by a hash "
            f"of the qid; {len(test) - len(kept)} test questions left out because a gold paragraph holds no evidence "
            f"triple (no docid can retrieve it), so {len(kept)} are scored. Triples: {n} evidence triples."
        )  # fmt: skip

    def base_rows(self) -> None:
        base_tok = self.model or "default"
        index = self.index(base_tok, "index-base")
        self.retrieve(Row("base few-shot", "brackets, 3 examples from train"), index, self.model,
                      "--markers", "brackets", "--few-shot", 3, "--few-shot-from", self.p("train"))  # fmt: skip
        marked = marker_model(self.model, self.p("base-markers"))
        self.retrieve(Row("base special", "marker tokens added, untrained, no examples"), self.index(marked, "index-markers"), marked, "--few-shot", 0)

    def gold_chains(self) -> None:
        out = json.loads(self.run("chains", "gold", self.p("train"), self.p("triples"), "--out", self.p("chains-gold"), "--split", "train", "--json"))
        self.run("filters", "apply", self.p("chains-gold"), "--corpus", self.p("train"), "--triples", self.p("triples"), "--out", self.p("filtered-gold"), "--split", "train")
        self.gold_kept = kept(self.p("filtered-gold"))
        rejected = ", ".join(f"{n} {why}" for why, n in out["rejected"].items()) or "none"
        self.notes.append(f"Gold teacher: `chains gold` wrote {out['rows']} chains for {out['questions']} train questions (rejected: {rejected}); {self.gold_kept} passed the filters.")

    def sft_row(self, name: str, filtered: Path, ckpt: str, *export_extra, note: str = "", corpus: Path | None = None) -> Path:
        data = self.p(f"export/{ckpt}.json")
        self.run("export", "sft", filtered, "--corpus", corpus or self.p("train"), "--out", data, "--seed", self.args.seed, "--split", "train", *export_extra)
        seconds = self.train("sft", data, self.p(ckpt), self.args.steps, self.args.lr, 512)
        row = self.retrieve(Row(name, note), self.index(self.p(ckpt), f"index-{ckpt}"), self.p(ckpt))
        row.train_s = seconds
        return self.p(ckpt)

    def kto_row(self) -> None:
        a = self.args
        sft = self.p("sft")
        samples = self.p("responses/sft-samples-train")
        t0 = time.perf_counter()
        self.run("retrieve", self.p("train"), "--index", self.p("index-sft"), "--model", sft, "--samples", a.kto_samples, "--temperature", 1.0,
                 "--max-tokens", a.max_tokens, "--seed", a.seed, "--split", "train", "--out", samples)  # fmt: skip
        labels = json.loads(self.run("export", "kto", samples, "--corpus", self.p("train"), "--triples", self.p("triples"), "--out", self.p("export/kto.json"), "--split", "train", "--json", ok=(0, 1)) or "{}")
        sampling = time.perf_counter() - t0
        self.notes.append(f"KTO labels (`export kto`, exact gold set desirable, recall < 0.5 undesirable) of {a.kto_samples} samples per train question at temperature 1.0: "
                          f"{labels.get('desirable')} desirable, {labels.get('undesirable')} undesirable, {labels.get('dropped')} dropped.")  # fmt: skip
        if not labels.get("desirable") or not labels.get("undesirable"):
            self.rows.append(Row("SFT → KTO", note="not run: KTO needs both classes"))
            return
        seconds = self.train("kto", self.p("export/kto.json"), self.p("kto"), a.kto_steps, a.kto_lr, 512, base=sft, batch=2)
        row = self.retrieve(Row("SFT → KTO", f"{a.kto_steps} KTO steps from SFT"), self.p("index-sft"), self.p("kto"))
        row.train_s = seconds + sampling

    def gmr_row(self) -> None:
        a = self.args
        data = self.p("export/gmr.jsonl")
        self.run("export", "gmr", self.p("train"), "--out", data, "--split", "train")
        seconds = self.train("sft", data, self.p("gmr"), a.steps, a.lr, 1024)
        index = self.p("index-gmr")
        self.run("index", "build", self.p("all/documents"), "--source", "documents", "--tokenizer", self.p("gmr"), "--out", index)
        from grtool.index.base import Index

        longest = Index.open(index).meta["sizes"]["max_sequence_tokens"]  # a step writes one whole document
        limit = ["--limit", a.gmr_questions] if a.gmr_questions else []
        scored = f"the first {a.gmr_questions} test questions, " if a.gmr_questions and a.gmr_questions < self.split[2] else ""
        row = self.retrieve(Row("GMR", f"{scored}one whole document per step, greedy, at most {a.gmr_steps} steps"), index, self.p("gmr"),
                            "--mode", "gmr", "--max-steps", a.gmr_steps, *limit, max_tokens=longest + 8)  # fmt: skip
        row.train_s = seconds

    def teacher_row(self) -> None:
        a = self.args
        chains, filtered = self.p("chains-teacher"), self.p("filtered-teacher")
        teacher = [] if a.teacher == "default" else ["--model", a.teacher]
        t0 = time.perf_counter()
        self.run("chains", "synthesize", self.p("teacher"), self.p("triples"), "--out", chains, "--backend", a.teacher_backend, *teacher,
                 "--candidates", a.teacher_candidates, "--few-shot-corpus", 3, "--max-tokens", 192, "--max-empty-share", 1.0, "--seed", a.seed, "--split", "train")  # fmt: skip
        self.run("filters", "apply", chains, "--corpus", self.p("teacher"), "--triples", self.p("triples"), "--out", filtered, "--report", self.p("reports/filters-teacher.md"), "--split", "train")
        synth = time.perf_counter() - t0
        n = kept(filtered)
        name = slug(None if a.teacher == "default" else a.teacher)
        self.notes.append(f"Teacher {name} (`chains synthesize --backend {a.teacher_backend} --candidates {a.teacher_candidates} --few-shot-corpus 3`, "
                          f"{synth:.0f} s): {n} of the first {min(a.teacher_questions, self.split[0])} train questions kept a chain after `filters apply`.")  # fmt: skip
        if n == 0:
            self.rows.append(Row(f"SFT (teacher {name})", note="not run: no chain passed the filters"))
            return
        self.sft_row(f"SFT (teacher {name})", filtered, "sft-teacher", note=f"{n} chains", corpus=self.p("teacher"))
        self.rows[-1].train_s += synth


def kept(filtered: Path) -> int:
    from grtool.store.stage import read_table

    return sum(read_table(filtered, ["selected"]).column("selected").to_pylist())


def slug_row(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# ------------------------------------------------------------------------------------------------- report


def write_results(bench: Bench, wall: float, started: str) -> Path:
    a = bench.args
    name = slug(a.model)
    RESULTS.mkdir(parents=True, exist_ok=True)
    md, png = RESULTS / f"quality-{name}.md", RESULTS / f"quality-{name}.png"
    scored = [r for r in bench.rows if r.report]
    if scored:
        bench.run("eval", "compare", *(f"{r.name}={r.report_file}" for r in scored), "--out", bench.p("reports/compare.md"), "--plot", png)
    n_train, n_test, n_scored = bench.split
    lines = [
        f"# Retrieval quality on held-out 2WikiMultihopQA questions: {name}",
        "",
        f"`{' '.join(['python bench/quality.py', *sys.argv[1:]])}` — started {started}, **wall time {wall / 60:.1f} min** "
        f"on {os.cpu_count()} CPU cores shared with other work.",
        "",
        f"Model `{a.model or 'SmolLM2-135M-Instruct (embedded)'}`, seed {a.seed}; SFT {a.steps} steps (batch 1, lr {a.lr}, no warm-up), "
        f"KTO {a.kto_steps} steps (batch 2, lr {a.kto_lr}) from the SFT checkpoint; retrieve greedy, `--max-tokens {a.max_tokens}`, "
        f"index `--flips` built with each model's tokenizer. Train questions {n_train}, test questions {n_test} ({n_scored} scored).",
        "",
        "| row | recall | exact set | hallucinated / docids | tokens / question | retrieve s | train s | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in bench.rows:
        if r.report:
            rep = r.report
            lines.append(f"| {r.name} | {rep['recall']:.4f} | {rep['exact_match_share']:.4f} | {rep['hallucinated']} / {rep['docids']} | "
                         f"{r.tokens:.0f} | {r.retrieve_s:.0f} | {r.train_s:.0f} | {r.note} |")  # fmt: skip
        else:
            lines.append(f"| {r.name} | - | - | - | - | - | - | {r.note} |")
    lines += [
        "",
        "Recall = |retrieved ∩ gold| / |gold| per question (`eval recall`); exact set = the retrieved documents are exactly "
        "the gold ones; a GMR step writes a whole document, so its docids column counts documents. `train s` includes "
        "the sampling of the KTO row and the chain synthesis of the teacher row.",
        "",
        *(f"- {n}" for n in bench.notes),
        "",
        f"![recall]({png.name})",
        "",
        "<details><summary>Every command, with its wall time</summary>",
        "",
        "```",
        *(f"{s:7.0f} s  exit {code}  {cmd}" for cmd, s, code in bench.run.log),
        "```",
        "</details>",
        "",
    ]
    text = "\n".join(lines).replace(str(bench.work), "WORK")
    md.write_text(text)
    return md


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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", default="base,sft,kto,nothought,gmr,teacher", help="comma-separated subset of base,sft,kto,nothought,gmr,teacher")
    ap.add_argument("--work", type=Path, help="keep the intermediate stages here (default: a temporary folder, removed)")
    args = ap.parse_args()
    if not args.data.is_dir():
        sys.exit(f"--data {args.data}: not a folder (the bench data lives in ../shared/data/bench/2wikimultihopqa)")
    rows = set(args.rows.split(","))
    if args.work and args.work.exists() and any(args.work.iterdir()):
        sys.exit(f"--work {args.work}: not empty")
    work = args.work or Path(tempfile.mkdtemp(prefix="grtool_quality_"))
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t0 = time.perf_counter()
    bench = Bench(args, work)
    try:
        bench.prepare()
        if "base" in rows:
            bench.base_rows()
        bench.gold_chains()
        if rows & {"sft", "kto"}:
            bench.sft_row("SFT", bench.p("filtered-gold"), "sft", note=f"{bench.gold_kept} gold chains")
        if "kto" in rows:
            bench.attempt("SFT → KTO", bench.kto_row)
        if "nothought" in rows:
            bench.sft_row("w/o Thought", bench.p("filtered-gold"), "sft-nothought", "--no-thought", note="gold chains, docids and answer only")
        if "gmr" in rows:
            bench.attempt("GMR", bench.gmr_row)
        if "teacher" in rows and args.teacher != "none":
            bench.attempt("SFT (teacher)", bench.teacher_row)
        md = write_results(bench, time.perf_counter() - t0, started)
        print(md.read_text())
        print(f"wrote {md}")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
