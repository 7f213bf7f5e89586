"""The embedded CPU path: grtool's `transformers` backend against a bare batched `model.generate` loop.

One model in one process (the embedded SmolLM2-135M-Instruct unless --model), the real `triples extract` prompts
of N example paragraphs, greedy, the same batch size. Sides, alternated --repeats times (the best time counts):
  bare      the loop a user writes: tokenizer(batch, padding=True) -> model.generate, batches in input order,
            transformers' own attention and cache
  grtool    TransformersBackend.generate: the shared prompt prefix computed once, grouped-head SDPA, a cache
            that appends in place (the default)
  no-reuse  the same backend with prefix reuse switched off (what the prefix reuse alone is worth)
and grtool again at 1 thread (torch's default is one thread per CPU). Prints wall times, generated tokens/s and
the ratio of grtool's throughput to the bare loop's (target >= 0.9).

    python bench/transformers_generate.py [--docs 16] [--max-tokens 128] [--batch-size 8] [--repeats 2]
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
    ap.add_argument("--model", default=None)
    args = ap.parse_args()

    import torch

    from grtool.llm import Sampling, make_backend
    from grtool.llm.transformers_backend import _SharedPrefix
    from grtool.log import configure
    from grtool.triples.prompt import load_prompt

    configure(quiet=True)
    backend = make_backend("transformers", args.model, batch_size=args.batch_size)
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
        "grtool-1-thread": grtool_side(True, 1),
    }
    bare_loop(backend.lm, backend.tokenizer, texts[:1], 1, 4)  # warm-up, outside the timings
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.repeats):
        for name, run in sides.items():
            t0 = time.perf_counter()
            tokens = run()
            seconds = time.perf_counter() - t0
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tokens)

    prompt_tokens = sum(len(backend.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts) / len(texts)
    shared = len(reuse.ids)
    print(f"{backend.model}, {args.docs} triples prompts (mean {prompt_tokens:.0f} tokens, {shared} shared), "
          f"greedy, max {args.max_tokens} tokens, batch {args.batch_size}, {threads} torch threads, best of {args.repeats}")  # fmt: skip
    bare_rate = best["bare"][1] / best["bare"][0]
    for name, (seconds, tokens) in best.items():
        rate = tokens / seconds
        print(f"  {name:16s} {seconds:7.1f} s  {tokens:6d} tokens  {rate:6.1f} generated tok/s  {rate / bare_rate:5.2f}x bare")
    ratio = (best["grtool"][1] / best["grtool"][0]) / bare_rate
    print(f"grtool / bare throughput: {ratio:.2f} (target >= 0.9)")


if __name__ == "__main__":
    main()
