"""grtool's `transformers` backend on the CPU against llama.cpp (llama-cpp-python) on the same GGUF and prompts.

One process: the embedded SmolLM2-135M-Instruct GGUF (or --gguf), the real `triples extract` prompts of N example
paragraphs rendered with the model's chat template, greedy, --max-tokens new tokens. Sides, alternated --repeats
times (the order flips every repeat; the best time counts):
  grtool     TransformersBackend.generate on the model converted from the GGUF (fp32), --batch-size prompts at a
             time (the demo's batch size by default), the shared prompt prefix computed once
  llama.cpp  llama_cpp.Llama on the GGUF itself (its own quantization), the prompts one after the other: its
             cache keeps the previous prompt, so each call evaluates only what differs (prefix reuse)
Both use every CPU torch uses (on a busy machine set OMP_NUM_THREADS=1: both sides then run at 1 thread). Prints generated tokens/s of both and the ratio grtool / llama.cpp (goal >= 1.0),
and how many outputs of each side equal the unbatched fp32 model's (the same model one prompt at a time, no prefix
reuse). Best and median of the repeats are printed.

llama-cpp-python is not a dependency of grtool (its build compiles llama.cpp, minutes per environment): without it
the script says so and exits 0.

    python bench/llamacpp.py [--docs 8] [--max-tokens 128] [--batch-size 8] [--repeats 2] [--gguf FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from transformers_generate import paragraphs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8, help="grtool's batch (the demo's: 8)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--gguf", default=None, help="a GGUF file (default: the embedded SmolLM2-135M-Instruct's)")
    args = ap.parse_args()
    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama-cpp-python is not installed (pip install llama-cpp-python; it is not a dependency of grtool): skipped")
        return

    import torch

    from grtool.llm import Sampling, make_backend
    from grtool.models import embedded_gguf
    from grtool.llm.transformers_backend import _SharedPrefix
    from grtool.log import configure
    from grtool.triples.prompt import load_prompt

    configure(quiet=True)
    gguf = args.gguf or str(embedded_gguf())
    threads = torch.get_num_threads()
    backend = make_backend("transformers", gguf, batch_size=args.batch_size, device="cpu", dtype="float32")
    prompt = load_prompt()
    messages = [prompt.messages(title, text) for title, text in paragraphs(args.docs)]
    texts = [backend.tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    sampling = Sampling(max_tokens=args.max_tokens)
    llm = Llama(model_path=gguf, n_ctx=4096, n_threads=threads, n_batch=512, verbose=False, seed=0)

    def grtool_side() -> tuple[int, list[str]]:
        out = backend.generate(messages, sampling)
        return sum(g.completion_tokens for g in out), [g.text for g in out]

    def llamacpp_side() -> tuple[int, list[str]]:
        tokens, outs = 0, []
        for text in texts:  # one after the other: the cache keeps the shared prefix of the previous prompt
            r = llm.create_completion(text, max_tokens=args.max_tokens, temperature=0.0, top_k=1)
            tokens += r["usage"]["completion_tokens"]
            outs.append(r["choices"][0]["text"])
        return tokens, outs

    sides = {"grtool": grtool_side, "llama.cpp": llamacpp_side}
    best: dict[str, tuple[float, int, list[str]]] = {}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.repeats):
        order = list(sides.items())
        for name, run in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            tokens, outs = run()
            seconds = time.perf_counter() - t0
            print(f"  repeat {r} {name}: {tokens / seconds:.1f} tok/s", file=sys.stderr, flush=True)
            rates[name].append(tokens / seconds)
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tokens, outs)
    # The unbatched fp32 model, what both sides are compared with: one prompt at a time, no shared prefix.
    backend.batch_size = 1
    backend._prefix = _SharedPrefix(backend.lm)
    backend._prefix.MIN_TOKENS = 10**9
    reference = [g.text for g in backend.generate(messages, sampling)]

    print(f"{gguf}: {args.docs} triples prompts, greedy, max {args.max_tokens} tokens, {threads} threads, grtool batch {args.batch_size}, "
          f"llama.cpp sequential with prefix reuse, best of {args.repeats} alternated")  # fmt: skip
    for name, (seconds, tokens, outs) in best.items():
        same = sum(a.strip() == b.strip() for a, b in zip(outs, reference))
        print(f"  {name:10s} {seconds:7.1f} s  {tokens:6d} tokens  best {tokens / seconds:7.1f}  median {statistics.median(rates[name]):7.1f} generated tok/s   "
              f"outputs equal to the unbatched fp32 model's: {same}/{len(reference)}")  # fmt: skip
    ratio = (best["grtool"][1] / best["grtool"][0]) / (best["llama.cpp"][1] / best["llama.cpp"][0])
    median = statistics.median(rates["grtool"]) / statistics.median(rates["llama.cpp"])
    print(f"grtool / llama.cpp throughput: {ratio:.2f} best of {args.repeats}, {median:.2f} median (goal >= 1.0)")


if __name__ == "__main__":
    main()
