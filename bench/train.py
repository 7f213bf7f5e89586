"""SFT training throughput: `grtool train sft`'s path against a bare TRL `SFTTrainer` script on the same rows.

One process, the embedded SmolLM2-135M-Instruct on the CPU (fp32), N realistic rows as `export sft --format
trl-messages` writes them (a question, then a reasoning chain through `<docid_start>h, r, t<docid_end>` triples).
Sides, alternated --repeats times (the best throughput counts), each with --packing and --no-packing:
  grtool  grtool.train.run.train(plan(...)) — what `grtool train sft` calls: tokenizer with the markers added,
          their embeddings from [ and ], the progress callback, a loss logged every step, the checkpoint saved
  bare    the script a user writes: AutoTokenizer + the two markers as special tokens, resize_token_embeddings,
          messages split into prompt/completion, SFTTrainer(SFTConfig(completion_only_loss=True, packing=...,
          report_to="none", save_strategy="no", disable_tqdm=True, bf16=False)), trainer.train()
Same model, max steps, batch, cutoff, learning rate, schedule, seed. Both trainers are instrumented the same way:
a callback timestamps every step's start; a wrapper of `training_step` counts the non-padding tokens of each
batch (attention_mask, or every input id of a padding-free packed batch). Steady-state throughput = tokens of
the timed steps / the time from the start of the first timed step to the start of the step after the last one
(so each timed step includes everything the trainer does around it: callbacks, logging, progress), after
--warmup steps; the one extra last step (and grtool's final checkpoint save) is outside the window.
Prints tokens/s per side and the ratio grtool / bare (target >= 0.95), plus each side's time from the trainer built to
the end (trainer.train(); grtool's also saves a checkpoint at the last step and the model; informative only).

    python bench/train.py [--rows 32] [--steps 8] [--warmup 2] [--batch-size 2] [--cutoff 256] [--repeats 2]
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
    from grtool.export.formats import instruction, sft_row

    path.write_text("".join(json.dumps(sft_row("trl-messages", instruction(q), c, None)) + "\n" for q, c in rows(n)))
    return path


class Meter:
    """Step start times (callback) and non-padding tokens per step (a training_step wrapper)."""

    def __init__(self, warmup: int):
        from transformers import TrainerCallback

        self.warmup, self.starts, self.tokens = warmup, {}, {}
        meter = self

        class Stamp(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                meter.starts[state.global_step + 1] = time.perf_counter()

        self.callback = Stamp()

    def attach(self, trainer) -> None:
        trainer.add_callback(self.callback)
        step = trainer.training_step

        def training_step(model, inputs, *a, **kw):
            mask = inputs.get("attention_mask")
            n = int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())  # padding-free: no pads
            current = trainer.state.global_step + 1
            self.tokens[current] = self.tokens.get(current, 0) + n
            return step(model, inputs, *a, **kw)

        trainer.training_step = training_step

    def rate(self) -> tuple[float, int, float]:
        """(tokens/s, tokens, seconds) over steps warmup+1 .. last-1."""
        last = max(self.starts)
        timed = range(self.warmup + 1, last)
        tokens = sum(self.tokens[s] for s in timed)
        seconds = self.starts[last] - self.starts[self.warmup + 1]
        return tokens / seconds, tokens, seconds


def grtool_side(data: Path, args, packing: bool, tmp: Path) -> tuple[Meter, float]:
    import grtool.train.run as run
    from grtool.train.config import resolve

    meter = Meter(args.warmup)
    options = {"max_steps": args.warmup + args.steps + 1, "per_device_batch_size": args.batch_size, "cutoff_len": args.cutoff,
               "learning_rate": args.lr, "warmup_ratio": 0.0, "packing": packing, "seed": 0}  # fmt: skip
    p = run.plan("sft", data, None, tmp / "ckpt", resolve("sft", options), overwrite=True)
    original = run.build_trainer

    def build_trainer(plan, callbacks=None):
        trainer = original(plan, callbacks=callbacks)
        meter.attach(trainer)
        meter.built = time.perf_counter()
        return trainer

    run.build_trainer = build_trainer
    try:
        run.train(p)
        wall = time.perf_counter() - meter.built
    finally:
        run.build_trainer = original
        shutil.rmtree(tmp / "ckpt", ignore_errors=True)
    return meter, wall


def bare_side(data: Path, args, packing: bool, tmp: Path) -> tuple[Meter, float]:
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from grtool.docid import DOCID_END, DOCID_START
    from grtool.llm.models import resolve_model

    path = resolve_model(None).path
    meter = Meter(args.warmup)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([DOCID_START, DOCID_END], special_tokens=True)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.resize_token_embeddings(len(tokenizer))
    dataset = load_dataset("json", data_files=str(data), split="train")
    dataset = dataset.map(lambda r: {"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}, remove_columns=["messages"])
    config = SFTConfig(output_dir=str(tmp / "bare"), max_steps=args.warmup + args.steps + 1, per_device_train_batch_size=args.batch_size,
                       max_length=args.cutoff, learning_rate=args.lr, lr_scheduler_type="cosine", warmup_steps=0, seed=0,
                       packing=packing, completion_only_loss=True, report_to="none", save_strategy="no", disable_tqdm=True, bf16=False)  # fmt: skip
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    meter.attach(trainer)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    shutil.rmtree(tmp / "bare", ignore_errors=True)
    return meter, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--cutoff", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--packing", choices=["both", "on", "off"], default="both")
    args = ap.parse_args()

    import datasets
    import torch
    import transformers

    from grtool.log import configure

    configure(quiet=True)
    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    modes = {"both": [False, True], "on": [True], "off": [False]}[args.packing]
    best: dict[tuple[bool, str], tuple[float, int, float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="grtool-bench-train-") as tmp:
        tmp = Path(tmp)
        data = write_rows(tmp / "thinkgr_sft.jsonl", args.rows)
        for r in range(args.repeats):
            for packing in modes:
                order = [("grtool", grtool_side), ("bare", bare_side)]
                for name, side in order if r % 2 == 0 else order[::-1]:
                    meter, wall = side(data, args, packing, tmp)
                    rate, tokens, seconds = meter.rate()
                    key = (packing, name)
                    if key not in best or rate > best[key][0]:
                        best[key] = (rate, tokens, seconds, wall)

    print(f"SmolLM2-135M-Instruct (embedded), {args.rows} trl-messages rows, SFT full fp32 on the CPU, batch {args.batch_size}, "
          f"cutoff {args.cutoff}, {args.steps} timed steps after {args.warmup} warm-up, {torch.get_num_threads()} torch threads, "
          f"best of {args.repeats}")  # fmt: skip
    for packing in modes:
        print(f"packing {'on' if packing else 'off'}:")
        for name in ("bare", "grtool"):
            rate, tokens, seconds, wall = best[(packing, name)]
            print(f"  {name:7s} {tokens:6d} tokens in {seconds:6.2f} s  {rate:7.1f} tok/s   (train() and after: {wall:6.1f} s)")
        ratio = best[(packing, "grtool")][0] / best[(packing, "bare")][0]
        print(f"  grtool / bare throughput: {ratio:.2f} (target >= 0.95)")


if __name__ == "__main__":
    main()
