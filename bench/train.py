"""SFT training throughput: `grtool train sft`'s path against a bare TRL `SFTTrainer` script on the same rows.

One process, one model (the embedded SmolLM2-135M-Instruct unless --model or --random-init), N realistic rows as
`export sft --format trl-messages` writes them (a question, then a reasoning chain through
`<docid_start>h, r, t<docid_end>` triples). On a GPU (--device auto finds one) both sides load the model in bf16 and
train with bf16=True, as grtool does there; on the CPU both train in fp32. Sides, alternated --repeats times (the
order flips every repeat; the best throughput counts), each with --packing and --no-packing:
  grtool  grtool.train.run.train(plan(...)) — what `grtool train sft` calls: tokenizer with the markers added,
          their embeddings from [ and ], the progress callback, the loss logged at grtool's default interval
          (every step), the checkpoint saved (fsync) at the last step, the model saved
  bare    the script a user writes: AutoTokenizer + the two markers as special tokens, resize_token_embeddings,
          messages split into prompt/completion, SFTTrainer(SFTConfig(completion_only_loss=True, packing=...,
          report_to="none", save_strategy="no", disable_tqdm=True, bf16=<on a GPU>)), trainer.train(); TRL's
          default logging interval (10 steps)
--ablation adds variants that each change one thing, to find what a gap is made of: grtool with a loss logged
every 1, 10 or 50 steps (those that are not its default), grtool without its progress callback, bare with a loss
logged every step. (The gradient-mask hook of grtool's LoRA path is not on the full-SFT path measured here.)
Same model, max steps, batch, cutoff, learning rate, schedule, seed. Both trainers are instrumented the same way:
a callback timestamps every step's start; a wrapper of `training_step` counts the non-padding tokens of each
batch (attention_mask, or every input id of a padding-free packed batch; summed on the device, read at the end).
On a GPU the device is synchronised at the two ends of the window only (a sync per step would hide the cost of
the syncs a side makes itself). Steady-state throughput = tokens of the timed steps / the time from the start of
the first timed step to the start of the step after the last one (so each timed step includes everything the
trainer does around it: callbacks, logging, progress), after --warmup steps; the one extra last step is outside
the window. Printed per side: tokens/s, the ratio grtool / bare (target >= 0.95), and the time after the end of
the last step (grtool: the checkpoint saved with fsync, the model saved; bare saves nothing).

    python bench/train.py [--rows 32] [--steps 8] [--warmup 2] [--batch-size 2] [--cutoff 256] [--repeats 2]
    python bench/train.py --random-init 1b --rows 96 --batch-size 8 --cutoff 512 --warmup 5 --steps 40 --packing off --ablation   # a GPU
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

# (person, birthplace, country, spouse) — two-hop chains through real-looking triples
PEOPLE = [("Ada Lovelace", "London", "England", "William King-Noel"), ("Marie Curie", "Warsaw", "Poland", "Pierre Curie"),
          ("Alan Turing", "Maida Vale", "England", None), ("Niels Bohr", "Copenhagen", "Denmark", "Margrethe Nørlund"),
          ("Emmy Noether", "Erlangen", "Germany", None), ("Enrico Fermi", "Rome", "Italy", "Laura Capon"),
          ("Lise Meitner", "Vienna", "Austria", None), ("Paul Dirac", "Bristol", "England", "Manci Balázs"),
          ("Max Planck", "Kiel", "Germany", "Marie Merck"), ("Srinivasa Ramanujan", "Erode", "India", "Janaki Ammal"),
          ("Dorothy Hodgkin", "Cairo", "Egypt", "Thomas Lionel Hodgkin"), ("Erwin Schrödinger", "Vienna", "Austria", "Annemarie Bertel"),
          ("Hideki Yukawa", "Tokyo", "Japan", "Sumi Yukawa"), ("Chien-Shiung Wu", "Liuhe", "China", "Luke Chia-Liu Yuan"),
          ("Satyendra Nath Bose", "Calcutta", "India", None), ("Rosalind Franklin", "Notting Hill", "England", None)]  # fmt: skip


def rows(n: int) -> list[tuple[str, str]]:
    """(question, chain) pairs: birthplace → country, or spouse → birthplace → country, with docid triples."""
    from grtool.docid import DOCID_END as E
    from grtool.docid import DOCID_START as S

    out = []
    for i in range(n):
        person, city, country, spouse = PEOPLE[i % len(PEOPLE)]
        if i < len(PEOPLE) or spouse is None:
            q = f"In which country is the city where {person} was born?"
            c = (f"To answer this I need {person}'s birthplace and then the country of that city. "
                 f"{person} was born in {city}: {S}{person}, place of birth, {city}{E}. "
                 f"{city} is in {country}: {S}{city}, country, {country}{E}. So the answer is {country}.")  # fmt: skip
        else:
            q = f"In which country was the spouse of {spouse} born?"
            c = (f"First I find who {spouse} was married to: {S}{spouse}, spouse, {person}{E}. "
                 f"Then where {person} was born: {S}{person}, place of birth, {city}{E}. "
                 f"Finally the country of {city}: {S}{city}, country, {country}{E}. So the answer is {country}.")  # fmt: skip
        out.append((q, c))
    return out


def write_rows(path: Path, n: int) -> Path:
    """The file `grtool export sft --format trl-messages` writes (JSON Lines of {"messages": [...]})."""
    from grtool.vocab.prompt import instruction
    from grtool.export.formats import sft_row

    path.write_text("".join(json.dumps(sft_row("trl-messages", instruction(q), c, None)) + "\n" for q, c in rows(n)))
    return path


class Meter:
    """Step start times (callback), the end of the last step, and non-padding tokens per step (a training_step
    wrapper). ``sync``: what waits for the device (None on the CPU), called at the window's two ends only."""

    def __init__(self, warmup: int, last: int, sync=None):
        from transformers import TrainerCallback

        self.warmup, self.last, self.sync = warmup, last, sync
        self.starts: dict[int, float] = {}
        self.tokens: dict[int, object] = {}
        self.last_end = None
        meter = self

        class Stamp(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                step = state.global_step + 1
                if meter.sync is not None and step in (meter.warmup + 1, meter.last):
                    meter.sync()
                meter.starts[step] = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == meter.last:
                    if meter.sync is not None:
                        meter.sync()
                    meter.last_end = time.perf_counter()

        self.callback = Stamp()

    def attach(self, trainer) -> None:
        trainer.add_callback(self.callback)
        step = trainer.training_step

        def training_step(model, inputs, *a, **kw):
            mask = inputs.get("attention_mask")
            n = mask.sum() if mask is not None else inputs["input_ids"].numel()  # padding-free: no pads; no sync
            current = trainer.state.global_step + 1
            self.tokens[current] = self.tokens.get(current, 0) + n
            return step(model, inputs, *a, **kw)

        trainer.training_step = training_step

    def rate(self) -> tuple[float, int, float]:
        """(tokens/s, tokens, seconds) over steps warmup+1 .. last-1."""
        last = max(self.starts)
        timed = range(self.warmup + 1, last)
        tokens = int(sum(int(self.tokens[s]) for s in timed))
        seconds = self.starts[last] - self.starts[self.warmup + 1]
        return tokens / seconds, tokens, seconds


def _sync(device: str):
    import torch

    return torch.cuda.synchronize if device == "cuda" else None


def _release(device: str) -> None:
    """Free what a side left on the device before the next one loads its model."""
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def grtool_side(data: Path, args, packing: bool, tmp: Path, *, logging_steps: int | None = None, progress: bool = True) -> tuple[Meter, float]:
    import grtool.train.run as run
    from grtool.train.config import resolve
    from grtool.train.progress import TrainProgress

    last = args.warmup + args.steps + 1
    meter = Meter(args.warmup, last, _sync(args.device))
    options = {"max_steps": last, "per_device_batch_size": args.batch_size, "cutoff_len": args.cutoff,
               "learning_rate": args.lr, "warmup_ratio": 0.0, "packing": packing, "seed": 0}  # fmt: skip
    if logging_steps is not None:
        options["logging_steps"] = logging_steps
    p = run.plan("sft", data, args.model, tmp / "ckpt", resolve("sft", options), overwrite=True)
    original = run.build_trainer

    def build_trainer(plan, callbacks=None):
        trainer = original(plan, callbacks=callbacks)
        if not progress:
            trainer.remove_callback(TrainProgress)
        meter.attach(trainer)
        return trainer

    run.build_trainer = build_trainer
    try:
        run.train(p)
        after = time.perf_counter() - meter.last_end
    finally:
        run.build_trainer = original
        shutil.rmtree(tmp / "ckpt", ignore_errors=True)
        _release(args.device)
    return meter, after


def bare_side(data: Path, args, packing: bool, tmp: Path, *, logging_steps: int | None = None) -> tuple[Meter, float]:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from grtool.docid import DOCID_END, DOCID_START
    from grtool.models import resolve_model

    path = resolve_model(args.model).path
    last = args.warmup + args.steps + 1
    meter = Meter(args.warmup, last, _sync(args.device))
    bf16 = args.device == "cuda"
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([DOCID_START, DOCID_END], special_tokens=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if bf16 else torch.float32)
    model.resize_token_embeddings(len(tokenizer))
    dataset = load_dataset("json", data_files=str(data), split="train")
    dataset = dataset.map(lambda r: {"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}, remove_columns=["messages"])
    extra = {"logging_steps": logging_steps} if logging_steps is not None else {}
    config = SFTConfig(output_dir=str(tmp / "bare"), max_steps=last, per_device_train_batch_size=args.batch_size,
                       max_length=args.cutoff, learning_rate=args.lr, lr_scheduler_type="cosine", warmup_steps=0, seed=0,
                       packing=packing, completion_only_loss=True, report_to="none", save_strategy="no", disable_tqdm=True, bf16=bf16,
                       **extra)  # fmt: skip
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    meter.attach(trainer)
    trainer.train()
    after = time.perf_counter() - meter.last_end
    del trainer, model
    shutil.rmtree(tmp / "bare", ignore_errors=True)
    _release(args.device)
    return meter, after


def sides(args) -> dict[str, object]:
    """The sides to run: grtool and bare, and with --ablation the variants that change one thing each."""
    import functools

    from grtool.train.config import TrainConfig

    out = {"bare": bare_side, "grtool": grtool_side}
    if args.ablation:
        default = TrainConfig().logging_steps
        for every in (n for n in (1, 10, 50) if n != default):
            out[f"grtool, loss every {every} steps"] = functools.partial(grtool_side, logging_steps=every)
        out["grtool, no progress callback"] = functools.partial(grtool_side, progress=False)
        out["bare, loss every step"] = functools.partial(bare_side, logging_steps=1)
    return out


def main() -> None:
    import os
    import sys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--cutoff", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--packing", choices=["both", "on", "off"], default="both")
    ap.add_argument("--model", default=None, help="a local HF model folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--random-init", default=None, choices=["1b", "135m", "tiny"], help="train a random-init Llama of this shape (bench/random_model.py) with --tokenizer's files instead of --model")
    ap.add_argument("--tokenizer", default=None, help="with --random-init: a folder with tokenizer files (default: the embedded model's)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: a GPU when one is present")
    ap.add_argument("--ablation", action="store_true", help="also the variants that change one thing each (see above)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the results here")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # grtool picks the GPU by itself when one is visible

    import datasets
    import torch
    import transformers

    from grtool.log import configure

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    configure(quiet=True)
    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.packing]
    runs = sides(args)
    best: dict[tuple[bool, str], tuple[float, int, float, float]] = {}
    every: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="grtool-bench-train-") as tmp:
        tmp = Path(tmp)
        if args.random_init:
            from random_model import write_random_model

            t = time.perf_counter()
            args.model = str(write_random_model(tmp / f"random-{args.random_init}", args.random_init, args.tokenizer, device=args.device))
            print(f"random-init {args.random_init} written in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        data = write_rows(tmp / "thinkgr_sft.jsonl", args.rows)
        for r in range(args.repeats):
            for packing in modes:
                order = list(runs.items())
                for name, side in order if r % 2 == 0 else order[::-1]:
                    meter, after = side(data, args, packing, tmp)
                    rate, tokens, seconds = meter.rate()
                    every.append({"repeat": r, "packing": packing, "side": name, "tok_s": rate, "tokens": tokens, "seconds": seconds, "after_last_step_s": after})
                    print(f"  repeat {r} packing {'on' if packing else 'off'} {name}: {rate:.1f} tok/s", file=sys.stderr, flush=True)
                    key = (packing, name)
                    if key not in best or rate > best[key][0]:
                        best[key] = (rate, tokens, seconds, after)

    from grtool.train.config import TrainConfig

    model = f"random-init {args.random_init} Llama" if args.random_init else (args.model or "SmolLM2-135M-Instruct (embedded)")
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else f"the CPU, {torch.get_num_threads()} torch threads"
    dtype = "bf16 weights, bf16=True" if args.device == "cuda" else "fp32"
    print(f"{model}, {args.rows} trl-messages rows, SFT full, {dtype}, on {where}; batch {args.batch_size}, cutoff {args.cutoff}, "
          f"{args.steps} timed steps after {args.warmup} warm-up, best of {args.repeats} alternated; "
          f"grtool's default logging interval: {TrainConfig().logging_steps} steps, torch {torch.__version__}, transformers {transformers.__version__}")  # fmt: skip
    for packing in modes:
        print(f"packing {'on' if packing else 'off'}:")
        bare = best[(packing, "bare")][0]
        for name in runs:
            rate, tokens, seconds, after = best[(packing, name)]
            print(f"  {name:32s} {tokens:6d} tokens in {seconds:6.2f} s  {rate:8.1f} tok/s  {rate / bare:5.2f}x bare   (after the last step: {after:5.1f} s)")
        ratio = best[(packing, "grtool")][0] / bare
        print(f"  grtool / bare throughput: {ratio:.2f} (target >= 0.95)")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": where, "dtype": dtype, "args": vars(args), "runs": every}, indent=1))


if __name__ == "__main__":
    main()
