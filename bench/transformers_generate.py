"""The embedded CPU path: grtool's `transformers` backend against a bare batched `model.generate` loop.

One model in one process (the embedded SmolLM2-135M-Instruct unless --model, a local HF folder, or --random-init,
a random-init Llama of a preset shape: bench/random_model.py), the real `triples extract` prompts of N example
paragraphs, greedy, the same batch size, on a GPU when one is present (--device; bf16 there, both sides: the one
model the backend loaded serves both), else the CPU in fp32. Sides, alternated --repeats times (the order flips every
repeat; the best time counts):
  bare      the loop a user writes: tokenizer(batch, padding=True) -> model.generate, batches in input order,
            transformers' own attention and cache
  grtool    TransformersBackend.generate: the shared prompt prefix computed once, grouped-head SDPA, a cache
            that appends in place (the default)
  no-reuse  the same backend with prefix reuse switched off (what the prefix reuse alone is worth)
and on the CPU grtool again at 1 thread (torch's default is one thread per CPU). Prints the device and dtype, wall
times, generated tokens/s and the ratio of grtool's throughput to the bare loop's (target >= 0.9).

    python bench/transformers_generate.py [--docs 16] [--max-tokens 128] [--batch-size 8] [--repeats 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def paragraphs(n: int) -> list[tuple[str, str]]:
    """(title, text) of the bundled HotpotQA example paragraphs, cycled to n."""
    records = json.loads((REPO / "examples/data/hotpotqa/hotpot_dev_distractor_v1.example.json").read_text())
    found = [(title, "".join(sentences)) for rec in records for title, sentences in rec["context"]]
    return [found[i % len(found)] for i in range(n)]


def bare_loop(lm, tokenizer, texts: list[str], batch_size: int, max_tokens: int) -> int:
    """Generated tokens (up to and including the first end-of-sequence token of each row), stock transformers."""
    grtool_attention = lm.config._attn_implementation
    lm.set_attn_implementation("sdpa")  # transformers' own attention, not the backend's grouped-head SDPA
    try:
        return _generate_all(lm, tokenizer, texts, batch_size, max_tokens)
    finally:
        lm.set_attn_implementation(grtool_attention)


def _generate_all(lm, tokenizer, texts: list[str], batch_size: int, max_tokens: int) -> int:
    import torch

    eos = lm.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    generated = 0
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = lm.generate(**enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            generated += next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
    return generated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default=None, help="a local HF model folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--random-init", default=None, choices=["1b", "135m", "tiny"], help="a random-init Llama of this shape instead of --model")
    ap.add_argument("--tokenizer", default=None, help="with --random-init: a folder with tokenizer files (default: the embedded model's)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: a GPU when one is present")
    args = ap.parse_args()

    import tempfile

    import torch

    from grtool.llm import Sampling, make_backend
    from grtool.llm.transformers_backend import _SharedPrefix
    from grtool.log import configure
    from grtool.triples.prompt import load_prompt

    configure(quiet=True)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = "bfloat16" if device == "cuda" else "float32"
    if args.random_init:
        from random_model import write_random_model

        folder = Path(tempfile.mkdtemp(prefix="grtool-bench-model-")) / f"random-{args.random_init}"
        args.model = str(write_random_model(folder, args.random_init, args.tokenizer, dtype=dtype, device=device))
    backend = make_backend("transformers", args.model, batch_size=args.batch_size, device=device, dtype=dtype)
    prompt = load_prompt()
    messages = [prompt.messages(title, text) for title, text in paragraphs(args.docs)]
    texts = [backend.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    sampling = Sampling(max_tokens=args.max_tokens)
    threads = torch.get_num_threads()
    reuse = backend._prefix

    def grtool_side(prefix_reuse: bool, n_threads: int):
        def run() -> int:
            torch.set_num_threads(n_threads)
            if prefix_reuse:
                backend._prefix = reuse
            else:
                backend._prefix = _SharedPrefix(backend.lm)
                backend._prefix.MIN_TOKENS = 10**9
            try:
                return sum(g.completion_tokens for g in backend.generate(messages, sampling))
            finally:
                torch.set_num_threads(threads)

        return run

    sides = {
        "bare": lambda: bare_loop(backend.lm, backend.tokenizer, texts, args.batch_size, args.max_tokens),
        "grtool": grtool_side(True, threads),
        "no-reuse": grtool_side(False, threads),
    }
    if device == "cpu":
        sides["grtool-1-thread"] = grtool_side(True, 1)
    bare_loop(backend.lm, backend.tokenizer, texts[:1], 1, 4)  # warm-up, outside the timings
    best: dict[str, tuple[float, int]] = {}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for r in range(args.repeats):
        order = list(sides.items())
        for name, run in order if r % 2 == 0 else order[::-1]:
            sync()
            t0 = time.perf_counter()
            tokens = run()
            sync()
            seconds = time.perf_counter() - t0
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tokens)

    prompt_tokens = sum(len(backend.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts) / len(texts)
    shared = len(reuse.ids)
    where = torch.cuda.get_device_name(0) if device == "cuda" else f"the CPU, {threads} torch threads"
    model = f"random-init {args.random_init} Llama" if args.random_init else backend.model
    print(f"{model}, {args.docs} triples prompts (mean {prompt_tokens:.0f} tokens, {shared} shared), greedy, max {args.max_tokens} "
          f"tokens, batch {args.batch_size}, on {where}, {dtype}, best of {args.repeats} alternated")  # fmt: skip
    bare_rate = best["bare"][1] / best["bare"][0]
    for name, (seconds, tokens) in best.items():
        rate = tokens / seconds
        print(f"  {name:16s} {seconds:7.1f} s  {tokens:6d} tokens  {rate:6.1f} generated tok/s  {rate / bare_rate:5.2f}x bare")
    ratio = (best["grtool"][1] / best["grtool"][0]) / bare_rate
    print(f"grtool / bare throughput: {ratio:.2f} (target >= 0.9)")


if __name__ == "__main__":
    main()
